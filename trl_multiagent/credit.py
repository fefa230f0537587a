"""Credit assignment: the pure math of each algorithm.

Every function here is small, side-effect free and works on plain Python numbers or 1-D tensors, so that each
paper equation can be checked against a hand-computed example in ``tests/test_credit.py``. Trainers call these
functions; they never re-implement them.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Hashable, Sequence

import torch

#: Added to the standard deviation before dividing, as TRL's GRPOTrainer does (``std + 1e-4``).
STD_EPS = 1e-4


def group_relative_advantages(
    returns: Sequence[float] | torch.Tensor, scale: str = "group", batch_std: float | None = None
) -> torch.Tensor:
    """Group-relative advantage of MAGRPO, Eq. 1 (``A = (R - mean(R)) / std(R)`` over one group).

    Args:
        returns: the returns ``R^(g)`` of the G members of ONE group (the joint actions sampled at one node).
        scale: ``"group"`` divides by the group's standard deviation (Eq. 1), ``"batch"`` by ``batch_std`` (the
            standard deviation over the whole batch), ``"none"`` only centres (Dr. GRPO). The names follow
            ``GRPOConfig.scale_rewards``.
        batch_std: required when ``scale == "batch"``.

    The standard deviation is the unbiased one (``torch.std``) plus ``STD_EPS``, exactly as in TRL's
    ``GRPOTrainer``, so a one-agent, one-turn run reproduces TRL's advantages. A group of one has advantage 0.
    """
    r = torch.as_tensor(returns, dtype=torch.float64)
    if r.numel() == 0:
        return r
    centred = r - r.mean()
    if r.numel() == 1:
        return torch.zeros_like(r)
    if scale == "group":
        return centred / (r.std() + STD_EPS)
    if scale == "batch":
        if batch_std is None:
            raise ValueError("scale='batch' needs batch_std")
        return centred / (batch_std + STD_EPS)
    if scale == "none":
        return centred
    raise ValueError(f"Unknown scale {scale!r}; expected 'group', 'batch' or 'none'.")


def grouped_advantages(
    returns: Sequence[float], keys: Sequence[Hashable], scale: str = "group"
) -> tuple[list[float], dict[str, float]]:
    """Normalise ``returns`` inside the groups given by ``keys`` (Eq. 1 of MAGRPO, applied group by group).

    Members with equal keys form one group; different keys never mix. Returns the advantages (in input order) and
    statistics: the number of groups and the fraction of groups whose returns all tie (zero variance: they carry no
    learning signal).
    """
    if len(returns) != len(keys):
        raise ValueError(f"{len(returns)} returns but {len(keys)} group keys")
    members: dict[Hashable, list[int]] = defaultdict(list)
    for idx, key in enumerate(keys):
        members[key].append(idx)
    batch_std = float(torch.tensor(list(returns), dtype=torch.float64).std()) if len(returns) > 1 else 0.0
    advantages = [0.0] * len(returns)
    zero_std = 0
    for idxs in members.values():
        group_returns = [returns[i] for i in idxs]
        if max(group_returns) - min(group_returns) < 1e-12:
            zero_std += 1
        adv = group_relative_advantages(group_returns, scale=scale, batch_std=batch_std)
        for i, a in zip(idxs, adv.tolist()):
            advantages[i] = a
    n_groups = len(members)
    return advantages, {"num_groups": float(n_groups), "frac_zero_std_groups": zero_std / max(n_groups, 1)}


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


def mix_rewards(team: float, local: float, alpha: float) -> float:
    """AT-GRPO's agent-wise credit, Eq. 3: ``r_{t,i} = alpha * r_team_t + r_local_{t,i}``."""
    return alpha * float(team) + float(local)


def num_tree_generations(num_agents: int, num_samples: int, horizon: int) -> int:
    """Inference calls of an aligned joint tree without early stop: ``n*K*(K^H - 1)/(K - 1)`` (CoLLM, Prop. 4.3)."""
    if num_samples == 1:
        return num_agents * horizon
    return num_agents * num_samples * (num_samples**horizon - 1) // (num_samples - 1)
