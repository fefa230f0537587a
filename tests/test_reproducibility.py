"""The same seed gives bitwise-identical adapters after a few steps in two fresh processes (different hash seeds,
all cores), and another seed gives different ones: the adapters are initialised after the seed is set, and nothing
in a step depends on the process (thread scheduling, set order, sandbox timing)."""

from __future__ import annotations

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
