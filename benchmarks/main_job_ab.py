"""One setting of the main job, two values (or the library at an earlier commit against the checkout's): step times,
the training passes against the matmul rate, page faults and peak memory of runs of each, alternating, each in a
process of its own.

    python benchmarks/main_job_ab.py --option per_device_train_batch_size --values 16 64 [--rounds 3] [--steps 5] \
        [--out experiments/speed/step_profile/micro_batch.json]
    python benchmarks/main_job_ab.py --baseline COMMIT [--rounds 3] [--steps 5] [--out ...]

Each run is ``python -m trl_multiagent train`` on make demo's recipe (``targets.MAIN_JOB``) for ``--steps`` steps
without evaluation, as ``make bench``'s ``demo_step_s`` runs it, with ``--<option> <value>`` added; the two values
alternate for ``--rounds`` rounds (the first value first). With ``--baseline``, the two ways are the library of
``COMMIT`` (a ``git worktree`` of it, the child run there with it first on ``PYTHONPATH``; checked to be what the
child imports) and the checkout's, both on the checkout's recipe. Per run:

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
from targets import MAIN_JOB, recipe_train_pass_flops, train_pass_bound

from trl_multiagent.runtime.provenance import cpu_flags, cpu_model

PARTS = ("time/generation", "time/forward", "time/backward", "time/environment")


def run_main_job(out: Path, steps: int, options: list[str], library: str | None = None) -> dict:
    """One training run of the main job with ``options`` added to its command line, in a child process (glibc's
    ``MALLOC_*`` and ``GLIBC_TUNABLES`` variables removed): its step metrics and its own resource usage. ``library``:
    a checkout whose ``trl_multiagent`` the child imports instead of the installed one."""
    recipe = str(Path(__file__).resolve().parents[1] / MAIN_JOB)
    command = [sys.executable, "-m", "trl_multiagent", "train", "--config", recipe, "--max_steps", str(steps),
               "--evaluator", "none", "--output_dir", str(out), "--disable_tqdm", "true", *options]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    if library is not None:  # run from there too: ``-m`` puts the working directory first on the path
        env["PYTHONPATH"] = library
        imported = subprocess.run([sys.executable, "-c", "import trl_multiagent; print(trl_multiagent.__file__)"],
                                  env=env, cwd=library, check=True, capture_output=True, text=True).stdout.strip()
        if not Path(imported).resolve().is_relative_to(Path(library).resolve()):
            raise SystemExit(f"the child imports {imported}, not the library in {library}")
    rate_before = matmul_flops()
    start = time.perf_counter()
    with open(out.with_suffix(".log"), "w") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=library)
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
    return {"options": options, "library": library or "installed", "cpu_allocator": summary["machine"]["cpu_allocator"], "step_time_s": times,
            "mean_step_s_after_first": statistics.fmean(times[1:]),
            "mean_parts_after_first_s": {k: statistics.fmean(r[k] for r in later if k in r) for k in PARTS},
            "train_pass": train_pass_bound(records, recipe_train_pass_flops(summary["recipe"]), rate),
            "grad_norm": [r["grad_norm"] for r in records[:len(times)] if "grad_norm" in r],
            "wall_s": wall, "minor_page_faults": usage.ru_minflt, "system_s": usage.ru_stime,
            "user_s": usage.ru_utime, "peak_rss_mib": usage.ru_maxrss / 1024}


def alternate(ways: dict[str, list[str]], rounds: int, steps: int,
              libraries: dict[str, str] | None = None) -> dict[str, list[dict]]:
    """``rounds`` rounds of one run per way (name -> options), in the order given, each in its own process;
    ``libraries``: the checkout a way's runs import (:func:`run_main_job`), by name."""
    runs: dict[str, list[dict]] = {name: [] for name in ways}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(rounds):
            for index, (name, options) in enumerate(ways.items()):
                result = run_main_job(Path(tmp) / f"way{index}_{round_}", steps, options,
                                      (libraries or {}).get(name))
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
    parser.add_argument("--option", help="a training option of the CLI, without the dashes")
    parser.add_argument("--values", nargs=2, metavar=("FIRST", "SECOND"))
    parser.add_argument("--baseline", help="instead of --option: a commit whose library runs against the checkout's")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default=None, help="where to write the result (JSON); printed either way")
    args = parser.parse_args(argv)
    if (args.baseline is None) == (args.option is None or args.values is None):
        parser.error("give either --option and --values, or --baseline")
    if args.values and args.values[0] == args.values[1]:
        parser.error("--values: two different values")
    if args.steps < 3:
        parser.error("--steps: at least 3 (the first step is left out of the means)")
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline is None:
            ways, libraries = {value: [f"--{args.option}", value] for value in args.values}, {}
        else:
            repo = Path(__file__).resolve().parents[1]
            commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", args.baseline], check=True,
                                    capture_output=True, text=True).stdout.strip()
            worktree = Path(tmp) / "baseline"
            subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(worktree), commit],
                           check=True, capture_output=True)
            args.values = [f"library at {commit}", "library of the checkout"]
            ways, libraries = {args.values[0]: [], args.values[1]: []}, {args.values[0]: str(worktree)}
        try:
            runs = alternate(ways, args.rounds, args.steps, libraries)
        finally:
            if libraries:
                subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(worktree)], check=True)
    ratios = round_ratios(runs[args.values[0]], runs[args.values[1]])
    write_result(args.out, {
        "command": "python benchmarks/main_job_ab.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_model(), "cpu_flags": cpu_flags(), "recipe": MAIN_JOB, "option": args.option, "baseline": args.baseline,
        "values": args.values, "steps": args.steps, "rounds": args.rounds, "runs": runs,
        "first_over_second": ratios, "median_first_over_second": {k: statistics.median(v) for k, v in ratios.items()},
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
