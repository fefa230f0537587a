"""Asynchronous rollouts (``max_staleness``, trl_multiagent/trainers/async_rollouts.py) against the fake
OpenAI-compatible vLLM server of tests/test_vllm_server.py (no vLLM needed).

A two-agent MAGRPO team (writer, editor; tests/tiny.py's model, ``<eos>`` = 1, ``a`` = 3, ``b`` = 4, ...) trains for
eight steps through the fake server on twelve two-letter tasks, two per step (six steps per epoch: the run crosses an
epoch), with k = 0, 1 and 2.
Every comparison is with the synchronous run (k = 0) of the same seed, in the same test, or with values computed by
hand from the server's script.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

import pytest
import torch
from datasets import Dataset
from transformers import GenerationConfig, TrainerCallback

from tests.test_vllm_server import EOS, FakeVLLM, _no_adapter, _perturb
from trl_multiagent.environments.base import FunctionEnvironment
from trl_multiagent.generation.vllm_server import VLLMServerBackend, VLLMServerSettings
from trl_multiagent.team.pool import AgentPool, AgentSpec, GenerationRequest
from trl_multiagent.trainers import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from trl_multiagent.trainers.async_rollouts import WORKER_NAME

AGENTS = ("writer", "editor")
TOPICS = ["ab", "cd", "ef", "gh", "ij", "kl", "mn", "op", "qr", "st", "uv", "wx"]  # two per step: six steps an epoch
STEPS = 8


def environment():
    return FunctionEnvironment(AGENTS, {a: (lambda task: f"{task['topic']}:") for a in AGENTS},
                               lambda completions: sum(len(c) for c in completions.values()) / 10.0,
                               required_columns=["topic"])


def answer_by_position(payload):
    """Sample j answers j + 1 letters ``a`` then ``<eos>``, whatever the adapter and the seed: the same samples for
    every k, so that any difference in the losses comes from the pipeline."""
    return [([3] * (j + 1) + [EOS], [-1.0] * (j + 2)) for j in range(payload["n"])]


def answer_by_version(payload):
    """As :func:`answer_by_position`, with the letter telling the adapter version that answered: ``<policy>-v<N>``
    answers the (N+1)-th letter (``b`` for v1, ``c`` for v2, ...); the bare base would answer ``a``."""
    n = int(payload["model"].rsplit("-v", 1)[1]) if "-v" in payload["model"] else 0
    return [([3 + n] * (j + 1) + [EOS], [-1.0] * (j + 2)) for j in range(payload["n"])]


def answer_by_seed(payload):
    """The letters follow the request's seed: a run that draws other seeds answers other tokens."""
    g = torch.Generator().manual_seed(payload["seed"])
    return [([int(t) for t in torch.randint(3, 29, (j + 1,), generator=g)] + [EOS], [-1.0] * (j + 2))
            for j in range(payload["n"])]


class RecordingTrainer(MultiAgentGRPOTrainer):
    """The team trainer, noting each step's tasks (as the loop hands them over) and what its update trained on."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.steps.append({"step": self.state.global_step, "tasks": [row["topic"] for row in inputs]})
        return super().training_step(model, inputs, num_items_in_batch)

    def update(self, model, experience):
        loss = super().update(model, experience)
        tok = self.pool.tokenizer_of("writer")
        self.steps[-1].update(loss=float(loss), samples=[
            (s.policy, tok.decode(s.generation.prompt_ids), tuple(s.generation.completion_ids), s.version)
            for s in experience.samples])
        return loss


class PinLog(VLLMServerBackend):
    """The server backend, noting the adapter names it pins at each step of the trainer."""

    trainer = None

    def pin(self):
        pins = super().pin()
        names = {p: v.name for p, v in pins.items()}
        step = self.trainer.state.global_step
        assert self.pinned_at.setdefault(step, names) == names  # one set of versions per step
        return pins


@dataclass
class Run:
    steps: list
    metrics: list
    loads: list
    unloads: list
    loaded_after: list
    most_loaded: int
    seeds: list
    pinned_at: dict = field(default_factory=dict)
    threads: bool = False


def _most_loaded(calls) -> int:
    loaded, most = set(), 0
    for path, payload in calls:
        if path == "/v1/load_lora_adapter":
            loaded.add(payload["lora_name"])
        elif path == "/v1/unload_lora_adapter":
            loaded.discard(payload["lora_name"])
        most = max(most, len(loaded))
    return most


def train(model, tmp_path, k, respond=answer_by_position, max_steps=STEPS, callbacks=(), **overrides) -> Run:
    """Train the team for ``max_steps`` with ``max_staleness`` k (None: the field left at its default) through a fake
    server with exactly the LoRA slots the team needs (2 policies x (1 + k), + 1 for the zero adapter of the bare
    base's requests)."""
    server = FakeVLLM(model, max_loras=2 * (1 + (k or 0)) + 1)
    server.respond = respond
    torch.manual_seed(0)
    pool = AgentPool([AgentSpec(a, model=model, lora_r=4) for a in AGENTS])
    fields = dict(output_dir=str(tmp_path), report_to=[], use_vllm=True, vllm_mode="server",
                  vllm_server_base_url=server.url, vllm_server_timeout=5.0, max_completion_length=4, num_generations=2,
                  episodes_per_step=2, save_strategy="no", disable_tqdm=True, learning_rate=5e-2,
                  max_steps=max_steps, logging_steps=1, print_logs=False, seed=3, disable_dropout=True, **overrides)
    if k is not None:
        fields["max_staleness"] = k
    config = MultiAgentGRPOConfig(**fields)
    backend = PinLog(pool, VLLMServerSettings.from_config(config))
    backend.pinned_at = {}
    backend.sync_adapters()
    pool.generation_backend = backend
    try:
        trainer = RecordingTrainer(pool, environment, config, Dataset.from_dict({"topic": TOPICS}),
                                   callbacks=list(callbacks))
        trainer.steps = []
        backend.trainer = trainer
        trainer.train()
        threads = any(t.name == WORKER_NAME for t in threading.enumerate()) or trainer.async_rollouts is not None
        metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        return Run(trainer.steps, [m for m in metrics if "loss" in m], server.loads(), server.unloads(),
                   sorted(server.loaded), _most_loaded(server.calls),
                   [c.get("seed") for c in server.posts("/v1/completions")], backend.pinned_at, threads)
    finally:
        backend.close()
        server.stop()


def _trained(run: Run):
    """Per step: the tasks, and the (policy, prompt, completion) of every sample trained on, and the loss."""
    return [(s["tasks"], [x[:3] for x in s["samples"]], s["loss"]) for s in run.steps]


# ---------------------------------------------------------------------------------------------------- k = 0
def test_k0_is_the_synchronous_path_token_for_token(tiny_text_model, tmp_path):
    """max_staleness 0 (given) and the field left unset give the same request seeds, tokens and losses (the server
    answers from each request's seed), with no worker thread; every sample's version is the step that trained it."""
    default = train(tiny_text_model, tmp_path / "default", None, respond=answer_by_seed)
    zero = train(tiny_text_model, tmp_path / "zero", 0, respond=answer_by_seed)
    assert not default.threads and not zero.threads
    # (the requests of a step are in flight at once: the server sees them in any order)
    assert sorted(zero.seeds) == sorted(default.seeds) and all(isinstance(s, int) for s in zero.seeds)
    assert _trained(zero) == _trained(default)
    assert [m["loss"] for m in zero.metrics] == [m["loss"] for m in default.metrics]
    assert all(v == s["step"] for s in zero.steps for *_, v in s["samples"])
    assert not any(k.startswith("async/") for m in zero.metrics for k in m)
    assert zero.pinned_at == {}  # nothing pinned: the synchronous path generates with the current adapters
    # the samples really follow the seeds: not the same letters in every step
    assert len({x[2] for s in zero.steps for x in s["samples"]}) > 4


# ---------------------------------------------------------------------------------------------------- k = 1, 2
@pytest.fixture(scope="module")
def synchronous(tiny_text_model, tmp_path_factory):
    return train(tiny_text_model, tmp_path_factory.mktemp("sync"), 0)


@pytest.mark.parametrize("k", [1, 2])
def test_the_tasks_samples_and_losses_are_the_synchronous_ones_when_the_answers_do_not_depend_on_the_version(
        tiny_text_model, tmp_path, synchronous, k):
    """With a server whose answers depend on the prompt alone, every step trains on the same tasks, the same samples
    and (the adapters being equal step by step) gives the same loss as the synchronous run: the pipeline hands each
    step the rollout of its own tasks, and the update is the synchronous one. The task order crosses two epochs."""
    run = train(tiny_text_model, tmp_path, k)
    assert [s["tasks"] for s in run.steps] == [s["tasks"] for s in synchronous.steps]
    assert len(run.steps) == STEPS and sorted(t for s in run.steps[:6] for t in s["tasks"]) == TOPICS
    for s in run.steps:  # each trained sample's prompt is one of the step's own tasks
        assert sorted({prompt for _, prompt, *_ in s["samples"]}) == sorted(f"{t}:" for t in s["tasks"])
    assert _trained(run) == _trained(synchronous)
    assert [m["loss"] for m in run.metrics] == [m["loss"] for m in synchronous.metrics]
    assert run.threads


@pytest.mark.parametrize("k", [1, 2])
def test_every_trained_sample_is_within_k_versions_and_was_generated_by_the_version_it_records(
        tiny_text_model, tmp_path, k):
    run = train(tiny_text_model, tmp_path, k, respond=answer_by_version)
    # six steps per epoch; the look-ahead stops at an epoch's end, so the first step of an epoch waits for its own
    # rollout: step 0 trains on version 0, steps 1..k on the versions of step 0, then each step on the version of k
    # steps before; the same from step 6 on
    def expected(step):
        return min(step % 6, k)

    for s in run.steps:
        step = s["step"]
        lag = {step - v for *_, v in s["samples"]}
        assert lag == {expected(step)}, (step, lag)
        for policy, _, completion, version in s["samples"]:
            served = f"{policy}-v{completion[0] - 3}"  # the letter tells the version that answered
            assert run.pinned_at[version][policy] == served
    staleness = {m["step"] - 1: (m["async/staleness_mean"], m["async/staleness_max"]) for m in run.metrics}
    assert staleness == {s: (float(expected(s)),) * 2 for s in range(STEPS)}
    assert all(m["async/dropped_samples"] == 0 for m in run.metrics)
    # every step changes both adapters, so every pin after a step loads the next version of each (v1: the initial
    # adapters, pinned at step 0)
    steps = sorted(run.pinned_at)
    assert steps[0] == 0 and run.pinned_at[0] == {p: f"{p}-v1" for p in AGENTS}
    for n, step in enumerate(steps, start=1):
        assert run.pinned_at[step] == {p: f"{p}-v{n}" for p in AGENTS}
    # never more versions loaded than the server's --max-loras (the backend checks it before every load), and all
    # of them were needed: the version trained on, the k ahead and the current one, and the zero adapter
    assert run.most_loaded == 2 * (1 + k) + 1
    # at the end only the current adapters (and the zero adapter) stay: every pinned version was released and unloaded
    assert run.loaded_after == sorted([*(f"{p}-v{len(steps)}" for p in AGENTS), _no_adapter()])
    assert sorted(run.loads) == sorted([*(f"{p}-v{n}" for p in AGENTS for n in range(1, len(steps) + 1)),
                                        _no_adapter()])


def test_a_rollout_staler_than_k_is_dropped_counted_and_generated_again(tiny_text_model, tmp_path):
    """global_step moved by 2 before the third step (k = 1): the rollout started for it at step 1 would be 3 steps
    behind, so its 8 samples (2 tasks x 2 agents x 2 samples) are dropped and it is generated again with the
    adapters of step 4; the next one, started at step 4, is 1 behind."""

    class Jump(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 2:
                state.global_step = 4

    run = train(tiny_text_model, tmp_path, 1, respond=answer_by_version, max_steps=6, callbacks=[Jump()])
    assert [s["step"] for s in run.steps] == [0, 1, 4, 5]
    assert [sorted({s["step"] - v for *_, v in s["samples"]}) for s in run.steps] == [[0], [1], [0], [1]]
    assert [m["async/dropped_samples"] for m in run.metrics] == [0, 0, 8, 8]
    assert [m["async/staleness_max"] for m in run.metrics] == [0, 1, 0, 1]


# ---------------------------------------------------------------------------------------------------- the backend
def test_a_pinned_version_serves_its_rollout_and_stays_loaded_until_unpinned(tiny_text_model, tmp_path):
    server = FakeVLLM(tiny_text_model, max_loras=5)  # 2 policies x 2 versions + the zero adapter
    server.respond = answer_by_version
    torch.manual_seed(0)
    pool = AgentPool([AgentSpec(a, model=tiny_text_model, lora_r=4) for a in AGENTS])
    backend = VLLMServerBackend(pool, VLLMServerSettings([server.url], timeout=5.0, adapter_dir=str(tmp_path),
                                                         max_staleness=1))
    greedy = GenerationConfig(max_new_tokens=4, do_sample=False)
    try:
        pins = backend.pin()  # loads v1 of both
        _perturb(pool, "writer", seed=5)
        backend.mark_stale()
        [[now]] = backend.generate([GenerationRequest("writer", "", prompt_ids=(5,))], greedy)  # syncs: writer-v2
        assert now.completion_ids == [5, EOS]
        result = {}

        def rollout():  # in another thread, with the pinned versions: no sync, writer-v1 still
            with backend.pinned(pins, torch.Generator().manual_seed(0)):
                _perturb(pool, "writer", seed=6)  # (what a step in the training thread does meanwhile)
                backend.mark_stale()
                result["gens"] = backend.generate([GenerationRequest("writer", "", prompt_ids=(5,)),
                                                   GenerationRequest("editor", "", prompt_ids=(5,))], greedy)

        worker = threading.Thread(target=rollout)
        worker.start()
        worker.join(timeout=30)
        assert [g.completion_ids for [g] in result["gens"]] == [[4, EOS], [4, EOS]]  # writer-v1, editor-v1
        assert server.loads() == ["writer-v1", "editor-v1", _no_adapter(), "writer-v2"] and server.unloads() == []
        assert backend.adapter_names() == {"writer": "writer-v2", "editor": "editor-v1"}
        backend.unpin(pins)  # writer-v1 is no longer current nor used: unloaded; editor-v1 is still current
        assert server.unloads() == ["writer-v1"]
        [[now]] = backend.generate([GenerationRequest("writer", "", prompt_ids=(5,))], greedy)  # the stale: v3
        assert now.completion_ids == [6, EOS] and server.unloads() == ["writer-v1", "writer-v2"]
    finally:
        backend.close()
        server.stop()


# ---------------------------------------------------------------------------------------------------- config
def _config(tmp_path, **kw):
    fields = dict(output_dir=str(tmp_path), report_to=[], use_vllm=True, vllm_mode="server",
                  vllm_server_base_url="http://127.0.0.1:8000")
    fields.update(kw)
    return MultiAgentGRPOConfig(**fields)


@pytest.mark.parametrize("kw, message", [
    (dict(max_staleness=-1), "max_staleness must be an integer >= 0 (how many optimizer steps a rollout may be "
                             "generated ahead of the step that trains on it; 0: synchronous rollouts), got -1"),
    (dict(max_staleness=1.5), "max_staleness must be an integer >= 0 (how many optimizer steps a rollout may be "
                              "generated ahead of the step that trains on it; 0: synchronous rollouts), got 1.5"),
    (dict(max_staleness=1, use_vllm=False),
     "max_staleness=1 (asynchronous rollouts) needs use_vllm: true (vllm_mode colocate or server): the library's own "
     "decoding generates with the adapters being trained and cannot serve the older adapter versions of rollouts "
     "generated ahead; generate with vLLM (docs/guides/vllm.md) or set max_staleness: 0"),
    (dict(max_staleness=1, vllm_importance_sampling_correction=False),
     "max_staleness=1 needs vllm_importance_sampling_correction: true: the samples come from adapters up to "
     "max_staleness optimizer steps old (off-policy), and the correction weighs each by the trained policy's "
     "probability of it over the probability the engine sampled it with"),
    (dict(max_staleness=1, num_iterations=2),
     "max_staleness=1 needs every rollout trained in one optimizer step (num_iterations=2): a rollout reused for "
     "several steps would be trained on further behind its version than max_staleness; set them to 1 or "
     "max_staleness: 0"),
])
def test_the_config_checks_are_one_line_each(tmp_path, kw, message):
    with pytest.raises(ValueError) as error:
        _config(tmp_path, **kw)
    assert str(error.value) == message


def test_the_config_accepts_k_with_the_server_and_counts_the_lora_slots(tmp_path, monkeypatch):
    monkeypatch.setattr("trl_multiagent.generation.vllm.vllm_available", lambda: True)
    config = _config(tmp_path, max_staleness=2)
    assert config.max_staleness == 2 and VLLMServerSettings.from_config(config).max_staleness == 2
    # and with the colocated engine, which serves the pinned versions from a worker thread
    assert _config(tmp_path, max_staleness=2, vllm_mode="colocate").max_staleness == 2  # vLLM faked as present
    assert _config(tmp_path, use_vllm=False).max_staleness == 0


def test_maporl_minibatches_count_as_iterations(tmp_path):
    from trl_multiagent.trainers import TRAINERS

    config_class = TRAINERS["maporl"][0]
    with pytest.raises(ValueError) as error:
        config_class(output_dir=str(tmp_path), report_to=[], use_vllm=True, vllm_mode="server",
                     vllm_server_base_url="http://127.0.0.1:8000", max_staleness=1, num_iterations=1,
                     episodes_per_step=2, num_minibatches=2)
    assert str(error.value).startswith("max_staleness=1 needs every rollout trained in one optimizer step "
                                       "(num_iterations=1, num_minibatches=2)")
