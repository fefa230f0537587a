"""What keeping freed CPU memory (``cpu_keep_freed_memory``) does to the main job's steps: step times, page faults and
system time of runs with it off and on, alternating, each in a process of its own.

    python benchmarks/allocator.py [--rounds 2] [--steps 5] [--out docs/results/step_profile/allocator.json]
    python benchmarks/allocator.py --memory [--out docs/results/step_profile/allocator_memory.json]

Each run is ``python -m trl_multiagent train`` on make demo's recipe (``targets.MAIN_JOB``) for ``--steps`` steps
without evaluation, as ``make bench``'s ``demo_step_s`` runs it, with ``--cpu_keep_freed_memory`` false or true; the
two alternate for ``--rounds`` rounds (off first). Per run: the steps' ``step_time`` and its parts (the mean of the
steps after the first), and from the child's own resource usage (``os.wait4``): minor page faults, system and user
CPU seconds and the peak resident memory, all over the whole run (loading included), and the allocator the run's
``summary.json`` records (``machine.cpu_allocator``). The result keeps each way's runs, and per round the ratio of
the mean step after the first, off over on.

``--memory`` instead runs ``make bench``'s memory measurement (``bench.py --skip-speed --skip-targets``: peak resident
memory of teams of 1, 2 and 4 agents on one 4-bit base and on separate ones, each in a fresh process) with the
setting off (the library's default) and on (``--memory-keep-freed``), and keeps both summaries.
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

from measure import write_result
from targets import MAIN_JOB

from trl_multiagent.provenance import cpu_flags, cpu_model

PARTS = ("time/generation", "time/forward", "time/backward", "time/environment")


def run(out: Path, steps: int, keep: bool) -> dict:
    """One training run in a child process; its step metrics and its own resource usage."""
    command = [sys.executable, "-m", "trl_multiagent", "train", "--config", MAIN_JOB, "--max_steps", str(steps),
               "--evaluator", "none", "--output_dir", str(out), "--disable_tqdm", "true",
               "--cpu_keep_freed_memory", str(keep).lower()]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    start = time.perf_counter()
    with open(out.with_suffix(".log"), "w") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(child.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(command)} failed ({code}); see {out.with_suffix('.log')}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = [r["step_time"] for r in records if "step_time" in r]
    later = records[1:len(times)]
    summary = json.loads((out / "summary.json").read_text())
    return {"keep_freed": keep, "cpu_allocator": summary["machine"]["cpu_allocator"], "step_time_s": times,
            "mean_step_s_after_first": statistics.fmean(times[1:]),
            "mean_parts_after_first_s": {k: statistics.fmean(r[k] for r in later if k in r) for k in PARTS},
            "wall_s": time.perf_counter() - start, "minor_page_faults": usage.ru_minflt,
            "system_s": usage.ru_stime, "user_s": usage.ru_utime, "peak_rss_mib": usage.ru_maxrss / 1024}


def memory(out_path: str, argv) -> int:
    """The memory measurement of ``make bench`` with the setting off and on."""
    summaries = {}
    with tempfile.TemporaryDirectory() as tmp:
        for way, extra in (("off", []), ("on", ["--memory-keep-freed"])):
            out = Path(tmp) / way
            subprocess.run([sys.executable, "benchmarks/bench.py", "--skip-speed", "--skip-targets", "--out-dir",
                            str(out), *extra], check=True, stdout=subprocess.DEVNULL)
            report = json.loads((out / "bench.json").read_text())["memory"]
            summaries[way] = {"summary": report["summary"], "shared_4_over_1": report["ratio_shared_nmax_over_one"],
                              "allocators": sorted({r.get("allocator", "default") for r in report["runs"]})}
            print(f"{way}: 4 agents shared / 1 = {summaries[way]['shared_4_over_1']:.3f}", flush=True)
    write_result(out_path, {"command": "python benchmarks/allocator.py " + " ".join(argv), "cpu": cpu_model(),
                            "cpu_flags": cpu_flags(), "memory": summaries})
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/results/step_profile/allocator.json")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--memory", action="store_true", help="the memory measurement instead of the step times")
    args = parser.parse_args(argv)
    if args.memory:
        out = args.out if args.out != parser.get_default("out") else "docs/results/step_profile/allocator_memory.json"
        return memory(out, argv if argv is not None else sys.argv[1:])
    runs = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for way in ("off", "on"):
                result = run(Path(tmp) / f"{way}{round_}", args.steps, way == "on")
                runs[way].append(result)
                print(f"round {round_ + 1} {way}: {result['mean_step_s_after_first']:.2f} s/step, "
                      f"{result['minor_page_faults']} faults, {result['system_s']:.1f} s system", flush=True)
    ratios = [a["mean_step_s_after_first"] / b["mean_step_s_after_first"] for a, b in zip(runs["off"], runs["on"])]
    result = {
        "command": "python benchmarks/allocator.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_model(), "cpu_flags": cpu_flags(), "recipe": MAIN_JOB, "steps": args.steps,
        "rounds": args.rounds, "runs": runs, "off_over_on_mean_step_after_first": ratios,
        "median_off_over_on": statistics.median(ratios),
    }
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
