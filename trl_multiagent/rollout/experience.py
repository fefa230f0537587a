"""What every sampler returns: :class:`Experience`, one :class:`Sample` per (agent, turn, sampled response), and the
metrics all samplers log."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from ..agents import Generation


@dataclass
class Sample:
    """One agent's sampled response at one node: a training row for that agent's policy."""

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


@dataclass
class JointAction:
    """One joint action of the tree: which sample of each agent, its joint reward, and its continuations."""

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
    """The result of one rollout: training samples, the joint actions behind them, and summary statistics."""

    samples: list[Sample]
    joint_actions: list[JointAction]
    stats: dict[str, float]

    def samples_of(self, policy: str) -> list[Sample]:
        return [s for s in self.samples if s.policy == policy]


def rollout_stats(agents, samples, joints, group_stats, num_generations, num_episodes) -> dict[str, float]:
    """The metrics every sampler logs: rewards, returns, group statistics, per-turn, per-environment-component
    and per-agent (``agent/<name>/...``) means."""
    def mean(xs):
        xs = list(xs)
        return sum(xs) / len(xs) if xs else math.nan

    rewards = [j.reward for j in joints]
    roots = [j for j in joints if j.turn == 0]
    stats = {
        "reward": mean(rewards),
        "reward_std": (mean([(r - mean(rewards)) ** 2 for r in rewards]) ** 0.5) if rewards else math.nan,
        "return": mean(j.ret for j in roots),
        "frac_reward_zero_std": group_stats["frac_zero_std_groups"],
        "num_groups": group_stats["num_groups"],
        "num_generations": float(num_generations),
        "num_joint_actions": float(len(joints)),
        "episodes": float(num_episodes),
        "turns": mean(1 + max((j.turn for j in joints if j.episode == e), default=0) for e in range(num_episodes)),
    }
    by_turn: dict[int, list[float]] = defaultdict(list)
    infos: dict[str, list[float]] = defaultdict(list)
    for j in joints:
        by_turn[j.turn].append(j.reward)
        for k, v in j.info.items():
            infos[k].append(float(v))
    for t, rs in by_turn.items():
        stats[f"turn/{t}/reward"] = mean(rs)
    for k, vs in infos.items():
        stats[f"env/{k}"] = mean(vs)
    for a in agents:
        mine = [s for s in samples if s.agent == a]
        stats[f"agent/{a}/reward"] = mean(s.reward for s in mine)
        stats[f"agent/{a}/return"] = mean(s.ret for s in mine)
        stats[f"agent/{a}/completion_length"] = mean(len(s.generation.completion_ids) for s in mine)
        stats[f"agent/{a}/clipped_ratio"] = mean(float(s.generation.truncated) for s in mine)
    return stats
