"""The step's phases as profiler ranges (the trainer's timed blocks, the pool's generation) and
benchmarks/step_profile.py's split of a profile by phase and kind of operator; benchmarks/targets.py's count of the
positions team-level generation prefills."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function
from transformers import GenerationConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from step_profile import KINDS, kind, split_by_phase  # noqa: E402
from targets import prefill_positions  # noqa: E402

from trl_multiagent.team.pool import AgentPool, AgentSpec, GenerationRequest  # noqa: E402
from trl_multiagent.trainers.base import MultiAgentTrainer  # noqa: E402


def _ops(phase: dict) -> set[str]:
    return set(phase["top_operators"])


def test_operators_are_counted_in_the_innermost_timed_range():
    # operators of a few milliseconds each: the split reports tenths of milliseconds
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("time/forward"):
            torch.nn.functional.embedding(torch.tensor([1, 2]), a)  # a model call's token embedding
            for _ in range(3):
                torch.mm(a, b)
            with record_function("time/generation"):
                for _ in range(3):
                    torch.softmax(a, dim=-1)
        torch.neg(b)
    phases = split_by_phase(prof.events(), steps=1)
    assert {"time/forward", "time/generation", "outside the timed phases"} <= set(phases)
    assert "aten::mm" in _ops(phases["time/forward"]) and "aten::softmax" not in _ops(phases["time/forward"])
    assert "aten::softmax" in _ops(phases["time/generation"]) and "aten::mm" not in _ops(phases["time/generation"])
    assert "aten::neg" in _ops(phases["outside the timed phases"])
    forward = phases["time/forward"]
    assert forward["kinds"]["other matmuls"] > 0 and forward["kinds"]["softmax"] == 0
    assert phases["time/generation"]["kinds"]["softmax"] > 0
    assert forward["model_calls"] == 1 and phases["time/generation"]["model_calls"] == 0
    for entry in phases.values():  # a phase's seconds are its kinds' sum (python: the range's own time)
        assert set(entry["kinds"]) == set(KINDS)
        assert entry["seconds"] == pytest.approx(sum(entry["kinds"].values()), abs=1e-3)


def test_per_step_figures_divide_by_the_profiled_steps():
    a = torch.randn(512, 512)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            with record_function("time/backward"):
                torch.mm(a, a)
    one, two = split_by_phase(prof.events(), 1), split_by_phase(prof.events(), 2)
    assert one["time/backward"]["operators"] == 2 * two["time/backward"]["operators"]
    assert one["time/backward"]["seconds"] == pytest.approx(2 * two["time/backward"]["seconds"], abs=1e-3)


def test_kinds_of_operators():
    assert kind("mkldnn::_linear_pointwise") == "frozen matmuls"
    assert kind("aten::addmm") == "other matmuls" and kind("aten::bmm") == "other matmuls"
    assert kind("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == "attention kernels"
    assert kind("aten::_log_softmax") == "softmax"
    assert kind("aten::index_select") == "copies and gathers" and kind("aten::_index_put_impl_") == "copies and gathers"
    assert kind("_PackedFrozenLinearBackward") == "python" and kind("Optimizer.step#AdamW.step") == "python"
    assert kind("autograd::engine::evaluate_function: MmBackward0") == "autograd engine"
    assert kind("aten::mul") == "element-wise and other"


def test_the_trainers_timed_block_is_a_profiler_range_and_still_adds_its_time():
    owner = SimpleNamespace(_timings=defaultdict(float))
    a = torch.randn(16, 16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with MultiAgentTrainer.timed(owner, "forward"):
            torch.mm(a, a)
    assert owner._timings["forward"] > 0
    assert "aten::mm" in _ops(split_by_phase(prof.events(), 1)["time/forward"])


def test_the_pools_generation_is_a_profiler_range(tiny_text_model):
    pool = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4)])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        pool.generate_many([GenerationRequest("aux", "abc")], GenerationConfig(max_new_tokens=3, do_sample=False))
    phases = split_by_phase(prof.events(), 1)
    assert phases["time/generation"]["operators"] > 0
    # every operator of the generation ran inside its range: none is left outside
    assert "outside the timed phases" not in phases


def test_prefill_positions_count_the_shared_opening_once_per_adapter(tiny_text_model):
    names = ["a0", "a1"]
    pool = AgentPool([AgentSpec(n, model=tiny_text_model, lora_r=4) for n in names])
    prompts = ["the same long opening, then one", "the same long opening, then two", "the same long opening, three",
               "the same long opening: four"]
    tokens = [pool.encode_prompt("a0", p) for p in prompts]
    alone = prefill_positions(pool, [GenerationRequest("a0", p) for p in prompts])
    pair = prefill_positions(pool, [GenerationRequest(names[i % 2], p) for i, p in enumerate(prompts)])
    # by hand: the common leading tokens of the prompts (each keeps at least one token of its own)
    def common(group):
        n = 0
        while all(len(t) > n + 1 and t[n] == group[0][n] for t in group):
            n += 1
        return n
    shared = common(tokens)
    assert shared > 0
    assert alone == shared + sum(len(t) - shared for t in tokens)
    halves = [tokens[0::2], tokens[1::2]]
    assert pair == sum(common(h) + sum(len(t) - common(h) for t in h) for h in halves)
    assert pair > alone
