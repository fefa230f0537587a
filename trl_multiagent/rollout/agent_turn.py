"""AT-GRPO's rollout: agent-and-turn groups, tree sampling with greedy execution (AT-GRPO Sec. 4.1, Alg. 1, Eq. 3).

The sampler keeps every candidate's team and local reward; the Eq. 3 rewards of the samples, their group
normalisation and the leaving out of tied groups are the trainer's credit
(:func:`~trl_multiagent.trainers.at_grpo.agent_turn_credit`). Eq. 3 also picks the executed candidate during the
rollout (Alg. 1, line 11), so the sampler mixes the rewards with the same ``alpha`` for that choice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import GenerationConfig

from trl_multiagent.credit.at_grpo import best_candidate, mix_rewards
from trl_multiagent.environments.base import Environment
from trl_multiagent.environments.stepping import map_steps, reset_env, step_env
from trl_multiagent.rollout.experience import Experience, JointAction, Sample, rollout_stats
from trl_multiagent.team.pool import AgentPool, Generation


@dataclass
class CandidateSample(Sample):
    """One agent's candidate at one turn, with the two rewards Eq. 3 mixes: the team reward and the agent's local
    reward observed when the candidate was scored."""

    team_reward: float = 0.0
    local_reward: float = 0.0


class AgentTurnSampler:
    """AT-GRPO's rollout: agent-and-turn groups, tree sampling with greedy execution (AT-GRPO Sec. 4.1, Alg. 1).

    In every environment instance e, at turn t, each agent i samples K candidates from the CURRENT state. Each
    candidate is scored with the mixed reward of Eq. 3, ``r = alpha * team + local_i``; the K candidates form the
    group keyed ``(e, t, i)`` (never two problems, turns or agents in one group), and the best-scoring candidate is
    executed (greedy; the first one on ties) before the rollout moves on.

    ``agent_order="sequential"``: agents act one after another within a turn; agent i+1 samples and is scored on
    the state after agent i's executed action. Each candidate is scored by stepping a clone of the environment with
    that agent's action alone, so the environment must accept partial joint actions
    (``supports_partial_actions = True``).
    ``agent_order="parallel"`` (this project's extension; the paper's turn is a chain of one-agent micro-transitions,
    Sec. 3): all agents sample from the same state; candidate k of every agent forms the k-th joint action, which is
    scored once and gives every agent its Eq. 3 reward; each agent's group is its K candidates. The executed joint
    action is the scored one with the highest sum of its agents' rewards (:func:`~trl_multiagent.credit.best_candidate`;
    its scored clone becomes the state), so the transition taken is one whose reward was observed, never a
    combination of each agent's best candidate from different joint actions.

    Args:
        num_samples: K candidates per agent per turn.
        num_turns: the turn budget (episodes end earlier when the environment says ``done``).
        agent_order: ``"sequential"`` or ``"parallel"``.
        alpha: weight of the team reward in Eq. 3, for the greedy choice of the executed candidate.
    """

    def __init__(self, num_samples: int, num_turns: int, agent_order: str = "sequential", alpha: float = 1.0):
        if agent_order not in ("sequential", "parallel"):
            raise ValueError(f"agent_order must be 'sequential' or 'parallel', got {agent_order!r}")
        if num_samples < 1 or num_turns < 1:
            raise ValueError("num_samples and num_turns must be at least 1")
        self.num_samples, self.num_turns, self.agent_order = num_samples, num_turns, agent_order
        self.alpha = alpha

    def rollout(self, pool: AgentPool, env_factory: Callable[[], Environment], tasks: Sequence[Mapping[str, Any]],
                generation_config: GenerationConfig) -> Experience:
        envs = [env_factory() for _ in tasks]
        agents = list(envs[0].agents) if envs else list(pool.agent_names)
        if self.agent_order == "sequential" and envs and not getattr(envs[0], "supports_partial_actions", False):
            raise ValueError(f"{type(envs[0]).__name__} does not accept partial joint actions "
                             "(supports_partial_actions); use agent_order='parallel'")
        prompts = [reset_env(env, task) for env, task in zip(envs, tasks)]
        active = list(range(len(envs)))
        samples: list[Sample] = []
        executed: list[JointAction] = []
        generated_samples = 0
        stages = [[a] for a in agents] if self.agent_order == "sequential" else [agents]
        for turn in range(self.num_turns):
            for stage in stages:
                if not active:
                    break
                gens = pool.generate_by_agent({a: [prompts[e][a] for e in active] for a in stage}, self.num_samples,
                                              generation_config)
                generated_samples += len(stage) * len(active) * self.num_samples
                finished = []
                scored = self._score([envs[e] for e in active], stage, [{a: gens[a][pos] for a in stage}
                                                                       for pos in range(len(active))],
                                     [tasks[e] for e in active], turn)
                for pos, e in enumerate(active):
                    candidates = scored[pos]
                    for a in stage:
                        for k, g in enumerate(gens[a][pos]):
                            result = candidates[k][1]
                            samples.append(CandidateSample(
                                agent=a, policy=pool.policy_of(a), episode=e, turn=turn, node=e, generation=g,
                                joint_ids=[], group=(e, turn, a), team_reward=result.team_reward,
                                local_reward=(result.local_rewards or {}).get(a, 0.0)))
                    # greedy transition (Alg. 1, line 11): the scored (joint) candidate with the highest reward, its
                    # scored clone kept as the environment's next state
                    best = best_candidate([mixed for _, _, mixed in candidates])
                    env, result, _ = candidates[best]
                    envs[e] = env
                    executed.append(JointAction(id=len(executed), node=e, episode=e, turn=turn,
                                                sample_index=tuple(best for _ in stage), reward=result.team_reward,
                                                done=result.done, info=dict(result.info),
                                                local_rewards=result.local_rewards))
                    if result.done:
                        finished.append(e)
                    else:
                        if result.next_prompts is None or set(result.next_prompts) != set(agents):
                            raise ValueError(f"{type(env).__name__}.step must return next prompts for {agents} "
                                             "when the episode goes on")
                        prompts[e] = result.next_prompts
                active = [e for e in active if e not in finished]
        stats = rollout_stats(agents, samples, executed, generated_samples, len(tasks),
                              reward_names=getattr(envs[0], "reward_names", ()) if envs else ())
        stats["team_reward"] = sum(j.reward for j in executed) / len(executed) if executed else math.nan
        return Experience(samples, executed, stats, agents)

    def _score(self, envs: Sequence[Environment], stage: list[str], gens: Sequence[Mapping[str, list[Generation]]],
               tasks: Sequence[Mapping[str, Any]], turn: int) -> list[list[tuple]]:
        """For every environment of ``envs`` (the active episodes): step a clone per candidate (sequential) or per
        aligned joint candidate (parallel); per episode, ``(clone, result, mixed rewards)`` of each of its K
        candidates. All episodes' clones step in one :func:`~trl_multiagent.environments.stepping.map_steps`:
        concurrently where the environment waits on subprocesses (``concurrent_steps``, the sandboxed tool)."""
        jobs = [(pos, k) for pos in range(len(envs)) for k in range(self.num_samples)]

        def run(job):
            pos, k = job
            clone = envs[pos].clone()
            result = step_env(clone, {a: gens[pos][a][k].text for a in stage}, tasks[pos], turn)
            local = result.local_rewards or {}
            return clone, result, {a: mix_rewards(result.team_reward, local.get(a, 0.0), self.alpha) for a in stage}

        steps = map_steps(run, jobs, envs[0] if envs else None)
        return [steps[pos * self.num_samples:(pos + 1) * self.num_samples] for pos in range(len(envs))]
