"""The actor-critic rollout: ONE path per episode, stored as joint transitions (CoLLM Algorithm 1, lines 3-15).

Each turn every agent samples one response to its own prompt (one team-level generation covers every agent of every
running episode), the joint action is executed on the episode's environment (no clones: nothing branches), and the
joint transition ``(h_t, m_t, a_t, r_t, o_{t+1}, m_{t+1})`` goes into the buffer. The histories are not copied
into each transition; :meth:`EpisodeBuffer.history` rebuilds ``h_{i,t}`` from the links between transitions.

This is :class:`~trl_multiagent.rollout.JointTreeSampler` with K = 1, plus what a critic needs that the tree does
not keep: every agent's observation text at every turn and the order of the transitions within an episode.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import GenerationConfig

from trl_multiagent.environments.base import Environment
from trl_multiagent.environments.stepping import reset_env, step_all
from trl_multiagent.generation.requests import Prompt
from trl_multiagent.rollout.experience import Experience, JointAction, Sample, rollout_stats
from trl_multiagent.team.pool import AgentPool


@dataclass
class Transition:
    """One joint transition of an episode: what CoLLM Algorithm 1 stores in its buffer (line 14).

    Attributes:
        index: position in :attr:`EpisodeBuffer.transitions`.
        episode, turn: where it happened.
        observations: ``o_{i,t}``, every agent's prompt at this turn.
        actions: ``a_{i,t}``, every agent's response text.
        samples: every agent's training row (token ids, behaviour log-probs, advantage).
        reward: the joint reward ``r_t``.
        done: the episode ended after this transition (last turn or early stop): no bootstrap.
        previous: index of the transition at ``t - 1`` of the same episode (``None`` at ``t = 0``).
        next: index of the transition at ``t + 1`` (``None`` when ``done``).
        ret: the Monte-Carlo return ``sum_{tau >= t} gamma^(tau - t) r_tau`` (logged; the critic's regression
            target in expectation), filled in by the trainer's credit
            (:func:`~trl_multiagent.trainers.collm.episode_returns`).
        info: the environment's named scalars for this step.
        old_values: each critic's value of this transition's history at rollout time (for value clipping).
    """

    index: int
    episode: int
    turn: int
    observations: dict[str, Prompt]
    actions: dict[str, str]
    samples: dict[str, Sample]
    reward: float
    done: bool
    previous: int | None = None
    next: int | None = None
    ret: float = 0.0
    info: dict[str, float] = field(default_factory=dict)
    old_values: dict[str, float] = field(default_factory=dict)


@dataclass
class EpisodeBuffer(Experience):
    """:class:`Experience` of single-path episodes, with the joint transitions (the actor-critic buffer)."""

    transitions: list[Transition] = field(default_factory=list)
    num_turns: int = 1

    def history(self, index: int, agent: str, max_turns: int | None = None) -> list[tuple[Prompt, str | None]]:
        """``h_{i,t}`` of transition ``index``: ``[(o_{i,0}, a_{i,0}), ..., (o_{i,t}, None)]``.

        ``max_turns`` keeps only that many earlier (observation, action) pairs before the current observation
        (``None``: all of them; 0: the current observation alone).
        """
        chain = []
        k: int | None = index
        while k is not None:
            chain.append(self.transitions[k])
            k = self.transitions[k].previous
        chain.reverse()
        past = chain[:-1]
        if max_turns is not None:
            past = past[max(0, len(past) - max_turns):] if max_turns > 0 else []
        return [(tr.observations[agent], tr.actions[agent]) for tr in past] + [(chain[-1].observations[agent], None)]

    def last_reward(self, index: int) -> float | None:
        """``r_{t-1}``, the reward of the previous turn of the same episode (``None`` at the first turn)."""
        prev = self.transitions[index].previous
        return None if prev is None else self.transitions[prev].reward

    def final_infos(self) -> list[dict[str, float]]:
        """The ``info`` of every episode's last transition, in episode order (final-state metrics)."""
        last: dict[int, Transition] = {}
        for tr in self.transitions:
            if tr.done:
                last[tr.episode] = tr
        return [dict(last[e].info) for e in sorted(last)]


class SinglePathSampler:
    """One rollout per episode (no tree): CoLLM Algorithm 1, lines 3-15.

    Args:
        num_turns: H, the horizon; an episode ends earlier when the environment says ``done``.
    """

    def __init__(self, num_turns: int):
        if num_turns < 1:
            raise ValueError(f"num_turns must be at least 1, got {num_turns}")
        self.num_turns = num_turns

    def rollout(self, pool: AgentPool, env_factory: Callable[[], Environment], tasks: Sequence[Mapping[str, Any]],
                generation_config: GenerationConfig) -> EpisodeBuffer:
        envs = [env_factory() for _ in tasks]
        agents = list(pool.agent_names)
        prompts: list[dict[str, Prompt]] = [dict(reset_env(env, task)) for env, task in zip(envs, tasks)]
        for env, p in zip(envs, prompts):
            if set(p) != set(agents):
                raise ValueError(f"{type(env).__name__}.reset returned prompts for {sorted(p)}, expected {sorted(agents)}")
        previous: dict[int, int] = {}
        active = list(range(len(envs)))
        transitions: list[Transition] = []
        joints: list[JointAction] = []
        samples: list[Sample] = []
        generated_samples = 0
        for turn in range(self.num_turns):
            if not active:
                break
            gens = pool.generate_by_agent({a: [prompts[e][a] for e in active] for a in agents}, 1, generation_config)
            generated_samples += len(agents) * len(active)
            results = step_all([envs[e] for e in active],
                               [{a: gens[a][pos][0].text for a in agents} for pos in range(len(active))],
                               [tasks[e] for e in active], [turn] * len(active))
            still = []
            for pos, e in enumerate(active):
                result = results[pos]
                done = bool(result.done) or turn + 1 >= self.num_turns
                row = {a: Sample(agent=a, policy=pool.policy_of(a), episode=e, turn=turn, node=e,
                                 generation=gens[a][pos][0], joint_ids=[len(joints)], group=(e, turn),
                                 reward=float(result.team_reward))
                       for a in agents}
                joints.append(JointAction(id=len(joints), node=e, episode=e, turn=turn, sample_index=(0,) * len(agents),
                                          reward=float(result.team_reward), done=done, info=dict(result.info),
                                          local_rewards=result.local_rewards))
                tr = Transition(index=len(transitions), episode=e, turn=turn, observations=dict(prompts[e]),
                                actions={a: row[a].generation.text for a in agents}, samples=row,
                                reward=float(result.team_reward), done=done, previous=previous.get(e),
                                info=dict(result.info))
                if tr.previous is not None:
                    transitions[tr.previous].next = tr.index
                transitions.append(tr)
                samples.extend(row.values())
                previous[e] = tr.index
                if not done:
                    if result.next_prompts is None or set(result.next_prompts) != set(agents):
                        raise ValueError(f"{type(envs[e]).__name__}.step returned next prompts for "
                                         f"{sorted(result.next_prompts or {})}, expected one per agent {sorted(agents)}")
                    prompts[e] = dict(result.next_prompts)
                    still.append(e)
            active = still
        stats = rollout_stats(agents, samples, joints, generated_samples, len(tasks),
                              reward_names=getattr(envs[0], "reward_names", ()) if envs else ())
        buffer = EpisodeBuffer(samples, joints, stats, agents, transitions=transitions, num_turns=self.num_turns)
        finals = buffer.final_infos()
        for key in dict.fromkeys(k for info in finals for k in info):
            values = [float(info[key]) for info in finals if key in info]
            stats[f"final/{key}"] = sum(values) / len(values)
        return buffer
