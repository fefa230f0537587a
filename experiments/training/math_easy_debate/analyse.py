"""Where the MAPoRL debate's learning goes, measured from a run's own records (issue 61, item 5).

    python experiments/training/math_easy_debate/analyse.py experiments/training/math_easy_debate/seed{0,1,2}

For each run folder (summary.json, metrics.jsonl, eval_texts_before/after.jsonl, and completions.jsonl where the run
logged its completions) it prints markdown tables:

1. the training signals, mean of the first and of the last quarter of the optimizer steps: the verifier's score of
   each turn's answers, the agents' rewards (after the influence-aware mixing, incentives and penalties), the
   penalties, the KL to the base and the share of answers cut at the token limit;
2. the advantages by turn (completions.jsonl): each turn's mean advantage and its share of positive advantages,
   split by whether the answer was right (the turn's team reward is the fraction of right answers);
3. what the debaters write on the held-out problems, before and after training, per turn: right, with a box, with no
   number at all (off the problem), and how the second turn changes an agent's first answer (right -> wrong,
   wrong -> right).
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def quarters(rows: list[dict], key: str) -> tuple[float | None, float | None]:
    """Mean of the first and of the last quarter of ``key``'s values (``a|b``: the first of the names a row has;
    the metric's name changed between the runs' versions)."""
    names = key.split("|")
    values = [v for r in rows for v in [next((r[n] for n in names if isinstance(r.get(n), (int, float))), None)]
              if v is not None]
    if not values:
        return None, None
    q = max(1, len(values) // 4)
    return sum(values[:q]) / q, sum(values[-q:]) / q


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


TRAINING_KEYS = [("turn1/team_reward|turn/0/reward", "team reward, turn 1"),
                 ("turn2/team_reward|turn/1/reward", "team reward, turn 2"),
                 ("agent/agent1/score", "agent1's verifier score"), ("agent/agent2/score", "agent2's verifier score"),
                 ("agent/agent1/reward", "agent1's reward"), ("agent/agent2/reward", "agent2's reward"),
                 ("incentive", "incentive"), ("penalty/any", "answers penalised"),
                 ("completions/clipped_ratio", "answers cut at the token limit"), ("kl", "KL to the base"),
                 ("grad_norm", "gradient norm (before clipping)"),
                 ("entropy", "entropy")]


def training_table(runs: dict[str, Path]) -> list[str]:
    lines = ["| signal | " + " | ".join(f"{name}: first -> last quarter" for name in runs) + " |",
             "|---|" + "---|" * len(runs)]
    metrics = {name: [r for r in read_jsonl(folder / "metrics.jsonl") if "loss" in r] for name, folder in runs.items()}
    for key, label in TRAINING_KEYS:
        cells = []
        for name in runs:
            first, last = quarters(metrics[name], key)
            cells.append(f"{fmt(first)} -> {fmt(last)}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def advantage_table(runs: dict[str, Path]) -> list[str]:
    """Each turn's advantages (the mean of each answer's token advantages), split by whether the answer was right
    (rows that carry ``correct``; older rows only have the turn's team reward, and an advantage of 0 for MAPoRL)."""
    lines = ["| run | turn | answers | mean advantage | advantage > 0 | right answers: mean advantage (> 0) | "
             "wrong answers: mean advantage (> 0) |", "|---|---|---|---|---|---|---|"]
    found = False
    for name, folder in runs.items():
        rows = read_jsonl(folder / "completions.jsonl")
        if not rows:
            continue
        found = True
        by_turn: dict[int, list[tuple[float, bool]]] = defaultdict(list)
        for row in rows:
            correct = row.get("correct") or {}
            for agent, adv in row["advantages"].items():
                by_turn[row["turn"]].append((adv, bool(correct.get(agent, row["reward"] > 0.5))))
        for turn in sorted(by_turn):
            pairs = by_turn[turn]
            advs = [a for a, _ in pairs]
            right = [a for a, ok in pairs if ok]
            wrong = [a for a, ok in pairs if not ok]

            def summary(values: list[float]) -> str:
                return (f"{sum(values) / len(values):+.3f} ({sum(v > 0 for v in values) / len(values):.2f}, "
                        f"n={len(values)})") if values else "-"

            lines.append(f"| {name} | {turn + 1} | {len(advs)} | {sum(advs) / len(advs):+.3f} | "
                         f"{sum(a > 0 for a in advs) / len(advs):.2f} | {summary(right)} | {summary(wrong)} |")
    return lines if found else ["(no run here logged its completions)"]


def text_stats(rows: list[dict]) -> dict[str, float]:
    by_turn: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        by_turn[r["turn"]].append(r)
    out: dict[str, float] = {}
    for turn, rs in sorted(by_turn.items()):
        n = len(rs)
        out[f"turn {turn + 1}: answers"] = n
        out[f"turn {turn + 1}: right"] = sum(r["local_reward"] > 0.5 for r in rs) / n
        out[f"turn {turn + 1}: with a box"] = sum("\\boxed" in r["text"] for r in rs) / n
        out[f"turn {turn + 1}: no number (off the problem)"] = sum(not NUMBER.search(r["text"]) for r in rs) / n
    first = {(r["task_id"], r["sample"], r["agent"]): r["local_reward"] > 0.5 for r in rows if r["turn"] == 0}
    second = {(r["task_id"], r["sample"], r["agent"]): r["local_reward"] > 0.5 for r in rows if r["turn"] == 1}
    both = [k for k in second if k in first]
    if both:
        out["turn 2 of turn-1 answers: right -> wrong"] = sum(first[k] and not second[k] for k in both) / len(both)
        out["turn 2 of turn-1 answers: wrong -> right"] = sum(not first[k] and second[k] for k in both) / len(both)
    return out


def _cell(value: float | None, key: str) -> str:
    return "-" if value is None else (f"{value:.0f}" if key.endswith("answers") else f"{value:.2f}")


def texts_table(runs: dict[str, Path]) -> list[str]:
    stats = {}
    for name, folder in runs.items():
        for stage in ("before", "after"):
            rows = [r for r in read_jsonl(folder / f"eval_texts_{stage}.jsonl") if r.get("method") == "team"]
            if rows:
                stats[(name, stage)] = text_stats(rows)
    if not stats:
        return ["(no run here wrote its held-out texts)"]
    keys = list(dict.fromkeys(k for s in stats.values() for k in s))
    names = list(dict.fromkeys(name for name, _ in stats))
    lines = ["| held-out answers | " + " | ".join(f"{n}: before -> after" for n in names) + " |",
             "|---|" + "---|" * len(names)]
    for key in keys:
        cells = []
        for n in names:
            b, a = stats.get((n, "before"), {}).get(key), stats.get((n, "after"), {}).get(key)
            cells.append(f"{_cell(b, key)} -> {_cell(a, key)}")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str]) -> int:
    runs = {Path(a).name: Path(a) for a in argv}
    if not runs:
        print(__doc__)
        return 2
    out = ["## Training signals (mean of the first -> the last quarter of the optimizer steps)", "",
           *training_table(runs), "", "## Advantages by turn (completions.jsonl, every logged step)", "",
           *advantage_table(runs), "", "## What the debaters write on the held-out problems", "", *texts_table(runs)]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
