"""What one more call of the teacher-forced pass costs, in positions: the constant ``CALL_COST_POSITIONS`` with which
``teacher_forcing.length_buckets`` weighs calls against padded positions.

    python benchmarks/call_cost.py [--out experiments/speed/teacher_forcing/call_cost.json]

The main job's base (SmolLM2-135M-Instruct, float32, one LoRA adapter r=16 on every linear) continues a 377-token KV
cache (a second-turn prompt of the main job) with ``rows x length`` new positions, forward with gradients and
backward through the LM head's log-sum-exp, as one micro-batch's call of stage 3 does. Each shape is timed
``--repeats`` times (the median kept), the shapes alternating. A least-squares line ``seconds = a + b x positions``
over the shapes gives the fixed cost of a call ``a`` (at few rows every weight is still read, forward and backward)
and the cost of a position ``b``; ``a / b`` is the call's cost in positions.

Then the largest shape with the model's attention switched between transformers' ``sdpa`` (each key/value head
copied for its query heads) and the library's ``grouped_sdpa`` (trl_multiagent/models/grouped_attention.py), alternately,
``--repeats`` times each: ``sdpa_over_grouped`` is the median of the paired ratios. Last, three shapes with the
frozen linears through ``F.linear`` and through oneDNN-packed weights (the pool's ``packs_training``, switched for
the base between calls), alternately: ``f_linear_over_packed`` per shape, the median of the paired ratios.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

import torch
from measure import matmul_flops, write_result

from trl_multiagent.generation.teacher_forcing import CALL_COST_POSITIONS, lm_forward
from trl_multiagent.models.grouped_attention import GROUPED_SDPA
from trl_multiagent.runtime.provenance import cpu_model
from trl_multiagent.team.pool import AgentPool, AgentSpec

SHAPES = [(1, 4), (2, 16), (4, 40), (8, 20), (12, 40)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/teacher_forcing/call_cost.json")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cached", type=int, default=377)
    args = parser.parse_args(argv)
    from transformers import DynamicCache

    torch.manual_seed(0)
    pool = AgentPool([AgentSpec("solver", model="smollm2-135m-instruct", lora_r=16, lora_alpha=32)])
    forward = lm_forward(functools.partial(pool, "solver"))
    ids = torch.randint(100, 1000, (1, args.cached))
    with torch.no_grad():
        _, prompt = forward(ids, torch.ones_like(ids), torch.arange(args.cached)[None], None, True, 1)

    def call(rows: int, length: int) -> float:
        cache = DynamicCache()
        for i, layer in enumerate(prompt.layers):
            cache.update(layer.keys.expand(rows, -1, -1, -1).clone(), layer.values.expand(rows, -1, -1, -1).clone(), i)
        tokens = torch.randint(100, 1000, (rows, length))
        mask = torch.ones(rows, args.cached + length, dtype=torch.long)
        positions = args.cached + torch.arange(length)[None].expand(rows, -1)
        start = time.perf_counter()
        logits, _ = forward(tokens, mask, positions, cache, True, length)
        logits.logsumexp(-1).sum().backward()
        pool.zero_grad()
        return time.perf_counter() - start

    call(*SHAPES[0])  # warm-up
    rate = matmul_flops()
    times = {shape: [] for shape in SHAPES}
    for _ in range(args.repeats):
        for shape in SHAPES:
            times[shape].append(call(*shape))
    x = [rows * length for rows, length in SHAPES]
    y = [statistics.median(times[s]) for s in SHAPES]
    mx, my = statistics.fmean(x), statistics.fmean(y)
    b = sum((xi - mx) * (yi - my) for xi, yi in zip(x, y)) / sum((xi - mx) ** 2 for xi in x)
    a = my - b * mx
    base = next(iter(pool.bases.values())).get_base_model()
    assert base.config._attn_implementation == GROUPED_SDPA
    attention = {"sdpa": [], GROUPED_SDPA: []}
    for _ in range(args.repeats):
        for name in attention:
            base.set_attn_implementation(name)
            attention[name].append(call(*SHAPES[-1]))
    base.set_attn_implementation(GROUPED_SDPA)
    key = next(iter(pool.bases))
    assert pool.packs_training(key)
    packing = {}
    for shape in SHAPES[:1] + SHAPES[2:3] + SHAPES[-1:]:
        runs = {True: [], False: []}
        for _ in range(args.repeats):
            for packs in (True, False):
                pool.paths[key].packed_training = packs  # the pool's decision for this base, switched for the comparison
                runs[packs].append(call(*shape))
        pool.paths[key].packed_training = True
        packing[f"{shape[0]}x{shape[1]}"] = {
            "packed_seconds": [round(t, 4) for t in runs[True]], "f_linear_seconds": [round(t, 4) for t in runs[False]],
            "f_linear_over_packed": statistics.median(f / p for f, p in zip(runs[False], runs[True]))}
    result = {"command": "python benchmarks/call_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "cpu": cpu_model(), "threads": torch.get_num_threads(), "cached_positions": args.cached,
              "matmul_gflops": rate / 1e9,
              "shapes": [{"rows": r, "length": n, "positions": r * n, "seconds_median": s,
                          "seconds": [round(t, 4) for t in times[(r, n)]]} for (r, n), s in zip(SHAPES, y)],
              "fixed_seconds_per_call": a, "seconds_per_position": b, "call_cost_positions": a / b,
              "CALL_COST_POSITIONS": CALL_COST_POSITIONS,
              "attention": {"shape": list(SHAPES[-1]), **{f"{k}_seconds": [round(t, 4) for t in v]
                                                          for k, v in attention.items()},
                            "sdpa_over_grouped": statistics.median(
                                s / g for s, g in zip(attention["sdpa"], attention[GROUPED_SDPA]))},
              "packed_training": packing}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
