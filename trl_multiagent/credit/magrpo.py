"""MAGRPO's credit: joint actions, cross-joint-action credit and the per-turn loss weights (MAGRPO Algorithm 1; the
returns are in :mod:`~trl_multiagent.credit.returns`, the group normalisation of Eq. 1 in
:mod:`~trl_multiagent.credit.group`).

Paper: "LLM Collaboration With Multi-Agent Reinforcement Learning" (Liu et al.), Algorithm 1 and Eq. 1-2; the
generation count is Prop. 4.3 of the CoLLM paper.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence

#: The advantage of a joint action: ``"eq1"`` (the paper's Eq. 1, :func:`~trl_multiagent.credit.group.grouped_advantages`)
#: or one of the modes of the authors' released trainer (CoMLRL's ``MAGRPOConfig.advantage_mode``,
#: :func:`released_code_advantages`).
ADVANTAGE_MODES = ("eq1", "mean", "raw", "max", "rloo")


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


def released_code_advantages(returns: Sequence[float], mode: str) -> list[float]:
    """The advantages of one group (the K joint actions at one node) as the authors' released trainer computes them
    (CoMLRL, ``comlrl/trainers/reinforce/magrpo.py``, ``MAGRPOTrainer._compute_advantages``, selected by
    ``MAGRPOConfig.advantage_mode``):

    * ``"mean"`` (CoMLRL's default): ``A = R - mean(R)``, Eq. 1 without the division by the group's standard
      deviation. Returns [0, 0, 0, 1]: -0.25, -0.25, -0.25, 0.75 (Eq. 1: (1 - 0.25) / (0.5 + 1e-4) = 1.4997);
    * ``"raw"``: ``A = R``, no baseline;
    * ``"max"``: ``A = R - max(R)`` (every advantage <= 0);
    * ``"rloo"``: ``A = (G R - sum(R)) / (G - 1)``, the return minus the mean of the OTHER G - 1 returns
      (leave-one-out); a group of one: ``R - mean(R) = 0``.

    The paper's Eq. 1 stays the trainer's default (``advantage_mode="eq1"``)."""
    r = [float(x) for x in returns]
    if not r:
        return []
    if mode == "mean":
        mean = sum(r) / len(r)
        return [x - mean for x in r]
    if mode == "raw":
        return list(r)
    if mode == "max":
        top = max(r)
        return [x - top for x in r]
    if mode == "rloo":
        g, total = len(r), sum(r)
        if g == 1:
            return [0.0]
        return [(x * g - total) / (g - 1) for x in r]
    raise ValueError(f"Unknown released-code advantage mode {mode!r}; expected one of {ADVANTAGE_MODES[1:]}")


def grouped_released_code_advantages(returns: Sequence[float], keys: Sequence[Hashable], mode: str
                                     ) -> tuple[list[float], dict[str, float]]:
    """:func:`released_code_advantages` inside the groups given by ``keys`` (equal keys: one node's joint actions),
    with the statistics of :func:`~trl_multiagent.credit.group.grouped_advantages` (number of groups, fraction
    whose returns all tie)."""
    if len(returns) != len(keys):
        raise ValueError(f"{len(returns)} returns but {len(keys)} group keys")
    members: dict[Hashable, list[int]] = {}
    for idx, key in enumerate(keys):
        members.setdefault(key, []).append(idx)
    advantages = [0.0] * len(returns)
    ties = 0
    for idxs in members.values():
        group = [float(returns[i]) for i in idxs]
        ties += max(group) - min(group) < 1e-12
        for i, a in zip(idxs, released_code_advantages(group, mode)):
            advantages[i] = a
    return advantages, {"num_groups": float(len(members)), "frac_zero_std_groups": ties / max(len(members), 1)}
