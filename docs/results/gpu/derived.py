"""Ratios derived from this folder's gpu_check.json (the H200 run of benchmarks/gpu_check.py), written to derived.md.

    python docs/results/gpu/derived.py
"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    report = json.loads((HERE / "gpu_check.json").read_text())
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
    (HERE / "derived.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
