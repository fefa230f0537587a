"""The teacher-forced pass packed against one row per completion: the loss's log-prob pass of one step of the main
job, forward and backward, the ways alternating in one process.

    python benchmarks/packed_completions.py [--micro_batches 64 16] [--main_job_steps 4] [--repeats 5] \
        [--baseline COMMIT] [--out experiments/speed/teacher_forcing/packed_completions.json]

The step's 48 samples are ``benchmarks/loss_pass.py``'s (``loss_positions.step_prompts``: the math team's prompts of
4 training problems, both agents, first and second turns, K = 4 each; completion lengths drawn from 5 to 40, seeded;
random completion tokens), on the embedded SmolLM2-135M-Instruct in float32 with one LoRA adapter (r 16, B made
non-zero), run as the trainer runs an update: micro-batches in prompt order, the shared prefixes stored once when
there are several, each micro-batch's ``sum(logps x mask)`` sent backward.

- ``rows``: the distinct prompts' rests in one stage, then one row per completion (each row's prompt cache gathered,
  completions in length buckets, each padded to its bucket's longest): the library before packing, and still the
  path of models that cannot take the packed mask (``teacher_forcing.packs_completions``); selected here by emptying
  ``PACKED_MODEL_TYPES``;
- ``packed``: the library (``teacher_forcing._packed_rests_and_completions``: each distinct prompt's rest and its
  completions as one sequence);
- ``baseline`` (with ``--baseline COMMIT``): the teacher-forced pass of the library at ``COMMIT`` (its
  ``teacher_forcing.py``, loaded from git beside this one), with packing as that commit packs.

The main job's own batches too (``--main_job_steps``, 0: skip): the script first trains make demo's recipe
(``targets.MAIN_JOB``, no evaluation) for that many steps in this process, keeping the batch of every log-prob pass
with gradients that the trainer runs (one per step: the recipe's step is one micro-batch) and the callable it runs
it with (the pool bound to the policy). After training, each batch runs every way, alternating, on the trained
adapter, with the process's allocator as the trainer left it (the recipe keeps freed memory).

Before timing, each way's log-probs and LoRA gradients are compared with ``rows``'. The result keeps every round's
seconds, the medians and the medians of the paired ratios rows / packed (and baseline / packed), per micro-batch
size and per main-job batch.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time

import torch
from loss_pass import micro_batches, step_workload
from measure import matmul_flops, paired_medians, write_result
from targets import MAIN_JOB

from trl_multiagent.generation import logprobs, teacher_forcing
from trl_multiagent.generation.logprobs import completion_logps
from trl_multiagent.generation.teacher_forcing import PrefixStore, completion_outputs, lm_forward
from trl_multiagent.runtime.provenance import cpu_flags, cpu_model

TEMPERATURE = 0.7
PACKED_TYPES = teacher_forcing.PACKED_MODEL_TYPES


def main_job_batches(steps: int) -> list:
    """``(model, batch)`` of every log-prob pass with gradients of ``steps`` steps of the main job, trained here."""
    from trl_multiagent.command.cli import main as cli
    from trl_multiagent.trainers.compat import TeamTrainerSurface

    kept, original = [], TeamTrainerSurface.token_logps

    def keep(self, model, prompt_ids, prompt_mask, completion_ids, completion_mask, compute_entropy=False):
        if torch.is_grad_enabled():
            kept.append((model, (prompt_ids, prompt_mask, completion_ids, completion_mask)))
        return original(self, model, prompt_ids, prompt_mask, completion_ids, completion_mask, compute_entropy)

    TeamTrainerSurface.token_logps = keep
    try:
        with tempfile.TemporaryDirectory() as out:
            code = cli(["train", "--config", MAIN_JOB, "--max_steps", str(steps), "--evaluator", "none",
                        "--output_dir", out, "--disable_tqdm", "true"])
    finally:
        TeamTrainerSurface.token_logps = original
    if code:
        raise SystemExit(f"the main job failed ({code})")
    return kept


def compare(step, label: str, repeats: int, ways=("rows", "packed")) -> dict:
    """Each way of ``step(way) -> (logps, grads, calls)``: checked against ``rows``, then all timed alternately."""
    results = {way: step(way) for way in ways}
    reference = results["rows"]
    check = {}
    for way in ways[1:]:
        got = results[way]
        found = {"logps_max_abs_diff": (got[0] - reference[0]).abs().max().item(),
                 "grad_max_abs_diff": max((a - b).abs().max().item() for a, b in zip(got[1], reference[1])),
                 "grad_max_abs": max(g.abs().max().item() for g in reference[1])}
        if found["logps_max_abs_diff"] > 1e-3 or found["grad_max_abs_diff"] > 1e-4 * found["grad_max_abs"]:
            raise SystemExit(f"{way} differs from rows ({label}): {found}")
        check[way] = found
    times = {way: [] for way in ways}
    for _ in range(repeats):
        for way in times:
            start = time.perf_counter()
            step(way)
            times[way].append(time.perf_counter() - start)
    medians, ratios = paired_medians(times, "rows")
    out = {"check": check if len(ways) > 2 else check["packed"],
           "model_calls": {way: r[2] for way, r in results.items()},
           "positions_computed": {way: sum(rows * width for rows, width in r[2]) for way, r in results.items()},
           "seconds_median": medians, "seconds_all": times, "rows_over_packed": ratios["packed"]}
    if "baseline" in ways:
        out["rows_over"] = ratios
        out["baseline_over_packed"] = paired_medians(times, "baseline")[1]["packed"]
    print(label, medians, {k: v for k, v in out.items() if k.endswith("_over_packed")}, flush=True)
    return out


def baseline_completion_outputs(commit: str):
    """``completion_outputs`` of the library at ``commit``: its ``teacher_forcing.py`` (``git show``) loaded as a
    module of this package, so that its relative imports resolve to the checkout's other modules."""
    import importlib.util
    import subprocess
    from pathlib import Path

    source = subprocess.run(["git", "show", f"{commit}:trl_multiagent/generation/teacher_forcing.py"], check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="baseline-")) / "teacher_forcing.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("trl_multiagent._baseline_teacher_forcing", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/teacher_forcing/packed_completions.json")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--micro_batches", type=int, nargs="+", default=[64, 16])
    parser.add_argument("--main_job_steps", type=int, default=4)
    parser.add_argument("--baseline", default=None,
                        help="a commit whose teacher-forced pass runs as a third way, 'baseline' (packed as it packs)")
    args = parser.parse_args(argv)
    ways = ("rows", "packed") + (("baseline",) if args.baseline else ())
    baseline = baseline_completion_outputs(args.baseline) if args.baseline else None

    def using(way: str):
        """Set the pass of ``way``; returns what undoes it."""
        teacher_forcing.PACKED_MODEL_TYPES = PACKED_TYPES if way != "rows" else frozenset()
        logprobs.completion_outputs = baseline.completion_outputs if way == "baseline" else completion_outputs

        def undo():
            teacher_forcing.PACKED_MODEL_TYPES = PACKED_TYPES
            logprobs.completion_outputs = completion_outputs
        return undo
    pool, prompts, lengths = step_workload()
    model = functools.partial(pool, "solver")
    params = pool.policy_parameters("solver")
    calls: list[tuple[int, int]] = []

    def counted(**inputs):
        calls.append(tuple(inputs["input_ids"].shape))
        return model(**inputs)

    counted.config = pool.config_of("solver")

    def step(way: str, batches):
        undo = using(way)
        pool.zero_grad()
        calls.clear()
        store = PrefixStore.build(lm_forward(model), prompts, torch.device("cpu")) if len(batches) > 1 else None
        logps = []
        for batch in batches:
            lp = completion_logps(counted, *batch, TEMPERATURE, compute_entropy=True, prefix_store=store)[0]
            (lp * batch[3]).sum().backward()
            logps.append(lp[batch[3].bool()].detach())
        if store is not None:
            store.backward()
        undo()
        return torch.cat(logps), [p.grad.clone() for p in params], list(calls)

    rate_before = matmul_flops()
    runs = {}
    for size in args.micro_batches:
        batches = micro_batches(prompts, lengths, size, pool.tokenizer_of("solver").vocab_size)
        runs[str(size)] = {"micro_batches": len(batches),
                           **compare(functools.partial(step, batches=batches), f"micro-batch {size}", args.repeats,
                                           ways)}
    main_job = []
    if args.main_job_steps:
        del pool, model, counted, params  # the trained pool takes their place
        for n, (run, batch) in enumerate(main_job_batches(args.main_job_steps)):
            trained, policy = getattr(run.func, "module", run.func), run.args[0]  # the pool, the policy's name

            def counted_run(_run=run, **inputs):
                calls.append(tuple(inputs["input_ids"].shape))
                return _run(**inputs)

            counted_run.config = trained.config_of(policy)

            def main_step(way, _pool=trained, _policy=policy, _batch=batch, _counted=counted_run):
                undo = using(way)
                _pool.zero_grad()
                calls.clear()
                lp = completion_logps(_counted, *_batch, TEMPERATURE, compute_entropy=True)[0]
                (lp * _batch[3]).sum().backward()
                undo()
                return (lp[_batch[3].bool()].detach(), [p.grad.clone() for p in _pool.policy_parameters(_policy)],
                        list(calls))

            main_job.append({"rows": int(batch[2].size(0)), "completion_tokens": int(batch[3].sum()),
                             "distinct_prompts": len({tuple(r[m.bool()].tolist()) for r, m in zip(batch[0], batch[1])}),
                             **compare(main_step, f"main job batch {n + 1}", args.repeats, ways)})
    result = {
        "command": "python benchmarks/packed_completions.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_model(), "cpu_flags": cpu_flags(), "threads": torch.get_num_threads(), "torch": torch.__version__,
        "baseline": args.baseline, "samples": len(prompts), "distinct_prompts": len({tuple(p) for p in prompts}),
        "completion_tokens": sum(lengths), "repeats": args.repeats,
        "matmul_gflops": (rate_before + matmul_flops()) / 2e9,
        "by_micro_batch": runs,
        "main_job_steps": args.main_job_steps, "main_job_batches": main_job,
    }
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
