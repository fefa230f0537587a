"""Asynchronous rollouts with the colocated engine (``max_staleness`` k > 0, ``vllm_mode: colocate``): the backend's
pinned versions (trl_multiagent/generation/vllm.py) and a team trained through it, against a fake in-process vLLM
(``vllm.LLM`` and ``LoRARequest`` stand-ins put in ``sys.modules``; no vLLM needed). The real engine is
tests/test_vllm.py's (make test-vllm).

The fake engine answers every prompt with ``j + 1`` copies of one letter then ``<eos>`` for sample j, the letter
telling the LoRA id that served it (``3 + id % 26``), and checks that every adapter it is asked to serve is still on
disk and was never removed: a version used after its removal, or served from a deleted folder, fails the test.
"""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass

import pytest
import torch
from datasets import Dataset

from tests.test_async_rollouts import AGENTS, TOPICS, RecordingTrainer, environment
from trl_multiagent.generation.vllm import VLLMGenerationBackend, VLLMSettings
from trl_multiagent.team.pool import AgentPool, AgentSpec, GenerationRequest
from trl_multiagent.trainers import MultiAgentGRPOConfig

EOS = 1


def letter_of(lora_id: int) -> int:
    return 3 + lora_id % 26


@dataclass
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


class FakeSamplingParams:
    def __init__(self, n=1, seed=None, **kwargs):
        self.n, self.seed, self.kwargs = n, seed, kwargs


class FakeLLM:
    """Records every generate call (LoRA ids, seeds) and every removal; refuses a removed or deleted adapter."""

    instances: list = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.removed = kwargs, [], []
        self.llm_engine = types.SimpleNamespace(remove_lora=self.removed.append)
        FakeLLM.instances.append(self)

    def generate(self, prompts, params, lora_request, use_tqdm=False):
        outputs = []
        for _, param, lora in zip(prompts, params, lora_request):
            assert lora.lora_int_id not in self.removed, f"{lora.lora_name} served after its removal"
            assert os.path.isdir(lora.lora_path), f"{lora.lora_name} served from a deleted folder"
            self.calls.append((lora.lora_int_id, param.seed))
            letter = letter_of(lora.lora_int_id)
            completions = [types.SimpleNamespace(token_ids=[letter] * (j + 1) + [EOS], logprobs=None)
                           for j in range(param.n)]
            outputs.append(types.SimpleNamespace(outputs=completions))
        return outputs


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = FakeLLM, FakeSamplingParams
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = FakeLoRARequest
    for name, module in (("vllm", vllm), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr("trl_multiagent.generation.vllm.vllm_available", lambda: True)
    FakeLLM.instances = []
    return FakeLLM


def _backend(model):
    torch.manual_seed(0)
    pool = AgentPool([AgentSpec(a, model=model, lora_r=4) for a in AGENTS])
    backend = VLLMGenerationBackend(pool, VLLMSettings())
    pool.generation_backend = backend
    return pool, backend


def _ask(pool, agent="writer", n=2):
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=True, max_new_tokens=4, temperature=1.0, top_k=0, top_p=1.0)
    return pool.generate_many([GenerationRequest(agent, "ab:", n)], config)[0]


def test_a_pinned_version_is_served_and_kept_until_unpinned(fake_vllm, tiny_text_model):
    pool, backend = _backend(tiny_text_model)
    try:
        first = backend.pin()  # the first sync and the engine, on this thread
        engine = FakeLLM.instances[0]
        old = first["writer"]
        backend.mark_stale()  # an optimizer step
        second = backend.pin()  # the next version; the first is still held
        assert second["writer"].lora_int_id != old.lora_int_id and os.path.isdir(old.lora_path)
        with backend.pinned(first):
            assert {g.completion_ids[0] for g in _ask(pool)} == {letter_of(old.lora_int_id)}
        assert engine.removed == []  # still held by `first`
        backend.unpin(first)
        _ask(pool)  # not pinned: the current version; the released one goes before this call
        assert engine.removed == [old.lora_int_id, first["editor"].lora_int_id]
        assert not os.path.exists(old.lora_path) and os.path.isdir(second["writer"].lora_path)
        backend.unpin(second)
        assert engine.removed == [old.lora_int_id, first["editor"].lora_int_id]  # current ones are never removed
    finally:
        backend.close()


def test_a_version_held_twice_goes_only_when_both_release_it(fake_vllm, tiny_text_model):
    pool, backend = _backend(tiny_text_model)
    try:
        a, b = backend.pin(), backend.pin()
        backend.mark_stale()
        backend.sync_adapters()
        backend.unpin(a)
        _ask(pool)
        assert FakeLLM.instances[0].removed == []
        backend.unpin(b)
        _ask(pool)
        assert sorted(FakeLLM.instances[0].removed) == sorted(r.lora_int_id for r in a.values())
    finally:
        backend.close()


def test_the_seeds_of_a_pinned_rollout_come_from_its_generator(fake_vllm, tiny_text_model):
    pool, backend = _backend(tiny_text_model)
    try:
        pins = backend.pin()
        with backend.pinned(pins, torch.Generator().manual_seed(11)):
            _ask(pool)
            torch.manual_seed(0)  # the global RNG is not what the seeds come from
            _ask(pool)
        expected = torch.Generator().manual_seed(11)
        want = [int(torch.randint(0, 2**31 - 1, (1,), generator=expected).item()) for _ in range(2)]
        assert [seed for _, seed in FakeLLM.instances[0].calls] == want
    finally:
        backend.close()


def train(model, tmp_path, k, max_steps=6):
    torch.manual_seed(0)
    pool = AgentPool([AgentSpec(a, model=model, lora_r=4) for a in AGENTS])
    config = MultiAgentGRPOConfig(
        output_dir=str(tmp_path), report_to=[], use_vllm=True, vllm_mode="colocate", max_completion_length=4,
        num_generations=2, episodes_per_step=2, save_strategy="no", disable_tqdm=True, learning_rate=5e-2,
        max_steps=max_steps, logging_steps=1, print_logs=False, seed=3, disable_dropout=True, max_staleness=k)

    class PinLog(VLLMGenerationBackend):
        def pin(self):
            pins = super().pin()
            self.pinned_at.setdefault(trainer.state.global_step, {p: r.lora_int_id for p, r in pins.items()})
            return pins

    backend = PinLog(pool, VLLMSettings.from_config(config))
    backend.pinned_at = {}
    pool.generation_backend = backend
    try:
        trainer = RecordingTrainer(pool, environment, config, Dataset.from_dict({"topic": TOPICS}))
        trainer.steps = []
        trainer.train()
        return trainer, backend, FakeLLM.instances[-1]
    finally:
        backend.close()


def test_a_team_trains_asynchronously_through_the_colocated_engine_within_the_bound(fake_vllm, tiny_text_model,
                                                                                    tmp_path):
    trainer, backend, engine = train(tiny_text_model, tmp_path, k=1)
    assert [s["step"] for s in trainer.steps] == list(range(6))
    for step in trainer.steps:
        versions = {version for *_, version in step["samples"]}
        assert versions and all(0 <= step["step"] - v <= 1 for v in versions)
        for policy, _, completion, version in step["samples"]:
            # every sample came from the LoRA id pinned for its version: the adapters of the step it records
            assert completion[0] == letter_of(backend.pinned_at[version][policy])
    assert any(step["step"] - v == 1 for step in trainer.steps for *_, v in step["samples"])  # some ran ahead
    # every version but the last was removed once trained on, never while a rollout held it (FakeLLM checks)
    assert len(engine.removed) == len(set(engine.removed)) >= 2 * (len(backend.pinned_at) - 2)


def test_k0_through_the_colocated_engine_pins_nothing(fake_vllm, tiny_text_model, tmp_path):
    trainer, backend, _ = train(tiny_text_model, tmp_path, k=0, max_steps=3)
    assert backend.pinned_at == {} and trainer.async_rollouts is None
    assert {v for s in trainer.steps for *_, v in s["samples"]} == {0, 1, 2}
