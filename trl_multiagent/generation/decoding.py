"""The decoding loop: :func:`decode` samples completions of a batch of left-padded prompts.

One prefill that keeps only the last position's logits (prompts that begin with the same tokens prefill that shared
prefix once, :func:`~trl_multiagent.generation.prefixes.shared_prefixes`; rows of very different lengths prefill in
buckets, :func:`prefill_buckets`), then one token per step with a preallocated KV cache
(:mod:`~trl_multiagent.generation.kv_cache`); rows that have finished are dropped from the batch (and their cache)
as they accumulate; the next token comes from the sampler (:func:`~trl_multiagent.generation.sampling.sample_next`).
The one-token steps run through the model's forward, or, for a Llama-architecture base, through the lean step
(:class:`~trl_multiagent.generation.lean_step.LeanStep`, ``lean_step``), which computes them with few operations.
A mixed batch of LoRA adapters (:class:`~trl_multiagent.generation.lora_batch.MultiAdapterBatch`) follows the rows;
where several adapters have as many rows each, the decoding steps run on the rows sorted by adapter (each adapter's
rows one block, :class:`~trl_multiagent.generation.lora_batch.AdapterBlocks`), and the sampler draws in the rows'
original order (:func:`sampling_order`), so the samples do not depend on the sort.

:data:`SUPPORTED_OPTIONS` are the GenerationConfig options the loop implements (:func:`unsupported_options`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import torch
from transformers import GenerationConfig

from trl_multiagent.generation.kv_cache import preallocated_cache
from trl_multiagent.generation.lean_step import LeanStep
from trl_multiagent.generation.lora_batch import MultiAdapterBatch
from trl_multiagent.generation.sampling import sample_next

#: Generation options the loop implements; any other non-default option of a GenerationConfig is refused.
SUPPORTED_OPTIONS = ("max_new_tokens", "min_new_tokens", "do_sample", "temperature", "top_k", "top_p", "min_p",
                     "repetition_penalty", "suppress_tokens", "eos_token_id", "pad_token_id", "bos_token_id",
                     "num_return_sequences", "use_cache", "return_dict_in_generate", "output_scores",
                     "transformers_version", "_from_model_config", "cache_implementation")


def unsupported_options(config: GenerationConfig, supported: Sequence[str] = SUPPORTED_OPTIONS) -> list[str]:
    """Options set in ``config`` (differently from a default GenerationConfig) that are not ``supported`` (by
    default: that :func:`decode` does not implement)."""
    default = GenerationConfig().to_dict()
    return sorted(k for k, v in config.to_dict().items() if k not in supported and default.get(k) != v)


#: Buckets of the prefill (:func:`prefill_buckets`) hold at least this many rows (smaller ones compute less well).
PREFILL_BUCKET_MIN_ROWS = 16
#: What one more prefill call costs, in padded positions (its per-call overhead).
PREFILL_BUCKET_OVERHEAD = 32


def prefill_buckets(lengths: Sequence[int], min_rows: int | None = None,
                    overhead: int | None = None) -> list[tuple[list[int], int]]:
    """Rows grouped for the prefill, to pad little: ``[(rows, width), ...]``, each bucket's rows sorted by length
    and its width their longest. The buckets are runs of the rows sorted by length, chosen (exactly, by dynamic
    programming) to minimise the positions computed, ``sum(len(rows) x width)``, plus ``overhead`` per bucket; each
    holds at least ``min_rows`` rows. With fewer than ``2 x min_rows`` rows (or no gain) it is one bucket, in the
    original order."""
    min_rows = PREFILL_BUCKET_MIN_ROWS if min_rows is None else min_rows
    overhead = PREFILL_BUCKET_OVERHEAD if overhead is None else overhead
    n = len(lengths)
    single = [(list(range(n)), max(lengths, default=0))]
    if n < 2 * min_rows:
        return single
    order = sorted(range(n), key=lambda i: lengths[i])
    ordered = [lengths[i] for i in order]
    # best[j]: the least cost of the first j sorted rows in buckets; cut[j]: where the last bucket starts
    best = [0.0] + [math.inf] * n
    cut = [0] * (n + 1)
    for j in range(min_rows, n + 1):
        width = ordered[j - 1]
        for i in range(0, j - min_rows + 1):
            if best[i] < math.inf and (cost := best[i] + (j - i) * width + overhead) < best[j]:
                best[j], cut[j] = cost, i
    if best[n] >= n * ordered[-1] + overhead:
        return single
    out, j = [], n
    while j > 0:
        out.append(([order[k] for k in range(cut[j], j)], ordered[j - 1]))
        j = cut[j]
    return out[::-1]


def _bucketed_prefill(model, cache, input_ids, attention_mask, position_ids, start: int, sizes: Sequence[int],
                      widths: Sequence[int], batch: MultiAdapterBatch | None) -> torch.Tensor:
    """Prefill the left-padded rows (positions ``start`` on) in consecutive buckets of ``sizes`` rows, each only
    ``widths[b]`` positions wide: a bucket writes its keys and values into its rows of ``cache`` at the last
    ``widths[b]`` positions; the positions left out are padding, masked, and their cache entries zero. Returns the
    last position's logits of every row."""
    total = input_ids.size(1)
    logits, row = [], 0
    for size, width in zip(sizes, widths):
        rows = slice(row, row + size)
        view = cache.row_view(rows, total - width)
        with batch.rows(rows) if batch is not None else contextlib.nullcontext():
            out = model(input_ids=input_ids[rows, total - width:], attention_mask=attention_mask[rows],
                        position_ids=position_ids[rows, total - width:], cache=view, use_cache=True,
                        logits_to_keep=1)
        logits.append(out.logits[:, -1, :])
        row += size
    cache.set_length(total)
    return torch.cat(logits)


@torch.no_grad()
def decode(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, config: GenerationConfig,
           eos_ids: Sequence[int], batch: MultiAdapterBatch | None = None,
           compact_fraction: float = 0.25, expand: torch.Tensor | None = None,
           prefix: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
           lean_step: LeanStep | None = None) -> list[list[int]]:
    """Sample completions of the left-padded ``input_ids`` rows; returns each row's completion token ids (ending
    with its EOS token when it produced one).

    ``expand`` (optional, indices into the prompt rows) samples one completion per entry: the prompts are prefilled
    once and their KV cache rows copied, so ``num_samples`` completions of one prompt cost one prefill, not
    ``num_samples`` (``batch`` is then given per prompt row, like ``input_ids``).

    ``prefix`` (optional) is ``(prefix_ids, prefix_mask, group)``: left-padded prefixes, one per group of prompts,
    and the group (a row of the prefixes) of each prompt row, whose ``input_ids`` are then the rest of the prompt,
    left-padded. The prefixes are prefilled once and their cache rows copied to their prompts, which continue from
    them (the padding between a prefix and the rest is masked; positions count real tokens only). ``batch`` is then
    given per prefix row.

    ``model`` is a transformers causal LM (the PEFT-injected model under ``batch``, if any). Rows that produced
    EOS leave the batch, with their KV cache rows, once at least ``compact_fraction`` of the live rows have
    finished (each removal copies the cache, so it is not done at every step).

    ``lean_step`` (optional): a :class:`~trl_multiagent.generation.lean_step.LeanStep` of ``model`` (made within
    ``batch``) that computes the one-token steps after the prefill instead of ``model``'s forward; the prefill
    stays on the forward."""
    unknown = unsupported_options(config)
    if unknown:
        raise ValueError(f"team-level generation does not implement the generation option(s) {unknown}")
    max_new = int(config.max_new_tokens)
    device = input_ids.device
    eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.long, device=device) if eos_ids else None
    width = input_ids.size(1) + (prefix[0].size(1) if prefix is not None else 0)
    cache = preallocated_cache(model, width + max_new)
    start = 0
    # Every move of the cache's rows copies all of it (every layer, its whole capacity), so moves that follow each
    # other with no forward between them are composed into one index: the prefixes' rows to their prompts then the
    # prompts into prefill buckets; the prompts' rows to their samples then the samples sorted by adapter.
    moved = None  # the cache rows the prompt rows come from, not applied yet
    if prefix is not None:  # the groups' prefixes first; their cache rows are copied to the group's prompts
        prefix_ids, prefix_mask, group = (t.to(device) for t in prefix)
        model(input_ids=prefix_ids, attention_mask=prefix_mask,
              position_ids=(prefix_mask.long().cumsum(-1) - 1).clamp(min=0), cache=cache, use_cache=True,
              logits_to_keep=1)
        moved = group
        if batch is not None:
            batch.select(group)
        start = prefix_ids.size(1)
        input_ids = torch.cat([prefix_ids[group], input_ids], dim=1)
        attention_mask = torch.cat([prefix_mask[group], attention_mask], dim=1)
    rows = input_ids.size(0)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    buckets = prefill_buckets(attention_mask[:, start:].sum(-1).tolist()) if cache.supports_row_views() else [()]
    if batch is not None and cache.supports_row_views():
        # each bucket's rows grouped by adapter (stable): where a bucket holds as many rows of each adapter, its LoRA
        # deltas view the rows as blocks in place, instead of gathering them into blocks and back at every layer
        adapter = batch.row_index.tolist()
        grouped = [(sorted(members, key=adapter.__getitem__), width) for members, width in buckets]
        if any(new != old for (new, _), (old, _) in zip(grouped, buckets)):
            buckets = grouped
    if buckets == [()] or (len(buckets) == 1 and buckets[0][0] == list(range(rows))):  # one call, rows as they are
        if moved is not None:
            cache.batch_select_indices(moved)
        out = model(input_ids=input_ids[:, start:], attention_mask=attention_mask,
                    position_ids=position_ids[:, start:], cache=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1, :]
    else:  # rows of similar length prefill together, each bucket only as wide as its longest prompt (or in order)
        order = torch.tensor([row for bucket, _ in buckets for row in bucket], dtype=torch.long, device=device)
        if start == 0:  # nothing cached yet: allocate the rows the buckets write into
            cache.allocate(rows, device, model.get_input_embeddings().weight.dtype)
        else:
            cache.batch_select_indices(moved[order])
        if batch is not None:
            batch.select(order)
        input_ids, attention_mask, position_ids = input_ids[order], attention_mask[order], position_ids[order]
        logits = _bucketed_prefill(model, cache, input_ids, attention_mask, position_ids, start,
                                   [len(bucket) for bucket, _ in buckets], [w for _, w in buckets], batch)
        back = torch.empty_like(order)
        back[order] = torch.arange(rows, device=device)
        expand = back if expand is None else back[expand.to(device)]  # the prompt rows' new places
    moved = None  # the cache rows the decoding rows come from, not applied yet
    if expand is not None:
        moved = expand = expand.to(device)
        if batch is not None:
            batch.select(expand)
        rows = int(expand.numel())
    live = torch.arange(rows, device=device)  # original row of each live row
    blocks = batch.blocks if batch is not None else None
    if blocks is not None and blocks.full and not blocks.in_place:
        # rows of several adapters, as many each: sorted by adapter, so that each adapter's rows are one block that
        # the LoRA deltas view in place (lora_batch.AdapterBlocks); the sampler still sees them in their original
        # order (sampling_order), so the draws are the same
        live = torch.argsort(batch.row_index, stable=True).to(device)
        batch.select(live)
        moved = live if moved is None else moved[live]
    if moved is not None:
        cache.batch_select_indices(moved)
        logits, input_ids, attention_mask, position_ids = (t[moved] for t in (logits, input_ids, attention_mask,
                                                                              position_ids))
    order = sampling_order(live)
    completions: list[list[int]] = [[] for _ in range(rows)]
    need_seen = config.repetition_penalty not in (None, 1.0)
    # the ids a repetition penalty looks at; padding repeats the row's last prompt token (a repeat changes nothing)
    seen = torch.where(attention_mask.bool(), input_ids, input_ids[:, -1:]) if need_seen else None
    next_pos = position_ids[:, -1] + 1
    mask = attention_mask
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    for step in range(max_new):
        if order is None:
            tokens = sample_next(logits, config, seen, step, eos_ids)
        else:  # drawn in the rows' original order, put back in the batch's
            tokens = torch.empty_like(live)
            tokens[order] = sample_next(logits[order], config, seen[order] if seen is not None else None, step,
                                        eos_ids)
        for row, token in zip(live.tolist(), tokens.tolist()):
            completions[row].append(token)
        if eos is not None:
            finished = finished | torch.isin(tokens, eos)
        if step + 1 == max_new or bool(finished.all()):
            break
        if need_seen:
            seen = torch.cat([seen, tokens[:, None]], dim=1)
        mask = torch.cat([mask, mask.new_ones((mask.size(0), 1))], dim=1)
        if int(finished.sum()) >= max(1.0, compact_fraction * live.numel()):
            keep = (~finished).nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            live, tokens, mask, next_pos, finished = live[keep], tokens[keep], mask[keep], next_pos[keep], finished[keep]
            order = sampling_order(live)
            seen = seen[keep] if seen is not None else None
            if batch is not None:
                batch.select(keep)
        # finished rows still in the batch decode on; what they add after their EOS is cut below
        if lean_step is not None:
            logits = lean_step(tokens, mask, next_pos, cache)
        else:
            out = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=next_pos[:, None], cache=cache,
                        use_cache=True)
            logits = out.logits[:, -1, :]
        next_pos = next_pos + 1
    eos_set = set(eos_ids)
    return [through_first_eos(comp, eos_set) for comp in completions]


def sampling_order(live: torch.Tensor) -> torch.Tensor | None:
    """The batch's rows in their original order (``live``: each row's original index), for the sampler; ``None``
    where they already are."""
    if live.numel() < 2 or bool((live[1:] > live[:-1]).all()):
        return None
    return torch.argsort(live)


def through_first_eos(ids: list[int], eos_ids: set[int]) -> list[int]:
    """A completion cut after its first EOS token (kept), or ``ids`` itself when it has none."""
    cut = next((i + 1 for i, t in enumerate(ids) if t in eos_ids), None)
    return ids[:cut] if cut is not None else ids
