"""Small helpers shared across the package."""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator
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


#: ``mallopt`` parameter number of glibc's mmap threshold (``M_MMAP_THRESHOLD`` in ``malloc.h``).
_M_MMAP_THRESHOLD = -3


def set_cpu_mmap_threshold(threshold: int) -> bool:
    """Pin glibc's mmap threshold to ``threshold`` bytes for this process (CPU training only).

    glibc serves allocations above the mmap threshold with their own ``mmap`` and unmaps them on ``free``, so their
    memory goes straight back to the OS. By default the threshold is *dynamic*: each freed large block raises it to
    that block's size, after which the activation buffers of a forward/backward pass come from the heap instead,
    where they fragment between the small long-lived tensors of each policy (gradients, optimizer state). A team's
    resident memory then grows with its number of policies although its live tensors hardly do. A fixed threshold
    (the same effect as the environment variable ``MALLOC_MMAP_THRESHOLD_``) keeps every large tensor in its own
    mapping; ``make bench`` (part b) measures both settings.

    Does nothing and returns ``False`` when ``threshold`` is 0, when CUDA is in use (GPU memory is not managed by
    glibc), when ``MALLOC_MMAP_THRESHOLD_`` is set (glibc already obeys the user's choice) or when the C library
    is not glibc. Returns ``True`` when the threshold was set.
    """
    import os

    import torch

    if threshold < 0:
        raise ValueError(f"the mmap threshold must be >= 0 bytes, got {threshold}")
    if threshold == 0 or torch.cuda.is_available() or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    mallopt = _mallopt()
    if mallopt is None or not mallopt(_M_MMAP_THRESHOLD, int(threshold)):
        return False
    _PINNED["threshold"] = int(threshold)
    return True


#: glibc's largest dynamic mmap threshold on 64-bit systems (``DEFAULT_MMAP_THRESHOLD_MAX``, 32 MiB).
GENERATION_MMAP_THRESHOLD = 32 << 20

_PINNED: dict[str, int] = {"threshold": 0}  # the threshold set_cpu_mmap_threshold pinned in this process (0: none)


@contextlib.contextmanager
def generation_mmap_threshold() -> Iterator[None]:
    """Serve blocks up to 32 MiB from the heap while generating, when :func:`set_cpu_mmap_threshold` pinned a lower
    threshold; the pinned threshold is back in force on exit.

    Generation allocates and frees many short-lived MiB-sized buffers per token: the KV cache growing and, for 4-bit
    bases on CPU, the weights bitsandbytes dequantizes at every matmul. With a 128 KiB threshold each of them is a
    fresh ``mmap`` whose pages the kernel zero-fills, which doubled the time of a 4-bit generation on SmolLM2-135M
    (17-18 s against 7-9 s, measured). Those buffers are all freed when the call ends and ``release_freed_memory``
    trims the heap after it, so the pinned threshold is only needed for the update, where freed activations would
    otherwise fragment the heap between long-lived tensors. Does nothing when no threshold was pinned.
    """
    pinned = _PINNED["threshold"]
    mallopt = _mallopt() if pinned else None
    if mallopt is None:
        yield
        return
    mallopt(_M_MMAP_THRESHOLD, max(pinned, GENERATION_MMAP_THRESHOLD))
    try:
        yield
    finally:
        mallopt(_M_MMAP_THRESHOLD, pinned)


def _mallopt():
    libc = _libc()
    return getattr(libc, "mallopt", None) if libc is not None else None


@functools.lru_cache(maxsize=1)
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
