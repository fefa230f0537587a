"""A `make demo` run against the recorded seed 0, value by value (the record predates some fields and baselines):

    python experiments/training/math_generalisation/make_demo/same_values.py outputs/demo

Every value of ``../seed0/eval_per_task.jsonl`` must be the same in the run's file, for every (stage, method, task)
that both hold (the record's ``single`` is today's ``reasoner_alone``); the run's held-out texts after training must
be the same bytes, and the record's texts before training must all be among the run's. Prints what it found and
exits 1 on any difference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RECORDED = Path(__file__).resolve().parents[1] / "seed0"
RENAMED = {"single": "reasoner_alone"}


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(run: Path) -> int:
    new = {(r["stage"], r["method"], r["task_id"]): r for r in rows(run / "eval_per_task.jsonl")}
    compared = differing = 0
    for r in rows(RECORDED / "eval_per_task.jsonl"):
        key = (r["stage"], RENAMED.get(r["method"], r["method"]), r["task_id"])
        if key not in new:
            print(f"missing in the run: {key}")
            differing += 1
            continue
        for field, value in r.items():
            if field == "method":
                continue
            compared += 1
            differing += new[key].get(field) != value
    after_same = (run / "eval_texts_after.jsonl").read_bytes() == (RECORDED / "eval_texts_after.jsonl").read_bytes()
    before_new = set((run / "eval_texts_before.jsonl").read_text().splitlines())
    before_kept = all(line in before_new for line in (RECORDED / "eval_texts_before.jsonl").read_text().splitlines())
    print(f"eval_per_task: {differing} of {compared} recorded values differ; texts after training the same bytes: "
          f"{after_same}; every recorded text before training in the run: {before_kept}")
    return 0 if differing == 0 and after_same and before_kept else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/demo")))
