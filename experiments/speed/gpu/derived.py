"""Ratios derived from a folder's gpu_check.json (an H200 run of benchmarks/gpu_check.py), written to its derived.md.

    python experiments/speed/gpu/derived.py                        # this folder (the first run, 2026-11-27)
    python experiments/speed/gpu/derived.py experiments/speed/gpu/2026-11-28
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(folder: Path = HERE) -> None:
    report = json.loads((folder / "gpu_check.json").read_text())
    steps = report["settings"]["max_completion_length"]  # forced tokens: one decoding step each
    lines = [f"# Ratios from gpu_check.json ({report['device']['name']}, {report['date']})", "",
             "| base | step vs TRL | generated tokens/s, ours / TRL | update s, ours / TRL | ms per token of generate (8 rows: generate s / "
             "forced tokens), ours / TRL | whole-step s per token, 4 agents / 1 | peak memory, 4 agents / 1 |",
             "|---|---|---|---|---|---|---|"]
    for base, slot in report["bases"].items():
        speed, runs = slot["speed"], {r["agents"]: r for r in slot["team"]["runs"]}
        ours, trl = speed["ours"], speed["trl"]
        lines.append(
            f"| {base} | {speed['ratio_ours_over_trl']:.3f} | {speed['ratio_generate_tokens_per_s_ours_over_trl']:.2f}"
            f" | {ours['median_update_s'] / trl['median_update_s']:.2f} | {1000 * ours['median_generate_s'] / steps:.0f}"
            f" / {1000 * trl['median_generate_s'] / steps:.0f} | "
            f"{runs[1]['step_tokens_per_s'] / runs[4]['step_tokens_per_s']:.3f} | "
            f"{runs[4]['peak_memory_mib'] / runs[1]['peak_memory_mib']:.3f} |")
    (folder / "derived.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
