"""benchmarks/decode_gpu.py (a decoding step on a GPU against its bound) run on CPU on gpu_check.py's tiny model, so
that it cannot rot: the bound's byte and FLOP counts against a hand count of that model, the lean step's logits
against transformers' forward, and one error line without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.cli_harness import ROOT

SCRIPT = str(ROOT / "benchmarks" / "decode_gpu.py")


def run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_tiny_run_on_cpu(tmp_path):
    out = tmp_path / "decode.json"
    proc = run("--device", "cpu", "--tiny", "--rows", "2,8", "--steps", "4", "--rounds", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    # gpu_check.TINY_MODEL: 2 layers of width 64 (4 heads of 16, 2 key/value heads), MLP 128, vocabulary 512, an
    # untied head; LoRA r=8 on the 7 linears of each layer, two adapters
    frozen = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128) + 512 * 64
    lora = 2 * 2 * 8 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 2 * (64 + 128) + (128 + 64))
    assert frozen == 106496 and lora == 32768
    assert [r["rows"] for r in result["by_rows"]] == [2, 8]
    for r in result["by_rows"]:
        rows = r["rows"]
        assert r["weight_bytes"] == 4 * (frozen + lora)  # float32
        cached = 200 + 4 // 2  # the prompt and half the steps
        assert r["flops"] == 2 * rows * (frozen + lora) + 4 * rows * 2 * 4 * cached * 16
        bound = max(r["weight_bytes"] / result["bound"]["copy_bytes_per_s"],
                    r["flops"] / result["bound"]["matmul_flops_per_s"])
        assert r["bound_ms"] == pytest.approx(1000 * bound)
        assert r["lean_graph"] == {"skipped": "CUDA graphs need a CUDA device"}
        for path in ("forward", "lean"):
            p = r[path]
            assert len(p["rounds_ms"]) == 2 and all(t > 0 for t in p["rounds_ms"])
            assert p["step_over_bound"] == pytest.approx(p["ms_per_step"] / r["bound_ms"])
            assert p["device_ops_per_step"] is None  # the profiler counts device kernels on CUDA only
        assert r["lean"]["max_logit_diff_vs_forward"] < 1e-5


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where CUDA is missing")
def test_without_cuda_an_error_line():
    proc = run("--out", "unused.json")
    assert proc.returncode == 2
    # the last line (bitsandbytes may print a warning of its own on import, before any model is built)
    assert proc.stderr.strip().splitlines()[-1] == \
        "decode_gpu: error: CUDA is not available here (pass --device cpu --tiny for the CPU run)"
    assert proc.stdout == ""
