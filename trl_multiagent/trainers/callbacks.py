"""Trainer callbacks shared by all multi-agent trainers."""

from __future__ import annotations

import json
import math
from pathlib import Path

from transformers import TrainerCallback

from trl_multiagent.runtime.process import progress_bar


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def format_logs(logs: dict, max_str_len: int = 100) -> str:
    """A logged dict as transformers' ``ProgressCallback.on_log`` prints it under TRL's GRPOTrainer: floats to 4
    significant digits (as strings), long strings replaced by a note, ``total_flos`` left out."""
    shown = {}
    for key, value in logs.items():
        if isinstance(value, str) and len(value) > max_str_len:
            shown[key] = (f"[String too long to display, length: {len(value)} > {max_str_len}. "
                          "Consider increasing `max_str_len` if needed.]")
        elif isinstance(value, float):
            shown[key] = f"{value:.4g}"
        else:
            shown[key] = value
    shown.pop("total_flos", None)
    return str(shown)


class MetricsFileCallback(TrainerCallback):
    """Appends every logged dict to ``<output_dir>/metrics.jsonl`` (one JSON object per logging step).

    The file is written by the main process only. A resumed run appends to the file it finds, after dropping the
    lines logged past the checkpoint it resumes from, so that every step appears once.
    """

    def __init__(self, output_dir: str):
        self.path = Path(output_dir) / "metrics.jsonl"

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= state.global_step]
            self.path.write_text("".join(line + "\n" for line in kept))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, "epoch": state.epoch, **{k: _jsonable(v) for k, v in logs.items()}}
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")


class TrainingProgressCallback(TrainerCallback):
    """A rich progress bar of training: steps done of ``max_steps``, elapsed time, time left, and the last logged
    team reward (``reward``) and step time; one line fits 100 columns. The main process draws it.

    It stands in for transformers' ``ProgressCallback``, and prints what that prints: each logging step's dict
    (:func:`format_logs`), above the bar, as TRL's GRPOTrainer shows it; ``print_logs: false`` leaves the bar alone.
    """

    def __init__(self):
        self.progress = None
        self.task = None

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero or state.max_steps <= 0:
            return
        from rich.progress import TextColumn

        self.progress = progress_bar("training", "steps", TextColumn("{task.fields[status]}"))
        self.progress.start()
        self.task = self.progress.add_task("training", total=state.max_steps, completed=state.global_step,
                                           status="")

    def on_step_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if getattr(args, "print_logs", True):
            from rich.console import Console

            # above the live bar, as tqdm.write prints above tqdm's; without a bar, to standard output as TRL does
            console = self.progress.console if self.progress is not None else Console()
            console.print(format_logs(logs), markup=False, highlight=False, soft_wrap=True)
        if self.progress is None:
            return
        shown = [f"{name} {logs[key]:.3f}" for key, name in (("reward", "reward"), ("loss", "loss"))
                 if isinstance(logs.get(key), (int, float))]
        if isinstance(logs.get("step_time"), (int, float)):
            shown.append(f"{logs['step_time']:.0f} s/step")
        if shown:
            self.progress.update(self.task, status=" · ".join(shown))

    def on_train_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step)
            self.progress.stop()
            self.progress = None
