"""Held-out results of the easy arithmetic recipes per problem form (issue 18): for every seed folder of a results
folder, the team's metric before and after training on each form of ``word_problems(level="easy")`` (gain: "more",
together: "together", loss: "gives ... of them", groups: "bags with ... in each"), from the seed's
``eval_per_task.jsonl``; the problems are regenerated from their task ids (``word-easy/test/<seed>/<index>``).

    python experiments/training/by_template.py experiments/training/math_easy_at_grpo final/team_correct
    python experiments/training/by_template.py experiments/training/math_easy_debate majority_accuracy

Writes ``<folder>/by_template.md`` and prints it.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

# This folder holds a results folder named vllm/, which would shadow the vllm package that trl probes for.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from trl_multiagent.environments.math_problems import EASY_TEMPLATES, word_problems  # noqa: E402


def templates_of(task_ids: list[str]) -> dict[str, str]:
    """task id -> its problem form, by regenerating the test problems of each seed named in the ids."""
    by_seed: dict[int, int] = defaultdict(int)
    for task_id in task_ids:
        prefix, split, seed, index = task_id.split("/")
        if prefix != "word-easy" or split != "test":
            raise SystemExit(f"{task_id!r} is not an easy test-split problem")
        by_seed[int(seed)] = max(by_seed[int(seed)], int(index) + 1)
    return {row["task_id"]: row["template"] for seed, n in by_seed.items()
            for row in word_problems(n, seed, "test", "easy")}


def main(folder: str, metric: str) -> str:
    root = Path(folder)
    lines = [f"Held-out `{metric}` per problem form, before -> after (mean over that form's problems; n problems).",
             "", "| seed | " + " | ".join(EASY_TEMPLATES) + " |", "|---|" + "---|" * len(EASY_TEMPLATES)]
    for seed_dir in sorted(root.glob("seed*")):
        records = [json.loads(line) for line in (seed_dir / "eval_per_task.jsonl").read_text().splitlines()]
        records = [r for r in records if r["method"] == "team"]
        forms = templates_of([r["task_id"] for r in records])
        values: dict[tuple[str, str], list[float]] = defaultdict(list)
        for r in records:
            values[(forms[r["task_id"]], r["stage"])].append(float(r[metric]))
        cells = []
        for form in EASY_TEMPLATES:
            before, after = values[(form, "before")], values[(form, "after")]
            cells.append(f"{sum(before) / len(before):.2f} -> {sum(after) / len(after):.2f} (n={len(before)})"
                         if before and after else "-")
        lines.append(f"| {seed_dir.name.removeprefix('seed')} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    (root / "by_template.md").write_text(text)
    return text


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: by_template.py RESULTS_FOLDER METRIC")
    print(main(sys.argv[1], sys.argv[2]))
