"""Time the main job's before-training evaluation (the four baselines on held-out TLDR posts) in one process.

    python benchmarks/eval_speed.py [--problems 10] [--samples 4] [--no-share-draws] [--out FILE]

The pool, prompts, decoding and batch bound are the demo's (recipes/configs/tldr_magrpo.yaml): two QLoRA adapters on one
4-bit SmolLM2-135M, 48 new tokens, temperature 0.8, top-p 0.95, at most 256 sequences per batch; the baselines run
with the adapters off. Prints (and writes to ``--out``, as JSON) the seconds, generated sequences and tokens, the
prompt tokens prefilled, and a 2048^3 matmul timed in the same run, so that runs on different code can be compared
as ratios. Run it against an older checkout with ``PYTHONPATH=<checkout> python benchmarks/eval_speed.py``.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from pathlib import Path

import torch
from measure import matmul_flops, write_result
from transformers import GenerationConfig

import trl_multiagent
from trl_multiagent.environments.writing import TLDREnv
from trl_multiagent.evaluation.core import evaluate_team
from trl_multiagent.evaluation.writing import BASELINES, WritingEvaluator
from trl_multiagent.team.pool import AgentPool, AgentSpec


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=10)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--no-share-draws", action="store_true", help="every baseline draws its own first round")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    specs = [AgentSpec(name=n, model="smollm2-135m-instruct", quantization="4bit", lora_r=16, lora_alpha=32)
             for n in ("summary", "elaboration")]
    pool = AgentPool(specs)
    tasks = TLDREnv.make_rows(args.problems, seed=0, split="eval")
    config = GenerationConfig(max_new_tokens=48, do_sample=True, temperature=0.8, top_p=0.95)
    counts = {"decode_calls": 0, "prompt_rows": 0, "prompt_tokens": 0, "new_tokens": 0}
    try:  # the module whose decode generate_team calls
        import trl_multiagent.generation.team as dispatch
    except ImportError:  # a checkout from before generation/ was a package
        import trl_multiagent.generation as dispatch
    decode = dispatch.decode

    def counting_decode(model, input_ids, attention_mask, *a, **kw):  # what each call prefills and generates
        out = decode(model, input_ids, attention_mask, *a, **kw)
        prefix = kw.get("prefix")
        counts["decode_calls"] += 1
        counts["prompt_rows"] += input_ids.size(0)
        counts["prompt_tokens"] += int(attention_mask.sum()) + (int(prefix[1].sum()) if prefix is not None else 0)
        counts["new_tokens"] += sum(map(len, out))
        return out

    dispatch.decode = counting_decode
    forward = {"prefill_positions": 0, "decode_positions": 0, "forward_calls": 0}

    def count_positions(module, args, kwargs):  # every position a forward computes, padding included
        ids = kwargs["input_ids"]
        forward["prefill_positions" if ids.size(1) > 1 else "decode_positions"] += ids.numel()
        forward["forward_calls"] += 1

    for base in pool.bases.values():
        base.get_base_model().register_forward_pre_hook(count_positions, with_kwargs=True)
    kwargs = {"share_draws": False} if args.no_share_draws else {}
    if args.no_share_draws and "share_draws" not in inspect.signature(evaluate_team).parameters:
        kwargs = {}  # a checkout from before draws were shared never shares them
    start = time.perf_counter()
    result = evaluate_team(pool, WritingEvaluator(TLDREnv), tasks, list(BASELINES), args.samples, config,
                           stage="before", seed=0, max_batch_sequences=256, **kwargs)
    seconds = time.perf_counter() - start
    flops = matmul_flops()
    record = {"problems": args.problems, "samples": args.samples, "seconds": round(seconds, 1),
              "generated_sequences": result.generated_sequences, "generate_calls": result.generate_calls,
              **counts, **forward, "matmul_gflops": round(flops / 1e9, 1), "torch_threads": torch.get_num_threads(),
              "reward": {m: round(r.mean("reward"), 4) for m, r in result.methods.items()},
              "code": str(Path(trl_multiagent.__file__).resolve().parent.parent)}
    write_result(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
