"""Trainer callbacks shared by all multi-agent trainers."""

from __future__ import annotations

import json
import math
from pathlib import Path

from transformers import TrainerCallback


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


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
