"""Helpers shared by the benchmark scripts: the matmul rate of this run, writing a result file, and keeping the
latest bench record of each kind of CPU."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import time
from pathlib import Path

import torch


def matmul_flops(n: int = 2048, repeats: int = 10, clock=time.perf_counter, device: str = "cpu",
                 dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of an ``n``^3 matmul in ``dtype`` on ``device`` (the CPU: this process's threads), one warm-up call,
    then ``repeats`` timed by ``clock``: wall-clock time by default; ``time.thread_time`` with one thread counts only
    the time it ran. On CUDA the device is synchronised before and after the timed calls."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    synchronize(device)
    start = clock()
    for _ in range(repeats):
        a @ b
    synchronize(device)
    return repeats * 2 * n**3 / (clock() - start)


def synchronize(device: str) -> None:
    """Wait for ``device``'s queued work (CUDA); nothing on the CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def packed_matmul_flops(n: int = 2048, repeats: int = 10, clock=time.perf_counter) -> float | None:
    """FLOP/s of the same ``n``^3 float32 product through oneDNN with the weight packed once
    (``torch.ops.mkldnn._linear_pointwise``, the kernel of the library's frozen matmuls), or ``None`` where this
    torch has no such op. ``torch.mm`` (:func:`matmul_flops`) is MKL's ``sgemm``, which may use narrower vector
    instructions than oneDNN on the same CPU (on the AMD EPYC with AVX-512 it ran at about half oneDNN's rate:
    ``experiments/speed/isa_caps/``), so this is the better estimate of what the machine's arithmetic allows."""
    from trl_multiagent.generation.frozen_weights import packed_matmul, packed_weight

    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return None
    a, layer = torch.randn(n, n), torch.nn.Linear(n, n, bias=False).requires_grad_(False)
    packed = packed_weight(layer, [layer.weight])  # as the library packs a frozen weight
    packed_matmul(a, packed, None)
    start = clock()
    for _ in range(repeats):
        packed_matmul(a, packed, None)
    return repeats * 2 * n**3 / (clock() - start)


def paired_medians(times: dict[str, list[float]], base: str) -> tuple[dict[str, float], dict[str, float]]:
    """Of alternating timings ``times`` (way -> seconds of each round): each way's median, and for each other way the
    median over rounds of ``base``'s time over its time (the two runs of a round share the machine's state)."""
    medians = {name: statistics.median(t) for name, t in times.items()}
    ratios = {name: statistics.median(b / t for b, t in zip(times[base], ts)) for name, ts in times.items()
              if name != base}
    return medians, ratios


def child_result(argv: list[str], tag: str) -> dict | None:
    """Run the command ``argv`` (a fresh process) and return the JSON it printed on its line beginning with ``tag``;
    ``None``, with the tail of its stderr printed, when it failed or printed no such line."""
    import subprocess
    import sys

    done = subprocess.run(argv, capture_output=True, text=True)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith(tag)), None)
    if done.returncode != 0 or line is None:
        print(done.stderr[-3000:], file=sys.stderr)
        return None
    return json.loads(line[len(tag):])


def write_result(path: str | Path | None, result: dict) -> None:
    """Print ``result`` as JSON and, when ``path`` is given, write it there (folders created)."""
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")


def cpu_slug(cpu: str) -> str:
    """A file name for a CPU model: ``"AMD EPYC"`` -> ``amd_epyc``, ``"Intel(R) Xeon(R) Platinum 8488C"`` ->
    ``intel_r_xeon_r_platinum_8488c``."""
    return re.sub(r"[^a-z0-9]+", "_", cpu.lower()).strip("_") or "unknown_cpu"


def keep_cpu_record(out: Path, cpu: str) -> Path:
    """Copy ``out``'s bench.json and bench.md to ``out/by_cpu/<cpu_slug>.{json,md}``: the latest record of
    each kind of CPU a bench ran on stays beside the latest record of all (issue 40: targets hold on every CPU)."""
    folder = out / "by_cpu"
    folder.mkdir(parents=True, exist_ok=True)
    for suffix in ("json", "md"):
        shutil.copyfile(out / f"bench.{suffix}", folder / f"{cpu_slug(cpu)}.{suffix}")
    return folder / f"{cpu_slug(cpu)}.json"


#: The kinds of operator a step's profile is split into (``step_profile.py``, ``targets.py``).
KINDS = ("frozen matmuls", "other matmuls", "attention kernels", "softmax", "copies and gathers", "autograd engine",
         "element-wise and other", "python")
_MATMULS = {"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::baddbmm_",
            "aten::addbmm", "aten::mv"}
_COPIES = {"aten::copy_", "aten::index_select", "aten::cat", "aten::index", "aten::index_put_", "aten::gather",
           "aten::clone", "aten::contiguous", "aten::embedding", "aten::embedding_dense_backward",
           "aten::index_add_", "aten::scatter_add_", "aten::constant_pad_nd", "aten::fill_", "aten::zero_",
           "aten::_index_put_impl_"}


def kind(name: str) -> str:
    """The kind of an operator, by its profiler name."""
    if name == "mkldnn::_linear_pointwise":
        return "frozen matmuls"
    if name in _MATMULS:
        return "other matmuls"
    if "scaled_dot_product" in name or "flash_attention" in name:
        return "attention kernels"
    if "softmax" in name:
        return "softmax"
    if name in _COPIES:
        return "copies and gathers"
    if name.startswith("autograd::engine::"):
        return "autograd engine"
    if "::" not in name:  # a Python range: an autograd Function's forward or backward, the optimizer's step, ...
        return "python"
    return "element-wise and other"
