"""Small helpers shared across the package."""

from __future__ import annotations

import functools
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
            f"Cannot import {what} {spec!r}: {exc}. Reward functions under rewards/ are importable from the "
            "repository root; run from there or pass a callable."
        ) from exc


def release_freed_memory() -> None:
    """Return freed heap memory to the OS (glibc ``malloc_trim``) on CPU.

    Between policies the update frees large activation buffers while small, long-lived tensors (each policy's
    gradients and optimizer state, created lazily) land between them; glibc then keeps the freed space, and the
    resident memory of a team grows with its number of policies although the live tensors do not. Trimming after
    each policy's backward pass keeps a team on one shared base close to one agent's footprint (``make bench``).
    """
    import torch

    if torch.cuda.is_available():
        return
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None
