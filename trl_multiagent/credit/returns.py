"""Returns: the one place discounted sums of rewards are computed (MAGRPO Alg. 1 line 11 and its tree form; CoLLM's
Monte-Carlo returns; MAPoRL's cumulative and influence-aware rewards, App. F / Def. 1), and the general RL estimates
beside them: GAE and the whitening of advantages (MAPoRL Sec. 3.2's PPO).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


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
    """``R_t = sum_{tau >= t} gamma^(tau - t) r_tau`` for one linear trajectory (MAGRPO Algorithm 1, line 11): the
    tree of :func:`tree_returns` where every turn has one continuation."""
    chain = [[t + 1] for t in range(len(rewards) - 1)] + ([[]] if rewards else [])
    return tree_returns(rewards, chain, gamma)


def gae(rewards: Sequence[float], values: Sequence[float], gamma: float, lam: float,
        last_value: float = 0.0) -> tuple[list[float], list[float]]:
    """Generalized Advantage Estimation (Schulman et al. 2016; MAPoRL Sec. 3.2) over one response's tokens.

    ``delta_k = r_k + gamma * V_{k+1} - V_k`` with ``V_K = last_value`` after the last token (0: the response is a
    whole episode, its reward already holds the future turns), ``A_k = delta_k + gamma * lam * A_{k+1}``, and the
    value targets ``R_k = A_k + V_k``. Returns ``(advantages, returns)``.
    """
    if len(rewards) != len(values):
        raise ValueError(f"{len(rewards)} rewards but {len(values)} values")
    advantages = [0.0] * len(rewards)
    running, next_value = 0.0, float(last_value)
    for k in reversed(range(len(rewards))):
        delta = float(rewards[k]) + gamma * next_value - float(values[k])
        running = delta + gamma * lam * running
        advantages[k] = running
        next_value = float(values[k])
    return advantages, [a + float(v) for a, v in zip(advantages, values)]


def whiten(rows: Sequence[Sequence[float]], eps: float = 1e-8) -> list[list[float]]:
    """Normalise all tokens of ``rows`` together to mean 0 and standard deviation 1 (the usual PPO advantage
    whitening, MAPoRL's ``whiten_advantages``); a single token or a constant set is only centred."""
    flat = [float(x) for row in rows for x in row]
    if not flat:
        return [list(row) for row in rows]
    mean = sum(flat) / len(flat)
    var = sum((x - mean) ** 2 for x in flat) / max(len(flat) - 1, 1)
    scale = 1.0 / math.sqrt(var + eps) if var > 0 else 1.0
    return [[(float(x) - mean) * scale for x in row] for row in rows]


def whiten_groups(rows: Sequence[Sequence[float]], keys: Sequence, eps: float = 1e-8) -> list[list[float]]:
    """:func:`whiten` each group of ``rows`` apart, the rows with equal ``keys`` forming one group (order kept).

    MAPoRL's released trainer whitens the GAE advantages of every (turn, agent) batch on its own
    (``advantages = masked_whiten(advantages, ~padding_mask)`` inside its loop over turns and agents, with the
    unbiased variance plus 1e-8 under the square root, as :func:`whiten`): keyed by ``(turn, agent)``, a turn whose
    answers all earned more than another turn's keeps no advantage over it. Keyed by policy, all turns are whitened
    together (this library's reading before issue 61)."""
    if len(rows) != len(keys):
        raise ValueError(f"{len(rows)} rows but {len(keys)} keys")
    members: dict = {}
    for idx, key in enumerate(keys):
        members.setdefault(key, []).append(idx)
    out: list[list[float]] = [[] for _ in rows]
    for idxs in members.values():
        for i, row in zip(idxs, whiten([rows[i] for i in idxs], eps)):
            out[i] = row
    return out
