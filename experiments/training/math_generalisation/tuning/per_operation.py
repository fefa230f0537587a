"""Per-operation accuracy of tuning runs on the validation split of math_tool_generalisation (training arithmetic).

    python experiments/training/math_generalisation/tuning/per_operation.py outputs/tune_natural outputs/tune_balanced ...

Reads each run's summary.json (the recipe: seed, split, number of problems) and eval_per_task.jsonl, regenerates the
evaluated problems to name each one's operation, and writes table.md and table.json next to this file: per run,
stage and method, the share of problems the team answered right, over all and per operation (add, sub, mul), and
the macro mean over the operations (the number a configuration is chosen by: a team that answers every problem with
one operation cannot score well on it).
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from trl_multiagent.environments.math_problems import generalisation_problems

HERE = Path(__file__).resolve().parent
OPERATIONS = ("add", "sub", "mul")


def run_table(run: Path) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    recipe = summary["recipe"]
    split = recipe.get("eval_dataset_split")
    if split != "validation":
        raise SystemExit(f"{run}: evaluated on {split!r}, not the validation split: not a tuning run")
    rows = [json.loads(line) for line in (run / "eval_per_task.jsonl").read_text().splitlines() if line]
    seed = recipe.get("seed", 0)
    count = max(int(r["task_id"].rsplit("/", 1)[1]) for r in rows) + 1
    problems = {p["task_id"]: p for p in generalisation_problems(count, seed, split)}
    right: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        operation = problems[r["task_id"]]["arithmetic"].split(":")[0]
        for key in ((r["stage"], r["method"], "all"), (r["stage"], r["method"], operation)):
            right[key].append(r["final/team_correct"])
    table = {}
    for (stage, method, part), values in sorted(right.items()):
        table.setdefault(f"{stage}/{method}", {})[part] = {"accuracy": sum(values) / len(values), "tasks": len(values)}
    for cells in table.values():
        cells["macro"] = sum(cells[op]["accuracy"] for op in OPERATIONS if op in cells) / len(OPERATIONS)
    settings = {"dataset_split": recipe.get("dataset_split", "train"), "max_steps": recipe.get("max_steps"),
                "learning_rate": recipe.get("learning_rate"),
                "worked_examples": (recipe.get("env_kwargs") or {}).get("worked_examples", "add_mul")}
    return {"run": str(run), **settings, "seed": seed, "cells": table}


def main(runs: list[str]) -> None:
    tables = [run_table(Path(r)) for r in runs]
    lines = ["| run | examples | training split | steps | lr | stage/method | all | add | sub | mul | macro |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in tables:
        for name, cells in t["cells"].items():
            parts = [f"{cells[p]['accuracy']:.3f} ({cells[p]['tasks']})" if p in cells else "-"
                     for p in ("all", *OPERATIONS)]
            lines.append(f"| {Path(t['run']).name} | {t['worked_examples']} | {t['dataset_split']} | {t['max_steps']} "
                         f"| {t['learning_rate']:g} | {name} | "
                         + " | ".join(parts) + f" | {cells['macro']:.3f} |")
    (HERE / "table.md").write_text("\n".join(lines) + "\n")
    (HERE / "table.json").write_text(json.dumps(tables, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
