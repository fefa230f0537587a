"""MAPoRL's rollout: collaborative debates, each answer scored by the verifier and checked for the App. G penalties.

Paper: MAPoRL (Park et al., arXiv 2502.18439), Sec. 3.1 (debate), Def. 1 / App. F (reward modes), Sec. 3.3 (Tables 1-2),
App. G.2-G.3 (penalties).

For every task the sampler runs ``num_debates`` independent debates. Turn 1: each agent answers the question alone;
later turns: each agent reads every agent's previous answer (the environment writes those prompts) and revises. A
debate ends after ``num_turns`` turns or when the environment says ``done``; with ``early_stop=False`` (the trainer's
default, as the authors train) a :class:`~trl_multiagent.environments.debate.DebateEnv` does not end a debate because
its agents agree. Generation is batched: at each turn, all agents answer all live debates in one team-level call.

Each answer ``y_{i,t}`` becomes one :class:`DebateSample` with what the rollout observed: the verifier score
``s(q, y_{i,t})`` (the environment's ``local_rewards``, the rule verifier, or a learned verifier's score when a
``scorer`` is given), the App. G checks it triggered, and (debate environments) its answer group and correctness.
Its reward is the trainer's credit (:func:`~trl_multiagent.trainers.maporl.debate_rewards`), in this order:

1. a penalised answer's verifier score becomes the penalty value (-10, App. G.2,
   :func:`~trl_multiagent.credit.maporl.penalized_score`), so that it enters every sum below;
2. the reward mode over the debate's (penalised) score matrix (``immediate``, ``cumulative`` or ``influence``, with
   ``gamma``; an early-stopped debate is rewarded over the turns it played);
3. plus the collaboration incentives of Tables 1-2 (needs a :class:`~trl_multiagent.environments.debate.DebateEnv`,
   which knows which answers are right);

then the token-level part (KL penalty per token, GAE with the critic's values at rollout time).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import GenerationConfig

from trl_multiagent.credit.maporl import PenaltySettings, answer_penalties
from trl_multiagent.environments.base import Environment
from trl_multiagent.environments.debate import DebateEnv, TurnOutcome
from trl_multiagent.environments.stepping import reset_env, step_env
from trl_multiagent.metrics.debate import majority_vote_accuracy
from trl_multiagent.rollout.experience import Experience, JointAction, Sample, rollout_stats
from trl_multiagent.team.pool import AgentPool, Generation

#: A learned verifier: ``scorer(questions, solutions) -> scores in [0, 1]``.
Scorer = Callable[[Sequence[str], Sequence[str]], Sequence[float]]


@dataclass
class DebateSample(Sample):
    """One agent's answer at one turn of one debate, with what MAPoRL's PPO needs on top of a :class:`Sample`.

    Attributes:
        score: the verifier score of the answer as the verifier gave it (before an App. G penalty replaces it by the
            penalty value in the reward's sums).
        base_reward: the reward-mode reward over the penalised scores, before the incentives (the credit's).
        incentive: the Tables 1-2 incentive added to it (the credit's).
        correct: whether the answer is right (debate environments), else ``None``.
        answer_group: the answer's group key in its turn (equal keys: the same answer; ``None``: no answer), debate
            environments only.
        penalties: the App. G checks and whether each triggered.
        token_advantages, token_returns, old_values: per completion token, filled in by the trainer (GAE).
    """

    score: float = 0.0
    base_reward: float = 0.0
    incentive: float = 0.0
    correct: bool | None = None
    answer_group: int | None = None
    penalties: dict[str, bool] = field(default_factory=dict)
    token_advantages: list[float] | None = None
    token_returns: list[float] | None = None
    old_values: list[float] | None = None


@dataclass
class Debate:
    """One debate as played: per turn, every agent's generation, verifier score and (debate environments) outcome."""

    episode: int
    task: Mapping[str, Any]
    agents: list[str]
    question: str | None = None
    generations: list[dict[str, Generation]] = field(default_factory=list)
    scores: list[dict[str, float]] = field(default_factory=list)
    team_rewards: list[float] = field(default_factory=list)
    outcomes: list[TurnOutcome] = field(default_factory=list)
    infos: list[dict[str, float]] = field(default_factory=list)

    @property
    def turns_played(self) -> int:
        return len(self.generations)


class DebateSampler:
    """Rolls out MAPoRL debates, scores every answer and runs the App. G checks (see the module docstring).

    Args:
        num_turns: T, the turn budget.
        num_debates: independent debates per task.
        penalties: the App. G checks (``None``: no penalties).
        scorer: a learned verifier ``scorer(questions, solutions)``; ``None`` uses the environment's local rewards.
        early_stop: keep a debate environment's ``early_stop`` (end once all agents agree); ``False`` switches it off
            on every environment this sampler makes, so each debate plays ``num_turns`` turns (other ends, e.g. a
            game's own, still count).
    """

    def __init__(self, num_turns: int, num_debates: int = 1, penalties: PenaltySettings | None = None,
                 scorer: Scorer | None = None, early_stop: bool = True):
        if num_turns < 1 or num_debates < 1:
            raise ValueError("num_turns and num_debates must be at least 1")
        self.num_turns, self.num_debates = num_turns, num_debates
        self.penalties = penalties
        self.scorer = scorer
        self.early_stop = early_stop

    # ------------------------------------------------------------------------------------------------ debates
    def run(self, pool: AgentPool, env_factory: Callable[[], Environment], tasks: Sequence[Mapping[str, Any]],
            generation_config: GenerationConfig) -> list[Debate]:
        """Play ``num_debates`` debates per task; one team-level generation per turn."""
        envs, debates = [], []
        prompts: list[dict] = []
        for task in tasks:
            for _ in range(self.num_debates):
                env = env_factory()
                if not self.early_stop and isinstance(env, DebateEnv):
                    env.early_stop = False
                prompts.append(reset_env(env, task))
                envs.append(env)
                debates.append(Debate(len(debates), task, list(env.agents),
                                      question=env.question if isinstance(env, DebateEnv) else None))
        if self.scorer is not None and envs and not isinstance(envs[0], DebateEnv):
            raise ValueError(f"a learned verifier scores debate answers; {type(envs[0]).__name__} is not a DebateEnv")
        live = list(range(len(envs)))
        for turn in range(self.num_turns):
            if not live:
                break
            agents = debates[live[0]].agents
            gens = pool.generate_by_agent({a: [prompts[d][a] for d in live] for a in agents}, 1, generation_config)
            finished = []
            for pos, d in enumerate(live):
                turn_gens = {a: gens[a][pos][0] for a in agents}
                result = step_env(envs[d], {a: g.text for a, g in turn_gens.items()}, debates[d].task, turn)
                if result.local_rewards is None or set(result.local_rewards) != set(agents):
                    raise ValueError(f"{type(envs[d]).__name__}.step must return a local reward (the verifier score) "
                                     f"for every agent {agents}")
                debate = debates[d]
                debate.generations.append(turn_gens)
                debate.scores.append({a: float(result.local_rewards[a]) for a in agents})
                debate.team_rewards.append(float(result.team_reward))
                debate.infos.append(dict(result.info))
                if isinstance(envs[d], DebateEnv):
                    debate.outcomes.append(envs[d].outcomes[-1])
                if result.done:
                    finished.append(d)
                else:
                    prompts[d] = result.next_prompts
            live = [d for d in live if d not in finished]
        if self.scorer is not None:
            self._score_with_verifier(debates)
        return debates

    def _score_with_verifier(self, debates: list[Debate]) -> None:
        cells = [(d, t, a) for d in debates for t in range(d.turns_played) for a in d.agents]
        scores = list(self.scorer([d.question for d, _, _ in cells], [d.generations[t][a].text for d, t, a in cells]))
        if len(scores) != len(cells):
            raise ValueError(f"the verifier returned {len(scores)} scores for {len(cells)} answers")
        for (d, t, a), s in zip(cells, scores):
            d.scores[t][a] = float(s)

    # ------------------------------------------------------------------------------------------------ rewards
    def penalty_flags(self, pool: AgentPool, debate: Debate) -> list[dict[str, dict[str, bool]]]:
        """The App. G checks of every answer, ``[turn played][agent] -> {check: triggered}`` (empty without
        penalties)."""
        if self.penalties is None:
            return [{a: {} for a in debate.agents} for _ in range(debate.turns_played)]
        flags = []
        for turn_gens in debate.generations:
            row = {}
            for agent, gen in turn_gens.items():
                tok = pool.tokenizer_of(agent)
                tokens = [tok.decode([tid]) for tid in gen.completion_ids]
                row[agent] = answer_penalties(gen.text, tokens, gen.truncated, self.penalties)
            flags.append(row)
        return flags

    def rollout(self, pool: AgentPool, env_factory: Callable[[], Environment], tasks: Sequence[Mapping[str, Any]],
                generation_config: GenerationConfig) -> Experience:
        """Debates -> one :class:`DebateSample` per answer (score, App. G checks, answer group and correctness; no
        reward yet) and the per-turn team results as joint actions, each turn's the child of the turn before."""
        debates = self.run(pool, env_factory, tasks, generation_config)
        samples: list[DebateSample] = []
        joints: list[JointAction] = []
        for debate in debates:
            flags = self.penalty_flags(pool, debate)
            for t in range(debate.turns_played):
                ja = JointAction(id=len(joints), node=debate.episode, episode=debate.episode, turn=t,
                                 sample_index=tuple([0] * len(debate.agents)), reward=debate.team_rewards[t],
                                 done=t == debate.turns_played - 1, info=debate.infos[t],
                                 local_rewards=dict(debate.scores[t]))
                if t > 0:
                    joints[-1].children.append(ja.id)
                joints.append(ja)
                for i, agent in enumerate(debate.agents):
                    outcome = debate.outcomes[t] if debate.outcomes else None
                    samples.append(DebateSample(
                        agent=agent, policy=pool.policy_of(agent), episode=debate.episode, turn=t, node=debate.episode,
                        generation=debate.generations[t][agent], joint_ids=[ja.id], group=(debate.episode,),
                        score=debate.scores[t][agent], correct=outcome.correct[i] if outcome else None,
                        answer_group=outcome.groups[i] if outcome else None, penalties=dict(flags[t][agent])))
        agents = debates[0].agents if debates else list(pool.agent_names)
        stats = rollout_stats(agents, samples, joints, len(samples), len(debates))
        for key in ("generated_samples", "num_joint_actions"):
            stats.pop(key, None)
        stats.update(debate_stats(debates, samples, self.num_turns))
        return Experience(samples, joints, stats, agents)


def debate_stats(debates: Sequence[Debate], samples: Sequence[DebateSample], num_turns: int) -> dict[str, float]:
    """Metrics of one batch of debates: per-turn majority accuracy (tie rule; early-stopped debates keep their last
    answers), agreement, scores and the fraction of answers each penalty hit (the incentives are the credit's)."""
    def mean(xs):
        xs = list(xs)
        return sum(xs) / len(xs) if xs else math.nan

    stats: dict[str, float] = {"debate/turns_played": mean(d.turns_played for d in debates),
                               "score": mean(s.score for s in samples)}
    with_outcomes = [d for d in debates if d.outcomes]
    for t in range(num_turns):
        if with_outcomes:
            stats[f"debate/turn{t + 1}/majority_accuracy"] = mean(
                majority_vote_accuracy(o.groups, o.correct) for o in
                (d.outcomes[min(t, d.turns_played - 1)] for d in with_outcomes))
    if with_outcomes:
        stats["debate/agreed"] = mean(float(len(set(d.outcomes[-1].groups)) == 1
                                            and d.outcomes[-1].groups[0] is not None) for d in with_outcomes)
    names = sorted({k for s in samples for k in s.penalties})
    for name in names:
        stats[f"penalty/{name}"] = mean(float(s.penalties.get(name, False)) for s in samples)
    if names:
        stats["penalty/any"] = mean(float(any(s.penalties.values())) for s in samples)
    for agent in sorted({s.agent for s in samples}):
        stats[f"agent/{agent}/score"] = mean(s.score for s in samples if s.agent == agent)
    return stats
