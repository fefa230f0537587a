"""Collect the seeds of one recipe into experiments/<name>/, and rebuild the table of every trainer in
docs/results.md (issue 18).

Each run directory (the recipe's ``output_dir``, one per seed) is copied to ``<name>/seed<N>/`` (summary.json,
report.md, reward_curve.png, metrics.jsonl, eval_per_task.jsonl and the held-out texts eval_texts_*.jsonl), and ``<name>/table.{json,md}`` list per seed
the team's held-out metric
before and after training and the paired gain, each with its 95% bootstrap interval, the optimizer steps and the
wall time. Then the table between the markers of docs/results.md is rebuilt from every ``*/table.json`` here
that names a trainer, and from every ``*/*/table.json`` (earlier runs of a recipe, kept in a subfolder of its
folder).

    python experiments/training/collect.py tldr_cc outputs/tldr_cc_s0 outputs/tldr_cc_s1 outputs/tldr_cc_s2
    python experiments/training/collect.py --table-only
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = ("summary.json", "report.md", "reward_curve.png", "metrics.jsonl", "eval_per_task.jsonl", "eval_texts_before.jsonl",
         "eval_texts_after.jsonl")
README = HERE.parents[1] / "docs" / "results.md"  # the one results table of the docs
BEGIN, END = "<!-- table: begin (python experiments/training/collect.py) -->", "<!-- table: end -->"


def trainer_name(summary: dict) -> str:
    recipe = summary.get("recipe", {})
    algorithm = summary.get("algorithm") or recipe.get("trainer", "?")
    if recipe.get("trainer") in ("collm", "actor_critic") or algorithm.startswith("CoLLM"):  # actor_critic: its name in older records
        critic = recipe.get("critic", "centralized")
        return "CoLLM-CC" if critic == "centralized" else "CoLLM-DC"
    return algorithm


def row(summary: dict) -> dict:
    ev = summary["evaluation"]
    team = ev["methods"]["team"]
    recipe = summary.get("recipe", {})
    out = {"trainer": trainer_name(summary), "task": recipe.get("environment", "?"), "metric": ev["metric"],
           "seed": recipe.get("seed", 0), "held_out_tasks": ev["held_out_tasks"], "num_samples": ev["num_samples"],
           "before": team["before"], "after": team["after"], "gain": team["gain"],
           "steps": summary.get("global_step"), "wall_time_s": summary["wall_time_s"],
           "command": summary.get("command", "")}
    if "gain_vs_best_baseline" in team:
        out["gain_vs_best_baseline"] = team["gain_vs_best_baseline"]
    return out


def interval(entry: dict, signed: bool = False) -> str:
    lo, hi = entry["ci95"]
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"{f.format(entry['mean'])} [{f.format(lo)}, {f.format(hi)}]"


def copy_seeds(dest_root: Path, run_dirs: list[str], make_row=row) -> list[dict]:
    """Copy each run's files to ``dest_root/seed<N>/`` and write ``dest_root/table.json``; returns the rows by seed."""
    rows = []
    for run in map(Path, run_dirs):
        r = make_row(json.loads((run / "summary.json").read_text()))
        dest = dest_root / f"seed{r['seed']}"
        dest.mkdir(parents=True, exist_ok=True)
        for file in FILES:
            if (run / file).exists():
                shutil.copy2(run / file, dest / file)
        rows.append(r)
    rows.sort(key=lambda r: r["seed"])
    (dest_root / "table.json").write_text(json.dumps(rows, indent=2) + "\n")
    return rows


def collect(name: str, run_dirs: list[str]) -> list[dict]:
    dest_root = HERE / name
    rows = copy_seeds(dest_root, run_dirs)
    lines = ["| seed | held-out tasks x samples | before | after | gain (paired) | steps | wall time |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['seed']} | {r['held_out_tasks']} x {r['num_samples']} | {interval(r['before'])} | "
                     f"{interval(r['after'])} | {interval(r['gain'], True)} | {r['steps']} | "
                     f"{r['wall_time_s'] / 60:.1f} min |")
    (dest_root / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return rows


def rebuild_readme() -> None:
    lines = ["| trainer | task (folder) | metric | seed | before -> after | gain [95% CI] | gain CI > 0 | steps | "
             "minutes |", "|---|---|---|---|---|---|---|---|---|"]
    tables = [*HERE.glob("*/table.json"), *HERE.glob("*/*/table.json")]  # a recipe's folder, then its earlier runs
    for table in sorted(tables, key=lambda t: (t.relative_to(HERE).parts[0], len(t.parts), str(t))):
        folder = table.parent.relative_to(HERE).as_posix()
        for r in json.loads(table.read_text()):
            if "trainer" not in r:
                continue
            lo = r["gain"]["ci95"][0]
            lines.append(f"| {r['trainer']} | {r['task']} ({folder}) | {r['metric']} | {r['seed']} | "
                         f"{r['before']['mean']:.3f} -> {r['after']['mean']:.3f} | {interval(r['gain'], True)} | "
                         f"{'yes' if lo > 0 else 'no'} | {r['steps']} | {r['wall_time_s'] / 60:.1f} |")
    text = README.read_text() if README.exists() else f"# Results\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{README} has no table markers {BEGIN!r} ... {END!r}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(head + BEGIN + "\n" + "\n".join(lines) + "\n" + END + tail)


def main(argv: list[str]) -> int:
    if argv and argv[0] != "--table-only":
        if len(argv) < 2:
            raise SystemExit("usage: collect.py NAME RUN_DIR [RUN_DIR ...] | --table-only")
        collect(argv[0], argv[1:])
    rebuild_readme()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
