"""The results of an evaluation, in one place: the ``evaluation`` section of ``summary.json``, ``report.md``,
``reward_curve.png``, ``eval_per_task.jsonl`` and what the team wrote, ``eval_texts_before.jsonl`` and
``eval_texts_after.jsonl``.

For every method and stage the section gives the mean of the headline metric over tasks with its 95% bootstrap
interval; for the team the ``gain`` from before to after training, and ``gain_vs_best_baseline`` against the
baseline with the highest mean before training, both ``{"mean": m, "ci95": [lo, hi]}`` from a paired bootstrap over
tasks (:func:`~trl_multiagent.metrics.stats.paired_bootstrap`). The best baseline is chosen over every baseline
evaluated, whatever agent's answer it scores (each agent alone, ``<agent>_alone``, among them: a team is worth its
training only if it beats its best member alone); ``baseline_means`` lists each one's mean before training. Every other metric gets the same entries under
``metrics``; aggregates that are not per-task means (pass@k for k > 1, transitions, per-turn means) are under
``details``. Held-out tasks that name their set (column ``held_out_set``, e.g. unseen operands and an unseen problem
form) are also reported set by set (``held_out_sets``), as are the values of any other column a caller groups by
(``groups``: ``python -m trl_multiagent evaluate --group_by form``), and ``examples`` holds what the team wrote on five tasks
chosen by a fixed rule, before and after training, shown side by side in ``report.md``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trl_multiagent.evaluation.core import TEAM, StageResult, nan_to_none
from trl_multiagent.evaluation.labels import METHOD_NAMES, _cell, _fmt, method_label  # noqa: F401 (re-exported)
from trl_multiagent.metrics.stats import DEFAULT_RESAMPLES, paired_bootstrap
from trl_multiagent.runtime.atomic_files import open_atomically, write_atomically, write_text_atomically

logger = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
CURVE_FILE = "reward_curve.png"
PER_TASK_FILE = "eval_per_task.jsonl"
#: What the team wrote at each stage of the held-out evaluation: eval_texts_before.jsonl, eval_texts_after.jsonl.
TEXTS_FILE = "eval_texts_{stage}.jsonl"

def summarize(stages: Mapping[str, StageResult], metric: str, baselines: Sequence[str] = (),
              num_resamples: int = DEFAULT_RESAMPLES, seed: int = 0, alpha: float = 0.05) -> dict[str, Any]:
    """Per method: each stage's mean with its interval, the paired gains, and every metric's (see the module doc)."""
    boot = dict(num_resamples=num_resamples, seed=seed, alpha=alpha)
    names = list(dict.fromkeys(m for stage in stages.values() for m in stage.methods))
    names.sort(key=lambda m: m != TEAM)
    before, after = stages.get("before"), stages.get("after")
    out: dict[str, Any] = {}
    for method in names:
        runs = {s: stage.methods[method] for s, stage in stages.items() if method in stage.methods}
        entry: dict[str, Any] = {}
        metrics = list(dict.fromkeys(k for r in runs.values() for k in r.metrics))
        per_metric: dict[str, Any] = {}
        for name in metrics:
            values = {s: r.per_task(name) for s, r in runs.items() if name in r.samples}
            item = {s: _interval(paired_bootstrap(v, None, **boot)) for s, v in values.items()}
            if "before" in values and "after" in values:
                item["gain"] = _interval(paired_bootstrap(values["after"], values["before"], **boot))
            per_metric[name] = item
        for key in ("before", "after", "gain"):
            if metric in per_metric and key in per_metric[metric]:
                entry[key] = per_metric[metric][key]
        entry["metrics"] = per_metric
        entry["details"] = {s: r.details for s, r in runs.items() if r.details}
        out[method] = entry
    best = best_baseline(before, metric, baselines) if before is not None else None
    team_stage = after if after is not None and TEAM in after.methods else None
    if best is not None and team_stage is not None:
        gain = paired_bootstrap(team_stage.methods[TEAM].per_task(metric), before.methods[best].per_task(metric),
                                **boot)
        out[TEAM]["gain_vs_best_baseline"] = {**_interval(gain), "baseline": best}
    return out


def baseline_means(before: StageResult, metric: str, baselines: Sequence[str]) -> dict[str, float]:
    """Every evaluated baseline's mean of ``metric`` before training (the ones without it, or NaN, left out)."""
    means = {b: before.methods[b].mean(metric) for b in baselines
             if b in before.methods and metric in before.methods[b].samples}
    return {b: m for b, m in means.items() if not math.isnan(m)}


def best_baseline(before: StageResult, metric: str, baselines: Sequence[str]) -> str | None:
    """The baseline with the highest mean of ``metric`` before training, over all of ``baselines`` whatever agent's
    answer each scores (the first of equals; ``None`` without baselines)."""
    means = baseline_means(before, metric, baselines)
    return max(means, key=means.get) if means else None


def _interval(result: Mapping[str, Any]) -> dict[str, Any]:
    return {"mean": result["mean"], "ci95": list(result["ci95"])}


def evaluation_section(stages: Mapping[str, StageResult], metric: str, evaluator: str, num_samples: int,
                       decoding: Mapping[str, Any], baselines: Sequence[str] = (),
                       num_resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                       extra: Mapping[str, Any] | None = None,
                       task_sets: Mapping[str, Sequence[int]] | None = None,
                       tasks: Sequence[Mapping[str, Any]] | None = None,
                       groups: Mapping[str, Mapping[str, Sequence[int]]] | None = None) -> dict[str, Any]:
    """The ``evaluation`` section of ``summary.json``. ``task_sets`` (name -> task indices): held-out sets reported
    separately as well, each under ``held_out_sets`` with its own tasks' intervals and best baseline. ``tasks``: the
    held-out rows, whose questions and answers the ``examples`` (:func:`exchange_examples`) show. ``groups`` (column
    -> value -> task indices, :func:`task_groups`): the same per value of each column, under ``groups``."""
    first = next(iter(stages.values()))
    ids = next(iter(first.methods.values())).task_ids
    before = stages.get("before")
    section = {
        "evaluator": evaluator,
        "metric": metric,
        "held_out_tasks": len(ids),
        "task_ids": ids,
        "num_samples": num_samples,
        "decoding": dict(decoding),
        "baselines": [b for b in baselines if any(b in s.methods for s in stages.values())],
        "best_baseline": best_baseline(before, metric, baselines) if before is not None else None,
        "baseline_means": baseline_means(before, metric, baselines) if before is not None else {},
        "bootstrap": {"resamples": num_resamples, "alpha": 0.05, "seed": seed, "paired_by": "task",
                      "task_value": "mean over the task's samples"},
        "stages": {s: {"wall_time_s": st.wall_time_s, "generated_sequences": st.generated_sequences,
                       "generate_calls": st.generate_calls} for s, st in stages.items()},
        **dict(extra or {}),
        "methods": summarize(stages, metric, baselines, num_resamples, seed),
    }
    examples = exchange_examples(stages, tasks)
    if examples:
        section["examples"] = examples
    if task_sets:
        section["held_out_sets"] = _subset_entries(stages, task_sets, metric, baselines, num_resamples, seed)
    if groups:
        section["groups"] = {column: _subset_entries(stages, sets, metric, baselines, num_resamples, seed)
                             for column, sets in groups.items()}
    return section


def _subset_entries(stages: Mapping[str, StageResult], sets: Mapping[str, Sequence[int]], metric: str,
                    baselines: Sequence[str], num_resamples: int, seed: int) -> dict[str, Any]:
    """Per named set of tasks: its size, best baseline, baseline means and every method's summary on it alone."""
    out = {}
    for name, indices in sets.items():
        subsets = {s: st.subset(indices) for s, st in stages.items()}
        sub_before = subsets.get("before")
        out[name] = {
            "held_out_tasks": len(indices),
            "best_baseline": best_baseline(sub_before, metric, baselines) if sub_before is not None else None,
            "baseline_means": baseline_means(sub_before, metric, baselines) if sub_before is not None else {},
            "methods": summarize(subsets, metric, baselines, num_resamples, seed),
        }
    return out


def exchange_examples(stages: Mapping[str, StageResult], tasks: Sequence[Mapping[str, Any]] | None = None,
                      count: int = 5) -> list[dict[str, Any]]:
    """What the team wrote on ``count`` held-out tasks before and after training, side by side in ``report.md``.

    The tasks are chosen by a fixed rule that never looks at the results: evenly spaced over the held-out list
    (indices ``round(i * n / count)``; with sets in a row, each set gets its share). Each entry: ``task_id``, the
    task's ``question`` and ``answer`` where its row has them, and per stage the first sample's responses
    (``turn``, ``agent``, ``text``, ``reward``). Empty when no stage kept the team's texts."""
    kept = {s: st.methods[TEAM] for s, st in stages.items() if TEAM in st.methods and st.methods[TEAM].texts}
    if not kept:
        return []
    ids = next(iter(kept.values())).task_ids
    n = len(ids)
    chosen = sorted({min(n - 1, round(i * n / count)) for i in range(count)}) if n else []
    examples = []
    for i in chosen:
        entry: dict[str, Any] = {"task_id": ids[i]}
        row = tasks[i] if tasks is not None and i < len(tasks) else {}
        for key in ("question", "answer", "held_out_set"):
            if isinstance(row, Mapping) and key in row:
                entry[key] = row[key]
        for stage, result in kept.items():
            entry[stage] = [{k: r[k] for k in ("turn", "agent", "text", "reward") if k in r}
                            for r in result.texts if r["task_id"] == ids[i] and r.get("sample", 0) == 0]
        examples.append(entry)
    return examples


def task_sets_of(tasks: Sequence[Mapping[str, Any]], column: str = "held_out_set") -> dict[str, list[int]] | None:
    """The held-out sets named by the tasks' ``column`` (name -> task indices, in order of first appearance), or
    ``None`` when the tasks do not name at least two."""
    sets: dict[str, list[int]] = {}
    for i, task in enumerate(tasks):
        name = task.get(column) if isinstance(task, Mapping) else None
        if name is None:
            return None
        sets.setdefault(str(name), []).append(i)
    return sets if len(sets) > 1 else None


def task_groups(tasks: Sequence[Mapping[str, Any]], column: str) -> dict[str, list[int]]:
    """The tasks grouped by the value of ``column`` (value -> task indices, in order of first appearance); a task
    without the column is in the group ``(none)``. A ``ValueError`` when no task has the column."""
    if not any(isinstance(t, Mapping) and column in t for t in tasks):
        have = sorted({k for t in tasks if isinstance(t, Mapping) for k in t})
        raise ValueError(f"group_by {column!r}: no held-out task has a column {column!r} (they have {have})")
    groups: dict[str, list[int]] = {}
    for i, task in enumerate(tasks):
        value = task.get(column) if isinstance(task, Mapping) else None
        groups.setdefault("(none)" if value is None else str(value), []).append(i)
    return groups


def _samples_text(ev: Mapping[str, Any]) -> str:
    """``4 sample(s) per task and method``, or the count of each method when they differ."""
    per_method = ev.get("num_samples_per_method") or {}
    if len(set(per_method.values())) > 1:
        return "samples per task: " + ", ".join(f"{method_label(m)} {n}" for m, n in per_method.items())
    return f"{ev['num_samples']} sample(s) per task and method"


# ------------------------------------------------------------------------------------------------------- files

def log_evaluation(section: dict, metric: str, before: str = "before", after: str = "after") -> None:
    """Log the headline of an evaluation section: every baseline's mean and the best, the team's gain and its gain over
    the best baseline (``before`` / ``after`` name the two stages: untrained / trained for the evaluate command)."""
    if section.get("baseline_means"):
        logger.info("baselines (%s): %s; the best: %s", metric, ", ".join(
            f"{m} {v:.4f}" for m, v in section["baseline_means"].items()), section["best_baseline"])
    team = section["methods"].get("team", {})
    if "gain" in team:
        logger.info("team %s: %s %.4f, %s %.4f, gain %+.4f %s", metric, before, team["before"]["mean"], after,
                    team["after"]["mean"], team["gain"]["mean"], team["gain"]["ci95"])
    if "gain_vs_best_baseline" in team:
        vs = team["gain_vs_best_baseline"]
        logger.info("team %s vs %s: %+.4f %s", after, vs["baseline"], vs["mean"], vs["ci95"])


def write_run_outputs(output_dir: str | Path, evaluation: Mapping[str, Any] | None, run: Mapping[str, Any],
                      stages: Mapping[str, StageResult] | None = None) -> Path:
    """Add ``evaluation`` and the run's own entries (command, wall time, ...) to ``summary.json`` (the trainer's
    training summary, when it wrote one, stays as it is), then write ``report.md``, ``reward_curve.png``, the
    per-task values and the texts (:func:`write_texts`), and, where ``output_dir`` holds a saved team, its model
    card with these results (:mod:`trl_multiagent.evaluation.model_card`). The one place where a run's results are written after
    training. Each file is written whole or not at all, a full disk is one line (:mod:`trl_multiagent.runtime.atomic_files`).
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / SUMMARY_FILE
    summary: dict[str, Any] = {}
    if path.is_file():
        try:
            summary = json.loads(path.read_text())
        except ValueError:
            logger.warning("%s does not parse; it is replaced", path)
    summary.update(dict(run))
    if evaluation is not None:
        summary["evaluation"] = dict(evaluation)
    write_text_atomically(path, json.dumps(nan_to_none(summary), indent=2, default=str))
    if stages:
        with open_atomically(out / PER_TASK_FILE) as handle:
            for stage_name, stage in stages.items():
                for method, result in stage.methods.items():
                    for i, task_id in enumerate(result.task_ids):
                        row = {"stage": stage_name, "method": method, "task_id": task_id}
                        row.update({m: result.per_task(m)[i] for m in result.metrics})
                        row.update(result.per_turn[i] if result.per_turn else {})
                        handle.write(json.dumps(nan_to_none(row)) + "\n")
    write_texts(out, stages or {})
    write_report(summary, out / REPORT_FILE)
    plot_reward_curve(out / "metrics.jsonl", out / CURVE_FILE, summary.get("evaluation"),
                      summary.get("global_step"))
    from trl_multiagent.evaluation.model_card import write_model_cards

    write_model_cards(out)  # where out holds a saved team: its card, now with the held-out results
    return path


def write_texts(out: Path, stages: Mapping[str, StageResult]) -> list[Path]:
    """``eval_texts_<stage>.jsonl`` for every stage whose methods kept their texts: one row per response, ``method``,
    ``task_id``, ``sample``, ``turn``, ``agent``, ``text``, ``reward`` (the team reward of the step that executed it;
    ``local_reward`` too where the environment gave one) and ``done``. A file of a stage this run did not evaluate is
    removed, so that no text of an earlier run in ``output_dir`` passes for this run's."""
    written = []
    for stage in ("before", "after", *(s for s in stages if s not in ("before", "after"))):
        path = out / TEXTS_FILE.format(stage=stage)
        rows = [{"method": method, **row} for method, result in (stages[stage].methods.items() if stage in stages
                                                                 else ()) for row in result.texts]
        if not rows:
            path.unlink(missing_ok=True)
            continue
        with open_atomically(path) as handle:
            for row in rows:
                handle.write(json.dumps(nan_to_none(row), default=str) + "\n")
        written.append(path)
    return written


def write_report(summary: Mapping[str, Any], md_path: str | Path) -> Path:
    """``report.md``: the headline table (before, after, gain, gain vs the best baseline), every metric, the
    details, and the run."""
    ev = summary.get("evaluation")
    lines = ["# Run report", ""]
    if summary.get("command"):
        lines += [f"Command: `{summary['command']}`", ""]
    if ev:
        metric, best = ev["metric"], ev.get("best_baseline")
        decoding = ", ".join(f"{k} {v}" for k, v in ev.get("decoding", {}).items())
        lines += [
            f"## Held-out evaluation ({ev['evaluator']})",
            "",
            f"{ev['held_out_tasks']} held-out tasks, {_samples_text(ev)}; decoding: "
            f"{decoding}. Values are means over tasks of `{metric}` (a task's value is the mean over its samples); "
            "brackets: 95% bootstrap interval over tasks; gains are paired by task.",
            *(["", f"Before training: {ev['stage_meaning'].get('before', '-')}; after training: "
                   f"{ev['stage_meaning'].get('after', '-')}."] if ev.get("stage_meaning") else []),
            "",
            "| method | before training | after training | gain | gain vs best baseline |",
            "|---|---|---|---|---|",
        ]
        for method, entry in ev["methods"].items():
            label = method_label(method) + (" (best baseline)" if method == best else "")
            vs = entry.get("gain_vs_best_baseline")
            vs_text = f"{_cell(vs, True)} vs {vs['baseline']}" if vs else "-"
            lines.append(f"| {label} | {_cell(entry.get('before'))} | {_cell(entry.get('after'))} | "
                         f"{_cell(entry.get('gain'), True)} | {vs_text} |")
        lines += _baselines_line(ev.get("baseline_means") or {}, best)
        for name, held in ev.get("held_out_sets", {}).items():
            lines += _subset_table(f"Held-out set `{name}`", held)
        for column, sets in ev.get("groups", {}).items():
            for value, held in sets.items():
                lines += _subset_table(f"`{column}` = `{value}`", held)
        if ev.get("team_before_is_naive"):
            lines += ["", "The team before training is the naive-concatenation baseline's result (fresh LoRA adapters "
                          "have B = 0, so the untrained team IS the bases with the team's prompts)."]
        lines += ["", "### Every metric", "", "| method | metric | before | after | gain |", "|---|---|---|---|---|"]
        for method, entry in ev["methods"].items():
            for name, item in entry.get("metrics", {}).items():
                lines.append(f"| {method_label(method)} | {name} | {_cell(item.get('before'))} | "
                             f"{_cell(item.get('after'))} | {_cell(item.get('gain'), True)} |")
        detail_rows = [(m, s, k, v) for m, entry in ev["methods"].items()
                       for s, d in entry.get("details", {}).items() for k, v in d.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if detail_rows:
            lines += ["", "### Details", "", "| method | stage | value | |", "|---|---|---|---|"]
            lines += [f"| {method_label(m)} | {s} | {k} | {_fmt(v)} |" for m, s, k, v in detail_rows]
        lines += _examples_markdown(ev.get("examples") or [])
        stage_times = ", ".join(f"{s} {st['wall_time_s']:.0f} s ({st['generate_calls']} generation calls)"
                                for s, st in ev.get("stages", {}).items())
        lines += ["", f"Evaluation time: {stage_times}."]
    if "global_step" in summary:
        lines += ["", f"Training: {summary.get('global_step')} steps of {summary.get('algorithm', 'the trainer')}, "
                      f"{summary.get('train_runtime_s') or 0:.0f} s."]
    if "wall_time_s" in summary:
        lines += [f"Whole run: {summary['wall_time_s']:.0f} s."]
    write_text_atomically(md_path, "\n".join(lines) + "\n")
    return Path(md_path)


def _subset_table(title: str, held: Mapping[str, Any]) -> list[str]:
    """The headline table of one set of the held-out tasks (a held-out set, or a value of a grouping column)."""
    lines = ["", f"### {title} ({held['held_out_tasks']} tasks)", "",
             "| method | before training | after training | gain | gain vs best baseline |", "|---|---|---|---|---|"]
    for method, entry in held["methods"].items():
        label = method_label(method) + (" (best baseline)" if method == held.get("best_baseline") else "")
        vs = entry.get("gain_vs_best_baseline")
        vs_text = f"{_cell(vs, True)} vs {vs['baseline']}" if vs else "-"
        lines.append(f"| {label} | {_cell(entry.get('before'))} | {_cell(entry.get('after'))} | "
                     f"{_cell(entry.get('gain'), True)} | {vs_text} |")
    return lines + _baselines_line(held.get("baseline_means") or {}, held.get("best_baseline"))


def _baselines_line(means: Mapping[str, Any], best: str | None) -> list[str]:
    """One sentence naming every baseline's mean before training, highest first, and the best one."""
    if not means:
        return []
    ranked = sorted(means.items(), key=lambda kv: -kv[1] if isinstance(kv[1], (int, float)) else math.inf)
    listed = "; ".join(f"{method_label(m)} {_fmt(v)}" for m, v in ranked)
    return ["", f"Baselines before training, highest first: {listed}. The best baseline ({method_label(best)}) is "
                "the highest of them all, whatever agent's answer it scores."] if best else []


def _examples_markdown(examples: Sequence[Mapping[str, Any]]) -> list[str]:
    if not examples:
        return []
    lines = ["", f"### {len(examples)} held-out tasks, the untrained and the trained team", "",
             "Chosen by a fixed rule (evenly spaced over the held-out list), not by their results; the first sample "
             "of each. Reward: the team reward of the step."]

    def cell(row: Mapping[str, Any] | None) -> str:
        if row is None:
            return "-"
        text = str(row["text"]).strip().replace("|", "\\|").replace("\n", "<br>")
        return f"{text} (reward {_fmt(row.get('reward'))})"

    for ex in examples:
        head = f"`{ex['task_id']}`" + (f" ({ex['held_out_set']})" if "held_out_set" in ex else "")
        lines += ["", f"#### {head}", ""]
        if "question" in ex:
            lines += [f"{ex['question']}" + (f" (answer: {ex['answer']})" if "answer" in ex else ""), ""]
        before, after = ex.get("before", []), ex.get("after", [])
        keys = list(dict.fromkeys((r["turn"], r["agent"]) for r in [*before, *after]))
        lines += ["| turn | agent | untrained team | trained team |", "|---|---|---|---|"]
        for turn, agent in keys:
            b = next((r for r in before if (r["turn"], r["agent"]) == (turn, agent)), None)
            a = next((r for r in after if (r["turn"], r["agent"]) == (turn, agent)), None)
            lines.append(f"| {turn + 1} | {agent} | {cell(b)} | {cell(a)} |")
    return lines


def plot_reward_curve(metrics_path: str | Path, png_path: str | Path, evaluation: Mapping[str, Any] | None = None,
                      global_step: int | None = None) -> Path | None:
    """The mean training reward per logged step (and its per-level parts when present), with the team's held-out
    values before (step 0) and after training (last step) and the best baseline, as a PNG."""
    metrics_path = Path(metrics_path)
    rows = []
    if metrics_path.is_file():
        rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
        rows = [r for r in rows if isinstance(r.get("reward"), (int, float)) and "step" in r]
    team = (evaluation or {}).get("methods", {}).get(TEAM, {})
    points = [(s, team[s]) for s in ("before", "after") if isinstance(team.get(s, {}).get("mean"), (int, float))]
    if not rows and not points:
        logger.info("Nothing to plot: no training rewards in %s and no held-out values", metrics_path)
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    if rows:
        steps = [r["step"] for r in rows]
        ax.plot(steps, [r["reward"] for r in rows], label="training reward", color="black", linewidth=2)
        for key in sorted({k for r in rows for k in r if k.startswith("env/level/")}):
            ax.plot(steps, [r.get(key) for r in rows], label=key.removeprefix("env/level/"), linewidth=1)
    last = global_step if global_step is not None else (rows[-1]["step"] if rows else 1)
    metric = (evaluation or {}).get("metric", "metric")
    for stage, entry in points:
        x = 0 if stage == "before" else last
        lo, hi = entry.get("ci95") or [entry["mean"], entry["mean"]]
        err = [[max(0.0, entry["mean"] - lo)], [max(0.0, hi - entry["mean"])]] if None not in (lo, hi) else None
        ax.errorbar([x], [entry["mean"]], yerr=err, fmt="o", color="tab:red" if stage == "after" else "tab:blue",
                    capsize=4, label=f"held-out {metric}, team {stage}")
    best = (evaluation or {}).get("best_baseline")
    best_entry = (evaluation or {}).get("methods", {}).get(best or "", {}).get("before")
    if best_entry and isinstance(best_entry.get("mean"), (int, float)):
        ax.axhline(best_entry["mean"], color="tab:gray", linestyle="--", linewidth=1,
                   label=f"held-out {metric}, best baseline ({best})")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("mean reward / held-out value")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        write_atomically(png_path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    finally:
        plt.close(fig)
    return Path(png_path)
