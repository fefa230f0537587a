"""Group-relative normalisation shared by every GRPO-style algorithm (MAGRPO Eq. 1, AT-GRPO, MHGPO Eq. 5).

A group is a set of samples compared with one another; which samples form a group is what distinguishes the
algorithms (joint actions at one tree node, one agent's candidates at one turn, heterogeneous pipeline groups).
"""

from __future__ import annotations

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
