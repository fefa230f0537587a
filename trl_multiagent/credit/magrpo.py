"""MAGRPO's credit: joint actions, tree returns with discount, cross-joint-action credit (MAGRPO Algorithm 1, Eq. 1).

Paper: "LLM Collaboration With Multi-Agent Reinforcement Learning" (Liu et al.), Algorithm 1 and Eq. 1; the
generation count is Prop. 4.3 of the CoLLM paper.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence


def joint_action_indices(num_agents: int, num_samples: int, joint_mode: str) -> list[tuple[int, ...]]:
    """Which sample of every agent forms each joint action at one node (MAGRPO, Sec. "Joint actions").

    ``"aligned"``: the k-th samples of all agents form joint action k (K joint actions).
    ``"cross"``: the Cartesian product of the agents' samples (K**n joint actions).
    """
    if joint_mode == "aligned":
        return [tuple([k] * num_agents) for k in range(num_samples)]
    if joint_mode == "cross":
        return list(itertools.product(range(num_samples), repeat=num_agents))
    raise ValueError(f"Unknown joint_mode {joint_mode!r}; expected 'aligned' or 'cross'.")


def tree_returns(rewards: Sequence[float], children: Sequence[Sequence[int]], gamma: float) -> list[float]:
    """Returns of the joint actions of a rollout tree (MAGRPO, Algorithm 1 line 11, extended to a tree).

    ``R_t = sum_{tau >= t} gamma^(tau - t) r_tau`` along one branch. In a tree a joint action has several
    continuations (the joint actions sampled at its child node), so its return is its reward plus ``gamma`` times the
    MEAN return of its children: the Monte-Carlo estimate of the expected continuation. A leaf (last turn or early
    stop) has return equal to its reward.

    Args:
        rewards: the joint reward ``r`` of every joint action, indexed by joint-action id.
        children: ``children[j]`` lists the ids of the joint actions sampled at the node that joint action ``j``
            leads to (empty for a leaf). Children always have larger ids than their parent.
        gamma: discount factor (1.0 in the MAGRPO paper).
    """
    if len(rewards) != len(children):
        raise ValueError("rewards and children must have one entry per joint action")
    returns = [0.0] * len(rewards)
    for j in reversed(range(len(rewards))):
        kids = children[j]
        future = sum(returns[c] for c in kids) / len(kids) if kids else 0.0
        returns[j] = float(rewards[j]) + gamma * future
    return returns


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """``R_t = sum_{tau >= t} gamma^(tau - t) r_tau`` for one linear trajectory (MAGRPO Algorithm 1, line 11)."""
    out, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


def cross_sample_credit(joint_advantages: Sequence[float], joint_indices: Sequence[tuple[int, ...]], agent: int,
                        num_samples: int) -> list[float]:
    """Credit of each of one agent's K samples under ``cross`` joint actions.

    Sample k of agent i takes part in every joint action whose i-th index is k; it is credited with the mean of
    their (Eq. 1) advantages. Because Eq. 1 is affine in the returns, this equals normalising the mean return of the
    joint actions the sample appears in with the statistics of the whole K**n group.
    """
    sums, counts = [0.0] * num_samples, [0] * num_samples
    for adv, idx in zip(joint_advantages, joint_indices):
        sums[idx[agent]] += float(adv)
        counts[idx[agent]] += 1
    return [s / c if c else math.nan for s, c in zip(sums, counts)]


def num_tree_generations(num_agents: int, num_samples: int, horizon: int) -> int:
    """Inference calls of an aligned joint tree without early stop: ``n*K*(K^H - 1)/(K - 1)`` (CoLLM, Prop. 4.3)."""
    if num_samples == 1:
        return num_agents * horizon
    return num_agents * num_samples * (num_samples**horizon - 1) // (num_samples - 1)
