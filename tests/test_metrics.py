"""@k metrics and bootstrap intervals (trl_multiagent/metrics/at_k.py, stats.py) against hand-computed values; the
coding evaluation itself is tested in tests/test_evaluation.py."""

import math

import pytest

from trl_multiagent.evaluation import at_k_metrics, bootstrap_interval, expected_max_at_k, pass_at_k
from trl_multiagent.metrics import load_metric


def test_pass_at_k_unbiased_estimator_by_hand():
    # n=5 samples, c=2 correct: pass@1 = 2/5; pass@3 = 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0  # fewer than k wrong: every subset holds a correct one
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_expected_max_by_enumeration():
    values = [0.0, 0.5, 1.0, 0.25]
    # k=2: the 6 pairs have maxima 0.5, 1, 0.25, 1, 0.5, 1 -> mean 4.25 / 6
    assert expected_max_at_k(values, 2) == pytest.approx(4.25 / 6)
    assert expected_max_at_k(values, 1) == pytest.approx(sum(values) / 4)
    assert expected_max_at_k(values, 4) == 1.0
    # binary values reproduce the pass@k estimator
    assert expected_max_at_k([1, 1, 0, 0, 0], 3) == pytest.approx(pass_at_k(5, 2, 3))


def test_at_k_metrics_mean_over_problems():
    problem_a = [{"passed_all": 1, "pass_rate": 1.0, "coop": 1.0}, {"passed_all": 0, "pass_rate": 0.5, "coop": 0.0}]
    problem_b = [{"passed_all": 0, "pass_rate": 0.0, "coop": 0.5}, {"passed_all": 0, "pass_rate": 0.2, "coop": 0.0}]
    m = at_k_metrics([problem_a, problem_b], ks=[1, 2])
    assert m["pass@1"] == pytest.approx((0.5 + 0.0) / 2)
    assert m["pass@2"] == pytest.approx((1.0 + 0.0) / 2)
    assert m["acc@1"] == pytest.approx((0.75 + 0.1) / 2)
    assert m["acc@2"] == pytest.approx((1.0 + 0.2) / 2)
    assert m["coop@2"] == pytest.approx((1.0 + 0.5) / 2)


def test_evaluate_module_loads_from_the_repo_and_agrees():
    metric = load_metric("coding_at_k")
    out = metric.compute(passed=[[1, 0, 0], [0, 0, 0]], pass_rate=[[1, 0.5, 0], [0.2, 0.2, 0]],
                         coop=[[1, 0, 0], [0, 0, 0]], ks=[1, 3])
    assert out["pass@1"] == pytest.approx(1 / 6)
    assert out["pass@3"] == pytest.approx(0.5)
    assert out["acc@3"] == pytest.approx((1.0 + 0.2) / 2)
    with pytest.raises(ValueError, match="No metric"):
        load_metric("bleu")


def test_bootstrap_interval_brackets_the_mean_and_degenerates():
    lo, hi = bootstrap_interval([0.0, 1.0] * 20, num_resamples=500)
    assert lo < 0.5 < hi and 0.25 < lo and hi < 0.75
    assert bootstrap_interval([0.3] * 10) == (pytest.approx(0.3), pytest.approx(0.3))
    assert all(math.isnan(x) for x in bootstrap_interval([]))
