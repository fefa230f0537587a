"""Reruns of the main job's seed 0 against the recorded one: the spread of its result (issue 39, point 2).

    python experiments/training/math_generalisation/reruns/compare.py NAME=RUN_DIR [NAME=RUN_DIR ...]

Each RUN_DIR is an output folder of recipes/configs/math_generalisation_at_grpo.yaml with seed 0. For each, against
``../seed0/``: whether the held-out answers and texts are the same bytes, the held-out accuracy before and after and
the paired gain, the largest relative difference of any logged training number (losses, rewards, gradient norms;
not times), and the kernels it ran with (summary.json's ``machine``). Copies each run's summary.json to
``<NAME>/summary.json`` here and writes ``table.md``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECORDED = HERE.parent / "seed0"
SAME_BYTES = ("eval_per_task.jsonl", "eval_texts_before.jsonl", "eval_texts_after.jsonl")


def team_result(summary: dict) -> tuple[float, float, float, list[float]]:
    metric = summary["evaluation"]["methods"]["team"]["metrics"]["final/team_correct"]
    return metric["before"]["mean"], metric["after"]["mean"], metric["gain"]["mean"], metric["gain"]["ci95"]


def largest_metric_difference(run: Path) -> float:
    """max |a - b| / max(|b|, 1e-12) over the numbers both metrics.jsonl log at a step, times left out."""
    ours = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    recorded = [json.loads(line) for line in (RECORDED / "metrics.jsonl").read_text().splitlines() if line]
    if len(ours) != len(recorded):
        return float("inf")
    largest = 0.0
    for a, b in zip(ours, recorded):
        for key, value in a.items():
            other = b.get(key)
            if "time" in key or key.endswith("_s") or "per_s" in key or not isinstance(value, (int, float)) \
                    or not isinstance(other, (int, float)):
                continue
            largest = max(largest, abs(value - other) / max(abs(other), 1e-12))
    return largest


def row(name: str, run: Path) -> str:
    summary = json.loads((run / "summary.json").read_text())
    machine = summary["machine"]
    same = all((run / f).read_bytes() == (RECORDED / f).read_bytes() for f in SAME_BYTES)
    before, after, gain, ci = team_result(summary)
    kernels = f"{machine['cpu']}, ATen {machine['aten_cpu_capability']}"
    for variable, library in (("ONEDNN_MAX_CPU_ISA", "oneDNN"), ("MKL_ENABLE_INSTRUCTIONS", "MKL")):
        if machine.get("env", {}).get(variable):
            kernels += f", {library} {machine['env'][variable]}"
    return (f"| {name} | {kernels} | {machine['torch_threads']} | {'yes' if same else 'no'} | {before:.3f} | "
            f"{after:.3f} | {gain:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}] | {largest_metric_difference(run):.1e} |")


def main(pairs: list[str]) -> None:
    if not pairs:
        raise SystemExit(__doc__)
    lines = ["| run | CPU, kernels | threads | held-out answers and texts the same bytes as seed0/ | before | after | "
             "gain [95% CI] | largest relative difference of a logged training number |",
             "|---|---|---|---|---|---|---|---|", row("recorded (`../seed0/`)", RECORDED)]
    for pair in pairs:
        name, _, folder = pair.partition("=")
        run = Path(folder)
        lines.append(row(name, run))
        (HERE / name).mkdir(exist_ok=True)
        shutil.copy(run / "summary.json", HERE / name / "summary.json")
    (HERE / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
