"""Statistics of an evaluation: means over tasks, percentile bootstrap intervals, and the paired bootstrap of a gain.

Every interval resamples TASKS with replacement: a task's value is the mean over its samples, so the samples of one
task (correlated: same problem, same prompt) never count as independent evidence. A gain between two results on the
same tasks (after vs before training, the team vs a baseline) is PAIRED: each resample draws one set of task indices
and takes the mean of the per-task differences at those indices, so the large spread between easy and hard tasks,
common to both sides, cancels out of the interval.

The interval is the percentile interval of the resampled means: with ``R`` sorted resampled means ``m_(0) <= ... <=
m_(R-1)`` and level ``1 - alpha``, it is ``[m_(floor(R alpha / 2)), m_(ceil(R (1 - alpha / 2)) - 1)]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Resamples of the bootstrap intervals unless a caller asks for another number.
DEFAULT_RESAMPLES = 10_000


def mean(values: Sequence[float]) -> float:
    """The mean of the values that are not NaN (NaN when none is)."""
    kept = [float(v) for v in values if not _isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def _isnan(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def resample_indices(num_tasks: int, num_resamples: int, seed: int = 0) -> np.ndarray:
    """``num_resamples`` rows of ``num_tasks`` task indices drawn uniformly with replacement (a seeded generator)."""
    if num_tasks < 1 or num_resamples < 1:
        raise ValueError(f"need at least one task and one resample, got {num_tasks} and {num_resamples}")
    return np.random.default_rng(seed).integers(0, num_tasks, size=(num_resamples, num_tasks))


def percentile_interval(resampled_means: Sequence[float], alpha: float = 0.05) -> tuple[float, float]:
    """The percentile interval of level ``1 - alpha`` of resampled means (see the module docstring)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    ordered = np.sort(np.asarray(resampled_means, dtype=float))
    r = len(ordered)
    if r == 0:
        return (math.nan, math.nan)
    lo = ordered[min(r - 1, int(math.floor(r * alpha / 2)))]
    hi = ordered[max(0, int(math.ceil(r * (1 - alpha / 2))) - 1)]
    return (float(lo), float(hi))


def paired_bootstrap(after: Sequence[float], before: Sequence[float] | None = None,
                     num_resamples: int = DEFAULT_RESAMPLES, alpha: float = 0.05, seed: int = 0,
                     indices: Sequence[Sequence[int]] | np.ndarray | None = None) -> dict[str, Any]:
    """Mean per-task difference ``after - before`` and its paired percentile bootstrap interval.

    Args:
        after, before: one value per task, the same tasks in the same order on both sides (each value the mean over
            that task's samples). ``before=None`` bootstraps the mean of ``after`` itself (an unpaired interval).
            A task whose value is NaN on either side is left out of both.
        num_resamples, seed: the resamples drawn when ``indices`` is not given.
        alpha: 0.05 for a 95% interval.
        indices: explicit resamples (rows of task indices into the kept tasks), e.g. for a hand-computed check.

    Returns:
        ``{"mean": m, "ci95": [lo, hi], "num_tasks": n}`` (NaN mean and interval when no task is left).
    """
    a = [float(x) for x in after]
    if before is not None:
        b = [float(x) for x in before]
        if len(a) != len(b):
            raise ValueError(f"a paired bootstrap needs the same tasks on both sides, got {len(a)} and {len(b)} values")
        diffs = [x - y for x, y in zip(a, b) if not (math.isnan(x) or math.isnan(y))]
    else:
        diffs = [x for x in a if not math.isnan(x)]
    if not diffs:
        return {"mean": math.nan, "ci95": [math.nan, math.nan], "num_tasks": 0}
    values = np.asarray(diffs, dtype=float)
    rows = np.asarray(indices, dtype=int) if indices is not None else \
        resample_indices(len(values), num_resamples, seed)
    if rows.ndim != 2 or rows.size == 0 or rows.min() < 0 or rows.max() >= len(values):
        raise ValueError(f"indices must be rows of task indices in [0, {len(values)})")
    lo, hi = percentile_interval(values[rows].mean(axis=1), alpha)
    return {"mean": float(values.mean()), "ci95": [lo, hi], "num_tasks": int(len(values))}


def bootstrap_interval(per_task_values: Sequence[float], num_resamples: int = 1000, alpha: float = 0.05,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean over tasks (tasks resampled with replacement)."""
    if not list(per_task_values):
        return (math.nan, math.nan)
    lo, hi = paired_bootstrap(per_task_values, None, num_resamples, alpha, seed)["ci95"]
    return (lo, hi)
