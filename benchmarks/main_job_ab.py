"""One setting of the main job, two values: step times, the training passes against the matmul rate, page faults and
peak memory of runs with each value, alternating, each in a process of its own.

    python benchmarks/main_job_ab.py --option per_device_train_batch_size --values 16 64 [--rounds 3] [--steps 5] \
        [--out docs/results/step_profile/micro_batch.json]

Each run is ``python -m trl_multiagent train`` on make demo's recipe (``targets.MAIN_JOB``) for ``--steps`` steps
without evaluation, as ``make bench``'s ``demo_step_s`` runs it, with ``--<option> <value>`` added; the two values
alternate for ``--rounds`` rounds (the first value first). Per run:

* the steps' ``step_time`` and its parts (the mean of the steps after the first: ``demo_step_s``'s definition);
* ``train_pass_vs_matmul`` as ``make bench`` computes it (``targets.train_pass_bound``), at the mean of the 2048^3
  matmul rates measured just before and just after the run;
* the steps' gradient norms (two values that train the same thing give the same norms, up to float summation order);
* from the child's own resource usage (``os.wait4``), over the whole run, loading included: minor page faults,
  system and user CPU seconds and the peak resident memory.

The result keeps each value's runs and, per round, the first value's mean step (and train-pass ratio) over the
second's; their medians summarise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import matmul_flops, write_result
from targets import MAIN_JOB, linear_flops_per_token, train_pass_bound

from trl_multiagent.provenance import cpu_flags, cpu_model

PARTS = ("time/generation", "time/forward", "time/backward", "time/environment")


def run_main_job(out: Path, steps: int, options: list[str]) -> dict:
    """One training run of the main job with ``options`` added to its command line, in a child process (glibc's
    ``MALLOC_*`` and ``GLIBC_TUNABLES`` variables removed): its step metrics and its own resource usage."""
    command = [sys.executable, "-m", "trl_multiagent", "train", "--config", MAIN_JOB, "--max_steps", str(steps),
               "--evaluator", "none", "--output_dir", str(out), "--disable_tqdm", "true", *options]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    rate_before = matmul_flops()
    start = time.perf_counter()
    with open(out.with_suffix(".log"), "w") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(command)} failed ({code}); see {out.with_suffix('.log')}")
    rate = (rate_before + matmul_flops()) / 2
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = [r["step_time"] for r in records if "step_time" in r]
    later = records[1:len(times)]
    summary = json.loads((out / "summary.json").read_text())
    model = summary["recipe"].get("model", "smollm2-135m-instruct")
    return {"options": options, "cpu_allocator": summary["machine"]["cpu_allocator"], "step_time_s": times,
            "mean_step_s_after_first": statistics.fmean(times[1:]),
            "mean_parts_after_first_s": {k: statistics.fmean(r[k] for r in later if k in r) for k in PARTS},
            "train_pass": train_pass_bound(records, linear_flops_per_token(model), rate),
            "grad_norm": [r["grad_norm"] for r in records[:len(times)] if "grad_norm" in r],
            "wall_s": wall, "minor_page_faults": usage.ru_minflt, "system_s": usage.ru_stime,
            "user_s": usage.ru_utime, "peak_rss_mib": usage.ru_maxrss / 1024}


def alternate(ways: dict[str, list[str]], rounds: int, steps: int) -> dict[str, list[dict]]:
    """``rounds`` rounds of one run per way (name -> options), in the order given, each in its own process."""
    runs: dict[str, list[dict]] = {name: [] for name in ways}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(rounds):
            for name, options in ways.items():
                result = run_main_job(Path(tmp) / f"{name}_{round_}", steps, options)
                runs[name].append(result)
                print(f"round {round_ + 1} {name}: {result['mean_step_s_after_first']:.2f} s/step, train pass "
                      f"{result['train_pass']['mean_after_first']:.3f}, {result['minor_page_faults']} faults, "
                      f"peak {result['peak_rss_mib']:.0f} MiB", flush=True)
    return runs


def round_ratios(first: list[dict], second: list[dict]) -> dict[str, list[float]]:
    """Per round, the first way's mean step after the first, and its train-pass ratio, over the second way's."""
    return {"mean_step_after_first": [a["mean_step_s_after_first"] / b["mean_step_s_after_first"]
                                      for a, b in zip(first, second)],
            "train_pass": [a["train_pass"]["mean_after_first"] / b["train_pass"]["mean_after_first"]
                           for a, b in zip(first, second)]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--option", required=True, help="a training option of the CLI, without the dashes")
    parser.add_argument("--values", nargs=2, required=True, metavar=("FIRST", "SECOND"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default=None, help="where to write the result (JSON); printed either way")
    args = parser.parse_args(argv)
    if args.values[0] == args.values[1]:
        parser.error("--values: two different values")
    if args.steps < 3:
        parser.error("--steps: at least 3 (the first step is left out of the means)")
    ways = {value: [f"--{args.option}", value] for value in args.values}
    runs = alternate(ways, args.rounds, args.steps)
    ratios = round_ratios(runs[args.values[0]], runs[args.values[1]])
    write_result(args.out, {
        "command": "python benchmarks/main_job_ab.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_model(), "cpu_flags": cpu_flags(), "recipe": MAIN_JOB, "option": args.option,
        "values": args.values, "steps": args.steps, "rounds": args.rounds, "runs": runs,
        "first_over_second": ratios, "median_first_over_second": {k: statistics.median(v) for k, v in ratios.items()},
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
