"""What keeping freed CPU memory (``cpu_keep_freed_memory``) does to the main job's steps: step times, page faults and
system time of runs with it off and on, alternating, each in a process of its own.

    python benchmarks/allocator.py [--rounds 2] [--steps 5] [--out experiments/speed/step_profile/allocator.json]
    python benchmarks/allocator.py --memory [--out experiments/speed/step_profile/allocator_memory.json]

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
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from main_job_ab import alternate
from measure import write_result
from targets import MAIN_JOB

from trl_multiagent.runtime.provenance import cpu_flags, cpu_model


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
    parser.add_argument("--out", default="experiments/speed/step_profile/allocator.json")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--memory", action="store_true", help="the memory measurement instead of the step times")
    args = parser.parse_args(argv)
    if args.memory:
        out = args.out if args.out != parser.get_default("out") else "experiments/speed/step_profile/allocator_memory.json"
        return memory(out, argv if argv is not None else sys.argv[1:])
    runs = alternate({way: ["--cpu_keep_freed_memory", str(way == "on").lower()] for way in ("off", "on")},
                     args.rounds, args.steps)
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
