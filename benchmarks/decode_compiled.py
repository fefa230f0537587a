"""The lean decoding step compiled with ``torch.compile`` against the same step eager, with and without packed weights.

    python benchmarks/decode_compiled.py [--out experiments/speed/generation/decode_compiled.json] [--rows 1]

The main job's base as in ``benchmarks/decode_step.py`` (4-bit SmolLM2-135M computing with its de-quantised copy,
two LoRA adapters r=16), a 200-token prompt prefilled, then 8 one-token steps per round: eager with packed weights
(what generation runs), eager without (``packed=False``: ``F.linear``), and compiled without (inductor does not lower
the packed oneDNN op with its weight as an input, so the packed step does not compile). Reported: the first compiled
call's seconds (the compilation), and milliseconds per step of each path (the median of 3 rounds).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from decode_step import run_steps
from measure import write_result

from trl_multiagent.generation import LeanStep, MultiAdapterBatch, PackedFrozenLinears
from trl_multiagent.generation.kv_cache import preallocated_cache
from trl_multiagent.runtime.provenance import cpu_model
from trl_multiagent.team.pool import AgentPool, AgentSpec


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/generation/decode_compiled.json")
    parser.add_argument("--rows", type=int, default=1)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    pool = AgentPool([AgentSpec(a, model="smollm2-135m-instruct", quantization="4bit", lora_r=16, lora_alpha=32)
                      for a in ("first", "second")])
    (key,) = pool.bases
    model = pool.bases[key].get_base_model().eval()
    prompt, steps, rows = 200, 8, args.rows
    adapters = [("first", "second")[i % 2] for i in range(rows)]
    ids = torch.randint(100, 1000, (rows, prompt))
    cache = preallocated_cache(model, prompt + steps + 1)
    mask = torch.ones(rows, prompt + steps, dtype=torch.long)
    tokens = torch.randint(100, 1000, (rows,))
    clock = time.perf_counter
    result = {"cpu": cpu_model(), "threads": torch.get_num_threads(), "rows": rows}
    with torch.no_grad(), MultiAdapterBatch(model, adapters) as batch:
        with PackedFrozenLinears(model, skip=LeanStep.concatenated_modules(model)):
            model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        for name, packed in (("eager_packed", True), ("eager_unpacked", False)):
            step = LeanStep(model, batch, packed=packed)
            run_steps(model, cache, batch, "lean", step, tokens, mask, prompt, 2, clock)
            result[f"{name}_ms"] = 1000 * statistics.median(
                run_steps(model, cache, batch, "lean", step, tokens, mask, prompt, steps, clock) for _ in range(3))
        step = LeanStep(model, batch, packed=False)
        compiled = torch.compile(step.__call__, dynamic=False)
        start = time.perf_counter()
        run_steps(model, cache, batch, "lean", compiled, tokens, mask, prompt, 1, clock)
        result["first_compiled_call_s"] = time.perf_counter() - start
        run_steps(model, cache, batch, "lean", compiled, tokens, mask, prompt, steps, clock)  # every cache length
        result["compiled_unpacked_ms"] = 1000 * statistics.median(
            run_steps(model, cache, batch, "lean", compiled, tokens, mask, prompt, steps, clock) for _ in range(3))
    result["command"] = "python benchmarks/decode_compiled.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
