"""Where a step of the main job spends its time: each phase of the step (generation, environment, the loss's forward
and backward, the optimizer) split by kind of operation, from a ``torch.profiler`` record of whole steps.

    python benchmarks/step_profile.py [--steps 4] [--profile 2] [--out experiments/speed/step_profile/step_profile.json]

Runs make demo's recipe (``benchmarks/targets.py:MAIN_JOB``, AT-GRPO math team, without evaluation) for ``--steps``
steps and profiles the last ``--profile`` of them (the first step is never profiled: it pays one-time costs). The
trainer's ``timed`` blocks are profiler ranges named as its metrics (``time/forward``, ``time/backward``, ...), and so
are the rollout (``time/environment``) and the pool's generation within it (``time/generation``), so every operator
is counted in the phase of the innermost range that holds it, as the metrics split the step. Per phase:

* ``seconds``: the phase's time per profiled step (its ranges' durations less the ranges nested in them);
* ``kinds``: the self CPU time of its operators by kind, in seconds per step: ``frozen matmuls`` (the packed oneDNN
  copies of the frozen linears, forward and the input's gradient), ``other matmuls`` (``mm``/``addmm``/``bmm``: LoRA,
  attention as matmuls, weight gradients of LoRA), ``attention kernels``, ``softmax``, ``copies and gathers``,
  ``autograd engine`` (its per-node wrappers), ``element-wise and other`` operators, and ``python``: the range's own
  self time (time in it outside any operator, i.e. Python and dispatch between operators) and that of the Python
  ranges within it (an autograd Function's forward and backward, the optimizer's step);
* ``operators``: the number of operators the phase ran, per step, and the top operators by self time;
* ``model_calls``: its calls of a model per step, counted by their token embeddings (``aten::embedding``: one per
  forward of a transformers model or the lean decoding step).

With the loss's token counts of the profiled steps (``tokens/loss_needed``, ``tokens/loss_completions``), the
frozen matmuls of forward + backward are compared with their FLOPs at the 2048^3 matmul rate measured before and after
the run (the bound of ``train_pass_vs_matmul``, ``benchmarks/targets.py:train_pass_bound``). The profiler adds a few
microseconds per operator: the steps' own metrics (``step_time`` and ``time/*``) of profiled and unprofiled steps are
reported beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch
from measure import KINDS, kind, matmul_flops, write_result
from targets import MAIN_JOB, train_pass_flops, train_pass_step_flops
from transformers import TrainerCallback

from trl_multiagent.runtime.provenance import cpu_model


class ProfileSteps(TrainerCallback):
    """Profiles the training steps from ``first`` on (0-based), all in one record."""

    def __init__(self, first: int):
        self.first = first
        self.profiler = None

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step >= self.first and self.profiler is None:
            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.profiler.start()

    def on_train_end(self, args, state, control, **kwargs):
        if self.profiler is not None:
            self.profiler.stop()


def split_by_phase(events, steps: int) -> dict:
    """Per ``time/*`` range: its seconds, its operators' self time by kind, its operator count and top operators,
    all per step."""
    kinds = defaultdict(lambda: dict.fromkeys(KINDS, 0.0))
    by_op = defaultdict(Counter)
    count, calls = Counter(), Counter()
    for e in events:
        if e.name.startswith("time/"):
            kinds[e.name]["python"] += e.self_cpu_time_total / 1e6
            continue
        parent = e.cpu_parent
        while parent is not None and not parent.name.startswith("time/"):
            parent = parent.cpu_parent
        phase = parent.name if parent is not None else "outside the timed phases"
        kinds[phase][kind(e.name)] += e.self_cpu_time_total / 1e6
        by_op[phase][e.name] += e.self_cpu_time_total / 1e6
        count[phase] += 1
        calls[phase] += e.name == "aten::embedding"
    out = {}
    for phase in sorted(kinds, key=lambda p: -sum(kinds[p].values())):
        out[phase] = {"seconds": sum(kinds[phase].values()) / steps,
                      "kinds": {k: round(v / steps, 4) for k, v in kinds[phase].items()},
                      "operators": count[phase] // steps, "model_calls": calls[phase] / steps,
                      "top_operators": {k: round(v / steps, 4) for k, v in by_op[phase].most_common(10)}}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/step_profile/step_profile.json")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--profile", type=int, default=2, help="how many of the last steps to profile")
    args = parser.parse_args(argv)
    if not 1 <= args.profile < args.steps:
        parser.error("--profile must be at least 1 and fewer than --steps (the first step is not profiled)")
    from trl_multiagent.command.cli import parse_recipe
    from trl_multiagent.command.runner import Run

    rate_before = matmul_flops()
    with tempfile.TemporaryDirectory() as tmp:
        recipe, config, given = parse_recipe(["--config", MAIN_JOB, "--max_steps", str(args.steps), "--evaluator",
                                              "none", "--output_dir", tmp, "--disable_tqdm", "true"])
        run = Run(recipe, config, given, command="benchmarks/step_profile.py")
        run.prepare()
        callback = ProfileSteps(args.steps - args.profile)
        trainer = run.build_trainer(callbacks=[callback])
        start = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - start
        records = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    rate = (rate_before + matmul_flops()) / 2
    start = time.perf_counter()
    phases = split_by_phase(callback.profiler.events(), args.profile)
    analysis_s = time.perf_counter() - start
    steps = [r for r in records if "step_time" in r]
    profiled = steps[-args.profile:]
    metrics = ("step_time", "time/generation", "time/environment", "time/forward", "time/backward",
               "time/optimizer", "tokens/loss_needed", "tokens/loss_completions", "tokens/loss_attention_pairs")
    flops = train_pass_flops(recipe.model or "smollm2-135m-instruct", recipe.lora_r)
    # forward and backward FLOPs of the profiled steps (as targets.train_pass_bound counts them), per step
    step_flops = [train_pass_step_flops(r, flops) for r in profiled]
    loss_flops = statistics.fmean(f["all"] for f in step_flops)
    frozen_flops = statistics.fmean(f["frozen"] for f in step_flops)
    passes = ("time/forward", "time/backward")
    frozen = sum(phases[p]["kinds"]["frozen matmuls"] for p in passes if p in phases)
    train = sum(phases[p]["seconds"] for p in passes if p in phases)
    result = {
        "command": "python benchmarks/step_profile.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__, "recipe": MAIN_JOB,
        "steps": args.steps, "profiled_steps": args.profile, "train_s": train_s, "analysis_s": analysis_s,
        "matmul_gflops": rate / 1e9,
        "step_metrics": [{k: r[k] for k in metrics if k in r} for r in steps],
        "phases": phases,
        "train_pass": {
            "forward_backward_s": train, "flops": loss_flops, "flops_at_matmul_rate_s": loss_flops / rate,
            "ratio": train / (loss_flops / rate), "frozen_flops": frozen_flops,
            "ratio_frozen_linears_only": train / (frozen_flops / rate), "frozen_matmuls_s": frozen,
            "frozen_matmuls_over_their_flops_at_rate": frozen / (frozen_flops / rate),
            "outside_frozen_matmuls_s": train - frozen},
    }
    write_result(args.out, result)
    for phase, entry in phases.items():
        print(f"{phase}: {entry['seconds']:.2f} s, {entry['operators']} operators; "
              + ", ".join(f"{k} {v:.2f}" for k, v in entry["kinds"].items() if v >= 0.01), flush=True)
    print("train pass:", {k: round(v, 3) for k, v in result["train_pass"].items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
