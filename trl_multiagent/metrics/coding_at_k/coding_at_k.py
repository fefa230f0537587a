"""pass@k, acc@k and coop@k of the MAGRPO paper (Appendix B, Eq. 6-8) as an `evaluate` module.

Inputs, one entry per problem, each a list of the M sampled solutions' values:
``passed`` (1 if every unit test passed, else 0), ``pass_rate`` (fraction of tests passed) and ``coop`` (normalised
cooperation return). The result has ``pass@k``, ``acc@k`` and ``coop@k`` for every requested k <= M.
"""

import datasets
import evaluate

from trl_multiagent.metrics.at_k import at_k_metrics

_DESCRIPTION = "Expected best-of-k over M samples per problem: pass@k (unbiased), acc@k and coop@k (MAGRPO App. B)."
_KWARGS = """
Args:
    passed: list (problems) of lists (samples) of 0/1.
    pass_rate: list of lists of floats in [0, 1].
    coop: list of lists of floats in [0, 1].
    ks: the k values (default 1, 3, 5, 10).
Returns:
    dict with pass@k, acc@k, coop@k.
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS)
class CodingAtK(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS,
            features=datasets.Features({
                "passed": datasets.Sequence(datasets.Value("float64")),
                "pass_rate": datasets.Sequence(datasets.Value("float64")),
                "coop": datasets.Sequence(datasets.Value("float64")),
            }),
        )

    def _compute(self, passed, pass_rate, coop, ks=(1, 3, 5, 10)):
        per_problem = [
            [{"passed_all": p, "pass_rate": r, "coop": c} for p, r, c in zip(ps, rs, cs)]
            for ps, rs, cs in zip(passed, pass_rate, coop)
        ]
        return at_k_metrics(per_problem, ks)
