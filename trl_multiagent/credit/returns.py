"""Returns: the one place discounted sums of rewards are computed (MAGRPO Alg. 1 line 11 and its tree form; CoLLM's
Monte-Carlo returns; MAPoRL's cumulative and influence-aware rewards, App. F / Def. 1).
"""

from __future__ import annotations

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
