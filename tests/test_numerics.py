"""The comparison helpers of tests/numerics.py: the rounding bound holds for sums in other orders, and a greedy
difference passes only at a tie."""

import pytest
import torch

from tests.numerics import assert_same_computation, assert_same_greedy, relative_deviation, rounding_tolerance


def test_rounding_tolerance_is_twice_gamma_n():
    u = 2.0 ** -24
    assert rounding_tolerance(1000) == pytest.approx(2 * 1000 * u / (1 - 1000 * u), rel=1e-12)
    assert rounding_tolerance(3, torch.float64) == pytest.approx(2 * 3 * 2.0 ** -53 / (1 - 3 * 2.0 ** -53))
    with pytest.raises(ValueError, match="terms"):
        rounding_tolerance(0)
    with pytest.raises(ValueError, match="no useful bound"):
        rounding_tolerance(2 ** 23)


def test_float32_sums_in_other_orders_stay_within_the_bound_relative_to_the_sum_of_magnitudes():
    torch.manual_seed(0)
    n = 4096
    x = torch.randn(64, n)
    exact = x.double().sum(-1)
    magnitudes = x.double().abs().sum(-1)
    for order in (torch.arange(n), torch.randperm(n), torch.arange(n).flip(0)):
        got = x[:, order].cumsum(-1)[:, -1]  # a sequential sum in this order, in float32
        assert bool(((got.double() - exact).abs() <= rounding_tolerance(n) / 2 * magnitudes).all())
    blocked = x.view(64, 64, 64).sum(-1).sum(-1)  # a blocked (pairwise-like) order
    assert relative_deviation(blocked, x[:, torch.randperm(n)].cumsum(-1)[:, -1]) > 0  # the orders do differ
    assert_same_computation(blocked, x.cumsum(-1)[:, -1], terms=n, scale=magnitudes.norm().item(), what="sums")


def test_assert_same_computation_fails_beyond_rounding():
    a = torch.ones(100)
    assert_same_computation(a + 1e-9, a, terms=10)
    with pytest.raises(AssertionError, match="exceeds the rounding tolerance"):
        assert_same_computation(a * 1.01, a, terms=10)


def test_greedy_differences_pass_only_at_a_tie():
    logits = torch.tensor([0.0, 5.0, 5.0 + 1e-7, -3.0])

    def reference(prefix):
        return logits

    assert_same_greedy([1, 2, 3], [1, 2, 3], reference, terms=100)
    assert_same_greedy([1, 1], [2, 3], reference, terms=100)  # tokens 1 and 2 tie within rounding
    with pytest.raises(AssertionError, match="logit gap"):
        assert_same_greedy([0, 1], [2, 3], reference, terms=100)  # token 0 is 5 below token 2
    with pytest.raises(AssertionError, match="stops early"):
        assert_same_greedy([2], [2, 3], reference, terms=100)
