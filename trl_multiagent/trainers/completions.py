"""``log_completions``: what each agent wrote for the same task, and what the joint reward made of it.

Every logging step with ``log_completions: true``, the trainer turns the step's rollout into rows, one per joint
action (:func:`completion_rows`): the task, each agent's completion side by side, the joint reward and its
environment components, and the advantage each agent's response received. The rows are appended to
``<output_dir>/completions.jsonl`` and the first ``num_completions_to_print`` (TRL's field; all when unset) are
printed as a rich table (:func:`print_completions`). The rows also go to the tracking backends of ``report_to``
(:func:`log_to_trackers`): TensorBoard's text tab as a markdown table (tag ``train/completions``,
:func:`completions_markdown`), and a table named ``completions`` in trackio and wandb (:func:`completions_frame`:
one column per agent's completion and advantage), as TRL's GRPOTrainer logs its own.

Every rollout, whatever ``log_completions``, also adds to the trainer's count of the completions generated for training
(:class:`GeneratedSamples`, the trainer's ``generated_samples``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl_multiagent.rollout.experience import Experience

#: Characters of a task's description kept in a row.
TASK_CHARS = 200
#: Columns that state a task, in the order they are looked for (TRL's ``prompt`` first).
PROMPT_COLUMNS = ("prompt", "question", "problem", "query", "instruction", "task", "input", "text")
#: Columns that hold a task's answer, its reference or its tests: never shown as the task (the table would give the
#: solution where the question belongs).
ANSWER_COLUMNS = frozenset({"solution", "solutions", "answer", "answers", "target", "targets", "label", "labels",
                            "reference", "references", "ground_truth", "gold", "canonical_solution", "test", "tests",
                            "test_list", "completion", "output", "response", "expected", "expected_output"})


@dataclass
class GeneratedSamples:
    """The samples this process generated for training, counted at every rollout of the trainer (its
    ``generated_samples``, read by the recipe runner for ``summary.json``'s ``generated_samples``).

    ``per_rollout`` holds each rollout's ``num_generations`` (the sampler's count of its generations, before any
    average over processes); ``completion_tokens`` sums the completion tokens of every rollout's samples (the training
    budget a single-agent comparison matches: ``train-single``)."""

    per_rollout: list[int] = field(default_factory=list)
    completion_tokens: int = 0

    def add(self, experience: Experience) -> None:
        """Count one rollout's samples, as the sampler returned them."""
        stats = getattr(experience, "stats", None) or {}
        if "generated_samples" in stats:
            self.per_rollout.append(int(stats["generated_samples"]))
        self.completion_tokens += sum(len(s.generation.completion_ids) for s in getattr(experience, "samples", ()))


def _text(value: Any) -> str | None:
    """The text of a prompt value: a string, or the content of the last user message of chat messages."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, (list, tuple)) and value and all(isinstance(m, Mapping) for m in value):
        users = [m for m in value if m.get("role") == "user"] or list(value)
        content = users[-1].get("content")
        return content if isinstance(content, str) and content else None
    return None


def describe_task(task: Any) -> str:
    """A short text naming a task row: its ``task_id`` (or ``id``); else its prompt (the first of
    :data:`PROMPT_COLUMNS`, a string or chat messages, whose last user message is shown); else its first other text
    column that is not an answer (:data:`ANSWER_COLUMNS`); else its repr."""
    if isinstance(task, Mapping):
        for key in ("task_id", "id"):
            if task.get(key) is not None:
                return str(task[key])
        others = [k for k in task if k not in PROMPT_COLUMNS and str(k).lower() not in ANSWER_COLUMNS]
        for key in [k for k in PROMPT_COLUMNS if k in task] + others:
            text = _text(task[key])
            if text is not None:
                return text[:TASK_CHARS]
    return repr(task)[:TASK_CHARS]


def sample_advantage(sample) -> float:
    """The advantage a sample's response received: ``Sample.advantage``, or where the credit is per token (MAPoRL's
    GAE) the mean of its token advantages."""
    tokens = getattr(sample, "token_advantages", None)
    return float(sum(tokens) / len(tokens)) if tokens else float(sample.advantage)


def completion_rows(experience: Experience, tasks: Sequence[Any], step: int, agents: Sequence[str]) -> list[dict]:
    """One row per joint action of ``experience``: ``step``, ``episode``, ``turn``, ``task``, ``completions``,
    ``advantages`` (:func:`sample_advantage`) and ``rewards`` by agent (an agent that did not act in the joint action
    is left out), ``correct`` by agent where the samples know it (debates), ``reward`` and the environment's
    ``components`` (its info values)."""
    by_joint: dict[int, dict[str, Any]] = {}
    for sample in experience.samples:
        for joint_id in sample.joint_ids:
            by_joint.setdefault(joint_id, {})[sample.agent] = sample
    rows = []
    for joint in experience.joint_actions:
        members = by_joint.get(joint.id, {})
        task = tasks[joint.episode] if 0 <= joint.episode < len(tasks) else None
        rows.append({
            "step": step, "episode": joint.episode, "turn": joint.turn, "task": describe_task(task),
            "completions": {a: members[a].generation.text for a in agents if a in members},
            "advantages": {a: sample_advantage(members[a]) for a in agents if a in members},
            "rewards": {a: float(members[a].reward) for a in agents if a in members},
            **({"correct": {a: members[a].correct for a in agents if a in members}}
               if any(getattr(members[a], "correct", None) is not None for a in members) else {}),
            "reward": float(joint.reward),
            "components": {k: float(v) for k, v in joint.info.items()},
        })
    return rows


def append_rows(rows: Sequence[dict], output_dir: str | Path) -> Path:
    """Append ``rows`` to ``<output_dir>/completions.jsonl``; returns the path."""
    path = Path(output_dir) / "completions.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def completions_table(rows: Sequence[dict], agents: Sequence[str], limit: int | None = None):
    """A rich Table of the first ``limit`` rows (all when None): task, one column per agent (its completion and its
    advantage), the joint reward and its components."""
    from rich.table import Table

    shown = list(rows)[:limit] if limit is not None else list(rows)
    step = shown[0]["step"] if shown else ""
    table = Table(title=f"Joint actions at step {step}", show_lines=True)
    table.add_column("task", max_width=30, overflow="fold")
    for agent in agents:
        table.add_column(agent, overflow="fold")
    table.add_column("reward", justify="right")
    for row in shown:
        cells = [f"{row['completions'][a]}\n[dim]advantage {row['advantages'][a]:+.3f}[/dim]"
                 if a in row["completions"] else "" for a in agents]
        components = ", ".join(f"{k} {v:.2f}" for k, v in row["components"].items())
        table.add_row(f"{row['task']}\n[dim]episode {row['episode']}, turn {row['turn']}[/dim]", *cells,
                      f"{row['reward']:.3f}" + (f"\n[dim]{components}[/dim]" if components else ""))
    return table


def completions_markdown(rows: Sequence[dict], agents: Sequence[str]) -> str:
    """The rows as a markdown table (for tracking backends that show text, e.g. TensorBoard's text tab)."""
    def cell(text: str) -> str:
        return " ".join(str(text).split()).replace("|", "\\|")

    lines = ["| task | " + " | ".join(agents) + " | reward |", "|---" * (len(agents) + 2) + "|"]
    for row in rows:
        answers = [f"{cell(row['completions'][a])} (advantage {row['advantages'][a]:+.3f})"
                   if a in row["completions"] else "" for a in agents]
        lines.append(f"| {cell(row['task'])} | " + " | ".join(answers) + f" | {row['reward']:.3f} |")
    return "\n".join(lines)


def print_completions(rows: Sequence[dict], agents: Sequence[str], limit: int | None = None, console=None) -> None:
    """Print :func:`completions_table` with rich."""
    from rich.console import Console

    (console or Console()).print(completions_table(rows, agents, limit))


def completions_frame(rows: Sequence[dict], agents: Sequence[str]):
    """The rows as a pandas DataFrame: ``step``, ``episode``, ``turn``, ``task``, ``completion/<agent>`` and
    ``advantage/<agent>`` for each agent (empty / NaN where the agent did not act), ``reward`` and one column per
    environment component."""
    import pandas as pd

    components = list(dict.fromkeys(k for row in rows for k in row["components"]))
    records = []
    for row in rows:
        record = {k: row[k] for k in ("step", "episode", "turn", "task")}
        for agent in agents:
            record[f"completion/{agent}"] = row["completions"].get(agent, "")
            record[f"advantage/{agent}"] = row["advantages"].get(agent, float("nan"))
        record["reward"] = row["reward"]
        record.update({k: row["components"].get(k, float("nan")) for k in components})
        records.append(record)
    return pd.DataFrame.from_records(records)


def log_to_trackers(rows: Sequence[dict], agents: Sequence[str], step: int, report_to: Sequence[str],
                    callbacks: Sequence[Any] = ()) -> list[str]:
    """Send one logging step's rows to the tracking backends of ``report_to`` that take them; returns their names.

    ``tensorboard``: the markdown table in the text tab of the TensorBoard callback's writer (tag
    ``train/completions``). ``trackio`` / ``wandb``: a ``Table`` of :func:`completions_frame` named ``completions``
    logged with ``train/global_step`` = ``step``, as transformers' callbacks log the metrics (wandb: only when its
    callback has started a run).
    """
    sent = []
    for callback in callbacks:
        writer = getattr(callback, "tb_writer", None)
        if writer is not None and "tensorboard" in report_to:
            writer.add_text("train/completions", completions_markdown(rows, agents), step)
            sent.append("tensorboard")
    if "trackio" in report_to:
        import trackio

        # no explicit step: transformers' callback logs without one (trackio counts log calls), with
        # train/global_step as the training step; so does the table
        trackio.log({"completions": trackio.Table(dataframe=completions_frame(rows, agents)),
                     "train/global_step": step})
        sent.append("trackio")
    if "wandb" in report_to:
        import wandb

        if wandb.run is not None:
            wandb.log({"completions": wandb.Table(dataframe=completions_frame(rows, agents)),
                       "train/global_step": step})
            sent.append("wandb")
    return sent


def record_completions(trainer, experience: Experience, tasks: Sequence[Mapping[str, Any]]) -> None:
    """``log_completions``: on logging steps, this step's joint actions go to ``completions.jsonl`` and the first
    ``num_completions_to_print`` to the console; ``trainer``'s process's rollout only (its main process writes)."""
    step = trainer.state.global_step + 1  # the step being computed
    every = trainer.state.logging_steps or trainer.args.logging_steps
    if not trainer.accelerator.is_main_process or (every and step % max(1, int(every)) != 0):
        return
    agents = trainer.pool.agent_names
    rows = completion_rows(experience, tasks, step, agents)
    append_rows(rows, trainer.args.output_dir)
    log_to_trackers(rows, agents, step, trainer.args.report_to or [], trainer.callback_handler.callbacks)
    if trainer.args.num_completions_to_print != 0:
        print_completions(rows, agents, trainer.args.num_completions_to_print)
