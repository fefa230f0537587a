"""SIGINT (Ctrl-C) and SIGTERM (a cluster scheduler's preemption: SLURM, Kubernetes) stop a run that can be resumed.

transformers and TRL leave a signal to Python: SIGINT raises ``KeyboardInterrupt`` wherever the process is (a
traceback, the steps since the last checkpoint lost), SIGTERM kills it. Here, while a trainer trains
(:func:`train_until_signal`, around ``transformers.Trainer.train``), the first SIGINT or SIGTERM is noted (a warning
says so) and the step in progress is finished; at its end :class:`StopOnSignal`, a ``TrainerCallback``, asks
transformers' loop through its own controls to save a checkpoint of that step (``control.should_save``: when
``save_on_signal``, the default, and the signal came after the first completed step) and to stop
(``control.should_training_stop``). The checkpoint is written as every checkpoint is, whole or not at all
(:mod:`~trl_multiagent.trainers.checkpoint_staging`). No final adapters, summary or evaluation follow:
:class:`~trl_multiagent.errors.TrainingInterrupted` is raised, ``run_status.json`` says ``interrupted`` with the
signal, the step, the checkpoint and the command that resumes the run (``--resume_from_checkpoint true``), and the
command line prints that as one line and exits 130 (SIGINT) or 143 (SIGTERM), the codes a shell gives a process
ended by those signals. A signal between two steps (during a checkpoint's save, say) lets the next step run first.

A second signal ends the process at once (``os._exit``, the same exit codes; the step in progress is lost), after
one log line and ``run_status.json`` saying so; a checkpoint being written then is left as a temporary folder that
no resume takes. Under several processes the decision is taken together at every step's end (one all-reduce), so
that all save and stop at the same step whichever of them got the signal. Handlers can only be set from the main
thread: a trainer run from another thread keeps Python's.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from trl_multiagent.errors import TrainingInterrupted
from trl_multiagent.trainers.outputs import OutputDirError, last_complete_checkpoint, write_run_status

logger = logging.getLogger(__name__)

#: The signals that stop a run after its step.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_RESUME_ARG = re.compile(r"\s--resume_from_checkpoint(=|\s+)\S+")


def resume_command(trainer) -> str:
    """The command that resumes ``trainer``'s run: the run's own command line (``trainer.launch_command``, set by
    the command line's :class:`~trl_multiagent.command.runner.Run`) with ``--resume_from_checkpoint true``; in Python,
    ``train(resume_from_checkpoint=True)``."""
    command = getattr(trainer, "launch_command", None)
    if not command:
        return "trainer.train(resume_from_checkpoint=True) (on the command line: --resume_from_checkpoint true)"
    return f"{_RESUME_ARG.sub('', ' ' + command).strip()} --resume_from_checkpoint true"


class StopOnSignal(TrainerCallback):
    """The signal handlers of one ``train`` call and the callback that stops it (see the module docstring)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.signum: int | None = None
        self.step_at_signal: int | None = None
        self.stopped_at: int | None = None  # the step at whose end training was told to stop
        self.previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            logger.debug("training outside the main thread: SIGINT and SIGTERM keep Python's handlers")
            return
        for sig in STOP_SIGNALS:
            self.previous[sig] = signal.signal(sig, self.handle)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()

    @property
    def main(self) -> bool:
        return bool(self.trainer.args.should_save)

    def handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        step = self.trainer.state.global_step
        if self.signum is not None:
            self.exit_now(signum)
        self.signum, self.step_at_signal = signum, step
        if self.main:
            save = "saving a checkpoint of it and " if self.will_save(step) else ""
            logger.warning("%s: finishing step %d, then %sstopping; %s again stops at once", name, step + 1, save, name)

    def will_save(self, step_at_signal: int) -> bool:
        return bool(self.trainer.args.save_on_signal) and step_at_signal >= 1

    def exit_now(self, signum: int) -> None:
        """The second signal: the status says so, one log line, and the process ends with ``128 + signum``."""
        name = signal.Signals(signum).name
        step = self.trainer.state.global_step
        fields = self.status_fields(signum)
        message = (f"a second {name} stopped the run at once after step {step} (the work since is lost); "
                   f"{self.where_to_resume(fields)}")
        if self.main:
            try:
                write_run_status(self.trainer.args.output_dir, "interrupted", message=message, **fields)
            except Exception:  # noqa: BLE001 - the process ends now whatever happens
                pass
            logger.error(message)
        for handler in logging.getLogger().handlers:
            try:
                handler.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(128 + signum)

    # ------------------------------------------------------------------------------------------------ the callback
    def on_step_end(self, args, state, control, **kwargs):
        signum, at = self.signum or 0, self.step_at_signal if self.step_at_signal is not None else -1
        accelerator = self.trainer.accelerator
        if accelerator.num_processes > 1:  # all processes stop (and save) at the same step
            flags = torch.tensor([signum, at], dtype=torch.long, device=accelerator.device)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            signum, at = int(flags[0]), int(flags[1])
            if signum and self.signum is None:
                self.signum, self.step_at_signal = signum, at
        if not signum:
            return control
        self.stopped_at = state.global_step
        control.should_training_stop = True
        control.should_log = True  # the last step's metrics are in metrics.jsonl
        if self.will_save(at):
            control.should_save = True
        return control

    # ------------------------------------------------------------------------------------------------ the end
    def status_fields(self, signum: int) -> dict[str, Any]:
        """What ``run_status.json`` records of the interruption: the signal, the last completed step, the last
        complete checkpoint (or None) and the command that resumes the run."""
        try:
            checkpoint = str(last_complete_checkpoint(self.trainer.args.output_dir))
        except OutputDirError:
            checkpoint = None
        return {"signal": signal.Signals(signum).name, "step": self.trainer.state.global_step,
                "max_steps": self.trainer.state.max_steps, "checkpoint": checkpoint,
                "resume": resume_command(self.trainer) if checkpoint else None}

    @staticmethod
    def where_to_resume(fields: dict[str, Any], named: bool = False) -> str:
        """How to go on: the command that resumes (and the checkpoint it takes, unless the message ``named`` it)."""
        if fields["checkpoint"] is None:
            return "there is no checkpoint to resume from: start the run again"
        last = "" if named else f"the last checkpoint is {os.path.basename(fields['checkpoint'])}; "
        return f"{last}resume with: {fields['resume']}"

    def interrupted(self) -> TrainingInterrupted:
        """The error that ends a run stopped by a signal after its step."""
        signum = self.signum
        fields = self.status_fields(signum)
        step = fields["step"]
        saved = fields["checkpoint"] is not None and os.path.basename(fields["checkpoint"]) == f"checkpoint-{step}"
        if saved:
            what = f"stopped after the step in progress and saved checkpoint-{step}"
        elif self.stopped_at is None:
            what = "the signal came after the last step; no checkpoint of it was saved"
        elif not self.trainer.args.save_on_signal:
            what = "stopped after the step in progress; no checkpoint of it was saved (save_on_signal is false)"
        else:
            what = ("stopped after the step in progress; no checkpoint of it was saved (the signal came before the "
                    "first step was done)")
        message = (f"{fields['signal']} at step {step} of {fields['max_steps']}: {what}; "
                   f"{self.where_to_resume(fields, named=saved)}")
        return TrainingInterrupted(message, signum, fields)


def train_until_signal(trainer, train: Callable[..., Any], *args, **kwargs):
    """``train(*args, **kwargs)`` (``transformers.Trainer.train``) with SIGINT and SIGTERM stopping it after the step
    in progress (see the module docstring): raises :class:`~trl_multiagent.errors.TrainingInterrupted` then."""
    stop = StopOnSignal(trainer)
    stop.install()
    trainer.add_callback(stop)
    try:
        output = train(*args, **kwargs)
    finally:
        trainer.remove_callback(stop)
        stop.restore()
    if stop.signum is not None:
        raise stop.interrupted()
    return output
