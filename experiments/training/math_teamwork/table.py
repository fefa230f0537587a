"""table.md of experiments/training/math_teamwork/ (issue 60): the protocol choice on training problems, then for each seed of the
main job the trained team against EVERY single-agent variant recorded, on the same 120 held-out problems, in the shape
of AT-GRPO's Table 1.

Rows: each agent alone untrained (its own role's first prompt, one turn), each agent trained alone with TRL's
GRPOTrainer on the team run's budget of generated tokens (``train-single``), the team untrained, the team trained
(AT-GRPO, one shared policy: the main job), the team trained with a policy per role (``specialized/seed<N>``) and
AT-GRPO's Table 4 ablation: each agent trained with its partner frozen, then the two evaluated together
(``ablation/seed<N>/combined``). The best single-agent variant is the one with the highest held-out mean; the last
columns are the trained team minus it, paired by problem, with a 95% bootstrap interval, over all problems and per
held-out set.

The main job's records (experiments/training/math_generalisation/seed<N>) predate the ``tool_alone`` baseline: its untrained
tool alone is read from their ``no_exchange`` rows (both agents answer once without seeing each other: the tool's
printed answer, ``final/tool_correct``, is the tool alone), its reasoner alone from ``single``.

    python experiments/training/math_teamwork/table.py
"""

from __future__ import annotations

import json
from pathlib import Path

from trl_multiagent.metrics.stats import paired_bootstrap

HERE = Path(__file__).resolve().parent
SHARED, PER_ROLE, APART = ("team + AT-GRPO (shared policy)", "team + AT-GRPO (a policy per role)",
                           "team of agents trained apart, partner frozen (Table 4)")
RESULTS = HERE.parent
SETS = ("all", "unseen_operands", "unseen_form")
METRIC = "final/team_correct"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def variants_of(team_dir: Path, single_dirs: list[Path]) -> tuple[list[str], dict[str, dict[str, float]]]:
    """``(task ids, {variant: {task id: score}})`` of one seed."""
    rows = read_jsonl(team_dir / "eval_per_task.jsonl")
    by = {}
    for r in rows:
        by.setdefault((r["stage"], r["method"]), {})[r["task_id"]] = r
    ids = list(by[("after", "team")])
    out = {"team, untrained": {i: by[("before", "team")][i][METRIC] for i in ids},
           "team + AT-GRPO (shared policy)": {i: by[("after", "team")][i][METRIC] for i in ids}}
    if ("before", "tool_alone") in by:
        for agent in ("reasoner", "tool"):
            out[f"{agent} alone, untrained"] = {i: by[("before", f"{agent}_alone")][i][METRIC] for i in ids}
    else:  # records before tool_alone existed
        out["reasoner alone, untrained"] = {i: by[("before", "single")][i][METRIC] for i in ids}
        out["tool alone, untrained"] = {i: by[("before", "no_exchange")][i]["final/tool_correct"] for i in ids}
    seed_dir = team_dir.name
    for name, folder in ((PER_ROLE, HERE / "specialized" / seed_dir), (APART, HERE / "ablation" / seed_dir / "combined")):
        if (folder / "eval_per_task.jsonl").is_file():
            team_rows = {r["task_id"]: r for r in read_jsonl(folder / "eval_per_task.jsonl") if r["method"] == "team"
                         and r["stage"] == "after"}
            out[name] = {i: team_rows[i][METRIC] for i in ids if i in team_rows}
            untrained = {r["task_id"]: r[METRIC] for r in read_jsonl(folder / "eval_per_task.jsonl")
                         if r["method"] == "team" and r["stage"] == "before"}
            if untrained and untrained != out["team, untrained"]:
                raise SystemExit(f"{folder}: its untrained team differs from the main job's on the same problems")
    for single in single_dirs:
        if not (single / "per_task.jsonl").is_file():
            continue
        for r in read_jsonl(single / "per_task.jsonl"):
            for key, value in r.items():
                if key.endswith("_alone_grpo"):
                    out.setdefault(f"{key.removesuffix('_alone_grpo')} alone + TRL GRPO", {})[r["task_id"]] = value
                elif key == "single_agent":  # the earlier script's record: the reasoner
                    out.setdefault("reasoner alone + TRL GRPO", {})[r["task_id"]] = value
    return ids, out


def subset(ids: list[str], name: str) -> list[str]:
    return ids if name == "all" else [i for i in ids if f"/{name}/" in i]


def seed_table(title: str, ids: list[str], variants: dict[str, dict[str, float]], seed: int) -> tuple[list[str], dict]:
    singles = {k: v for k, v in variants.items() if not k.startswith("team")}
    complete = {k: v for k, v in singles.items() if set(v) >= set(ids)}
    best = max(complete, key=lambda k: sum(complete[k][i] for i in ids))
    lines = [f"### {title}", "", "| | " + " | ".join(SETS) + " |", "|---|" + "---|" * len(SETS)]
    for name, scores in variants.items():
        if set(scores) < set(ids):
            continue
        cells = [f"{sum(scores[i] for i in subset(ids, s)) / len(subset(ids, s)):.3f}" for s in SETS]
        mark = " (best single agent)" if name == best else ""
        lines.append(f"| {name}{mark} | " + " | ".join(cells) + " |")
    record = {"best_single_agent": best}
    pairs = [(f"{team} minus the best single agent", team, best) for team in (SHARED, PER_ROLE, APART)]
    pairs.append((f"{PER_ROLE} minus the {APART}", PER_ROLE, APART))
    for label, first, second in pairs:
        if set(variants.get(first, {})) < set(ids) or set(variants.get(second, {})) < set(ids):
            continue
        diffs = {}
        for s in SETS:
            sub = subset(ids, s)
            diffs[s] = paired_bootstrap([variants[first][i] for i in sub], [variants[second][i] for i in sub],
                                        seed=seed)
        lines.append(f"| **{label}** | " + " | ".join(
            f"**{d['mean']:+.3f}** [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]" for d in diffs.values()) + " |")
        record["team_minus_best" if first == SHARED and second == best else label] = diffs
    return lines + [""], record


def protocol(title: str, team_dirs: list[Path], single_dirs: list[list[Path]]) -> tuple[list[str], dict]:
    lines, record = [f"## {title}", ""], {}
    for seed, (team_dir, singles) in enumerate(zip(team_dirs, single_dirs)):
        if not (team_dir / "eval_per_task.jsonl").is_file():
            lines += [f"### seed {seed}: not run", ""]
            continue
        ids, variants = variants_of(team_dir, singles)
        seed_lines, record[f"seed{seed}"] = seed_table(f"seed {seed}", ids, variants, seed)
        lines += seed_lines
    return lines, record


def main() -> None:
    seeds = (0, 1, 2)
    main_job = protocol(
        "The main job (recipes/configs/math_generalisation_at_grpo.yaml: the reasoner's answer is final)",
        [RESULTS / "math_generalisation" / f"seed{s}" for s in seeds],
        [[RESULTS / "math_generalisation" / "single_agent" / f"seed{s}", HERE / "main_job_single" / f"seed{s}"]
         for s in seeds])
    validation = ["## The protocol, chosen on training problems (validation split, seed 0)", "",
                  "| final word while the two disagree | reasoner alone | tool alone | team untrained | team trained |",
                  "|---|---|---|---|---|"]
    for final in ("reasoner", "tool"):
        ev = json.loads((HERE / "validation" / f"final_{final}" / "summary.json").read_text())["evaluation"]
        team = ev["methods"]["team"]
        validation.append(f"| {final} | {ev['baseline_means']['reasoner_alone']:.3f} | "
                          f"{ev['baseline_means']['tool_alone']:.3f} | {team['before']['mean']:.3f} | "
                          f"{team['after']['mean']:.3f} |")
    text = ["# The math team against its best member (issue 60)", "",
            "Generated by `python experiments/training/math_teamwork/table.py` from the records named in its docstring; the",
            "commands are in `run.sh`. Held-out: 80 problems of unseen arithmetic and 40 of an unseen question form,",
            f"`{METRIC}`, one greedy answer per problem. A seed without a row was not run for it (run.sh's steps).", "",
            *validation, "", *main_job[0]]
    (HERE / "table.md").write_text("\n".join(text))
    (HERE / "table.json").write_text(json.dumps({"main_job": main_job[1]}, indent=1) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
