"""The CPU allocator (glibc: keeping or trimming freed memory), gradients in one block, and a device's total memory."""

from __future__ import annotations

import os
from collections.abc import Iterable

#: glibc's ``mallopt`` parameters (``<malloc.h>``).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Blocks from this size on get their own mapping when the process keeps freed memory (:func:`keep_freed_cpu_memory`):
#: larger than any tensor of a step of the project's models, smaller than a model's weights loaded in one piece.
#: glibc's manual gives 32 MiB as the ceiling on 64-bit systems (the Debian glibc 2.36 of the project's machine takes
#: 1 GiB); where 1 GiB is refused, the ceiling is set.
KEEP_FREED_MMAP_THRESHOLD = 1 << 30
MMAP_THRESHOLD_CEILING = 32 << 20
#: The environment variables by which a user sets glibc's trim and mmap thresholds themselves (then left alone).
ALLOCATOR_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")
#: What :func:`keep_freed_cpu_memory` did in this process (:func:`cpu_allocator_record` reports it).
_ALLOCATOR = {"keeps_freed": False, "note": "glibc's defaults"}


def keep_freed_cpu_memory() -> bool:
    """Make this process keep the CPU memory it frees for its next allocations (glibc): no trimming of the heap's top
    (``M_TRIM_THRESHOLD`` -1) and blocks up to :data:`KEEP_FREED_MMAP_THRESHOLD` served from the heap rather than from
    mappings of their own (``M_MMAP_THRESHOLD``); :func:`release_freed_memory` then trims nothing either. Returns
    whether it did; it does nothing (False) on CUDA, without glibc, and when the user set any of
    :data:`ALLOCATOR_ENV`.

    A training step allocates and frees the same large tensors at every step (logits, activations, caches). With
    glibc's defaults, blocks above a dynamic threshold (at most 32 MiB) are mapped and unmapped, the heap's free top is
    given back, and the trainer trimmed the heap after the rollout and after each policy's update: every page was
    then faulted in and zeroed again by the kernel at its next use: in a 5-step run of the main job 6.4 million page
    faults and 16-17 s of system time, against 1.9 million and 8 s kept (``experiments/speed/step_profile/README.md``,
    "Page faults"). The cost: resident memory stays at its peak, and where several policies update one after
    another, the small tensors each creates between freed buffers make the heap grow (the trims kept that from
    resident memory). It is process-wide and stays set."""
    import torch

    if _ALLOCATOR["keeps_freed"]:
        return True
    if torch.cuda.is_available():
        return False
    user = [k for k in ALLOCATOR_ENV if k in os.environ and (k != "GLIBC_TUNABLES" or "malloc" in os.environ[k])]
    if user:
        _ALLOCATOR["note"] = f"set by the user's environment ({', '.join(user)})"
        return False
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    threshold = next((t for t in (KEEP_FREED_MMAP_THRESHOLD, MMAP_THRESHOLD_CEILING)
                      if libc.mallopt(_M_MMAP_THRESHOLD, t)), None)
    if threshold is None or not libc.mallopt(_M_TRIM_THRESHOLD, -1):
        raise RuntimeError("glibc's mallopt refused the mmap or trim threshold (cpu_keep_freed_memory); set it false")
    _ALLOCATOR.update(keeps_freed=True, note=f"keeps freed memory (mallopt: no trimming, mmap threshold {threshold})")
    return True


def cpu_allocator_record() -> str:
    """How this process's CPU allocator was set: glibc's defaults, kept freed memory, or the user's environment."""
    return _ALLOCATOR["note"]


def release_freed_memory() -> None:
    """Return freed heap memory to the OS (glibc ``malloc_trim``) on CPU, unless this process keeps its freed memory
    (:func:`keep_freed_cpu_memory`, the trainers' ``cpu_keep_freed_memory``).

    Between policies the update frees large activation buffers while small, long-lived tensors (the optimizer's
    state, created lazily; the gradients too, but for :func:`gradients_in_one_block`) land between them; glibc then
    keeps the freed space, and the resident memory of a team grows with its number of policies although the live
    tensors do not. Trimming after each policy's backward pass keeps a team on one shared base close to one agent's
    footprint (``make bench``), at the price of faulting those pages in again at the next step.
    """
    import torch

    if torch.cuda.is_available() or _ALLOCATOR["keeps_freed"]:
        return
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def gradients_in_one_block(params: Iterable) -> int:
    """Give each parameter of ``params`` that requires a gradient and has none a zero gradient, all of them views of
    one new buffer; returns how many parameters got one.

    The backward pass then adds into these views in place, where it would otherwise allocate each parameter's first
    gradient at the moment it is computed, amid the activations being freed. A LoRA adapter has a few hundred small
    parameters; a team updates its policies one after another, and each policy's scattered gradients, live until the
    optimizer's step, pin the freed activations' memory between them, so that glibc's heap, and the resident memory,
    grow with every policy of the step (``benchmarks/memory_phases.py``; ``experiments/speed/memory_ab/README.md``). One
    block per policy, allocated before its backward pass, leaves the space the pass frees in one piece. Values are
    those of the usual first gradient (zero plus the gradient, exactly); an optimizer's ``zero_grad`` (set to
    ``None``) frees the block.

    Only for parameters the caller's backward passes will reach: a parameter that gets a zero gradient this way
    but none from the backward is stepped by an optimizer as if its gradient were zero (Adam's moments then still
    move it), where ``None`` would skip it."""
    import torch

    missing = [p for p in params if p.requires_grad and p.grad is None]
    if not missing:
        return 0
    groups: dict[tuple, list] = {}
    for p in missing:
        groups.setdefault((p.dtype, p.device), []).append(p)
    for (dtype, device), group in groups.items():
        block = torch.zeros(sum(p.numel() for p in group), dtype=dtype, device=device)
        offset = 0
        for p in group:
            p.grad = block[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
    return len(missing)


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


def total_memory(device) -> int:
    """Bytes of memory ``device`` has in all (a fixed property of the machine, unlike the memory free at a given moment)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    import psutil

    return int(psutil.virtual_memory().total)


