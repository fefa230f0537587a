"""What a run leaves in its ``output_dir``, and the rules that keep it from being lost.

A run marks its directory with ``run_status.json`` (``running`` while it trains, ``finished`` at the end, ``failed``
with the error when it ends on one, ``interrupted`` when SIGINT or SIGTERM stopped it, with the step, the checkpoint
and the command that resumes it: :mod:`~trl_multiagent.trainers.signals`; with the process id and host). Before any model loads, a trainer refuses an
``output_dir`` that is empty, an existing file, a path where no directory can be made, or that holds the results of
another run (a status file, ``summary.json``, ``adapters/`` or ``checkpoint-*``), unless the run resumes from one of
its checkpoints or ``overwrite_output_dir`` is set; a directory whose run is still alive is refused even then. A
status that says ``running`` for a process of this host that is gone is stale (the run crashed or was killed): the
refusal says so, and a run allowed into the directory replaces it. A checkpoint to resume from is checked (its files
exist and parse) before anything loads; ``resume_from_checkpoint`` ``true`` / ``last`` is first resolved to the path of
the last checkpoint whose save completed (:func:`resolve_checkpoint`); a checkpoint's temporary folder
(``checkpoint-<step>.tmp-<pid>``, :mod:`~trl_multiagent.trainers.checkpoint_staging`) is never taken for one.

Every file written here is written whole or not at all (:mod:`trl_multiagent.runtime.atomic_files`); a disk that is full
while a run trains is one :class:`~trl_multiagent.errors.DiskFullError` line, and the status file is still written
(in place, where no new file fits).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from safetensors import safe_open

from trl_multiagent.errors import DiskFullError, TrainingInterrupted, one_line
from trl_multiagent.evaluation.model_card import config_differences, write_model_cards
from trl_multiagent.runtime.atomic_files import disk_full_error, is_disk_full, write_text_atomically
from trl_multiagent.runtime.provenance import machine_record

logger = logging.getLogger(__name__)

RUN_STATUS_FILE = "run_status.json"
#: Files and folders that mean a directory holds (part of) a run's results.
RESULT_MARKERS = (RUN_STATUS_FILE, "summary.json", "adapters")
#: ``resume_from_checkpoint`` values (any case) that mean the last complete checkpoint of ``output_dir``.
RESUME_LAST = ("true", "last")
#: The file a checkpoint's save writes last (``transformers.Trainer._save_checkpoint``): without it the save was cut
#: short.
CHECKPOINT_COMPLETE_MARKER = "trainer_state.json"


class OutputDirError(ValueError):
    """An ``output_dir`` or a checkpoint that a run must not use as it is."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_run_status(output_dir: str | Path) -> dict | None:
    path = Path(output_dir) / RUN_STATUS_FILE
    if not path.is_file():
        return None
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"status": "unreadable"}
    return status if isinstance(status, dict) else {"status": "unreadable"}


def run_is_alive(status: dict | None) -> bool:
    """The status file belongs to a run that is still running on this host."""
    return bool(status and status.get("status") == "running" and status.get("host") == socket.gethostname()
                and isinstance(status.get("pid"), int) and status["pid"] != os.getpid() and _pid_alive(status["pid"]))


def run_is_stale(status: dict | None) -> bool:
    """The status file says ``running`` for a process of this host that is gone: the run crashed or was killed."""
    return bool(status and status.get("status") == "running" and status.get("host") == socket.gethostname()
                and isinstance(status.get("pid"), int) and status["pid"] != os.getpid()
                and not _pid_alive(status["pid"]))


def _describe_status(status: dict | None) -> str:
    if run_is_stale(status):
        return (f"a run that did not finish (its {RUN_STATUS_FILE} says 'running' for process {status['pid']}, which "
                "is gone: it crashed or was killed)")
    if status and status.get("status") == "failed":
        error = status.get("error") or "no message"
        return f"a run that failed ({error})"
    if status and status.get("status") == "finished":
        return "a finished run"
    if status and status.get("status") == "interrupted":
        return f"a run that was interrupted ({status.get('message') or 'by a signal'})"
    return "the results of another run"


def check_writable_dir(output_dir: str | Path, name: str = "output_dir") -> None:
    """A directory can be made at ``output_dir`` (made and removed again here when it does not exist yet)."""
    if not str(output_dir).strip():
        raise OutputDirError(f"{name} is empty; give the directory the run writes to")
    path = Path(output_dir)
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise OutputDirError(f"{name} {str(path)!r} is not writable by this user")
        return
    made: list[Path] = []
    try:
        missing = [p for p in [path, *path.parents] if not p.exists()]
        for p in reversed(missing):
            try:
                p.mkdir()
            except FileExistsError:  # another process of this run made it meanwhile
                continue
            made.append(p)
    except OSError as exc:
        raise OutputDirError(f"{name} {str(path)!r} cannot be made: {exc.strerror or exc} "
                             f"({exc.filename or path})") from None
    finally:
        for p in reversed(made):
            try:
                p.rmdir()
            except OSError:
                pass


def check_output_dir(output_dir: str | Path, resume_from_checkpoint, overwrite: bool) -> None:
    """Refuse an ``output_dir`` whose contents a new run would overwrite, or where nothing can be written (see the
    module docstring). A stale status is removed when the run may use the directory."""
    path = Path(output_dir)
    if str(output_dir).strip() and path.exists() and not path.is_dir():
        raise OutputDirError(f"output_dir {str(path)!r} is an existing file, not a directory; choose another "
                             "output_dir")
    check_writable_dir(output_dir)
    if not path.is_dir():
        return
    status = read_run_status(path)
    if run_is_alive(status):
        raise OutputDirError(f"output_dir {str(path)!r} belongs to a run that is still running (pid {status['pid']}); "
                             "wait for it to end or choose another output_dir")
    by_step = sorted((p for p in path.glob("checkpoint-*") if _checkpoint_step(p) is not None), key=_checkpoint_step)
    checkpoints = [p.name for p in by_step]
    complete = [p.name for p in by_step if (p / CHECKPOINT_COMPLETE_MARKER).is_file()]
    if resume_from_checkpoint or overwrite:
        if run_is_stale(status):
            logger.warning("output_dir %s: %s; its status is replaced by this run's", path, _describe_status(status))
            (path / RUN_STATUS_FILE).unlink(missing_ok=True)
        return
    found = [m for m in RESULT_MARKERS if (path / m).exists()] + checkpoints + \
        sorted(p.name for p in path.glob("checkpoint-*") if _checkpoint_step(p) is None)
    if found:
        what = _describe_status(status)
        resume = ("Resume it (--resume_from_checkpoint <output_dir>/checkpoint-N, or true for the last complete one: "
                  f"{(complete or checkpoints)[-1]}), " if checkpoints else "It has no checkpoint-* to resume from; ")
        raise OutputDirError(
            f"output_dir {str(path)!r} already holds {what} ({', '.join(found[:4])}); it is never overwritten "
            f"silently. {resume}choose another --output_dir, or pass --overwrite_output_dir true to replace it.")


def _checkpoint_step(path: Path) -> int | None:
    suffix = path.name[len("checkpoint-"):]
    return int(suffix) if suffix.isdigit() else None


def last_complete_checkpoint(output_dir: str | Path, asked: str = "true") -> Path:
    """The ``checkpoint-<step>`` folder of ``output_dir`` with the highest step whose save completed (it holds
    :data:`CHECKPOINT_COMPLETE_MARKER`, written last); later ones whose save was cut short are skipped with a warning.
    None at all is an :class:`OutputDirError` that names the ways on (``asked``: the value given, for the message)."""
    path = Path(output_dir)
    head = f"resume_from_checkpoint={asked} (the last checkpoint of output_dir)"
    if not path.is_dir():
        state = "is an existing file, not a directory" if path.exists() else "does not exist"
        raise OutputDirError(f"{head}: output_dir {str(path)!r} {state}, so there is no checkpoint to resume from; "
                             "start the run without --resume_from_checkpoint, or give the --output_dir of the run to "
                             "continue")
    checkpoints = sorted((p for p in path.glob("checkpoint-*") if p.is_dir() and _checkpoint_step(p) is not None),
                         key=_checkpoint_step, reverse=True)
    complete = [p for p in checkpoints if (p / CHECKPOINT_COMPLETE_MARKER).is_file()]
    cut_short = [p.name for p in checkpoints if complete and _checkpoint_step(p) > _checkpoint_step(complete[0])]
    if complete:
        if cut_short:
            logger.warning("%s: passing over %s (no %s: the save was cut short); resuming from %s", head,
                           ", ".join(cut_short), CHECKPOINT_COMPLETE_MARKER, complete[0].name)
        return complete[0]
    found = [m for m in RESULT_MARKERS if (path / m).exists()]
    holds = (f" It holds {_describe_status(read_run_status(path))} ({', '.join(found)}), which cannot be continued "
             "without a checkpoint (a run writes them with save_strategy 'steps' and save_steps)."
             f"{_init_adapters_hint(path)}" if found else "")
    what = (f"no complete checkpoint in {str(path)!r} (no {CHECKPOINT_COMPLETE_MARKER} in "
            f"{', '.join(p.name for p in checkpoints)}: the saves were cut short)" if checkpoints
            else f"no checkpoint-* folder in {str(path)!r}")
    raise OutputDirError(f"{head}: {what}.{holds} Choose another --output_dir for a new run, or pass "
                         "--overwrite_output_dir true (without --resume_from_checkpoint) to train again in this one.")


def resolve_checkpoint(checkpoint, output_dir: str | Path) -> str | None:
    """``resume_from_checkpoint`` as the path of the checkpoint to resume from, or ``None`` for a fresh start.

    ``True`` and the strings ``true`` and ``last`` (any case) mean the last complete checkpoint of ``output_dir``
    (:func:`last_complete_checkpoint`), as ``True`` does in ``transformers.Trainer.train``; a command line gives the
    string, which transformers would take for a path. The trainer calls this once, before any model loads, and hands
    the path on to everything downstream (the checks, ``Trainer.train``, the runner), so that no later code sees
    ``true``. A path is returned as given."""
    if checkpoint in (None, False, ""):
        return None
    if checkpoint is True or (isinstance(checkpoint, str) and checkpoint.strip().lower() in RESUME_LAST):
        path = last_complete_checkpoint(output_dir, "true" if checkpoint is True else checkpoint.strip())
        logger.info("resume_from_checkpoint=%s: resuming from %s", checkpoint, path)
        return str(path)
    return str(checkpoint)


def check_checkpoint(checkpoint, output_dir: str | Path, policies, critics=()) -> None:
    """A checkpoint to resume from exists and its files parse: trainer state, team layout, every adapter (and critic
    head), optimizer state. ``checkpoint`` is a path (``true`` / ``last`` are resolved to one by
    :func:`resolve_checkpoint` first)."""
    checkpoint = resolve_checkpoint(checkpoint, output_dir)
    if checkpoint is None:
        return
    path = Path(checkpoint)
    if not path.is_dir():
        raise OutputDirError(f"resume_from_checkpoint {str(path)!r} does not exist (or is not a directory)"
                             f"{_other_checkpoints(output_dir, path)}")
    problems = []
    for name in ("trainer_state.json", "adapters/team.json"):
        try:
            json.loads((path / name).read_text())
        except FileNotFoundError:
            problems.append(f"{name} is missing")
        except (OSError, ValueError) as exc:
            problems.append(f"{name} does not parse ({type(exc).__name__})")
    files = [f"adapters/{p}/adapter_model.safetensors" for p in policies]
    files += [f"adapters/{c}/value_head.safetensors" for c in critics]
    for name in files:
        target = path / name
        if not target.is_file():
            problems.append(f"{name} is missing")
            continue
        try:
            with safe_open(str(target), framework="pt") as handle:
                list(handle.keys())
        except Exception as exc:  # noqa: BLE001 - safetensors raises several kinds for a damaged file
            problems.append(f"{name} is not a readable safetensors file ({type(exc).__name__})")
    # optimizer.pt; under FSDP accelerate writes optimizer.bin (full state dict) or optimizer_0/ (sharded)
    if not ((path / "optimizer.pt").is_file() or (path / "optimizer.bin").is_file() or (path / "optimizer_0").is_dir()):
        problems.append("optimizer.pt is missing")
    if problems:
        inside = sorted((p for p in path.glob("checkpoint-*") if (p / CHECKPOINT_COMPLETE_MARKER).is_file()),
                        key=lambda p: _checkpoint_step(p) or -1)
        where = (f"; it is a run's output_dir, not a checkpoint: resume from one of its checkpoints "
                 f"({', '.join(p.name for p in inside)}), or pass true for the last complete one of --output_dir"
                 if inside else "")
        others = "" if inside and path.resolve() == Path(output_dir).resolve() else _other_checkpoints(output_dir, path)
        hint = _init_adapters_hint(path) if "trainer_state.json is missing" in problems else ""
        raise OutputDirError(f"resume_from_checkpoint {str(path)!r} is incomplete or corrupt: {'; '.join(problems)}"
                             f"{where}{others}{'.' + hint if hint else ''}")


def _init_adapters_hint(path: Path) -> str:
    """The other way on from a folder that holds a saved team but no training state to resume: ``init_adapters``
    (:mod:`trl_multiagent.command.warm_start`)."""
    if not (path / "adapters" / "team.json").is_file():
        return ""
    return (f" To start a new run from its saved team instead (its adapters; a new optimizer, global step 0), pass "
            f"--init_adapters {path} without --resume_from_checkpoint.")


def _other_checkpoints(output_dir: str | Path, unusable: Path) -> str:
    """The other way on after a checkpoint that cannot be resumed from: the complete checkpoints of ``output_dir``."""
    folder = Path(output_dir)
    others = sorted((p for p in folder.glob("checkpoint-*") if p.is_dir() and _checkpoint_step(p) is not None
                     and (p / CHECKPOINT_COMPLETE_MARKER).is_file() and p.resolve() != unusable.resolve()),
                    key=_checkpoint_step) if folder.is_dir() else []
    if not others:
        return ""
    return f"; output_dir {str(folder)!r} has {', '.join(p.name for p in others)} to resume from instead"


def write_run_status(output_dir: str | Path, status: str, error: str | None = None, **fields) -> None:
    """Mark ``output_dir`` as ``running`` (with this process), ``finished``, ``failed`` (with ``error``) or
    ``interrupted`` (with ``fields``: the signal, the step, ...). The file is replaced whole; on a full disk, where no
    new file fits, it is rewritten in place (its blocks are already there), and where even that fails a warning says
    so: the status never hides the error that ended the run."""
    path = Path(output_dir)
    path.mkdir(parents=True, exist_ok=True)
    record = {"status": status, "pid": os.getpid(), "host": socket.gethostname(),
              "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **fields}
    if error is not None:
        record["error"] = error
    text = json.dumps(record, indent=2)
    try:
        write_text_atomically(path / RUN_STATUS_FILE, text)
    except DiskFullError:
        try:
            with open(path / RUN_STATUS_FILE, "r+") as handle:
                handle.write(text)
                handle.truncate()
        except OSError as exc:
            logger.warning("%s could not be written (%s): the disk is full; the run's status is %r",
                           path / RUN_STATUS_FILE, exc, status)


@contextlib.contextmanager
def marked_running(output_dir: str | Path, enabled: bool = True) -> Iterator[None]:
    """Mark ``output_dir`` ``running`` for the ``with`` block, and ``failed`` (with the error) if the block raises,
    ``interrupted`` if a signal stopped it (:class:`~trl_multiagent.errors.TrainingInterrupted`); ``enabled=False``
    (processes other than the main one) marks nothing. A full disk that a write of the block met without saying so
    (e.g. ``metrics.jsonl``'s) becomes one :class:`~trl_multiagent.errors.DiskFullError` line."""
    if enabled:
        write_run_status(output_dir, "running")
    try:
        yield
    except TrainingInterrupted as exc:
        if enabled:
            write_run_status(output_dir, "interrupted", message=one_line(exc), **exc.status_fields)
        raise
    except BaseException as exc:
        error = exc
        if isinstance(exc, Exception) and not isinstance(exc, DiskFullError) and is_disk_full(exc, output_dir):
            where = getattr(exc, "filename", None) or output_dir
            error = disk_full_error(f"{Path(where).name!r}", where, None, "the checkpoints saved before are as they "
                                    "were; free space on that file system, then resume with --resume_from_checkpoint "
                                    "true")
        if enabled:
            write_run_status(output_dir, "failed", error=one_line(error))
        if error is not exc:
            raise error from exc
        raise


def write_summary(trainer, output) -> Path:
    """``summary.json``: algorithm, team, run length, first/last and quarter-mean rewards, final metrics, the
    trainer's own part (:meth:`~trl_multiagent.trainers.base.MultiAgentTrainer.summary`) and the config's fields that
    differ from their defaults (``trainer_config``); then the saved team's model cards
    (:mod:`trl_multiagent.evaluation.model_card`)."""
    history = [h for h in trainer.state.log_history if "loss" in h or "reward" in h]
    last = history[-1] if history else {}
    rewards = [h["reward"] for h in history if isinstance(h.get("reward"), (int, float))]
    quarter = max(1, len(rewards) // 4)
    args = trainer.args
    summary = {
        "algorithm": trainer.algorithm,
        "trainer": type(trainer).__name__,
        "global_step": trainer.state.global_step,
        "train_runtime_s": output.metrics.get("train_runtime"),
        "train_loss": output.metrics.get("train_loss"),
        "first_reward": rewards[0] if rewards else None,
        "last_reward": rewards[-1] if rewards else None,
        "mean_reward_first_quarter": sum(rewards[:quarter]) / quarter if rewards else None,
        "mean_reward_last_quarter": sum(rewards[-quarter:]) / quarter if rewards else None,
        "final_metrics": {k: v for k, v in last.items() if isinstance(v, (int, float))},
        "agents": {name: {"policy": s.policy, "model": s.model_name, "quantization": s.quantization}
                   for name, s in trainer.pool.specs.items()},
        "adapters": {p: str(Path(args.output_dir) / "adapters" / p) for p in trainer.pool.policies},
    }
    own = trainer.summary()
    summary["config"] = {**{k: getattr(args, k) for k in ("num_generations", "episodes_per_step", "learning_rate",
                                                          "loss_type", "beta", "epsilon", "temperature",
                                                          "max_completion_length", "seed")},
                         **own.pop("config", {})}
    summary.update(own)
    summary["trainer_config"] = config_differences(args)  # every field set away from its default (the model card's)
    summary["card"] = {"paper": dict(getattr(trainer, "_paper", None) or {}), "config_class": type(args).__name__,
                       "trainer_name": getattr(trainer, "_trainer_name", None),
                       "tags": list(getattr(trainer, "_tag_names", None) or [])}  # the model card's trainer facts
    summary["machine"] = machine_record(trainer.pool)
    path = Path(args.output_dir) / "summary.json"
    write_text_atomically(path, json.dumps(summary, indent=2, default=str))
    write_model_cards(args.output_dir)  # README.md of the team and of each checkpoint (the runner adds the results)
    return path
