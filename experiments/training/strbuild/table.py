"""StrBuild's held-out table for the CoLLM-CC, CoLLM-DC and MAGRPO runs kept here.

    python experiments/training/strbuild/table.py     # reads {cc,dc,magrpo}_summary.json and _eval_per_task.jsonl

Prints one row for the untrained team (the before stage; every run measures it) and one per trained run: the final
world's IoU, same-texture adjacency (lower is better), the return with its 95% bootstrap interval, the return per
held-out string, and the commands accepted and rejected in the last turn.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = {"cc": "CoLLM-CC", "dc": "CoLLM-DC", "magrpo": "MAGRPO"}


def cells(summary: dict, per_task: list[dict], stage: str) -> str:
    m = summary["evaluation"]["methods"]["team"]["metrics"]
    ret = m["return"][stage]
    strings = ", ".join(f"{r['return']:.3f}" for r in per_task if r["stage"] == stage and r["method"] == "team")
    return (f"{m['final/iou'][stage]['mean']:.3f} | {m['final/adjacency'][stage]['mean']:.3f} | "
            f"{ret['mean']:.3f} [{ret['ci95'][0]:.3f}, {ret['ci95'][1]:.3f}] | {strings} | "
            f"{m['final/accepted'][stage]['mean']:.2f} / {m['final/rejected'][stage]['mean']:.2f}")


def main() -> None:
    lines = ["| | generated samples | IoU | adjacency (lower is better) | return [95% bootstrap] | per-string return | "
             "accepted / rejected (last turn) |", "|---|---|---|---|---|---|---|"]
    befores = set()
    rows = []
    for key, name in RUNS.items():
        path = HERE / f"{key}_summary.json"
        if not path.exists():
            continue
        summary = json.loads(path.read_text())
        per_task = [json.loads(line) for line in (HERE / f"{key}_eval_per_task.jsonl").read_text().splitlines()]
        befores.add(cells(summary, per_task, "before"))
        rows.append(f"| {name} | {summary['generated_samples']['total']} | {cells(summary, per_task, 'after')} |")
    if len(befores) != 1:
        raise SystemExit(f"the runs measured different untrained teams: {befores}")
    lines.append(f"| before training | - | {befores.pop()} |")
    lines += rows
    print("\n".join(lines))


if __name__ == "__main__":
    main()
