"""Metrics of a binary scorer (a verifier): accuracy at a threshold, ROC AUC, and their bootstrap over questions.

A verifier gives every (question, solution) a score ``s`` in [0, 1]; the label ``y`` says whether the solution is
correct. The quantities, each a small pure function:

* :func:`accuracy_at_threshold`: the fraction of solutions with ``(s >= threshold) == y``.
* :func:`roc_auc`: the probability that a random correct solution scores above a random incorrect one, a tie
  counting one half (the Mann-Whitney U statistic over ``P`` correct and ``N`` incorrect solutions):
  ``AUC = 1 / (P N) * sum_{i correct} sum_{j incorrect} (1[s_i > s_j] + 1/2 * 1[s_i = s_j])``, computed from the
  average ranks of the scores as ``(R_correct - P (P + 1) / 2) / (P N)``. A scorer that gives every solution the same
  score has AUC 1/2; a 0/1 scorer with ``a`` true-positive and ``b`` false-positive rates has AUC
  ``(1 + a - b) / 2``.
* :func:`question_bootstrap`: a percentile bootstrap interval of either metric that resamples QUESTIONS with
  replacement (all solutions of a drawn question come along), since the solutions of one question are not
  independent evidence; it reuses the intervals of :mod:`trl_multiagent.metrics.stats`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from trl_multiagent.metrics.stats import percentile_interval, resample_indices


def _check(scores: Sequence[float], labels: Sequence[bool]) -> None:
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} scores but {len(labels)} labels")
    if not scores:
        raise ValueError("no scores to evaluate")
    if any(isinstance(s, float) and math.isnan(s) for s in scores):
        raise ValueError("a score is NaN")


def accuracy_at_threshold(scores: Sequence[float], labels: Sequence[bool], threshold: float = 0.5) -> float:
    """The fraction of solutions whose prediction ``score >= threshold`` equals their label."""
    _check(scores, labels)
    return sum((float(s) >= threshold) == bool(y) for s, y in zip(scores, labels)) / len(scores)


def average_ranks(values: Sequence[float]) -> list[float]:
    """The 1-based rank of every value in ascending order; tied values share the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1  # ranks i + 1 .. j + 1, averaged
        i = j + 1
    return ranks


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """ROC AUC of ``scores`` for ``labels`` (see the module docstring); both classes must be present."""
    _check(scores, labels)
    positives = sum(bool(y) for y in labels)
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        raise ValueError(f"the AUC needs correct and incorrect solutions, got {positives} correct and {negatives} "
                         "incorrect")
    ranks = average_ranks([float(s) for s in scores])
    rank_sum = sum(r for r, y in zip(ranks, labels) if y)
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def question_bootstrap(metric: Callable[[list[float], list[bool]], float], scores: Sequence[Sequence[float]],
                       labels: Sequence[Sequence[bool]], num_resamples: int = 2000, alpha: float = 0.05,
                       seed: int = 0) -> dict[str, Any]:
    """``metric`` over every solution, and its percentile bootstrap interval over questions.

    Args:
        metric: ``metric(scores, labels) -> float`` over a flat list of solutions (e.g. :func:`roc_auc`).
        scores, labels: one list per question (the question's solutions' scores and labels).
        num_resamples, alpha, seed: the bootstrap (:func:`~trl_multiagent.metrics.stats.resample_indices`,
            :func:`~trl_multiagent.metrics.stats.percentile_interval`). A resample on which the metric is
            undefined (e.g. one class only for the AUC) is left out; ``resamples_used`` counts the others.

    Returns:
        ``{"mean": metric on all solutions, "ci95": [lo, hi], "num_questions": q, "num_solutions": n,
        "resamples_used": r}``.
    """
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} questions of scores but {len(labels)} of labels")
    flat_scores = [float(s) for group in scores for s in group]
    flat_labels = [bool(y) for group in labels for y in group]
    point = metric(flat_scores, flat_labels)
    values = []
    for row in resample_indices(len(scores), num_resamples, seed):
        s = [float(x) for q in row for x in scores[q]]
        y = [bool(x) for q in row for x in labels[q]]
        try:
            values.append(metric(s, y))
        except ValueError:
            continue
    lo, hi = percentile_interval(values, alpha) if values else (math.nan, math.nan)
    return {"mean": point, "ci95": [lo, hi], "num_questions": len(scores), "num_solutions": len(flat_scores),
            "resamples_used": len(values)}
