"""Helpers shared by the benchmark scripts: the matmul rate of this run, and writing a result file."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch


def matmul_flops(n: int = 2048, repeats: int = 10, clock=time.perf_counter) -> float:
    """FLOP/s of an ``n``^3 float32 matmul on this process's threads (one warm-up call, then ``repeats`` timed by
    ``clock``: wall-clock time by default; ``time.thread_time`` with one thread counts only the time it ran)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    start = clock()
    for _ in range(repeats):
        a @ b
    return repeats * 2 * n**3 / (clock() - start)


def write_result(path: str | Path | None, result: dict) -> None:
    """Print ``result`` as JSON and, when ``path`` is given, write it there (folders created)."""
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")
