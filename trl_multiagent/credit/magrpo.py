"""MAGRPO's credit: joint actions, cross-joint-action credit and the per-turn loss weights (MAGRPO Algorithm 1; the
returns are in :mod:`~trl_multiagent.credit.returns`, the group normalisation of Eq. 1 in
:mod:`~trl_multiagent.credit.group`).

Paper: "LLM Collaboration With Multi-Agent Reinforcement Learning" (Liu et al.), Algorithm 1 and Eq. 1-2; the
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


def cross_sample_credit(joint_values: Sequence[float], joint_indices: Sequence[tuple[int, ...]], agent: int,
                        num_samples: int) -> list[float]:
    """Credit of each of one agent's K samples at one node: the mean of a per-joint-action value (reward, return or
    Eq. 1 advantage) over the joint actions the sample is part of.

    Sample k of agent i takes part in every joint action whose i-th index is k (one under ``aligned``, K**(n-1) under
    ``cross``). For advantages this equals normalising the mean return of those joint actions with the statistics
    of the whole K**n group, because Eq. 1 is affine in the returns.
    """
    sums, counts = [0.0] * num_samples, [0] * num_samples
    for value, idx in zip(joint_values, joint_indices):
        sums[idx[agent]] += float(value)
        counts[idx[agent]] += 1
    return [s / c if c else math.nan for s, c in zip(sums, counts)]


def num_tree_generations(num_agents: int, num_samples: int, horizon: int) -> int:
    """Inference calls of an aligned joint tree without early stop: ``n*K*(K^H - 1)/(K - 1)`` (CoLLM, Prop. 4.3)."""
    if num_samples == 1:
        return num_agents * horizon
    return num_agents * num_samples * (num_samples**horizon - 1) // (num_samples - 1)


def turn_loss_weights(turns: Sequence[int]) -> list[float]:
    """Per-sample weights of one policy's MAGRPO loss over H turns (Algorithm 1, lines 10-15, with Eq. 2).

    Algorithm 1 computes ``J(theta_i)`` of Eq. 2 for each turn t on its own, ``1/|B| 1/|G|`` times the sum over the
    turn-t responses (every node of turn t in the batch, every response of its group), and applies each turn's
    gradient with the same rate alpha (``theta_i <- theta_i + alpha * grad J_t(theta_i)`` for t = H-1 down to 0). In
    one optimizer step those H updates are the SUM of the per-turn objectives, ``J = sum_t J_t`` (as H plain
    gradient steps add up to first order): each turn that has samples weighs 1, whatever its number of samples.
    A sample of turn t therefore weighs ``1 / N_t``, with ``N_t`` the policy's samples of turn t in the batch; the
    weights sum to the number of turns present. (One mean over all turns' samples would give turn t a share
    ``N_t / sum_t' N_t'``, growing as K^t in a tree: with K = 4, H = 2, 4 / 20 for the first turn instead of 1 / 2.)

    With one turn every weight is ``1 / N``: the plain mean of Eq. 2.
    """
    counts: dict[int, int] = {}
    for t in turns:
        counts[t] = counts.get(t, 0) + 1
    return [1.0 / counts[t] for t in turns]
