"""Where a decoding step's time goes: one decoding step of the main job's base at several batch sizes, against the
matmul rate of the same run.

    python benchmarks/decode_step.py [--out docs/results/generation/decode_step.json]

For each batch size, a 200-token prompt batch is prefilled into the generation's preallocated KV cache, then 10
one-token steps are timed (4-bit SmolLM2-135M computing with its de-quantised copy, adapters off, all threads), once
with ``F.linear`` and once with the frozen weights packed for oneDNN (``PackedFrozenLinears``, what generation uses
on a CPU), alternating. Reported per batch and path: milliseconds per step, tokens/s, and the achieved rate in GFLOP/s
at 2 x parameters FLOPs per token; for batch 64, the torch profiler's share of the step per operator (matmuls by
shape, attention), F.linear path.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections import defaultdict

import torch
from measure import matmul_flops, write_result

from trl_multiagent.agents import AgentPool, AgentSpec
from trl_multiagent.generation import PackedFrozenLinears
from trl_multiagent.generation.kv_cache import preallocated_cache


def steps(model, batch: int, prompt: int = 200, count: int = 10, profile: bool = False):
    ids = torch.randint(100, 1000, (batch, prompt))
    cache = preallocated_cache(model, prompt + count + 1)
    with torch.no_grad():
        model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        token = torch.randint(100, 1000, (batch, 1))
        context = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) \
            if profile else None
        start = time.perf_counter()
        if context is not None:
            context.__enter__()
        for i in range(count):
            model(input_ids=token, cache=cache, use_cache=True, position_ids=torch.full((batch, 1), prompt + i))
        if context is not None:
            context.__exit__(None, None, None)
        seconds = (time.perf_counter() - start) / count
    return seconds, context


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/results/generation/decode_step.json")
    args = parser.parse_args(argv)
    pool = AgentPool([AgentSpec("summary", model="smollm2-135m-instruct", quantization="4bit", lora_r=16,
                                lora_alpha=32)])
    base = next(iter(pool.bases.values()))
    model = base.get_base_model().eval()
    params = sum(p.quant_state.shape.numel() if getattr(p, "quant_state", None) is not None else p.numel()
                 for n, p in model.named_parameters() if "lora_" not in n)
    flops = matmul_flops()
    rows = []
    with base.disable_adapter():
        steps(model, 4, count=2)  # warm-up
        for batch in (1, 4, 16, 64):  # 256 rows x 200 prompt tokens take minutes to prefill
            for path in ("F.linear", "packed", "F.linear", "packed"):
                with PackedFrozenLinears(model) if path == "packed" else contextlib.nullcontext():
                    seconds, _ = steps(model, batch)
                rows.append({"batch": batch, "path": path, "ms_per_step": 1000 * seconds,
                             "tokens_per_s": batch / seconds, "gflops_achieved": batch * 2 * params / seconds / 1e9})
                print(rows[-1], flush=True)
        _, prof = steps(model, 64, count=5, profile=True)
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    shares: dict[str, float] = defaultdict(float)
    for e in prof.key_averages(group_by_input_shape=True):
        name = e.key
        if name == "aten::mm":
            name = f"aten::mm {e.input_shapes[:2]}"
        elif "scaled_dot_product" in name:
            name = "attention (scaled_dot_product)"
        shares[name] += e.self_cpu_time_total / total
    top = dict(sorted(((k, round(v, 4)) for k, v in shares.items()), key=lambda kv: -kv[1])[:12])
    speedup = {}
    for batch in sorted({r["batch"] for r in rows}):
        best = {path: min(r["ms_per_step"] for r in rows if r["batch"] == batch and r["path"] == path)
                for path in ("F.linear", "packed")}
        speedup[str(batch)] = best["F.linear"] / best["packed"]
    result = {"command": "python benchmarks/decode_step.py", "threads": torch.get_num_threads(),
              "parameters": params, "matmul_gflops": flops / 1e9, "steps": rows,
              "packed_speedup_by_batch (best F.linear ms / best packed ms)": speedup,
              "batch_64_profile_share_of_self_cpu_time": top}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
