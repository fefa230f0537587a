"""The frozen matmuls of a teacher-forced pass, through ``F.linear`` and through oneDNN-packed weights, forward and
backward: the choice behind ``PackedFrozenLinears(differentiable=True)`` (trl_multiagent/generation/frozen_weights.py).

    python benchmarks/packed_training.py [--out experiments/speed/teacher_forcing/packed_training.json]

SmolLM2-135M's frozen linears (per layer q+k+v 960 x 576 as three, o 576 x 576, gate+up 3072 x 576 as two, down
576 x 1536; 30 layers; the LM head 49152 x 576), random float32 weights, at M rows (the positions of one call).
Forward: ``F.linear(x, W)`` (re-packs W at every call) against ``_linear_pointwise`` with W packed once. Backward (the
input's gradient): ``g @ W`` (``mm``) against ``_linear_pointwise`` with W^T packed once. Milliseconds for all the
model's linears, best of ``--repeats``, and GFLOP/s; the matmul rate of the same run (2048^3) for scale.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from measure import matmul_flops, write_result

from trl_multiagent.runtime.provenance import cpu_model

LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]


def best_ms(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return 1000 * best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/teacher_forcing/packed_training.json")
    parser.add_argument("--rows", default="4,40,160,480")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    weights = [torch.randn(o, i) for o, i in LAYER * 30 + [(49152, 576)]]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, 64) for w in weights]
    packed_t = [torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous(), 64) for w in weights]
    linear = torch.ops.mkldnn._linear_pointwise
    results = []
    for rows in [int(r) for r in args.rows.split(",")]:
        x = {n: torch.randn(rows, n) for n in {w.size(1) for w in weights}}
        g = {n: torch.randn(rows, n) for n in {w.size(0) for w in weights}}
        gflop = 2 * rows * sum(w.numel() for w in weights) / 1e9
        times = {
            "forward_f_linear_ms": best_ms(lambda x=x: [torch.nn.functional.linear(x[w.size(1)], w) for w in weights],
                                           args.repeats),
            "forward_packed_ms": best_ms(lambda x=x: [linear(x[w.size(1)], p, None, "none", [], "")
                                                  for w, p in zip(weights, packed)], args.repeats),
            "backward_mm_ms": best_ms(lambda g=g: [g[w.size(0)].mm(w) for w in weights], args.repeats),
            "backward_packed_ms": best_ms(lambda g=g: [linear(g[w.size(0)], p, None, "none", [], "")
                                                   for w, p in zip(weights, packed_t)], args.repeats),
        }
        entry = {"rows": rows, "gflop": gflop, **times,
                 "forward_f_linear_over_packed": times["forward_f_linear_ms"] / times["forward_packed_ms"],
                 "backward_mm_over_packed": times["backward_mm_ms"] / times["backward_packed_ms"]}
        results.append(entry)
        print({k: round(v, 2) for k, v in entry.items()}, flush=True)
    write_result(args.out, {"command": "python benchmarks/packed_training.py " +
                            " ".join(argv if argv is not None else sys.argv[1:]),
                            "cpu": cpu_model(), "threads": torch.get_num_threads(),
                            "matmul_gflops": matmul_flops() / 1e9, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
