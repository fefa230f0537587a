"""@k metrics of the MAGRPO paper (Appendix B, Eq. 6-8).

For a task with M sampled values, the expected best value over a uniformly random subset of k of them is

    E[max over k of v] = sum_i v_(i) * C(i - 1, k - 1) / C(M, k)        (v_(1) <= ... <= v_(M) sorted)

``pass@k`` is this with v = 1 when every test passes (it equals the unbiased estimator of Chen et al. 2021,
1 - C(M - c, k) / C(M, k)); ``acc@k`` with v = the fraction of tests passed; ``coop@k`` with v = the normalised
cooperation return. Each metric is the mean over tasks. At k = 1 each is the plain per-task mean of the samples,
which is what the evaluation pairs by task.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from trl_multiagent.metrics.stats import mean

#: The k of the @k metrics (those at most the number of samples are reported).
KS = (1, 3, 5, 10)


def expected_max_at_k(values: Sequence[float], k: int) -> float:
    """Expected maximum of ``values`` over a uniformly random subset of size ``k`` (Eq. 6-8 of MAGRPO App. B)."""
    n = len(values)
    if not 1 <= k <= n:
        raise ValueError(f"k={k} needs 1 <= k <= number of samples ({n})")
    ordered = sorted(float(v) for v in values)
    total = math.comb(n, k)
    return sum(v * math.comb(i, k - 1) for i, v in enumerate(ordered)) / total  # i = rank - 1


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. (2021): ``1 - C(n - c, k) / C(n, k)``."""
    if not 1 <= k <= num_samples:
        raise ValueError(f"k={k} needs 1 <= k <= num_samples ({num_samples})")
    if num_samples - num_correct < k:
        return 1.0
    return 1.0 - math.comb(num_samples - num_correct, k) / math.comb(num_samples, k)


def at_k_metrics(per_problem: Sequence[Sequence[Mapping[str, float]]], ks: Sequence[int] = KS) -> dict[str, float]:
    """pass@k, acc@k and coop@k (mean over problems) from M sample records per problem.

    Each record has ``passed_all`` (0/1), ``pass_rate`` (fraction of tests passed) and ``coop`` (normalised
    cooperation return).
    """
    out: dict[str, float] = {}
    for k in ks:
        usable = [recs for recs in per_problem if len(recs) >= k]
        if not usable:
            continue
        out[f"pass@{k}"] = mean([pass_at_k(len(r), int(sum(x["passed_all"] for x in r)), k) for r in usable])
        out[f"acc@{k}"] = mean([expected_max_at_k([x["pass_rate"] for x in r], k) for r in usable])
        out[f"coop@{k}"] = mean([expected_max_at_k([x["coop"] for x in r], k) for r in usable])
    return out
