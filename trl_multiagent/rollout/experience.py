"""What every sampler returns: :class:`Experience`, one :class:`Sample` per (agent, turn, sampled response), and the
metrics all samplers log.

A sampler fills in what it observed: token ids, the rewards the environment gave, group keys and the links of the
tree (a sample's node and joint actions, a joint action's children). Returns and advantages are the trainer's:
:meth:`~trl_multiagent.trainers.base.MultiAgentTrainer.assign_credit` computes them with :mod:`trl_multiagent.credit`
right after the rollout, and adds :func:`credit_stats` to the rollout's :func:`rollout_stats`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from trl_multiagent.team.pool import Generation


@dataclass
class Sample:
    """One agent's sampled response at one node: a training row for that agent's policy.

    ``group`` is the key of the samples it is compared with; ``reward``, ``ret`` and ``advantage`` are the credit's
    (the trainer's ``assign_credit``): before it, ``reward`` holds only what the sampler observed, where that is the
    sample's own reward. ``version`` is the trainer's: the optimizer steps its policy's adapter had taken when it
    generated the sample (the trainer's ``global_step`` then; with asynchronous rollouts, ``max_staleness``, up to
    that many steps behind the step that trains on it), ``None`` where no trainer recorded it.
    """

    agent: str
    policy: str
    episode: int
    turn: int
    node: int
    generation: Generation
    joint_ids: list[int]
    group: tuple = ()
    reward: float = 0.0
    ret: float = 0.0
    advantage: float = 0.0
    old_logps: list[float] | None = None
    ref_logps: list[float] | None = None
    version: int | None = None


@dataclass
class JointAction:
    """One joint action of the tree: which sample of each agent (in :attr:`Experience.agents` order), its joint
    reward, and its continuations (the joint actions sampled at the node it leads to); ``ret`` and ``advantage`` are
    the credit's."""

    id: int
    node: int
    episode: int
    turn: int
    sample_index: tuple[int, ...]
    reward: float
    done: bool
    info: dict[str, float] = field(default_factory=dict)
    local_rewards: dict[str, float] | None = None
    children: list[int] = field(default_factory=list)
    ret: float = 0.0
    advantage: float = 0.0


@dataclass
class Experience:
    """The result of one rollout: training samples, the joint actions behind them, and summary statistics.

    ``agents`` are the team's agents in the order of :attr:`JointAction.sample_index` and of the per-agent metrics.
    """

    samples: list[Sample]
    joint_actions: list[JointAction]
    stats: dict[str, float]
    agents: list[str] = field(default_factory=list)

    def samples_of(self, policy: str) -> list[Sample]:
        return [s for s in self.samples if s.policy == policy]


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else math.nan


def _std(xs) -> float:
    """The sample standard deviation (Bessel's correction, as TRL's ``nanstd``); NaN for fewer than two values."""
    xs = list(xs)
    if len(xs) < 2:
        return math.nan
    m = _mean(xs)
    return (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5


def completion_stats(samples, prefix: str = "", terminated: bool = True) -> dict[str, float]:
    """TRL's completion metrics of ``samples`` (``GRPOTrainer._generate_and_score_completions``), under ``prefix``:
    ``completions/mean_length``, ``min_length``, ``max_length`` (tokens the agent generated itself),
    ``clipped_ratio`` (the share that hit ``max_completion_length`` without an EOS) and, with ``terminated``, the
    lengths of those that ended with one (``mean_terminated_length``, ...; 0 when none did, as in TRL)."""
    lengths = [float(s.generation.own_token_count) for s in samples]
    if not lengths:
        return {}
    stats = {f"{prefix}completions/mean_length": _mean(lengths), f"{prefix}completions/min_length": min(lengths),
             f"{prefix}completions/max_length": max(lengths),
             f"{prefix}completions/clipped_ratio": _mean(float(s.generation.truncated) for s in samples)}
    if terminated:
        ended = [n for n, s in zip(lengths, samples) if not s.generation.truncated] or [0.0]
        stats.update({f"{prefix}completions/mean_terminated_length": _mean(ended),
                      f"{prefix}completions/min_terminated_length": min(ended),
                      f"{prefix}completions/max_terminated_length": max(ended)})
    return stats


def reward_function_stats(agents, joints, reward_names) -> tuple[dict[str, float], set[str]]:
    """``rewards/<fn>/mean`` and ``/std`` (TRL's names) of the environment's reward functions, over every value they
    gave (each agent's and each joint action's), and ``agent/<a>/rewards/<fn>/mean|std`` over agent ``a``'s;
    returns them with the ``info`` keys they used. A function's values are the ``info`` entries named
    ``<fn>`` (a reward of the joint action) or ``<agent>/<fn>`` (a reward of one agent's completion), for ``fn`` in
    the environment's :attr:`~trl_multiagent.environments.base.Environment.reward_names`. The standard deviation is
    the sample one, as TRL's (NaN for a single value)."""
    names, agents = set(reward_names), list(agents)
    every: dict[str, list[float]] = defaultdict(list)
    per_agent: dict[tuple[str, str], list[float]] = defaultdict(list)
    used: set[str] = set()
    for j in joints:
        for key, value in j.info.items():
            agent, _, fn = key.partition("/")
            if key in names:
                every[key].append(float(value))
            elif agent in agents and fn in names:
                every[fn].append(float(value))
                per_agent[(agent, fn)].append(float(value))
            else:
                continue
            used.add(key)
    stats = {}
    for fn, values in every.items():
        stats[f"rewards/{fn}/mean"], stats[f"rewards/{fn}/std"] = _mean(values), _std(values)
    for (agent, fn), values in per_agent.items():
        stats[f"agent/{agent}/rewards/{fn}/mean"] = _mean(values)
        stats[f"agent/{agent}/rewards/{fn}/std"] = _std(values)
    return stats, used


def rollout_stats(agents, samples, joints, generated_samples, num_episodes, reward_names=()) -> dict[str, float]:
    """The metrics every sampler logs of what it played: joint rewards, the generation count, per-turn
    (``turn<t>/team_reward``, turns counted from 1 as the evaluation's ``turn<t>/...`` in report.md), the
    environment's reward functions (:func:`reward_function_stats`, ``reward_names``: the environment's), its other
    ``info`` values (``env/<key>``), the completions' lengths (:func:`completion_stats`, TRL's names) over all
    samples and per agent (``agent/<name>/completions/...``). The credit's metrics are :func:`credit_stats`, added by
    the trainer's ``assign_credit``."""
    rewards = [j.reward for j in joints]
    stats = {
        "reward": _mean(rewards),
        "reward_std": (_mean([(r - _mean(rewards)) ** 2 for r in rewards]) ** 0.5) if rewards else math.nan,
        "generated_samples": float(generated_samples),
        "num_joint_actions": float(len(joints)),
        "episodes": float(num_episodes),
        "turns": _mean(1 + max((j.turn for j in joints if j.episode == e), default=0) for e in range(num_episodes)),
    }
    by_turn: dict[int, list[float]] = defaultdict(list)
    for j in joints:
        by_turn[j.turn].append(j.reward)
    for t, rs in sorted(by_turn.items()):
        stats[f"turn{t + 1}/team_reward"] = _mean(rs)
    function_stats, reward_keys = reward_function_stats(agents, joints, reward_names)
    stats.update(function_stats)
    infos: dict[str, list[float]] = defaultdict(list)
    for j in joints:
        for k, v in j.info.items():
            if k not in reward_keys:
                infos[k].append(float(v))
    for k, vs in infos.items():
        stats[f"env/{k}"] = _mean(vs)
    stats.update(completion_stats(samples))
    for a in agents:
        stats.update(completion_stats([s for s in samples if s.agent == a], f"agent/{a}/", terminated=False))
    return stats


def credit_stats(agents, samples, joints, group_stats: dict[str, float] | None = None) -> dict[str, float]:
    """The metrics of the credit, logged after ``assign_credit``: the mean return of the first turn's joint actions,
    every agent's credited reward and return and, with ``group_stats`` (of
    :func:`~trl_multiagent.credit.group.grouped_advantages`), the number of groups and the fraction of groups whose
    rewards all tie (``frac_reward_zero_std``)."""
    stats = {"return": _mean(j.ret for j in joints if j.turn == 0)}
    if group_stats is not None:
        stats["frac_reward_zero_std"] = group_stats["frac_zero_std_groups"]
        stats["num_groups"] = group_stats["num_groups"]
    for a in agents:
        mine = [s for s in samples if s.agent == a]
        stats[f"agent/{a}/reward"] = _mean(s.reward for s in mine)
        stats[f"agent/{a}/return"] = _mean(s.ret for s in mine)
    return stats
