"""Small helpers shared across the package."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def import_object(spec: str | Callable, what: str = "object") -> Any:
    """``"package.module:name"`` -> the object (a callable passes through unchanged)."""
    if callable(spec):
        return spec
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{what} {spec!r} must look like 'package.module:name'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ImportError(
            f"Cannot import {what} {spec!r}: {exc}. Name an importable module (e.g. "
            "'trl_multiagent.rewards.coding:cooperative_code_reward') or pass a callable."
        ) from exc


def release_freed_memory() -> None:
    """Return freed heap memory to the OS (glibc ``malloc_trim``) on CPU.

    Between policies the update frees large activation buffers while small, long-lived tensors (each policy's
    gradients and optimizer state, created lazily) land between them; glibc then keeps the freed space, and the
    resident memory of a team grows with its number of policies although the live tensors do not. Trimming after
    each policy's backward pass keeps a team on one shared base close to one agent's footprint (``make bench``).
    It is an action, not a setting: no allocator behaviour changes for the rest of the process.
    """
    import torch

    if torch.cuda.is_available():
        return
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _libc():
    import ctypes
    import ctypes.util
    import platform

    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _malloc_trim():
    libc = _libc()
    return getattr(libc, "malloc_trim", None) if libc is not None else None


def available_memory(device) -> int:
    """Bytes that can still be allocated on ``device``: free GPU memory, or the system's available memory on CPU."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


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
