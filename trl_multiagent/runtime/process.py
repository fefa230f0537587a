"""The process around the library's work: torch's CPU threads, the rich progress bars, and the cache folder."""

from __future__ import annotations

import os
from pathlib import Path


def progress_bar(label: str, unit: str, *extra_columns, **kwargs):
    """A rich ``Progress`` with the project's columns: ``label`` in bold, a bar, done/total ``unit``, elapsed time
    and time left, then ``extra_columns`` (e.g. a status text)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn(f"[bold]{label}"), BarColumn(bar_width=24), MofNCompleteColumn(), TextColumn(unit),
                    TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(), *extra_columns, **kwargs)


def cache_dir() -> Path:
    """Root of the trl-multiagent cache: ``$TRL_MULTIAGENT_CACHE`` if set, else ``~/.cache/trl_multiagent``.

    The directory is not created here (the embedded models and the recipe fields' snapshot create what they need).
    """
    env = os.environ.get("TRL_MULTIAGENT_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "trl_multiagent"


def configure_threads(num_threads: int | None) -> int | None:
    """Set torch's CPU threads: ``num_threads``, or (None) the CPUs this process may run on divided among the
    processes of this machine (``LOCAL_WORLD_SIZE``). Returns the number set; ``None`` when it leaves them as they are:
    on CUDA, and when the user set ``OMP_NUM_THREADS`` themselves (``accelerate launch`` sets it to 1 on its own,
    which is not taken as the user's choice)."""
    import torch

    if num_threads is None:
        launched_by_accelerate = any(k.startswith("ACCELERATE_") for k in os.environ)
        if torch.cuda.is_available() or ("OMP_NUM_THREADS" in os.environ and not launched_by_accelerate):
            return None
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cpus = os.cpu_count() or 1
        num_threads = max(1, cpus // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    torch.set_num_threads(num_threads)
    return num_threads
