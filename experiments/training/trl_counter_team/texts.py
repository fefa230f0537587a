"""What the counter team wrote at the held-out evaluation: how many replies are the same before and after training,
and which tool each agent called.

    python experiments/training/trl_counter_team/texts.py
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    before, after = ([json.loads(line) for line in (HERE / f"eval_texts_{stage}.jsonl").read_text().splitlines()]
                     for stage in ("before", "after"))
    same = sum(a["text"] == b["text"] for a, b in zip(before, after))
    print(f"held-out replies the same text before and after training: {same} of {len(after)}")
    calls = Counter()
    for row in after:
        m = re.search(r'"name":\s*"(\w+)"', row["text"])
        calls[(row["agent"], m.group(1) if m else "no call")] += 1
    for (agent, tool), n in sorted(calls.items()):
        print(f"after training, {agent} calls {tool}: {n}")


if __name__ == "__main__":
    main()
