"""Render the joint-action table of one logging step of a run as SVG, through rich's own export.

    python docs/guides/monitoring/render_table.py outputs/monitoring_example/completions.jsonl \
        docs/guides/monitoring/completions_table.svg --step 1 --rows 2

The table is the one ``log_completions: true`` prints (trl_multiagent/trainers/completions.py: completions_table).
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console

from trl_multiagent.trainers.completions import completions_table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("completions", help="a run's completions.jsonl")
    parser.add_argument("svg", help="the SVG file to write")
    parser.add_argument("--step", type=int, default=None, help="the logging step (default: the first)")
    parser.add_argument("--rows", type=int, default=2, help="joint actions shown")
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in open(args.completions)]
    if not rows:
        parser.error(f"{args.completions} holds no rows")
    step = rows[0]["step"] if args.step is None else args.step
    rows = [r for r in rows if r["step"] == step]
    agents = list(dict.fromkeys(a for r in rows for a in r["completions"]))
    console = Console(record=True, width=140)
    console.print(completions_table(rows, agents, args.rows))
    console.save_svg(args.svg, title=f"log_completions, step {step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
