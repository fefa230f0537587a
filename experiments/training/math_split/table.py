"""table.md of experiments/training/math_split/ (issue 60, item 4): the team whose roles need each other (the reasoner
plans without the numbers, the tool computes without the question) against EVERY single agent, on the main job's
120 held-out problems per seed (the same task ids).

Single agents, two kinds:

* the members of this task alone, each with its own half of the problem: untrained (the team run's
  ``reasoner_alone`` / ``tool_alone`` rows) and trained alone with TRL's GRPOTrainer on the team's token budget
  (``single/seed<N>/<agent>/per_task.jsonl``, ``train-single``);
* single agents that see the WHOLE problem: the main job's records of the same problems
  (``../math_generalisation/seed<N>``, ``../math_generalisation/single_agent/seed<N>``,
  ``../math_teamwork/main_job_single/seed<N>``, read as ``../math_teamwork/table.py`` reads them).

The best single agent is the one with the highest held-out mean over all problems, of either kind; the team is
compared with it and with the untrained team, paired by problem, with a 95% bootstrap interval. AT-GRPO's Table 4
on this task, where recorded: the team with a policy per role (``specialized/seed<N>``), its members trained apart with
the partner frozen and then played together (``ablation/seed<N>/combined``), and the per-role team with its two
policies swapped between the roles (``ablation/seed<N>/swapped``).

    python experiments/training/math_split/table.py
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from trl_multiagent.metrics.answers import last_boxed
from trl_multiagent.metrics.stats import paired_bootstrap

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent
SETS = ("all", "unseen_operands", "unseen_form")
METRIC = "final/team_correct"
TEAM, UNTRAINED = "split team + AT-GRPO", "split team, untrained"
PER_ROLE = "split team + AT-GRPO, a policy per role"
APART = "split team of members trained apart, partner frozen (Table 4)"
SWAPPED = "split team, a policy per role, the two swapped (Table 4)"
#: (label, variant, compared with): the team against the best single agent and the untrained team, then Table 4.
COMPARISONS = (("team minus the best single agent", TEAM, "best"), ("team minus the untrained team", TEAM, UNTRAINED),
               ("a policy per role minus the best single agent", PER_ROLE, "best"),
               ("members trained apart minus the best single agent", APART, "best"),
               ("a policy per role minus members trained apart", PER_ROLE, APART),
               ("swapped minus a policy per role", SWAPPED, PER_ROLE))


def _teamwork_table():
    spec = importlib.util.spec_from_file_location("math_teamwork_table", RESULTS / "math_teamwork" / "table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def split_variants(seed_dir: Path) -> tuple[list[str], dict[str, dict[str, float]]]:
    by: dict[tuple[str, str], dict[str, dict]] = {}
    for r in read_jsonl(seed_dir / "eval_per_task.jsonl"):
        by.setdefault((r["stage"], r["method"]), {})[r["task_id"]] = r
    ids = list(by[("after", "team")])
    out = {f"{agent} alone, own half, untrained": {i: by[("before", f"{agent}_alone")][i][METRIC] for i in ids}
           for agent in ("reasoner", "tool")}
    for agent in ("reasoner", "tool"):
        path = seed_dir.parent / "single" / seed_dir.name / agent / "per_task.jsonl"
        if path.is_file():
            out[f"{agent} alone, own half, + TRL GRPO"] = {r["task_id"]: r[f"{agent}_alone_grpo"]
                                                          for r in read_jsonl(path)}
    out[UNTRAINED] = {i: by[("before", "team")][i][METRIC] for i in ids}
    out[TEAM] = {i: by[("after", "team")][i][METRIC] for i in ids}
    for name, folder in ((PER_ROLE, HERE / "specialized" / seed_dir.name),
                         (APART, HERE / "ablation" / seed_dir.name / "combined"),
                         (SWAPPED, HERE / "ablation" / seed_dir.name / "swapped")):
        if (folder / "eval_per_task.jsonl").is_file():
            rows = read_jsonl(folder / "eval_per_task.jsonl")
            after = {r["task_id"]: r[METRIC] for r in rows if r["method"] == "team" and r["stage"] == "after"}
            before = {r["task_id"]: r[METRIC] for r in rows if r["method"] == "team" and r["stage"] == "before"}
            if before and before != out[UNTRAINED]:
                raise SystemExit(f"{folder}: its untrained team differs from the split team's on the same problems")
            out[name] = after
    return ids, out


def subset(ids: list[str], name: str) -> list[str]:
    return ids if name == "all" else [i for i in ids if f"/{name}/" in i]


def mean(scores: dict[str, float], ids: list[str]) -> float:
    return sum(scores[i] for i in ids) / len(ids)


def seed_section(seed: int) -> tuple[list[str], dict]:
    seed_dir = HERE / f"seed{seed}"
    ids, variants = split_variants(seed_dir)
    whole_ids, whole = _teamwork_table().variants_of(
        RESULTS / "math_generalisation" / f"seed{seed}",
        [RESULTS / "math_generalisation" / "single_agent" / f"seed{seed}",
         RESULTS / "math_teamwork" / "main_job_single" / f"seed{seed}"])
    if set(whole_ids) != set(ids):
        raise SystemExit(f"seed {seed}: the split task's held-out problems are not the main job's")
    for name, scores in whole.items():
        if "team" in name:
            if name == "team + AT-GRPO (shared policy)":
                variants["whole-problem team + AT-GRPO (the main job)"] = scores
            continue
        variants[name.replace(" alone,", " alone, whole problem,").replace(" alone +", " alone, whole problem, +")] \
            = scores
    singles = {k: v for k, v in variants.items() if "team" not in k and set(v) >= set(ids)}
    best = max(singles, key=lambda k: mean(singles[k], ids))
    lines = [f"### seed {seed}", "", "| | " + " | ".join(SETS) + " |", "|---|" + "---|" * len(SETS)]
    for name, scores in variants.items():
        if set(scores) >= set(ids):
            mark = " (best single agent)" if name == best else ""
            lines.append(f"| {name}{mark} | " + " | ".join(f"{mean(scores, subset(ids, s)):.3f}" for s in SETS) + " |")
    record: dict = {"best_single_agent": best,
                    "means": {k: mean(v, ids) for k, v in variants.items() if set(v) >= set(ids)}}
    for label, one, other in COMPARISONS:
        other = best if other == "best" else other
        if not (set(variants.get(one, {})) >= set(ids) and set(variants.get(other, {})) >= set(ids)):
            continue
        diffs = {s: paired_bootstrap([variants[one][i] for i in subset(ids, s)],
                                     [variants[other][i] for i in subset(ids, s)], seed=seed) for s in SETS}
        lines.append(f"| **{label}** | " + " | ".join(
            f"**{d['mean']:+.3f}** [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]" for d in diffs.values()) + " |")
        record[label.replace(" ", "_")] = diffs
    return lines + [""], record


def teamwork(seed: int) -> list[str]:
    """What the team does on the held-out problems, before and after training: the reasoner's plan right, the
    tool's program following the plan (its printed answer equals the plan's value), the team right, and the team
    right where the tool alone (untrained, its own half) is wrong; then the plans written for each question form."""
    seed_dir = HERE / f"seed{seed}"
    rows = read_jsonl(seed_dir / "eval_per_task.jsonl")
    by = {(r["stage"], r["method"], r["task_id"]): r for r in rows}
    ids = [r["task_id"] for r in rows if r["stage"] == "after" and r["method"] == "team"]
    lines = [f"### seed {seed}", "", "| | set | plan right | tool followed the plan | team right | "
             "team right, tool alone wrong |", "|---|---|---|---|---|---|"]
    for stage in ("before", "after"):
        for s in SETS:
            sub = subset(ids, s)
            team = [by[(stage, "team", i)] for i in sub]
            alone_wrong = sum(by[(stage, "team", i)][METRIC] and not by[("before", "tool_alone", i)][METRIC]
                              for i in sub)
            lines.append(f"| {stage} | {s} | " + " | ".join(
                f"{sum(r[key] for r in team) / len(sub):.3f}" for key in
                ("final/plan_correct", "final/tool_followed_plan", METRIC)) + f" | {alone_wrong / len(sub):.3f} |")
    lines += ["", "The reasoner's boxed plans (count):", ""]
    for stage in ("before", "after"):
        lines += plan_lines(seed_dir / f"eval_texts_{stage}.jsonl", stage)
    for label, folder in (("a policy per role", HERE / "specialized" / seed_dir.name),
                          ("trained apart", HERE / "ablation" / seed_dir.name / "combined"),
                          ("swapped", HERE / "ablation" / seed_dir.name / "swapped")):
        if (folder / "eval_texts_after.jsonl").is_file():
            lines += plan_lines(folder / "eval_texts_after.jsonl", f"after, {label}")
    alone = HERE / "single" / seed_dir.name / "reasoner" / "texts.jsonl"  # train-single: its own answers only
    if alone.is_file():
        lines += plan_lines(alone, "the reasoner trained alone (its half, + TRL GRPO)")
    return lines + [""]


def plan_lines(texts: Path, label: str) -> list[str]:
    """The reasoner's boxed plans in held-out texts (a team's ``eval_texts_<stage>.jsonl``, or ``train-single``'s
    ``texts.jsonl`` of the reasoner alone), counted per held-out set (top six)."""
    plans: dict[str, dict[str, int]] = {}
    for line in texts.read_text().splitlines():
        t = json.loads(line)
        if t.get("method", "team") == "team" and t["agent"] == "reasoner":
            form = "unseen_form" if "/unseen_form/" in t["task_id"] else "unseen_operands"
            box = last_boxed(t["text"]) or "(no box)"
            plans.setdefault(form, {})[box] = plans.setdefault(form, {}).get(box, 0) + 1
    return [f"- {label}, {form}: " + ", ".join(f"`{k}` {v}" for k, v in
                                             sorted(counts.items(), key=lambda kv: -kv[1])[:6])
            for form, counts in plans.items()]


def main() -> None:
    lines = ["# The split math team against every single agent (issue 60, item 4)", "",
             "Generated by `python experiments/training/math_split/table.py`; the commands are `run.sh`. Held-out: the",
             "main job's 80 problems of unseen arithmetic and 40 of an unseen question form per seed, "
             f"`{METRIC}`, one greedy", "answer per problem.", "",
             "## The choice on training problems (validation split, seed 0)", "",
             "| training problems | reasoner alone (own half) | tool alone (own half) | team untrained | team trained |",
             "|---|---|---|---|---|"]
    for split in ("train", "train_balanced"):
        val = json.loads((HERE / "validation" / split / "summary.json").read_text())["evaluation"]
        lines.append(f"| {split} | {val['baseline_means']['reasoner_alone']:.3f} | "
                     f"{val['baseline_means']['tool_alone']:.3f} | {val['methods']['team']['before']['mean']:.3f} | "
                     f"{val['methods']['team']['after']['mean']:.3f} |")
    lines += ["",
             "## Held out", ""]
    record = {}
    for seed in (0, 1, 2):
        if not (HERE / f"seed{seed}" / "eval_per_task.jsonl").is_file():
            lines += [f"### seed {seed}: not run", ""]
            continue
        seed_lines, record[f"seed{seed}"] = seed_section(seed)
        lines += seed_lines
    lines += ["## What the team does (held-out texts)", ""]
    for seed in (0, 1, 2):
        if (HERE / f"seed{seed}" / "eval_texts_after.jsonl").is_file():
            lines += teamwork(seed)
    (HERE / "table.md").write_text("\n".join(lines))
    (HERE / "table.json").write_text(json.dumps(record, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
