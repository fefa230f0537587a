"""A checkpoint is written whole or not at all.

``transformers.Trainer._save_checkpoint`` writes ``checkpoint-<step>/`` file by file in place (adapters, optimizer,
scheduler, RNG states, ``trainer_state.json`` last) and does not stage it. Here it writes into a temporary folder,
``<output_dir>/checkpoint-<step>.tmp-<id>/`` (``<id>``: the main process's id, the same on every process), and the
complete ``checkpoint-<step>`` in it is renamed into ``output_dir`` when every process is done
(:func:`~trl_multiagent.runtime.atomic_files.publish_directory`; an existing folder of that step, left by an earlier run
that is resumed, is replaced whole). Then older checkpoints are rotated (``save_total_limit``), as transformers would.
A full disk, a crash or a kill during the write thus leaves the earlier checkpoints as they were and no
``checkpoint-<step>`` folder that ``resume_from_checkpoint true`` could take; the temporary folder is removed on an
error, and one that a killed process left is removed at the next save. Out of space is ONE
:class:`~trl_multiagent.errors.DiskFullError` line: the checkpoint, the space it needs (the larger of the tensors it
holds, the folder written so far and the previous checkpoint) and the space left.

The trainer's ``_save_checkpoint`` (:mod:`~trl_multiagent.trainers.compat`) runs transformers' own inside
:func:`staged_checkpoint`, with ``_get_output_dir`` answering the temporary folder meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from trl_multiagent.runtime.atomic_files import (
    TEMP_MARK,
    disk_full_error,
    folder_size,
    is_disk_full,
    publish_directory,
)
from trl_multiagent.trainers.outputs import CHECKPOINT_COMPLETE_MARKER, _checkpoint_step

logger = logging.getLogger(__name__)

#: Bytes a checkpoint holds beyond its tensors (RNG states, scheduler, trainer state, training arguments, configs).
SMALL_FILES_BYTES = 64 * 1024


def _token(trainer) -> int:
    """The main process's id, known to every process (the temporary folder's name must be one for all)."""
    if trainer.accelerator.num_processes == 1:
        return os.getpid()
    from accelerate.utils import broadcast_object_list

    return int(broadcast_object_list([os.getpid()])[0])


def remove_stale_staging(run_dir: Path, keep: Path) -> None:
    """Remove the temporary checkpoint folders that a killed or failed process left in ``run_dir`` (no live run
    shares an output_dir: :func:`~trl_multiagent.trainers.outputs.check_output_dir`)."""
    for path in run_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*{TEMP_MARK}*"):
        if path != keep and path.is_dir():
            logger.info("removing %s, a checkpoint whose save did not complete", path)
            shutil.rmtree(path, ignore_errors=True)


def checkpoint_size(trainer, run_dir: Path, staging: Path) -> int:
    """What a checkpoint of ``trainer`` takes, estimated: the trainable tensors and the optimizer's state, the folder
    written so far, and the last complete checkpoint, whichever is largest."""
    tensors = sum(p.numel() * p.element_size() for g in trainer.pool.trainable_groups() for p in g["params"])
    optimizer = getattr(trainer, "optimizer", None)
    if optimizer is not None:
        tensors += sum(v.numel() * v.element_size() for state in optimizer.state.values() for v in state.values()
                       if isinstance(v, torch.Tensor))
    done = complete_checkpoints(run_dir)
    previous = folder_size(done[-1]) if done else 0
    return max(tensors + SMALL_FILES_BYTES, folder_size(staging), previous)


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The ``checkpoint-<step>`` folders of ``run_dir`` whose save completed, by step."""
    return sorted((p for p in run_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if _checkpoint_step(p) is not None
                   and (p / CHECKPOINT_COMPLETE_MARKER).is_file()), key=_checkpoint_step)


@contextlib.contextmanager
def staged_checkpoint(trainer, trial) -> Iterator[str]:
    """The temporary folder to give transformers' ``_save_checkpoint`` as its output dir; its
    ``checkpoint-<step>`` is published into the run's output dir when the ``with`` block ends (see the module
    docstring)."""
    run_dir = Path(trainer._get_output_dir(trial))
    name = f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}"
    final = run_dir / name
    staging = run_dir / f"{name}{TEMP_MARK}{_token(trainer)}"
    main = trainer.args.should_save
    if main:
        remove_stale_staging(run_dir, keep=staging)
    try:
        yield str(staging)
        if trainer.accelerator.num_processes > 1:  # every process has written its part (its RNG state, ...)
            trainer.accelerator.wait_for_everyone()
        if main:
            publish_directory(staging / name, final)
            staging.rmdir()
            rotate_checkpoints(output_dir=str(run_dir), save_total_limit=trainer.args.save_total_limit,
                               best_model_checkpoint=trainer.state.best_model_checkpoint, use_mtime=True)
    except Exception as exc:
        if not main:
            raise
        needed = checkpoint_size(trainer, run_dir, staging)
        full = is_disk_full(exc, run_dir, needed)
        shutil.rmtree(staging, ignore_errors=True)
        if not full:
            raise
        earlier = ", ".join(p.name for p in complete_checkpoints(run_dir)) or "none"
        kept = (f"nothing of this save was kept, and the earlier checkpoints are as they were ({earlier}); free space "
                "on that file system (or move output_dir), then resume with --resume_from_checkpoint true")
        raise disk_full_error(name, final, needed, kept) from exc
    except BaseException:
        if main:
            shutil.rmtree(staging, ignore_errors=True)
        raise
