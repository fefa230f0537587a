"""One decoding step of the main job's base: transformers' forward against the lean step, and both against the
physical bound of the same run.

    python benchmarks/decode_step.py [--out experiments/speed/generation/decode_step.json] [--threads N] [--rounds R]

The base is the main job's: 4-bit SmolLM2-135M computing with its de-quantised copy, two agents' LoRA adapters
(r=16, every linear) active on alternate rows of a mixed batch. For each batch size (1, 16, 64 rows) a 200-token
prompt batch is prefilled once into the generation's preallocated KV cache; then, alternately, ``--rounds`` times,
``--steps`` one-token steps from that cache (its length reset to the prompt before each run) along two paths:

* ``forward``: transformers' ``LlamaForCausalLM`` forward with PEFT's LoRA layers under ``MultiAdapterBatch`` and the
  frozen weights packed for oneDNN (``PackedFrozenLinears``): what generation did before the lean step;
* ``lean``: :class:`~trl_multiagent.generation.lean_step.LeanStep` with packed concatenated weights (what generation
  on a CPU now does, ``lean_decode`` auto).

Reported per batch size and path: milliseconds per step (median over rounds), and the median over rounds of the
ratio forward / lean (the two runs of one round are timed back to back, so machine load affects both alike). The
bound of a step is ``max(bytes / bandwidth, FLOPs / matmul rate)`` with the bytes the weights it reads (frozen
linears, LM head and LoRA matrices in float32) and the FLOPs ``2 x rows x`` those weights plus attention
(``4 x rows x layers x heads x cached positions x head_dim``); the bandwidth is a large tensor copy (256 MiB, bytes
read + bytes written per second) and the matmul rate ``measure.matmul_flops`` (2048^3), both measured in every round
between its two paths, so that ``step / bound`` (reported per path, median over rounds) compares times taken under
the same load. A second bound adds the KV cache the step reads to the bytes. A third (not a target:
``lean_over_fastest_matmul_bound``) takes the faster of that matmul rate and oneDNN's packed matmul
(``measure.packed_matmul_flops``), which on some CPUs uses wider vector instructions than MKL's ``sgemm``.

Clock: with ``--threads 1`` every time (steps, copy, matmul rate) is the thread's CPU time
(``time.thread_time``): on a machine shared with other work, time spent descheduled does not count, so the numbers
are those of the code, not of the load. With more threads it is wall-clock time (a descheduled thread stalls the
others at every parallel region, which on a loaded machine dominates small steps). ``uptime``'s load is recorded.

Per batch size also where the lean step's time goes: each operator's share of the self CPU time of 3 steps under
torch's profiler (``lean_profile_share``, the 8 largest).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict

import torch
from measure import matmul_flops, packed_matmul_flops, synchronize, write_result

from trl_multiagent.generation import LeanStep, MultiAdapterBatch, PackedFrozenLinears
from trl_multiagent.generation.kv_cache import preallocated_cache
from trl_multiagent.generation.lean_step import frozen_linear
from trl_multiagent.generation.sampling import sample_next
from trl_multiagent.runtime.provenance import cpu_model
from trl_multiagent.team.pool import AgentPool, AgentSpec


def copy_bandwidth(clock, mib: int = 256, repeats: int = 5, device: str = "cpu") -> float:
    """Bytes per second of a large tensor copy on ``device`` (read + written), best of ``repeats`` (on CUDA each
    timed between two synchronisations)."""
    src = torch.ones(mib * 2**20 // 4, device=device)
    dst = torch.zeros_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = clock()
        dst.copy_(src)
        synchronize(device)
        best = min(best, clock() - start)
    return 2 * src.numel() * 4 / best


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def step_counts(model, rows: int, cached: int) -> dict[str, float]:
    """Bytes the step reads and FLOPs it computes (see the module docstring)."""
    config = model.config
    projections = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}
    frozen = frozen_linear(model.lm_head)[1].numel() + sum(
        frozen_linear(getattr(getattr(layer, owner), name))[1].numel()
        for layer in model.model.layers for owner, names in projections.items() for name in names)
    lora = sum(p.numel() for name, p in model.named_parameters() if "lora_" in name)
    weights = frozen + lora
    head_dim = config.hidden_size // config.num_attention_heads
    attention = 4 * rows * config.num_hidden_layers * config.num_attention_heads * cached * head_dim
    kv = rows * config.num_hidden_layers * 2 * config.num_key_value_heads * cached * head_dim * 4
    return {"frozen_weights": frozen, "lora_weights": lora, "weight_bytes": 4 * weights, "kv_cache_bytes": kv,
            "flops": 2 * rows * weights + attention}


def two_adapter_base():
    """The main job's base (4-bit SmolLM2-135M computing with its de-quantised copy) with two LoRA adapters, r=16,
    ``first`` and ``second``, their B matrices random (at initialisation they are zero and LoRA a no-op):
    ``(pool, base key, the base model in eval mode)``."""
    pool = AgentPool([AgentSpec(a, model="smollm2-135m-instruct", quantization="4bit", lora_r=16, lora_alpha=32)
                      for a in ("first", "second")])
    with torch.no_grad():
        for name, p in pool.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    (key,) = pool.bases
    return pool, key, pool.bases[key].get_base_model().eval()


def profile_shares(model, cache, batch, step, tokens, mask, prompt: int, clock, top: int = 8) -> dict[str, float]:
    """Where the lean step's time goes: each operator's share of the self CPU time of 3 steps (the ``top`` largest)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run_steps(model, cache, batch, "lean", step, tokens, mask, prompt, 3, clock)
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    shares = {e.key: round(e.self_cpu_time_total / total, 4) for e in prof.key_averages()}
    return dict(sorted(shares.items(), key=lambda kv: -kv[1])[:top])


def run_steps(model, cache, batch, path: str, step: LeanStep, tokens, mask, prompt: int, count: int, clock):
    cache.set_length(prompt)
    positions = torch.full((tokens.numel(),), prompt)
    packed = PackedFrozenLinears(model) if path == "forward" else contextlib.nullcontext()
    total = 0.0
    with torch.no_grad(), packed:
        for i in range(count):
            m = mask[:, :prompt + i + 1]
            start = clock()
            if path == "forward":
                model(input_ids=tokens[:, None], attention_mask=m, position_ids=positions[:, None] + i, cache=cache,
                      use_cache=True)
            else:
                step(tokens, m, positions + i, cache)
            total += clock() - start
    return total / count


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/generation/decode_step.json")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rows", default="1,16,64")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    clock = time.thread_time if threads == 1 else time.perf_counter
    load_before = load()
    pool, key, model = two_adapter_base()
    assert pool.lean_decodes(key) and pool.packs_weights(key)
    prompt = 200
    results, summary = [], {}
    for rows in [int(r) for r in args.rows.split(",")]:
        adapters = [("first", "second")[i % 2] for i in range(rows)]
        ids = torch.randint(100, 1000, (rows, prompt))
        # room for the longest run: the timed steps, or the profile's 3 (fewer --steps than 3 once ran out of cache)
        longest = max(args.steps, 3)
        cache = preallocated_cache(model, prompt + longest + 1)
        mask = torch.ones(rows, prompt + longest, dtype=torch.long)
        tokens = torch.randint(100, 1000, (rows,))
        with torch.no_grad(), MultiAdapterBatch(model, adapters) as batch:
            with PackedFrozenLinears(model, skip=LeanStep.concatenated_modules(model)):
                model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
            start = time.perf_counter()
            step = LeanStep(model, batch, packed=True)
            made_s = time.perf_counter() - start
            times = defaultdict(list)
            # (bandwidth, matmul rate, packed oneDNN matmul rate or None) of each round, measured between its paths
            rates = []
            for path in ("forward", "lean"):  # warm-up
                run_steps(model, cache, batch, path, step, tokens, mask, prompt, 2, clock)
            for _ in range(args.rounds):
                times["forward"].append(run_steps(model, cache, batch, "forward", step, tokens, mask, prompt,
                                                  args.steps, clock))
                rates.append((copy_bandwidth(clock, repeats=2), matmul_flops(repeats=2, clock=clock),
                              packed_matmul_flops(repeats=2, clock=clock)))
                times["lean"].append(run_steps(model, cache, batch, "lean", step, tokens, mask, prompt, args.steps,
                                               clock))
            profile = profile_shares(model, cache, batch, step, tokens, mask, prompt, clock)
            cache.set_length(prompt)
            logits = step(tokens, mask[:, :prompt + 1], torch.full((rows,), prompt), cache)
        sampler = []
        for config in ({"do_sample": False}, {"do_sample": True, "top_p": 0.9}):
            from transformers import GenerationConfig

            generation = GenerationConfig(**config)
            sample_next(logits, generation)
            start = clock()
            for _ in range(5):
                sample_next(logits, generation)
            sampler.append(1000 * (clock() - start) / 5)
        counts = step_counts(model, rows, prompt + args.steps // 2)
        # the bound of each round, from the bandwidth and matmul rate measured in that round (the machine's load
        # changes them as it changes the steps)
        bounds = [max(counts["weight_bytes"] / bw, counts["flops"] / rate) for bw, rate, _ in rates]
        bounds_kv = [max((counts["weight_bytes"] + counts["kv_cache_bytes"]) / bw, counts["flops"] / rate)
                     for bw, rate, _ in rates]
        # not the target's bound: the same with the faster of MKL's sgemm and oneDNN's packed matmul
        fastest = [max(counts["weight_bytes"] / bw, counts["flops"] / max(rate, packed or 0.0))
                   for bw, rate, packed in rates]
        bound, bound_kv = statistics.median(bounds), statistics.median(bounds_kv)
        bandwidth, flops_rate = (statistics.median(r[i] for r in rates) for i in (0, 1))
        ratios = [f / n for f, n in zip(times["forward"], times["lean"])]
        entry = {"rows": rows, "adapters": sorted(set(adapters)),
                 "forward_ms": [round(1000 * t, 2) for t in times["forward"]],
                 "lean_ms": [round(1000 * t, 2) for t in times["lean"]],
                 "forward_ms_median": 1000 * statistics.median(times["forward"]),
                 "lean_ms_median": 1000 * statistics.median(times["lean"]),
                 "forward_over_lean_median": statistics.median(ratios),
                 "bound_ms": 1000 * bound, "bound_with_kv_cache_ms": 1000 * bound_kv,
                 "bound_is": "memory" if counts["weight_bytes"] / bandwidth >= counts["flops"] / flops_rate
                 else "compute",
                 "copy_bandwidth_gb_s": bandwidth / 1e9, "matmul_gflops": flops_rate / 1e9,
                 "forward_over_bound": statistics.median(t / b for t, b in zip(times["forward"], bounds)),
                 "lean_over_bound": statistics.median(t / b for t, b in zip(times["lean"], bounds)),
                 "lean_over_bound_with_kv_cache": statistics.median(t / b for t, b in zip(times["lean"], bounds_kv)),
                 "packed_matmul_gflops": None if rates[0][2] is None else
                 statistics.median(r[2] for r in rates) / 1e9,
                 "lean_over_fastest_matmul_bound": statistics.median(t / b for t, b in zip(times["lean"], fastest)),
                 "lean_step_made_in_s": made_s, "lean_profile_share": profile,
                 "sampler_ms": {"greedy": sampler[0], "top_p_0.9": sampler[1]}, **counts}
        results.append(entry)
        summary[str(rows)] = {k: round(entry[k], 2) for k in ("forward_ms_median", "lean_ms_median",
                                                              "forward_over_lean_median", "bound_ms",
                                                              "forward_over_bound", "lean_over_bound",
                                                              "lean_over_bound_with_kv_cache",
                                                              "lean_over_fastest_matmul_bound")}
        print(summary[str(rows)], flush=True)
    result = {"command": "python benchmarks/decode_step.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "cpu": cpu_model(), "threads": threads,
              "clock": "thread CPU time" if clock is time.thread_time else "wall clock",
              "load_before": load_before, "load_after": load(),
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
              "summary": summary, "steps": results,
              f"lean_profile_share_{results[-1]['rows']}_rows": results[-1]["lean_profile_share"]}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
