"""How a test compares two numerical paths, so that it holds on every x86-64 CPU (AVX2 or AVX-512, AMD or Intel, one
thread or several).

Two paths that compute one quantity (a shared-prefix pass and separate passes, a packed and a plain layer, this
library's loss and TRL's) differ by rounding alone, and by how much depends on the order in which the kernels sum,
which the CPU's instruction set and the thread count choose. A fixed number of digits that one CPU happens to meet
fails on another. The rules (tests/README.md says the same):

1. Where the test builds its own tensors or its own tiny model, compute in float64 where the code path allows it.
2. Compare with :func:`assert_same_computation`: the deviation is measured on the NORM of the compared tensor (an
   element that is a difference of large terms can lose all its relative digits while the tensor is right), and the
   tolerance is :func:`rounding_tolerance`: the textbook bound on the rounding error of a sum of ``terms`` terms at
   the unit roundoff of the lowest precision the computation passes through. Name ``terms`` from the computation:
   the longest sum that produces the compared value (e.g. a LoRA gradient sums over every token of the batch and a
   layer's width), never a number tuned until one CPU passes.
3. Greedy decodings along two paths are compared with :func:`assert_same_greedy`: equal token for token, except
   after a tie that rounding may break either way.

With ``NUMERICS_LOG=<file>`` in the environment every comparison appends one JSON line (test, what, deviation,
tolerance) to that file: ``tests/numerics_matrix.py`` runs the numerical tests under each kernel choice and thread
count and reports the worst deviation of each comparison against its tolerance.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence

import torch

#: the unit roundoff u of each floating-point type: the largest relative error of one rounding (half an ulp of 1)
UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24,
                 torch.float64: 2.0 ** -53}

#: transformers' Llama computes RMSNorm and the rotary angles in float32 whatever the weights' dtype (it casts to
#: float32 and back), so a model's outputs carry float32 rounding even with float64 weights: the tolerance of a
#: comparison of model outputs uses float32's unit roundoff, and float64 weights only widen the margin.
MODEL_ROUNDING = torch.float32


def rounding_tolerance(terms: int, dtype: torch.dtype = torch.float32) -> float:
    """The relative tolerance for two evaluations of one quantity that differ only in the order of their floating-point
    operations: twice gamma_n = n u / (1 - n u), the bound on the relative error of a sum or dot product of n terms
    at unit roundoff u (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Lemma 3.1 and Sec. 3.1),
    each evaluation being within gamma_n of the exact value."""
    if terms < 1:
        raise ValueError(f"terms must be >= 1, got {terms}")
    nu = terms * UNIT_ROUNDOFF[dtype]
    if nu >= 0.5:
        raise ValueError(f"{terms} terms at unit roundoff {UNIT_ROUNDOFF[dtype]:.1e}: no useful bound (n u >= 0.5)")
    return 2 * nu / (1 - nu)


def _log(record: dict) -> None:
    path = os.environ.get("NUMERICS_LOG")
    if path:
        record["test"] = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def relative_deviation(actual, expected) -> float:
    """``||actual - expected||_2 / ||expected||_2`` over all elements (in float64; 0 when both are zero)."""
    a = torch.as_tensor(actual).detach().double().flatten()
    b = torch.as_tensor(expected).detach().double().flatten()
    if a.shape != b.shape:
        raise AssertionError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    diff, scale = (a - b).norm().item(), b.norm().item()
    if scale == 0:
        return 0.0 if diff == 0 else float("inf")
    return diff / scale


def assert_same_computation(actual, expected, *, terms: int, dtype: torch.dtype = MODEL_ROUNDING,
                            scale: float | None = None, what: str = "") -> float:
    """Assert that ``actual`` and ``expected`` (tensors, or sequences of tensors compared as one) are one quantity
    computed in two orders: ``||actual - expected||_2 <= rounding_tolerance(terms, dtype) * ||expected||_2``. Returns
    the relative deviation.

    ``scale``: the magnitude the rounding is relative to when it is not ``||expected||_2``: a value that is a
    difference of larger terms (a loss whose terms cancel) passes the sum of its terms' magnitudes, as the bound on a
    sum is relative to that sum (the deviation is then reported relative to ``scale``)."""
    if isinstance(actual, (list, tuple)):
        actual = torch.cat([torch.as_tensor(t).detach().double().flatten() for t in actual])
        expected = torch.cat([torch.as_tensor(t).detach().double().flatten() for t in expected])
    if scale is None:
        deviation = relative_deviation(actual, expected)
    else:
        diff = torch.as_tensor(actual).detach().double() - torch.as_tensor(expected).detach().double()
        deviation = diff.norm().item() / scale
    return check_deviation(deviation, terms=terms, dtype=dtype, what=what)


def check_deviation(deviation: float, *, terms: int, dtype: torch.dtype = MODEL_ROUNDING, what: str = "") -> float:
    """Assert that a relative deviation measured elsewhere (e.g. in a launched process) is within
    ``rounding_tolerance(terms, dtype)``; :func:`assert_same_computation` measures it and calls this."""
    tolerance = rounding_tolerance(terms, dtype)
    _log({"what": what, "deviation": deviation, "tolerance": tolerance, "terms": terms, "dtype": str(dtype)})
    assert deviation <= tolerance, (f"{what or 'values'}: relative deviation {deviation:.3e} exceeds the rounding "
                                    f"tolerance {tolerance:.3e} of {terms} terms at {dtype}")
    return deviation


def assert_same_greedy(got: Sequence[int], expected: Sequence[int],
                       reference_logits: Callable[[list[int]], torch.Tensor], *, terms: int,
                       dtype: torch.dtype = MODEL_ROUNDING, what: str = "") -> None:
    """Assert that two greedy decodings of one model agree token for token, up to a tie. Where they first differ, the
    reference's logits after the common part (``reference_logits(prefix)``, a ``(V,)`` tensor) must hold the two
    chosen tokens within rounding of each other (``|l_a - l_b| <= rounding_tolerance(terms, dtype) * max|l|``): a tie
    that either path may break, after which the decodings are not comparable. A difference with a clear margin is a
    bug."""
    got, expected = list(got), list(expected)
    if got == expected:
        _log({"what": what, "greedy": "identical", "tokens": len(got)})
        return
    step = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    if step == min(len(got), len(expected)):
        raise AssertionError(f"{what}: one greedy decoding stops early: {got} vs {expected}")
    logits = reference_logits(expected[:step]).detach().double()
    gap = abs(logits[got[step]] - logits[expected[step]]).item()
    allowed = rounding_tolerance(terms, dtype) * logits.abs().max().item()
    _log({"what": what, "greedy": "tie", "step": step, "gap": gap, "allowed": allowed})
    assert gap <= allowed, (f"{what}: greedy decodings differ at step {step} ({got[step]} vs {expected[step]}) with a "
                            f"logit gap {gap:.3e} above rounding ({allowed:.3e}): {got} vs {expected}")
