"""What the main job's generation computes: its decoding calls (prefill and decoding steps) and the rows and cache
lengths of their decoding steps.

    python benchmarks/generation_shapes.py [--steps 4] [--out experiments/speed/step_profile/generation_shapes.json]

Runs make demo's recipe (``benchmarks/targets.py:MAIN_JOB``, without evaluation) for ``--steps`` training steps with
the decoding loop (``generation.decoding.decode``, as ``generation/team.py`` calls it) and the lean decoding step
(``LeanStep.__call__``) wrapped to record, without changing what they compute:

* per decoding call: its prompt rows and their width, the shared prefixes' shape, the samples drawn (``expand``),
  its seconds, and how many decoding steps it ran and their seconds; the rest of a call (``other_s``) is its prefill,
  its cache moves and its sampling;
* per decoding step: its rows, its cached positions (the attention mask's width) and its seconds, and the keys and
  values its attention reads (rows x positions x layers x 2 x key/value heads x head_dim x 4 bytes).

Reported per training step (the trainer's ``time/generation`` beside the calls' seconds) and summed over the steps
after the first (the first pays one-time costs): the decoding steps' seconds by row count (0-7, 8-15, 16-31, 32 and
more rows), their mean cached positions, and the bytes of keys and values they read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from measure import write_result
from targets import MAIN_JOB

from trl_multiagent.runtime.provenance import kernel_record

ROW_BINS = ((0, 7), (8, 15), (16, 31), (32, None))


def bin_of(rows: int) -> str:
    for low, high in ROW_BINS:
        if rows >= low and (high is None or rows <= high):
            return f"{low}+" if high is None else f"{low}-{high}"
    raise ValueError(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/step_profile/generation_shapes.json")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first step is reported apart)")
    import trl_multiagent.generation.team as team
    from trl_multiagent.command.cli import parse_recipe
    from trl_multiagent.command.runner import Run
    from trl_multiagent.generation.lean_step import LeanStep

    calls, steps = [], []
    step_call = LeanStep.__call__
    decode = team.decode

    def timed_step(self, tokens, mask, positions, cache):
        start = time.perf_counter()
        out = step_call(self, tokens, mask, positions, cache)
        # one position's keys and values over the layers, in the cache's dtype (the embedding's)
        per_position = len(self.layers) * 2 * self.kv_heads * self.head_dim * self.embed.element_size()
        steps.append({"rows": int(tokens.numel()), "positions": int(mask.size(1)), "s": time.perf_counter() - start,
                      "kv_bytes": int(tokens.numel()) * int(mask.size(1)) * per_position})
        return out

    def timed_decode(model, input_ids, attention_mask, config, *rest, **kw):
        first, start = len(steps), time.perf_counter()
        out = decode(model, input_ids, attention_mask, config, *rest, **kw)
        seconds = time.perf_counter() - start
        mine = steps[first:]
        prefix, expand = kw.get("prefix"), kw.get("expand")
        calls.append({"rows": int(input_ids.size(0)), "width": int(input_ids.size(1)),
                      "prefix": None if prefix is None else list(prefix[0].shape),
                      "samples": None if expand is None else int(expand.numel()), "s": seconds,
                      "decode_steps": len(mine), "decode_s": sum(s["s"] for s in mine),
                      "other_s": seconds - sum(s["s"] for s in mine), "first_step": first})
        return out

    LeanStep.__call__ = timed_step
    team.decode = timed_decode
    try:
        with tempfile.TemporaryDirectory() as tmp:
            recipe, config, given = parse_recipe(["--config", MAIN_JOB, "--max_steps", str(args.steps), "--evaluator",
                                                  "none", "--output_dir", tmp, "--disable_tqdm", "true"])
            run = Run(recipe, config, given, command="benchmarks/generation_shapes.py")
            run.prepare()
            marks = []  # (calls, decoding steps) recorded when each training step began

            from transformers import TrainerCallback

            class Mark(TrainerCallback):
                def on_step_begin(self, *a, **k):
                    marks.append((len(calls), len(steps)))

            trainer = run.build_trainer(callbacks=[Mark()])
            trainer.train()
            records = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    finally:
        LeanStep.__call__ = step_call
        team.decode = decode
    metrics = [r for r in records if "step_time" in r]
    per_step = []
    bounds = marks + [(len(calls), len(steps))]
    for i, record in enumerate(metrics):
        (c0, s0), (c1, s1) = bounds[i], bounds[i + 1]
        mine = steps[s0:s1]
        per_step.append({"step_time": record["step_time"], "time/generation": record["time/generation"],
                         "decoding_calls": c1 - c0, "calls_s": sum(c["s"] for c in calls[c0:c1]),
                         "decode_steps": len(mine), "decode_s": sum(s["s"] for s in mine),
                         "other_s": sum(c["other_s"] for c in calls[c0:c1])})
    later = steps[bounds[1][1]:]
    by_rows = {}
    for low, high in ROW_BINS:
        name = f"{low}+" if high is None else f"{low}-{high}"
        chosen = [s for s in later if bin_of(s["rows"]) == name]
        by_rows[name] = {"steps": len(chosen), "s": sum(s["s"] for s in chosen),
                         "mean_positions": statistics.fmean(s["positions"] for s in chosen) if chosen else None,
                         "kv_mb": sum(s["kv_bytes"] for s in chosen) / 1e6}
    after = per_step[1:]
    result = {
        "command": "python benchmarks/generation_shapes.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "recipe": MAIN_JOB, "kernels": kernel_record(), "torch": torch.__version__, "steps": args.steps,
        "per_step": per_step,
        "after_first_step": {
            "steps": len(after),
            "generation_s_per_step": statistics.fmean(s["time/generation"] for s in after),
            "decode_steps_s_per_step": statistics.fmean(s["decode_s"] for s in after),
            "calls_other_s_per_step": statistics.fmean(s["other_s"] for s in after),
            "decode_steps_per_step": statistics.fmean(s["decode_steps"] for s in after),
            "mean_rows": statistics.fmean(s["rows"] for s in later),
            "mean_positions": statistics.fmean(s["positions"] for s in later),
            "kv_mb_per_step": sum(s["kv_bytes"] for s in later) / 1e6 / len(after),
            "decoding_steps_by_rows": by_rows,
        },
        "calls": calls, "decoding_steps": steps,
    }
    write_result(args.out, result)
    print(json.dumps(result["after_first_step"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
