"""The main job's training steps, two fresh-clone `make demo` runs side by side: before the issue-40 speed work on
the teacher-forced pass (``idle/``, commit 40db7ac) and after it (``issue40/``).

    python experiments/training/math_generalisation/make_demo/steps.py   # writes steps.md here

Per step: seconds of the whole step, of generation, and of the loss's forward and backward passes (metrics.jsonl's
``step_time``, ``time/generation``, ``time/forward``, ``time/backward``), and the positions the loss needs at least
(``tokens/loss_needed``: each distinct prompt prefix once, every completion token), which both runs share when
their rollouts are the same; then the sums over the steps and their ratios; and, for the run after, the largest
relative difference of a logged training number from the recorded seed 0 (``../reruns/compare.py``'s measure).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = {"before (idle/)": HERE / "idle", "after (issue40/)": HERE / "issue40"}
KEYS = ("step_time", "time/generation", "time/forward", "time/backward")


def steps(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "step_time" in r]


def main() -> None:
    before, after = (steps(p) for p in RUNS.values())
    lines = ["| step | needed positions | " + " | ".join(f"{k} before / after (s)" for k in KEYS) + " |",
             "|---" * (2 + len(KEYS)) + "|"]
    for b, a in zip(before, after):
        same = "" if b["tokens/loss_needed"] == a["tokens/loss_needed"] else " (differ: " + \
            f"{a['tokens/loss_needed']:.0f})"
        lines.append(f"| {b['step']} | {b['tokens/loss_needed']:.0f}{same} | " +
                     " | ".join(f"{b[k]:.1f} / {a[k]:.1f}" for k in KEYS) + " |")
    sums = {k: (sum(r[k] for r in before), sum(r[k] for r in after)) for k in KEYS}
    lines.append("| all | " + f"{sum(r['tokens/loss_needed'] for r in before):.0f} | " +
                 " | ".join(f"**{b:.1f} / {a:.1f}** ({a / b:.2f})" for b, a in sums.values()) + " |")
    spec = importlib.util.spec_from_file_location("compare", HERE.parent / "reruns" / "compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    lines += ["", "Largest relative difference of a logged training number (losses, rewards, gradient norms; not "
              f"times) of the run after from the recorded seed 0: {compare.largest_metric_difference(HERE / 'issue40'):.1e}."]
    text = "\n".join(lines) + "\n"
    (HERE / "steps.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
