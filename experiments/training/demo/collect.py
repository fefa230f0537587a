"""Collect the demo's seeds into one table: experiments/training/demo/README.md's table and table.json.

Each seed's run directory (``outputs/demo`` for seed 0 from ``make demo``, ``outputs/demo_seed<N>`` for the others)
is copied here as ``seed<N>/`` (summary.json, report.md, reward_curve.png, metrics.jsonl), and the table lists, per
seed, the team's held-out reward before and after training, the paired gain and the paired gain over the best
baseline, each with its 95% bootstrap interval, and every baseline's mean.

    python experiments/training/demo/collect.py outputs/demo outputs/demo_seed1 outputs/demo_seed2

It then rebuilds the table of every trainer in docs/results.md (experiments/training/collect.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import collect as results  # noqa: E402  (experiments/training/collect.py: the copying shared by every recipe's seeds)


def row(summary: dict) -> dict:
    ev = summary["evaluation"]
    team = ev["methods"]["team"]
    seed = summary["recipe"].get("seed", 0)
    out = {"trainer": summary.get("algorithm", "MAGRPO"), "task": summary["recipe"].get("environment", "tldr"),
           "metric": ev["metric"], "steps": summary.get("global_step"),
           "seed": seed, "held_out_tasks": ev["held_out_tasks"], "num_samples": ev["num_samples"],
           "before": team["before"], "after": team["after"], "gain": team["gain"],
           "gain_vs_best_baseline": team["gain_vs_best_baseline"],
           "baselines": {b: ev["methods"][b]["before"]["mean"] for b in ev["baselines"] if b in ev["methods"]},
           "wall_time_s": summary["wall_time_s"]}
    return out


def interval(entry: dict, signed: bool = False) -> str:
    lo, hi = entry["ci95"]
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"{f.format(entry['mean'])} [{f.format(lo)}, {f.format(hi)}]"


def main(run_dirs: list[str]) -> int:
    rows = results.copy_seeds(HERE, run_dirs, row)
    baselines = list(rows[0]["baselines"])
    lines = ["| seed | before | after | gain (paired) | gain vs best baseline | " + " | ".join(baselines) +
             " | wall time |", "|---" * (6 + len(baselines)) + "|"]
    for r in rows:
        vs = r["gain_vs_best_baseline"]
        lines.append(f"| {r['seed']} | {interval(r['before'])} | {interval(r['after'])} | "
                     f"{interval(r['gain'], True)} | {interval(vs, True)} ({vs['baseline']}) | " +
                     " | ".join(f"{r['baselines'][b]:.3f}" for b in baselines) +
                     f" | {r['wall_time_s'] / 60:.1f} min |")
    table = "\n".join(lines)
    print(table)
    (HERE / "table.md").write_text(table + "\n")
    results.rebuild_readme()  # the table of every trainer in docs/results.md
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
