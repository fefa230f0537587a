"""``frozen_matmul_dtype`` float32 against bfloat16 on the main job's base: the frozen matmuls, a decoding step, a
teacher-forced call, the main job's step, and what the rounding changes.

    python benchmarks/frozen_matmul_dtype.py [--out experiments/speed/frozen_matmul_dtype/frozen_matmul_dtype.json]
                                             [--rounds 5] [--demo-steps 5] [--no-demo]

Base: SmolLM2-135M-Instruct in float32 (the main job's), LoRA r=16 on every linear. Each part alternates the two
dtypes within every round (the same machine state for both), and reports medians and the median of the paired
ratios float32 / bfloat16 (above 1: bfloat16 takes less time):

* ``matmuls``: every frozen linear of the model (30 layers' seven projections and the LM head) on ``rows`` rows from
  its packed copy (``packed_weight`` / ``packed_linear``), forward (``x W^T``) and the input's gradient
  (``g W``, the transposed copy): what the frozen linears cost in a decoding step (1, 16, 64 rows) and in a
  teacher-forced call (480 rows);
* ``decode``: the lean decoding step (``LeanStep``, two adapters on alternate rows, 200 cached positions) at 1, 16
  and 64 rows, each against its own bound ``max(weight bytes / bandwidth, FLOPs / matmul rate)``: float32 with 4
  bytes per frozen weight and the float32 matmul rate (2048^3), bfloat16 with 2 bytes per frozen weight (LoRA stays
  float32) and the bfloat16 matmul rate (2048^3 in bfloat16); the copy bandwidth and both rates measured in every
  round;
* ``teacher_forced``: one call of the teacher-forced pass (forward with gradients, backward through the LM head's
  log-sum-exp) after 377 cached positions, at 1 x 4 and 12 x 40 new positions (``benchmarks/call_cost.py``'s);
* ``numerics``: the next-token distributions of 4 rows of 200 tokens of English arithmetic text under both dtypes
  (total variation distance per position, share of differing arg-max tokens), and the lean step's (generation)
  against the teacher-forced forward's (training) in each dtype (:func:`numerics`);
* ``demo_step`` (unless ``--no-demo``): the main job (``recipes/configs/math_generalisation_at_grpo.yaml``) for
  ``--demo-steps`` steps with each dtype, one after the other: mean step and its parts after the first step, and
  ``train_pass`` (forward + backward against their FLOPs at the float32 and at the bfloat16 matmul rate; see
  ``benchmarks/targets.py:train_pass_bound``). The two runs sample different completions from the first step on
  (bfloat16 changes the numbers), so the step times compare runs of similar, not equal, work: ``tokens_per_step``
  says how much.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from decode_step import copy_bandwidth, step_counts
from measure import matmul_flops, write_result
from targets import MAIN_JOB, recipe_train_pass_flops, train_pass_bound

from trl_multiagent.generation import LeanStep, MultiAdapterBatch, PackedFrozenLinears
from trl_multiagent.generation.frozen_weights import packed_linear, packed_transposed, packed_weight
from trl_multiagent.generation.kv_cache import preallocated_cache
from trl_multiagent.generation.teacher_forcing import CACHE_KEYWORD
from trl_multiagent.runtime.provenance import cpu_model
from trl_multiagent.team.pool import AgentPool, AgentSpec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ROOT = Path(__file__).resolve().parents[1]


def matmul_rate(dtype: torch.dtype, n: int = 2048, repeats: int = 3) -> float:
    """FLOP/s of an ``n``^3 matmul in ``dtype``."""
    if dtype == torch.float32:
        return matmul_flops(n, repeats)
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return repeats * 2 * n**3 / (time.perf_counter() - start)


def paired(times: dict[str, list[float]]) -> dict:
    return {"float32_ms": round(1000 * statistics.median(times["float32"]), 3),
            "bfloat16_ms": round(1000 * statistics.median(times["bfloat16"]), 3),
            "float32_over_bfloat16": round(statistics.median(a / b for a, b in zip(times["float32"],
                                                                                     times["bfloat16"])), 3)}


def frozen_modules(model) -> list[torch.nn.Module]:
    return [m for m in model.modules() if PackedFrozenLinears.frozen_weight(m) is not None]


def time_matmuls(model, rows: int, rounds: int) -> dict:
    modules = frozen_modules(model)
    copies = {name: [(packed_weight(m, [m.weight], dtype=d), packed_transposed(m, m.weight, d)) for m in modules]
              for name, d in DTYPES.items()}
    inputs = {size: torch.randn(rows, size) for size in {m.weight.size(1) for m in modules}}
    grads = {size: torch.randn(rows, size) for size in {m.weight.size(0) for m in modules}}

    def run(name: str, backward: bool) -> float:
        start = time.perf_counter()
        for m, (forward_copy, transposed_copy) in zip(modules, copies[name]):
            if backward:
                packed_linear(grads[m.weight.size(0)], transposed_copy, None)
            else:
                packed_linear(inputs[m.weight.size(1)], forward_copy, None)
        return time.perf_counter() - start

    out = {}
    for backward in (False, True):
        times = {name: [] for name in DTYPES}
        for name in DTYPES:
            run(name, backward)
        for _ in range(rounds):
            for name in DTYPES:
                times[name].append(run(name, backward))
        out["input_gradient" if backward else "forward"] = paired(times)
    return out


def time_decode(pool, rows: int, rounds: int, steps: int = 8, prompt: int = 200) -> dict:
    (key,) = pool.bases
    model = pool.bases[key].get_base_model().eval()
    adapters = [("first", "second")[i % 2] for i in range(rows)]
    ids = torch.randint(100, 1000, (rows, prompt))
    cache = preallocated_cache(model, prompt + steps + 1)
    mask = torch.ones(rows, prompt + steps, dtype=torch.long)
    tokens = torch.randint(100, 1000, (rows,))
    times = {name: [] for name in DTYPES}
    bounds = {name: [] for name in DTYPES}
    counts = step_counts(model, rows, prompt + steps // 2)
    with torch.no_grad(), MultiAdapterBatch(model, adapters) as batch:
        with PackedFrozenLinears(model, skip=LeanStep.concatenated_modules(model)):
            model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        lean = {name: LeanStep(model, batch, packed=True, frozen_dtype=d) for name, d in DTYPES.items()}

        def run(name: str, count: int) -> float:
            cache.set_length(prompt)
            positions = torch.full((rows,), prompt)
            start = time.perf_counter()
            for i in range(count):
                lean[name](tokens, mask[:, :prompt + i + 1], positions + i, cache)
            return (time.perf_counter() - start) / count

        for name in DTYPES:
            run(name, 2)
        for _ in range(rounds):
            bandwidth = copy_bandwidth(time.perf_counter, repeats=2)
            for name, d in DTYPES.items():
                times[name].append(run(name, steps))
                frozen_bytes = counts["frozen_weights"] * torch.empty((), dtype=d).element_size()
                weight_bytes = frozen_bytes + 4 * counts["lora_weights"]
                bounds[name].append(max(weight_bytes / bandwidth, counts["flops"] / matmul_rate(d)))
    out = paired(times)
    for name in DTYPES:
        out[f"{name}_bound_ms"] = round(1000 * statistics.median(bounds[name]), 3)
        out[f"{name}_over_bound"] = round(statistics.median(t / b for t, b in zip(times[name], bounds[name])), 3)
    return out


def time_teacher_forced(pool, shapes, rounds: int, cached: int = 377) -> dict:
    from transformers import DynamicCache

    model = pool.bases[pool.policies["first"].base_key].get_base_model()
    base = pool.activate("first")
    ids = torch.randint(100, 1000, (1, cached))
    with torch.no_grad():
        prompt = getattr(base(input_ids=ids, use_cache=True, logits_to_keep=1), CACHE_KEYWORD)

    def call(name: str, rows: int, length: int) -> float:
        cache = DynamicCache()
        for i, layer in enumerate(prompt.layers):
            cache.update(layer.keys.expand(rows, -1, -1, -1).clone(), layer.values.expand(rows, -1, -1, -1).clone(), i)
        tokens = torch.randint(100, 1000, (rows, length))
        mask = torch.ones(rows, cached + length, dtype=torch.long)
        positions = cached + torch.arange(length)[None].expand(rows, -1)
        start = time.perf_counter()
        with PackedFrozenLinears(model, differentiable=True, dtype=DTYPES[name]):
            logits = base(input_ids=tokens, attention_mask=mask, position_ids=positions, use_cache=True,
                          logits_to_keep=length, **{CACHE_KEYWORD: cache}).logits
            logits.logsumexp(-1).sum().backward()
        pool.zero_grad()
        return time.perf_counter() - start

    out = {}
    for rows, length in shapes:
        times = {name: [] for name in DTYPES}
        for name in DTYPES:
            call(name, rows, length)
        for _ in range(rounds):
            for name in DTYPES:
                times[name].append(call(name, rows, length))
        out[f"{rows}x{length}"] = paired(times)
    return out


TEXT = ("A farmer has 12 apples and buys 7 more at the market. She gives 5 to her neighbour and bakes a pie with 6. "
        "How many apples are left? First add the apples she bought: 12 + 7 = 19. Then take away the apples she gave "
        "away and baked: 19 - 5 - 6 = 8. So she has 8 apples left. A train leaves the station at 9 and travels for "
        "3 hours at 60 miles per hour; how far does it go? Distance is speed times time, 60 x 3 = 180 miles. ")


def total_variation(logps_a: torch.Tensor, logps_b: torch.Tensor) -> torch.Tensor:
    """Per position: half the L1 distance between two next-token distributions given as log-probabilities."""
    return 0.5 * (logps_a.exp() - logps_b.exp()).abs().sum(-1)


def numerics(pool) -> dict:
    """What bfloat16 copies change, on 4 rows of 200 tokens of English arithmetic text (4 offsets of one passage):
    per position the total variation distance between the next-token distributions of the two dtypes (mean and
    largest), the share of positions whose arg-max differs; then one decoding step of the lean step (generation)
    against the forward (the teacher-forced pass) with the same copies, in each dtype: how far the sampling policy
    is from the trained one."""
    key = pool.policies["first"].base_key
    model = pool.bases[key].get_base_model().eval()
    text = pool.tokenizers[key](TEXT * 4)["input_ids"]
    ids = torch.tensor([text[start:start + 200] for start in (0, 7, 19, 31)])
    logps, out = {}, {}
    with torch.no_grad():
        base = pool.activate("first")
        for name, d in DTYPES.items():
            with PackedFrozenLinears(model, differentiable=True, dtype=d):
                logps[name] = base(input_ids=ids).logits.log_softmax(-1)
        tv = total_variation(logps["float32"], logps["bfloat16"])
        out["float32_vs_bfloat16"] = {
            "total_variation_mean": float(tv.mean()), "total_variation_max": float(tv.max()),
            "argmax_differs_share": float((logps["float32"].argmax(-1) != logps["bfloat16"].argmax(-1)).float().mean())}
        prompt, adapters = 120, ["first", "second", "first", "second"]
        for name, d in DTYPES.items():
            cache = preallocated_cache(model, prompt + 2)
            with MultiAdapterBatch(model, adapters) as batch:
                with PackedFrozenLinears(model, skip=LeanStep.concatenated_modules(model), dtype=d):
                    model(input_ids=ids[:, :prompt], cache=cache, use_cache=True, logits_to_keep=1)
                    lean = LeanStep(model, batch, packed=True, frozen_dtype=d)(
                        ids[:, prompt], torch.ones(len(adapters), prompt + 1, dtype=torch.long),
                        torch.full((len(adapters),), prompt), cache).log_softmax(-1)
            forward = []
            for row, adapter in enumerate(adapters):
                with PackedFrozenLinears(model, differentiable=True, dtype=d):
                    forward.append(pool.activate(adapter)(input_ids=ids[row:row + 1, :prompt + 1]).logits[0, -1])
            tv = total_variation(lean, torch.stack(forward).log_softmax(-1))
            out[f"lean_step_vs_forward_{name}"] = {"total_variation_max": float(tv.max())}
    return out


def demo_steps(dtype: str, steps: int, tmp: Path) -> dict:
    out = tmp / dtype
    rates = {"float32": [matmul_rate(torch.float32)], "bfloat16": [matmul_rate(torch.bfloat16)]}
    cmd = [sys.executable, "-m", "trl_multiagent", "train", "--config", MAIN_JOB, "--max_steps", str(steps),
           "--evaluator", "none", "--output_dir", str(out), "--disable_tqdm", "true", "--frozen_matmul_dtype", dtype]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    for name, d in DTYPES.items():
        rates[name].append(matmul_rate(d))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in records if "step_time" in r]
    parts = {k: statistics.fmean(r[k] for r in timed[1:] if k in r)
             for k in ("time/generation", "time/forward", "time/backward", "time/environment")}
    flops = recipe_train_pass_flops(json.loads((out / "summary.json").read_text())["recipe"])
    return {"command": " ".join(cmd[1:]).replace(str(out), f"<tmp>/{dtype}"),
            "step_time_s": [r["step_time"] for r in timed],
            "mean_step_s_after_first": statistics.fmean(r["step_time"] for r in timed[1:]),
            "mean_parts_after_first_s": parts,
            "tokens_per_step": [r.get("tokens/loss_needed") for r in timed],
            "train_pass_vs_float32_matmul": train_pass_bound(records, flops, statistics.fmean(rates["float32"])),
            "train_pass_vs_bfloat16_matmul": train_pass_bound(records, flops, statistics.fmean(rates["bfloat16"])),
            "rewards": [r.get("reward") for r in timed]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/frozen_matmul_dtype/frozen_matmul_dtype.json")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--demo-steps", type=int, default=5)
    parser.add_argument("--no-demo", action="store_true")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    torch.manual_seed(0)
    pool = AgentPool([AgentSpec(a, model="smollm2-135m-instruct", lora_r=16, lora_alpha=32)
                      for a in ("first", "second")], frozen_matmul_dtype="bfloat16")
    with torch.no_grad():
        for n, p in pool.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.01)
    (key,) = pool.bases
    model = pool.bases[key].get_base_model()
    result = {"command": "python benchmarks/frozen_matmul_dtype.py " + " ".join(argv or sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d"), "cpu": cpu_model(), "threads": torch.get_num_threads(),
              "matmul_gflops": {name: matmul_rate(d) / 1e9 for name, d in DTYPES.items()},
              "copy_bandwidth_gb_s": copy_bandwidth(time.perf_counter) / 1e9}
    result["matmuls"] = {str(rows): time_matmuls(model, rows, args.rounds) for rows in (1, 16, 64, 480)}
    result["decode"] = {str(rows): time_decode(pool, rows, args.rounds) for rows in (1, 16, 64)}
    result["teacher_forced"] = time_teacher_forced(pool, [(1, 4), (12, 40)], args.rounds)
    result["numerics"] = numerics(pool)
    if not args.no_demo:
        del pool, model
        with tempfile.TemporaryDirectory(prefix="frozen-dtype-") as tmp:
            result["demo_step"] = {name: demo_steps(name, args.demo_steps, Path(tmp)) for name in DTYPES}
        f32, b16 = (result["demo_step"][n]["mean_step_s_after_first"] for n in DTYPES)
        result["demo_step"]["float32_over_bfloat16"] = f32 / b16
    result["wall_s"] = time.perf_counter() - start
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
