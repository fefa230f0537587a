"""One decoding step on a GPU: transformers' forward, the lean step, and the lean step replayed from a CUDA graph,
each against the step's bound measured on the same device in the same run.

    python benchmarks/decode_gpu.py --out experiments/speed/gpu/decode_gpu.json      # CUDA: gpu_check.py's 491M Llama
    python benchmarks/decode_gpu.py --device cpu --tiny --out /tmp/decode.json  # the tests' run (no graph on CPU)

The base is ``gpu_check.py``'s random Llama (bf16 on CUDA; ``--tiny``: its tiny one in float32) with two LoRA
adapters (r=8, every linear; B random, so that LoRA is not a no-op) on the two halves of the rows, sorted by adapter
as the decoding loop sorts them. For each row count (``--rows``) a 200-token prompt batch is prefilled once into the
generation's preallocated KV cache; then, in ``--rounds`` alternating rounds, ``--steps`` one-token steps from that
cache along each path:

* ``forward``: transformers' ``LlamaForCausalLM`` forward with PEFT's LoRA layers under ``MultiAdapterBatch``;
* ``lean``: :class:`~trl_multiagent.generation.lean_step.LeanStep` (what generation runs on this base);
* ``lean_graph`` (CUDA only): the same step captured once in a CUDA graph at the prompt's length and replayed. The
  replay writes the same cache position each time, so it is a timing of the step's kernels without their launches
  from Python, not a decoding loop: it is the time a decoding step could reach if each cache length's step were
  captured.

Every step is timed between two ``torch.cuda.synchronize`` (a decoding loop waits for each step's sampled token).
Reported per row count and path: milliseconds per step (median of the rounds); from torch's profiler over 3 steps,
the device operations one step launches and their summed device time (``device_busy_ms``: the step's time if its
kernels ran back to back); and ``step / bound``, the bound being ``max(bytes / bandwidth, FLOPs / matmul rate)`` of
the weights the step reads (frozen linears, LM head, LoRA matrices, at their element size) and the FLOPs ``2 x rows x
weights`` plus attention, with the bandwidth of a 1 GiB device copy (bytes read + written per second) and the matmul
rate of an 8192^3 matmul in the model's dtype (on CPU: 1024^3 and a 64 MiB copy), both measured in this run: the
copy's best of 5 (``decode_step.copy_bandwidth``), the matmul's mean over 5 after a warm-up (``measure.matmul_flops``;
the record of 50a48ac, ``experiments/speed/gpu/2026-11-28-stop55/``, took the best of 5 matmul calls).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from decode_step import copy_bandwidth, step_counts
from gpu_check import GPU_MODEL, TINY_MODEL, build_checkpoint
from measure import matmul_flops, synchronize, write_result

from trl_multiagent.generation import LeanStep, MultiAdapterBatch
from trl_multiagent.generation.kv_cache import preallocated_cache
from trl_multiagent.runtime.provenance import cpu_model
from trl_multiagent.team.pool import AgentPool, AgentSpec

PROMPT = 200
ADAPTERS = ("first", "second")


def device_profile(step, count: int, device: str) -> dict:
    """Device operations per step and their summed device time per step, over ``count`` steps under the profiler."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for i in range(count):
            step(i)
        synchronize(device)
    if device != "cuda":
        return {"device_ops_per_step": None, "device_busy_ms": None}
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy_us = sum(getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0) for e in kernels)
    return {"device_ops_per_step": len(kernels) / count, "device_busy_ms": busy_us / 1000 / count}


def two_adapter_model(path: str, device: str, dtype: str):
    pool = AgentPool([AgentSpec(a, model=path, lora_r=8, lora_alpha=16, lora_dropout=0.0) for a in ADAPTERS],
                     dtype=dtype, dense_copy="never", packed_weights="never")
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in pool.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    pool.to(device)
    (key,) = pool.bases
    return pool.bases[key].get_base_model().eval()


def measure_rows(model, rows: int, steps: int, rounds: int, device: str, bound: dict) -> dict:
    adapters = [ADAPTERS[0]] * (rows - rows // 2) + [ADAPTERS[1]] * (rows // 2)
    ids = torch.randint(3, model.config.vocab_size, (rows, PROMPT), device=device)
    cache = preallocated_cache(model, PROMPT + steps + 1)
    mask = torch.ones(rows, PROMPT + steps + 1, dtype=torch.long, device=device)
    tokens = torch.randint(3, model.config.vocab_size, (rows,), device=device)
    positions = torch.full((rows,), PROMPT, device=device)
    out: dict = {"rows": rows}
    with torch.no_grad(), MultiAdapterBatch(model, adapters) as batch:
        model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        lean = LeanStep(model, batch)

        def forward(i):
            model(input_ids=tokens[:, None], attention_mask=mask[:, :PROMPT + i + 1],
                  position_ids=positions[:, None] + i, cache=cache, use_cache=True)

        def lean_step(i):
            lean(tokens, mask[:, :PROMPT + i + 1], positions + i, cache)

        # the paths' logits at the prompt's length, against the forward's (same cache position written each time)
        cache.set_length(PROMPT)
        reference = model(input_ids=tokens[:, None], attention_mask=mask[:, :PROMPT + 1],
                          position_ids=positions[:, None], cache=cache, use_cache=True).logits[:, -1].float()
        cache.set_length(PROMPT)
        logits = {"lean": lean(tokens, mask[:, :PROMPT + 1], positions, cache)}
        paths = {"forward": forward, "lean": lean_step}
        if device == "cuda":
            paths["lean_graph"], logits["lean_graph"] = captured_step(lean, tokens, mask, positions, cache)
        else:
            out["lean_graph"] = {"skipped": "CUDA graphs need a CUDA device"}
        scale = reference.abs().max().item()
        agreement = {name: (x.float() - reference).abs().max().item() / scale for name, x in logits.items()}

        def run(fn) -> float:
            cache.set_length(PROMPT)
            total = 0.0
            for i in range(steps):
                synchronize(device)
                start = time.perf_counter()
                fn(i)
                synchronize(device)
                total += time.perf_counter() - start
            return total / steps

        for fn in paths.values():  # warm-up
            run(fn)
        times: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(rounds):
            for name, fn in paths.items():
                times[name].append(run(fn))
        counts = step_counts(model, rows, PROMPT + steps // 2)
        element = model.model.embed_tokens.weight.element_size()
        weight_bytes = counts["weight_bytes"] // 4 * element  # step_counts counts float32 bytes
        step_bound = max(weight_bytes / bound["copy_bytes_per_s"], counts["flops"] / bound["matmul_flops_per_s"])
        out["bound_ms"] = 1000 * step_bound
        out["weight_bytes"] = weight_bytes
        out["flops"] = counts["flops"]
        for name, fn in paths.items():
            cache.set_length(PROMPT)
            ms = 1000 * statistics.median(times[name])
            out[name] = {"ms_per_step": ms, "rounds_ms": [1000 * t for t in times[name]],
                         "step_over_bound": ms / out["bound_ms"], **device_profile(fn, 3, device)}
            if name in agreement:  # largest logit difference from the forward's, over the forward's largest logit
                out[name]["max_logit_diff_vs_forward"] = agreement[name]
    return out


def captured_step(lean: LeanStep, tokens, mask, positions, cache):
    """The lean step at the prompt's length captured in a CUDA graph: a step function replaying it, and the logits
    of its first replay."""
    m = mask[:, :PROMPT + 1]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            cache.set_length(PROMPT)
            lean(tokens, m, positions, cache)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    cache.set_length(PROMPT)
    with torch.cuda.graph(graph):
        logits = lean(tokens, m, positions, cache)
    graph.replay()
    return (lambda i: graph.replay()), logits.clone()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/gpu/decode_gpu.json")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="gpu_check.py's tiny model (the tests' run)")
    parser.add_argument("--rows", default="8,64")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("decode_gpu: error: CUDA is not available here (pass --device cpu --tiny for the CPU run)",
              file=sys.stderr)
        return 2
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model_info = build_checkpoint(Path(tmp), TINY_MODEL if args.tiny else GPU_MODEL, dtype, device)
        model = two_adapter_model(tmp, device, "bfloat16" if dtype == torch.bfloat16 else "float32")
    big = device == "cuda"
    bound = {"copy_bytes_per_s": copy_bandwidth(time.perf_counter, 1024 if big else 64, device=device),
             "matmul_flops_per_s": matmul_flops(8192 if big else 1024, repeats=5, device=device, dtype=dtype)}
    result = {"command": "python " + " ".join(sys.argv), "date": _dt.datetime.now(_dt.timezone.utc).isoformat(),
              "device": torch.cuda.get_device_name() if big else cpu_model(), "host_cpu": cpu_model(),
              "torch": torch.__version__, "dtype": str(dtype), "model": model_info, "bound": bound,
              "prompt": PROMPT, "steps": args.steps, "rounds": args.rounds, "by_rows": []}
    for rows in (int(r) for r in args.rows.split(",")):
        result["by_rows"].append(measure_rows(model, rows, args.steps, args.rounds, device, bound))
        r = result["by_rows"][-1]
        print(f"{rows} rows: bound {r['bound_ms']:.3f} ms; " + "; ".join(
            f"{name} {r[name]['ms_per_step']:.2f} ms ({r[name]['step_over_bound']:.1f}x)"
            for name in ("forward", "lean", "lean_graph") if "ms_per_step" in r[name]), flush=True)
    result["runtime_s"] = time.perf_counter() - started
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
