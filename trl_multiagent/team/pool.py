"""Agents and the pool of models that carries their policies.

An :class:`AgentSpec` describes one agent: its role name, the base model it runs on, and the policy it acts with. A
policy is a LoRA adapter (a QLoRA adapter when the base is loaded in 4-bit NF4). Several agents may act with the same
policy (parameter sharing), and several policies may live on the same base.

The :class:`AgentPool` loads every distinct base (model, quantization) ONCE and attaches one named adapter per
policy to it, so a team of n agents on one base costs one copy of the base weights plus n small adapters. Agents on
different bases (heterogeneous teams) each get their own base, tokenizer and chat template.

Critics (value models, :mod:`trl_multiagent.team.critics`) are one more adapter on the base of the agent they name, plus
a value head; :meth:`AgentPool.values` runs them.

The pool is an ``nn.Module`` so that ``transformers.Trainer`` and ``accelerate`` can hold, save and distribute it;
its ``forward(policy, **inputs)`` runs the policy's base with that policy's adapter active.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn
from transformers import GenerationConfig, PreTrainedTokenizerBase

from trl_multiagent.environments.tools import prepare_tool_agents
from trl_multiagent.generation import (  # noqa: F401  (Generation and GenerationRequest are re-exported)
    Generation,
    GenerationRequest,
    PackedFrozenLinears,
    Prompt,
    bfloat16_matmuls_available,
    dense_weight_bytes,
    frozen_matmul_torch_dtype,
    generate_team,
    lean_support,
    packed_weight_bytes,
    use_dense_copy,
)
from trl_multiagent.generation.compute_paths import (  # noqa: F401  (the settings' values are re-exported)
    DENSE_COPY,
    LEAN_DECODE,
    PACKED_WEIGHTS,
    BasePaths,
    decide_lean,
    decide_weight_copies,
)
from trl_multiagent.generation.teacher_forcing import completion_outputs, hidden_forward
from trl_multiagent.models import QUANTIZATIONS  # noqa: F401  (QUANTIZATIONS re-exported)
from trl_multiagent.models.loading import load_base_model, load_tokenizer, resolve_model
from trl_multiagent.runtime.memory import total_memory
from trl_multiagent.team.adapter_files import load_pool_adapters, save_pool_adapters
from trl_multiagent.team.agent_spec import AgentSpec, check_critics, check_frozen_policies, check_team, spec_record  # noqa: F401  (the public import path)
from trl_multiagent.team.critics import CriticSpec, ValueHead, select_head

logger = logging.getLogger(__name__)



@dataclass
class _Policy:
    name: str
    base_key: str
    agents: list[str] = field(default_factory=list)
    learning_rate: float | None = None


@dataclass
class _Critic:
    spec: CriticSpec
    base_key: str
    adapter: str  # its own adapter, or the policy adapter it shares
    params: list[nn.Parameter]  # what the critic's optimizer group holds: its adapter (unless shared) and its head


class AgentPool(nn.Module):
    """Loads each distinct base once and attaches one LoRA adapter per policy (and per critic).

    Args:
        specs: the team.
        dtype: weights dtype of full-precision bases (``"auto"``: bfloat16 on CUDA, float32 otherwise).
        critics: value models to add (see :mod:`trl_multiagent.team.critics`); each sits on the base of the agent it
            names unless it names a model of its own.
        dense_copy: whether 4-bit bases compute with a de-quantised copy of their frozen weights (:data:`DENSE_COPY`):
            ``"always"``, ``"never"``, or ``"auto"``: when the copy takes at most a quarter of the device's total
            memory (:meth:`dense_copy_of`).
        packed_weights: whether generation on CPU float32 bases computes the frozen linears with oneDNN-packed copies
            of their weights (:data:`PACKED_WEIGHTS`; same rule as ``dense_copy``; :meth:`packs_weights`), and the
            teacher-forced passes too, forward and backward, where three copies fit (:meth:`packs_training`).
        lean_decode: whether generation computes the one-token decoding steps with the lean step
            (:class:`~trl_multiagent.generation.lean_step.LeanStep`) instead of transformers' forward
            (:data:`LEAN_DECODE`): ``"auto"``: on every base it supports (Llama architecture; the others fall back,
            logged); ``"always"``: the same, and a base it does not support is an error; ``"never"``
            (:meth:`lean_decodes`).
        frozen_matmul_dtype: the dtype of the packed copies of the frozen linears
            (:data:`~trl_multiagent.generation.frozen_weights.FROZEN_MATMUL_DTYPES`): ``"float32"``, or
            ``"bfloat16"`` (rounded copies, oneDNN's bfloat16 kernels; generation and the teacher-forced passes
            alike). ``"bfloat16"`` needs both to pack (a float32 base on a CPU with oneDNN bfloat16 matmuls,
            ``packed_weights`` not ``never``, memory for the copies): otherwise an error when the base loads, never
            a silent float32 (:meth:`frozen_dtype_of`).
    """

    def __init__(self, specs: Sequence[AgentSpec], dtype: str = "auto", critics: Sequence[CriticSpec] = (),
                 dense_copy: str = "auto", packed_weights: str = "auto", lean_decode: str = "auto",
                 frozen_matmul_dtype: str = "float32"):
        super().__init__()
        self._frozen_dtype = frozen_matmul_torch_dtype(frozen_matmul_dtype)
        if self._frozen_dtype != torch.float32 and packed_weights == "never":
            raise ValueError("frozen_matmul_dtype 'bfloat16' computes with packed copies: packed_weights must not be "
                             "'never'")
        if self._frozen_dtype != torch.float32 and not bfloat16_matmuls_available():
            raise ValueError("frozen_matmul_dtype 'bfloat16' needs oneDNN's packed bfloat16 matmuls, which this CPU or "
                             "torch build does not offer (they need AVX512-BW/VL/DQ or AVX-NE-CONVERT); use 'float32'")
        if dense_copy not in DENSE_COPY:
            raise ValueError(f"dense_copy must be one of {DENSE_COPY}, got {dense_copy!r}")
        if packed_weights not in PACKED_WEIGHTS:
            raise ValueError(f"packed_weights must be one of {PACKED_WEIGHTS}, got {packed_weights!r}")
        if lean_decode not in LEAN_DECODE:
            raise ValueError(f"lean_decode must be one of {LEAN_DECODE}, got {lean_decode!r}")
        self.dense_copy, self.packed_weights, self.lean_decode = dense_copy, packed_weights, lean_decode
        #: How each base computes (:mod:`trl_multiagent.generation.compute_paths`), decided once per base.
        self.paths: dict[str, BasePaths] = {}
        #: Running totals of :meth:`generate_many`: seconds spent and completion tokens produced.
        self.generation_stats: dict[str, float] = {"seconds": 0.0, "tokens": 0}
        #: Where :meth:`generate_many` goes instead of the pool's own loop when set: the vLLM backend
        #: (:class:`~trl_multiagent.generation.vllm.VLLMGenerationBackend`, ``use_vllm``).
        self.generation_backend = None
        by_policy = check_team(specs)
        check_critics(specs, critics)
        self.specs: dict[str, AgentSpec] = {s.name: s for s in specs}
        self.bases = nn.ModuleDict()
        self.value_heads = nn.ModuleDict()
        self.tokenizers: dict[str, PreTrainedTokenizerBase] = {}
        self.base_sources: dict[str, tuple[str, str | None]] = {}
        self.policies: dict[str, _Policy] = {}
        self.critics: dict[str, _Critic] = {}
        self._adapter_base: dict[str, str] = {}  # adapter name -> base key
        self._policy_params: dict[str, list[nn.Parameter]] = {}
        self._fused_temperature: float | None = None
        self._dtype = "bfloat16" if dtype == "auto" and torch.cuda.is_available() else \
            ("float32" if dtype == "auto" else dtype)
        self._base_keys: dict[tuple[str, str | None], str] = {}
        #: Policies that act but do not learn (:meth:`freeze_policies`): no optimizer group, no gradient.
        self.frozen_policies: frozenset[str] = frozenset()

        for policy, members in by_policy.items():
            spec = members[0]
            key = self._attach_adapter(spec.model_name, spec.quantization, policy, self._lora_config(spec))
            self.policies[policy] = _Policy(policy, key, [m.name for m in members], spec.learning_rate)
        for policy in self.policies:
            self._policy_params[policy] = self._adapter_parameters(policy)
        for critic in critics:
            self._add_critic(critic)
        self._keep_all_adapters_trainable()
        self._active: dict[str, str] = {}
        self._tools, self._chat_templates = prepare_tool_agents(self.specs.values(), self.tokenizer_of)
        for key in self.bases:  # once every adapter is attached (LoRA outside the projections rules the step out)
            self.paths[key].lean_decode = decide_lean(key, self.base_sources[key][0],
                                                      self.bases[key].get_base_model(), self.lean_decode)

    def _attach_adapter(self, model_name: str, quantization: str | None, adapter: str, config: LoraConfig) -> str:
        """Add adapter ``adapter`` to the base of (model, quantization), loading that base the first time."""
        source = (resolve_model(model_name), quantization)
        key = self._base_keys.get(source)
        if key is None:
            key = self._base_keys[source] = f"base{len(self._base_keys)}"
            logger.info("Loading base %s (quantization=%s) as %s", source[0], source[1], key)
            model = load_base_model(source[0], quantization=source[1], dtype=self._dtype)
            self.tokenizers[key] = load_tokenizer(source[0])
            self.base_sources[key] = source
            with warnings.catch_warnings():
                # PEFT 0.21 reads transformers' deprecated `is_gradient_checkpointing` while wrapping the model;
                # the FutureWarning it raises is about PEFT's call, and would print in every run
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                self.bases[key] = get_peft_model(model, config, adapter_name=adapter)
            model = self.bases[key].get_base_model()
            self.paths[key] = decide_weight_copies(
                key, source[0], model, total_memory(next(model.parameters()).device), self.dense_copy,
                self.packed_weights, self._frozen_dtype)
        else:
            self.bases[key].add_adapter(adapter, config)
        self._adapter_base[adapter] = key
        head = self.bases[key].get_base_model().get_output_embeddings()
        if isinstance(head, BaseTunerLayer):
            raise ValueError(f"Adapter {adapter!r} puts LoRA on the output layer of {source[0]}; log-probs for the "
                             "loss are computed from the LM head's base weight, so it would never be trained. Leave "
                             "the output layer out of lora_target_modules.")
        return key

    def _adapter_parameters(self, adapter: str) -> list[nn.Parameter]:
        pattern = re.compile(rf"\.lora_(A|B|embedding_A|embedding_B|magnitude_vector)\.{re.escape(adapter)}(\.|$)")
        base = self.bases[self._adapter_base[adapter]]
        params = [prm for n, prm in base.named_parameters() if pattern.search(n)]
        if not params:
            raise RuntimeError(f"No LoRA parameters found for adapter {adapter!r}; check lora_target_modules")
        return params

    def adapters_are_identity(self) -> bool:
        """Whether every policy's adapter still computes nothing: all its LoRA B matrices are zero (PEFT's
        initialisation), so each agent's adapted model IS its base. The held-out evaluation before training then lets
        the baselines (adapters off) share the team's draws (:func:`~trl_multiagent.evaluation.core.run_programs`)."""
        for policy in self.policies:
            pattern = re.compile(rf"\.lora_(B|embedding_B|magnitude_vector)\.{re.escape(policy)}(\.|$)")
            for name, param in self.bases[self._adapter_base[policy]].named_parameters():
                if pattern.search(name) and ("magnitude_vector" in name or bool(param.detach().any())):
                    return False
        return True

    def _add_critic(self, spec: CriticSpec) -> None:
        agent = self.specs[spec.agent]
        if spec.share_adapter:
            adapter, key = agent.policy, self.policies[agent.policy].base_key
        else:
            adapter = spec.name
            model = spec.model if spec.model is not None else agent.model_name
            quantization = spec.quantization if spec.model is not None else agent.quantization
            key = self._attach_adapter(model, quantization, adapter, LoraConfig(
                r=spec.lora_r, lora_alpha=spec.lora_alpha, lora_dropout=spec.lora_dropout,
                target_modules=spec.lora_target_modules, task_type="CAUSAL_LM", bias="none"))
        text_config = self.bases[key].get_base_model().config.get_text_config()
        head = ValueHead(text_config.hidden_size, spec.num_heads,
                         dtype=self.bases[key].get_input_embeddings().weight.dtype)
        self.value_heads[spec.name] = head.to(next(self.bases[key].parameters()).device)
        adapter_params = [] if spec.share_adapter else self._adapter_parameters(adapter)
        self.critics[spec.name] = _Critic(spec, key, adapter, adapter_params + list(head.parameters()))

    @staticmethod
    def _lora_config(spec: AgentSpec) -> LoraConfig:
        return LoraConfig(r=spec.lora_r, lora_alpha=spec.lora_alpha, lora_dropout=spec.lora_dropout,
                          target_modules=spec.lora_target_modules, task_type="CAUSAL_LM", bias="none")

    # ----------------------------------------------------------------------------------------------- structure
    @property
    def agent_names(self) -> list[str]:
        return list(self.specs)

    def policy_of(self, agent: str) -> str:
        return self.specs[agent].policy

    def base_of(self, policy: str) -> PeftModel:
        return self.bases[self.policies[policy].base_key]

    def config_of(self, policy: str):
        """The transformers config of ``policy``'s base model (what
        :func:`~trl_multiagent.generation.teacher_forcing.model_config` reads for ``functools.partial(pool, policy)``)."""
        return self.base_of(policy).get_base_model().config

    def tokenizer_of(self, name: str) -> PreTrainedTokenizerBase:
        """The tokenizer of an agent's, a policy's or a critic's base."""
        if name in self.critics:
            return self.tokenizers[self.critics[name].base_key]
        policy = self.specs[name].policy if name in self.specs else name
        return self.tokenizers[self.policies[policy].base_key]

    def tools_of(self, agent: str) -> list:
        """The agent's tool functions (empty without tools)."""
        return self._tools.get(agent, [])

    def chat_template_of(self, agent: str) -> str | None:
        """The agent's own chat template, or ``None`` for its tokenizer's."""
        return self._chat_templates.get(agent)

    def policy_parameters(self, policy: str) -> list[nn.Parameter]:
        """The trainable parameters of one policy's adapter, and nothing else."""
        return self._policy_params[policy]

    def critic_parameters(self, critic: str) -> list[nn.Parameter]:
        """The trainable parameters of one critic: its adapter (unless it shares the policy's) and its value head."""
        return self.critics[critic].params

    def freeze_policies(self, names) -> None:
        """Keep the policies ``names`` as they are: their adapters leave :meth:`trainable_groups` and compute no
        gradient (the trainer leaves their samples out of the loss: ``trained_policies``). At least one policy must
        still train."""
        names = frozenset(names)
        check_frozen_policies(names, self.policies)
        self.frozen_policies = names
        self._keep_all_adapters_trainable()

    @property
    def trained_policies(self) -> list[str]:
        """The policies that learn, in the team's order: every policy but the :attr:`frozen_policies`."""
        return [p for p in self.policies if p not in self.frozen_policies]

    def trainable_groups(self) -> list[dict[str, Any]]:
        """One entry per optimizer param group: every policy that learns (not the :attr:`frozen_policies`), then every
        critic (``kind``, ``name``, ``params``, ``learning_rate`` (``None``: the trainer's default for that kind))."""
        groups = [{"kind": "policy", "name": p, "params": self._policy_params[p],
                   "learning_rate": self.policies[p].learning_rate} for p in self.trained_policies]
        groups += [{"kind": "critic", "name": c, "params": info.params, "learning_rate": info.spec.learning_rate}
                   for c, info in self.critics.items()]
        return groups

    def _keep_all_adapters_trainable(self) -> None:
        # PEFT's set_adapter freezes inactive adapters; one optimizer holds all adapters, so keep all trainable
        # (all but the frozen policies').
        for policy, params in self._policy_params.items():
            for p in params:
                p.requires_grad_(policy not in self.frozen_policies)
        for info in self.critics.values():
            for p in info.params:
                p.requires_grad_(True)

    def activate(self, adapter: str) -> PeftModel:
        """Make ``adapter`` (a policy's or a critic's) the active adapter of its base and return that base."""
        if adapter in self.critics:
            adapter = self.critics[adapter].adapter
        key = self._adapter_base[adapter]
        base = self.bases[key]
        if self._active.get(key) != adapter:
            base.set_adapter(adapter)
            self._keep_all_adapters_trainable()
            self._active[key] = adapter
        return base

    def values(self, critic: str, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               head: int | torch.Tensor | None = None) -> torch.Tensor:
        """Per-token values ``(B, T)`` of ``critic``: its value head on the last hidden states of its base, run with
        the critic's adapter active. ``head`` picks one of several heads (an int, or a ``(B,)`` tensor per row).
        Positions count real tokens (padding does not shift them), as in generation and the teacher-forced passes."""
        base = self.activate(critic)
        backbone = base.get_base_model().base_model  # the decoder without the LM head; LoRA layers live inside it
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).last_hidden_state
        return select_head(self.value_heads[critic](hidden), head)

    def completion_values(self, critic: str, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                          completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                          head: int | torch.Tensor | None = None, share_prompts: bool = True) -> torch.Tensor:
        """``(B, T)``: ``critic``'s value of the state before each completion token (the last prompt token's for
        the first one) after left-padded prompts, i.e. the columns of :meth:`values` that token-level GAE reads;
        shared prompts and prompt prefixes run once
        (:func:`~trl_multiagent.generation.teacher_forcing.completion_outputs`)."""
        base = self.activate(critic)
        with self._training_linears(critic):
            hidden = completion_outputs(hidden_forward(base.get_base_model().base_model), prompt_ids, prompt_mask,
                                        completion_ids, completion_mask, share_prompts=share_prompts)
        return select_head(self.value_heads[critic](hidden), head)

    @contextlib.contextmanager
    def reference(self, policy: str) -> Iterator[PeftModel]:
        """The reference policy for KL: the same base with the adapters disabled (no second copy of the model)."""
        base = self.activate(policy)
        with base.disable_adapter():
            yield base

    def prepare_for_training(self, temperature: float) -> None:
        """Give every base TRL's fused LM head (log-probs without materialising logits) at ``temperature``."""
        from trl.trainer.utils import add_fused_lm_head

        if self._fused_temperature is not None:
            if self._fused_temperature != temperature:
                raise ValueError(
                    f"This pool was prepared with temperature {self._fused_temperature}; build a new pool for "
                    f"temperature {temperature}."
                )
            return
        for base in self.bases.values():
            add_fused_lm_head(base.get_base_model(), temperature=temperature, outputs=("log_probs", "entropy"))
        self._fused_temperature = temperature

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs: dict | None = None,
                                        every_n_layers: int = 1, offload: bool = False) -> None:
        """Activation checkpointing on every base (``Trainer`` calls it when ``gradient_checkpointing`` is set)."""
        for base in self.bases.values():
            base.get_base_model().activation_checkpointing_enable(
                activation_checkpointing_kwargs=activation_checkpointing_kwargs, every_n_layers=every_n_layers,
                offload=offload)
            base.enable_input_require_grads()

    def forward(self, policy: str, **inputs: Any):
        """Run ``policy``'s base with its adapter active (``inputs`` go to the model's forward); on a base that
        :meth:`packs_training`, its frozen linears compute with oneDNN-packed weights, forward and backward."""
        base = self.activate(policy)
        with self._training_linears(policy):
            return base(**inputs)

    def _training_linears(self, adapter: str):
        """The context a teacher-forced pass of ``adapter`` (a policy or a critic) runs in: its base's frozen
        linears packed, differentiably, where :meth:`packs_training` says so."""
        if adapter in self.critics:
            adapter = self.critics[adapter].adapter
        key = self._adapter_base[adapter]
        if not self.packs_training(key):
            return contextlib.nullcontext()
        return PackedFrozenLinears(self.bases[key].get_base_model(), differentiable=True,
                                   dtype=self.frozen_dtype_of(key))

    def packs_training(self, base_key: str) -> bool:
        """Whether the forward passes through :meth:`forward` (the teacher-forced passes of the losses, behaviour
        log-probs) compute base ``base_key``'s frozen linears with oneDNN-packed weights, the input's gradient with
        packed transposed weights (:class:`~trl_multiagent.generation.frozen_weights.PackedFrozenLinears`,
        ``differentiable``): where generation packs them and three copies take at most a quarter of the machine's
        memory (``packed_weights`` 'auto'; 'always' and 'never' decide both)."""
        return base_key in self.paths and self.paths[base_key].packed_training

    # ----------------------------------------------------------------------------------------------- prompts
    def encode_prompt(self, agent: str, prompt: Prompt) -> list[int]:
        """Token ids of an agent's prompt, through its tokenizer's chat template when it has one."""
        spec, tok = self.specs[agent], self.tokenizer_of(agent)
        template = self.chat_template_of(agent)
        if spec.use_chat_template and (template or getattr(tok, "chat_template", None)):
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            if spec.system_prompt and not any(m.get("role") == "system" for m in messages):
                messages = [{"role": "system", "content": spec.system_prompt}, *messages]
            kwargs: dict[str, Any] = {"chat_template": template} if template else {}
            tools = [*self.tools_of(agent), *getattr(prompt, "tools", ())]
            if tools:
                kwargs["tools"] = tools
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
            return tok(text, add_special_tokens=False)["input_ids"]
        if not isinstance(prompt, str):
            prompt = "\n".join(f"{m['role']}: {m['content']}" for m in prompt)
        if spec.system_prompt:
            prompt = f"{spec.system_prompt}\n{prompt}"
        return tok(prompt)["input_ids"]

    def eos_token_ids(self, agent: str) -> list[int]:
        tok = self.tokenizer_of(agent)
        base = self.base_of(self.policy_of(agent))
        ids = base.generation_config.eos_token_id
        ids = [] if ids is None else ([ids] if isinstance(ids, int) else list(ids))
        if tok.eos_token_id is not None and tok.eos_token_id not in ids:
            ids.insert(0, tok.eos_token_id)
        return ids

    # ----------------------------------------------------------------------------------------------- generation
    @torch.no_grad()
    def generate_many(self, requests: Sequence[GenerationRequest], generation_config: GenerationConfig,
                      max_batch_sequences: int | None = None, progress=None) -> list[list[Generation]]:
        """Sample every request of a team's step at once; returns one list of ``num_samples`` generations per request,
        in request order. The one generation entry point of samplers and evaluation: the rows of all agents that
        share a base are decoded together, each with its own adapter (or none: ``use_adapter=False``), in chunks of
        at most ``max_batch_sequences`` rows (:func:`trl_multiagent.generation.team.generate_team`). A completion
        keeps its first EOS token and drops what follows; ``truncated`` marks completions that hit the length limit.
        ``progress(rows)`` is called after every chunk."""
        for req in requests:
            if req.agent not in self.specs:
                raise KeyError(f"Unknown agent {req.agent!r}; the team is {self.agent_names}")
            if req.num_samples < 1:
                raise ValueError(f"num_samples must be at least 1, got {req.num_samples}")
        if not requests:
            return []
        start = time.perf_counter()
        def raw(reqs, config, progress=progress):
            if self.generation_backend is not None:
                return self.generation_backend.generate(reqs, config, max_batch_sequences, progress)
            return generate_team(self, reqs, config, max_batch_sequences, progress)

        with torch.profiler.record_function("time/generation"):  # the trainer's metric of this time, in a profile
            out = raw(requests, generation_config)
            if any(self.tools_of(r.agent) for r in requests):
                from trl_multiagent.environments.tools import run_tool_calls

                out = run_tool_calls(self, requests, out, generation_config,
                                     lambda reqs, config: raw(reqs, config, progress=None))
        self.generation_stats["seconds"] += time.perf_counter() - start
        self.generation_stats["tokens"] += sum(g.own_token_count for gens in out for g in gens)
        return out

    def generate_by_agent(self, prompts: Mapping[str, Sequence[Prompt]], num_samples: int,
                          generation_config: GenerationConfig,
                          max_batch_sequences: int | None = None) -> dict[str, list[list[Generation]]]:
        """``num_samples`` responses of each agent to each of its prompts, all agents in one :meth:`generate_many`
        call: ``{agent: [samples of prompt 0, samples of prompt 1, ...]}``."""
        order = [(agent, p) for agent, agent_prompts in prompts.items() for p in agent_prompts]
        gens = self.generate_many([GenerationRequest(a, p, num_samples) for a, p in order], generation_config,
                                  max_batch_sequences)
        out: dict[str, list[list[Generation]]] = {agent: [] for agent in prompts}
        for (agent, _), g in zip(order, gens):
            out[agent].append(g)
        return out

    def generate(self, agent: str, prompts: Sequence[Prompt], num_samples: int,
                 generation_config: GenerationConfig, max_batch_sequences: int | None = None) -> list[list[Generation]]:
        """``num_samples`` responses of one agent for every prompt (:meth:`generate_many` with one agent)."""
        return self.generate_many([GenerationRequest(agent, p, num_samples) for p in prompts], generation_config,
                                  max_batch_sequences)

    def dense_copy_of(self, base_key: str) -> bool:
        """Whether the base ``base_key`` computes with a de-quantised copy of its 4-bit weights (decided when the base
        loads; see ``dense_copy``)."""
        return base_key in self.paths and self.paths[base_key].dense_copy

    def lean_decodes(self, base_key: str) -> bool:
        """Whether generation on base ``base_key`` computes its one-token decoding steps with the lean step
        (:class:`~trl_multiagent.generation.lean_step.LeanStep`) rather than transformers' forward (decided once,
        when the pool is built: ``lean_decode`` and :func:`~trl_multiagent.generation.lean_step.lean_support`)."""
        return base_key in self.paths and self.paths[base_key].lean_decode

    @property
    def frozen_matmul_dtype(self) -> torch.dtype:
        """The dtype asked for the packed frozen copies (``frozen_matmul_dtype``); per base: :meth:`frozen_dtype_of`."""
        return self._frozen_dtype

    def frozen_dtype_of(self, base_key: str) -> torch.dtype:
        """The dtype base ``base_key``'s packed frozen copies compute in, in generation and in the teacher-forced
        passes (``frozen_matmul_dtype``; float32 where the base does not pack)."""
        return self._frozen_dtype if self.packs_weights(base_key) else torch.float32

    def packs_weights(self, base_key: str) -> bool:
        """Whether generation on base ``base_key`` computes its frozen linears with oneDNN-packed weights
        (:class:`~trl_multiagent.generation.frozen_weights.PackedFrozenLinears`: CPU, float32; ``packed_weights``
        decides, ``auto`` where a copy of the frozen weights takes at most a quarter of the machine's memory)."""
        return base_key in self.paths and self.paths[base_key].packed_weights

    # ----------------------------------------------------------------------------------------------- save / load
    def save_adapters(self, directory: str | Path) -> None:
        """Write every policy's adapter to ``<directory>/adapters/<policy>/`` (every critic's adapter and value head
        to ``<directory>/adapters/<critic>/``) and the team layout to ``team.json``. Every tensor is checked finite
        first: a NaN or infinite one raises :class:`~trl_multiagent.errors.NonFiniteAdapterError` with nothing
        written (:mod:`trl_multiagent.team.adapter_files`)."""
        save_pool_adapters(self, directory)

    def load_adapters(self, directory: str | Path, only: Sequence[str] | None = None,
                      source: str | None = None) -> None:
        """Load every policy's adapter (and every critic's adapter and head) from ``<directory>/adapters/<name>/``;
        ``only``: just those policies' adapters (a team put together from agents trained apart); ``source``: the one
        policy of ``only`` takes the adapter saved there under that other policy's name."""
        load_pool_adapters(self, directory, only, source)
        self._keep_all_adapters_trainable()
        if self.generation_backend is not None:
            self.generation_backend.mark_stale()

    @classmethod
    def from_pretrained(cls, directory: str | Path, dtype: str = "auto", **options: Any) -> AgentPool:
        """Rebuild a team saved by :meth:`save_adapters` (its bases reload from their recorded sources); ``options``:
        the pool's other settings (``packed_weights``, ``lean_decode``, ...). ``trl_multiagent.Team`` adds the
        recipe's environment and decoding settings."""
        team = json.loads((Path(directory) / "adapters" / "team.json").read_text())
        pool = cls([AgentSpec(**a) for a in team["agents"]], dtype=dtype,
                   critics=[CriticSpec(**c) for c in team.get("critics", [])], **options)
        pool.load_adapters(directory)
        return pool
