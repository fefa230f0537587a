"""Role-sharing against per-role AT-GRPO on the same held-out problems, seed by seed (AT-GRPO Sec. 4.1-4.2).

    python experiments/training/math_easy_at_grpo_specialized/compare.py     # -> compare.md next to this file

Reads each seed's eval_per_task.jsonl here (per-role) and in ../math_easy_at_grpo/ (role-sharing). A seed of both
recipes evaluates the same 80 problems with the same untrained team, so the trained teams can be paired by problem:
per-role minus role-sharing, after training, with the paired 95% bootstrap interval the runs' own gains use.
"""

from __future__ import annotations

import json
from pathlib import Path

from trl_multiagent.metrics.stats import paired_bootstrap

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent / "math_easy_at_grpo"
QUANTITIES = {"final/team_correct": "team answer right (the metric)", "final/reasoner_correct": "reasoner right",
              "final/tool_correct": "tool program's answer right", "final/agreed": "the two agents agree",
              "final/reasoner_format": "reasoner writes a box", "turns": "turns played"}


def per_task(folder: Path, seed: int) -> dict[str, dict[str, dict]]:
    """{stage: {task_id: row}} of the team's held-out episodes."""
    rows: dict[str, dict[str, dict]] = {}
    for line in (folder / f"seed{seed}" / "eval_per_task.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["method"] == "team":
            rows.setdefault(row["stage"], {})[row["task_id"]] = row
    return rows


def mean(rows: dict[str, dict], key: str) -> float:
    return sum(r[key] for r in rows.values()) / len(rows)


def main() -> None:
    lines = []
    for seed in (0, 1, 2):
        shared, per_role = per_task(SHARED, seed), per_task(HERE, seed)
        tasks = sorted(shared["after"])
        if sorted(per_role["after"]) != tasks:
            raise SystemExit(f"seed {seed}: the two recipes evaluated different problems")
        if any(shared["before"][t][k] != per_role["before"][t][k] for t in tasks for k in QUANTITIES):
            raise SystemExit(f"seed {seed}: the untrained teams of the two recipes differ")
        diff = paired_bootstrap([per_role["after"][t]["final/team_correct"] for t in tasks],
                                [shared["after"][t]["final/team_correct"] for t in tasks])
        lines += [f"## Seed {seed}", "",
                  f"Per-role minus role-sharing, team answer right after training, paired over {len(tasks)} problems: "
                  f"{diff['mean']:+.3f} [{diff['ci95'][0]:+.3f}, {diff['ci95'][1]:+.3f}]", "",
                  "| quantity | before (both) | role-sharing after | per-role after |", "|---|---|---|---|"]
        for key, name in QUANTITIES.items():
            lines.append(f"| {name} | {mean(shared['before'], key):.3f} | {mean(shared['after'], key):.3f} | "
                         f"{mean(per_role['after'], key):.3f} |")
        lines.append("")
    (HERE / "compare.md").write_text("# Role-sharing against per-role, paired by problem (`compare.py`)\n\n"
                                     + "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
