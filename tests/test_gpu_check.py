"""benchmarks/gpu_check.py, the check prepared for a CUDA machine, run on CPU on a tiny model so that it cannot rot:
the same stages (a MAGRPO team of 1, 2 and 4 agents on one shared base; one agent against TRL's GRPOTrainer), and
a JSON with every field and sane values. Without CUDA and without --device cpu it stops with one error line."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.cli_harness import ROOT

SCRIPT = str(ROOT / "benchmarks" / "gpu_check.py")


def run_check(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def check_base(slot: dict, device: str) -> None:
    team, speed, summary = slot["team"], slot["speed"], slot["summary"]
    assert "error" not in team and "error" not in speed, (team.get("traceback"), speed.get("traceback"))
    assert team["memory_measure"] == ("VmHWM (peak RSS)" if device == "cpu" else "torch.cuda.max_memory_allocated")
    runs = {r["agents"]: r for r in team["runs"]}
    assert sorted(runs) == [1, 2, 4]
    for n, r in runs.items():
        assert r["bases"] == 1  # one shared base, one adapter per agent
        (path,) = r["paths"].values()  # the pool's record of the numerical path that base took
        assert path["quantization"] == slot["quantization"] and path["generation"] == "pool"
        assert path["dense_copy"] is (slot["quantization"] == "4bit")  # auto: a copy of a tiny model always fits
        assert r["steps"] == 2 and len(r["step_s"]) == 2 and all(positive(t) for t in r["step_s"])
        for key in ("build_s", "median_step_s", "generate_tokens_per_s", "step_tokens_per_s", "peak_memory_mib",
                    "memory_before_mib", "memory_after_build_mib"):
            assert positive(r[key]), (n, key, r[key])
        assert r["generated_tokens_per_step"] == n * 2 * 4  # agents x K=2 x 4 forced tokens
        assert r["peak_memory_mib"] >= r["memory_after_build_mib"] * 0.99
        assert len(r["rewards"]) == 2 and all(0 <= x <= 1 for x in r["rewards"])
    assert runs[4]["trainable_params"] == 4 * runs[1]["trainable_params"] == 4 * speed["trainable_params"]
    for side in ("trl", "ours"):
        r = speed[side]
        assert len(r["step_s"]) == 2
        assert r["generated_rows"] == 2 and r["generated_tokens_per_row"] == 4
        for key in ("median_step_s", "median_generate_s", "generate_tokens_per_s"):
            assert positive(r[key]), (side, key)
        assert r["median_generate_s"] < r["median_step_s"]
    assert speed["same_generate_shapes"] is True
    assert positive(speed["ratio_ours_over_trl"]) and positive(speed["ratio_generate_tokens_per_s_ours_over_trl"])
    assert summary["step_vs_trl"] == speed["ratio_ours_over_trl"]
    assert summary["memory_4_agents_vs_1"] == runs[4]["peak_memory_mib"] / runs[1]["peak_memory_mib"]
    assert 0.5 < summary["memory_4_agents_vs_1"] < 4
    assert summary["team2_median_step_s"] == runs[2]["median_step_s"]
    assert summary["team2_generate_tokens_per_s"] == runs[2]["generate_tokens_per_s"]


def test_tiny_cpu_run_writes_every_field(tmp_path):
    out = tmp_path / "gpu"
    done = run_check("--device", "cpu", "--tiny", "--out", str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert set(report) >= {"command", "date", "device", "versions", "settings", "model", "bases", "runtime_s"}
    assert report["device"]["kind"] == "cpu" and positive(report["device"]["memory_gib"])
    assert all(report["versions"][p] != "not installed" for p in ("torch", "trl", "transformers", "peft"))
    s = report["settings"]
    assert s["tiny"] and s["dtype"] == "float32" and s["num_generations"] == 2 and s["max_completion_length"] == 4
    m = report["model"]
    assert m["architecture"] == "LlamaForCausalLM" and 1e4 < m["parameters"] < 1e6 and positive(m["checkpoint_mib"])
    assert set(report["bases"]) == {"full", "4bit"}
    assert "--cpu-4bit" in report["bases"]["4bit"]["skipped"]  # off on CPU unless asked for: slow kernels
    check_base(report["bases"]["full"], "cpu")
    markdown = (out / "gpu_check.md").read_text()
    assert markdown.startswith("# GPU check (tiny model, CPU")
    assert "| full (float32) |" in markdown and "MAGRPOTrainer" in markdown


@pytest.mark.slow
def test_tiny_cpu_run_with_a_4bit_base(tmp_path):
    """The 4-bit stages (what a GPU with bitsandbytes runs too), on CPU: bitsandbytes' CPU kernels make this slow."""
    pytest.importorskip("bitsandbytes")
    out = tmp_path / "gpu"
    done = run_check("--device", "cpu", "--tiny", "--cpu-4bit", "--out", str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["bases"]["4bit"]["quantization"] == "4bit"
    for base in ("full", "4bit"):
        check_base(report["bases"][base], "cpu")


def test_without_cuda_one_clear_error(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    done = run_check("--out", str(tmp_path / "gpu"), timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "CUDA is not available" in errors[0] and "--device cpu" in errors[0], done.stderr
    assert not (tmp_path / "gpu").exists()
