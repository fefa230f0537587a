"""Reports of a run: the reward curve and the markdown tables of an evaluation."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

METHOD_NAMES = {
    "team": "aux + main (MAGRPO adapters)",
    "single": "single agent",
    "naive": "naive concatenation",
    "sequential": "sequential pipeline",
    "discussion": "one-round discussion",
}


def plot_reward_curve(metrics_path: str | Path, png_path: str | Path) -> Path | None:
    """Mean joint reward per logged training step (and its per-level parts when present) as a PNG."""
    metrics_path = Path(metrics_path)
    if not metrics_path.exists():
        logger.warning("No %s: no reward curve", metrics_path)
        return None
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if isinstance(r.get("reward"), (int, float))]
    if not rows:
        logger.warning("%s has no reward values: no reward curve", metrics_path)
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [r["reward"] for r in rows], label="joint reward", color="black", linewidth=2)
    for key in sorted({k for r in rows for k in r if k.startswith("env/level/")}):
        ax.plot(steps, [r.get(key) for r in rows], label=key.removeprefix("env/level/"), linewidth=1)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("mean reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return Path(png_path)


def _fmt(value: Any, ci: Any = None) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    text = f"{value:.3f}"
    if ci and all(isinstance(c, (int, float)) for c in ci):
        text += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
    return text


def write_coding_report(summary: Mapping[str, Any], md_path: str | Path) -> Path:
    """A markdown table: the trained pair (before and after training) against the four baselines."""
    ev = summary.get("evaluation", {})
    rows = []
    for stage in ("before", "after"):
        for method, res in ev.get(stage, {}).items():
            if stage == "after" or method != "team":
                label = METHOD_NAMES.get(method, method) + (" after training" if stage == "after" else "")
            else:
                label = METHOD_NAMES["team"] + " before training"
                if ev.get("team_before_is_naive"):
                    label += " (= naive concatenation: fresh LoRA adapters have B = 0)"
            rows.append((label, res["metrics"], res.get("ci95", {})))
    top_k = max((int(k.split("@")[1]) for res in ev.get("before", {}).values() for k in res["metrics"]
                 if k.startswith("pass@")), default=1)
    keys = ["reward", "pass@1", "acc@1", "coop@1"] + ([f"pass@{top_k}", f"acc@{top_k}", f"coop@{top_k}"]
                                                        if top_k > 1 else [])
    lines = [
        "# Cooperative coding on held-out HumanEval problems",
        "",
        f"Command: `{summary.get('command', '')}`",
        "",
        f"Held-out cooperative problems: {len(ev.get('held_out_problems', []))}; samples per problem and method: "
        f"{ev.get('num_samples')}; response length: {ev.get('max_new_tokens')} tokens. "
        "Values are means over problems; brackets: 95% bootstrap interval over problems.",
        "",
        "| method | " + " | ".join(keys) + " | tokens aux | tokens main | s / solution |",
        "|---|" + "---|" * (len(keys) + 3),
    ]
    for label, metrics, ci in rows:
        cells = [_fmt(metrics.get(k), ci.get(k)) for k in keys]
        cells += [_fmt(metrics.get("tokens/aux")), _fmt(metrics.get("tokens/main")),
                  _fmt(metrics.get("seconds_per_solution"))]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if "global_step" in summary:
        lines += ["", f"Training: {summary.get('global_step')} MAGRPO steps, "
                      f"{summary.get('train_runtime_s', 0) or 0:.0f} s; whole job {summary.get('wall_time_s', 0):.0f} s."]
    Path(md_path).write_text("\n".join(lines) + "\n")
    return Path(md_path)
