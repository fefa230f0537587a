"""The single-agent comparison over seeds: one table from each seed<N>/result.json (written by single_agent_grpo.py).

    python experiments/training/math_generalisation/single_agent/table.py    # -> single_agent/table.md

Besides the accuracies, each row counts the operation the single agent writes first in its answers ("a + b") next
to the operation the held-out problems need (regenerated from the seed, as the evaluation drew them).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from trl_multiagent.environments.math_problems import generalisation_problems

HERE = Path(__file__).resolve().parent


def fmt(x: float) -> str:
    return f"{x:+.3f}"


def operations(seed_dir: Path, held_out_set: str) -> str:
    """How often the single agent's answer writes each operation first (``a + b``, ``a - b``, ``a * b``) in one held-out
    set (``all`` for every task): "+ 76 / - 28 / * 16"."""
    counts: Counter = Counter()
    for line in (seed_dir / "texts.jsonl").read_text().splitlines():
        row = json.loads(line)
        if held_out_set != "all" and f"/{held_out_set}/" not in row["task_id"]:
            continue
        m = re.search(r"\d+\s*([-+*])\s*\d+", row["text"])
        counts[m.group(1) if m else "none"] += 1
    return " / ".join(f"{op} {counts[op]}" for op in ("+", "-", "*", "none") if counts[op])


def needed(seed: int, num_tasks: int, held_out_set: str) -> str:
    """The operations the held-out problems of ``seed`` need, in the form of :func:`operations`."""
    symbol = {"add": "+", "sub": "-", "mul": "*"}
    counts = Counter(symbol[p["arithmetic"].split(":")[0]] for p in generalisation_problems(num_tasks, seed, "test")
                     if held_out_set in ("all", p["held_out_set"]))
    return " / ".join(f"{op} {counts[op]}" for op in ("+", "-", "*") if counts[op])


def main() -> None:
    lines = ["| seed | held-out set | tasks | single agent, trained | trained team | team - single agent (paired) | "
             "single agent writes | problems need | steps | tokens (budget) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(HERE.glob("seed*/result.json")):
        r = json.loads(path.read_text())
        seed = r["training"]["seed"]
        for name, s in r["sets"].items():
            d = s["team_minus_single"]
            lines.append(
                f"| {seed} | {name} | {s['tasks']} | {s['single_agent']['mean']:.3f} | {s['team']['mean']:.3f} | "
                f"{fmt(d['mean'])} [{fmt(d['ci95'][0])}, {fmt(d['ci95'][1])}] | {operations(path.parent, name)} | "
                f"{needed(seed, r['held_out_tasks'], name)} | "
                f"{r['training']['steps']} | "
                f"{r['training']['completion_tokens']:,} ({r['training']['budget']:,}) |")
    (HERE / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
