"""The one teacher-forced pass over prompts and their completions: the model's outputs (logits for log-probs, hidden
states for a critic) at the positions that predict each completion token.

A batch of a multi-turn rollout repeats most of its prompt tokens: the K samples of one prompt share it whole, and
different prompts of one environment share their opening (a system message, worked examples as earlier chat turns).
:func:`completion_outputs` runs each repeated span once, in three stages, each continuing the KV cache of the last:

1. **shared prefixes**: prompts are grouped by their common leading tokens
   (:func:`~trl_multiagent.generation.prefixes.shared_prefixes`, the grouping team-level generation prefills with);
   each group's prefix runs once;
2. **distinct prompts**: the rest of every distinct prompt, on its group's cache rows;
3. **completions**: every row's completion, on its own copy of its prompt's cache row, in length buckets.

For the models :func:`packs_completions` accepts (the embedded Llama models among them), stages 2 and 3 are one call
per bucket instead (:func:`_packed_rests_and_completions`): each distinct prompt's rest and then its completions (the
K samples), one after another, as one sequence on its prefix's cache row, under a 4D mask that keeps the completions
apart.

Cache rows are copied with a differentiable gather, so a gradient through a shared span is the sum of the gradients
of every row that reads it: the outputs and their gradients are those of one separate pass per row (up to float
summation order). Padding between the stages is masked and positions count real tokens only, in the plain pass too.

A ``head`` (:data:`Head`) reduces each call's outputs to per-token values (the log-prob path's log-probs and entropies)
before the calls' results are put in row order: only those small ``(B, T)`` tensors are padded, joined and reordered,
never the ``(B, T, vocabulary)`` logits.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from transformers.modeling_outputs import BaseModelOutputWithPast

from trl_multiagent.generation.decoding import prefill_buckets
from trl_multiagent.generation.padding import left_pad
from trl_multiagent.generation.prefixes import shared_prefixes

#: the keyword of a transformers model's KV cache: ``cache`` from transformers 5.20 on, ``past_key_values`` before
#: (an unknown keyword would be swallowed by the model's ``**kwargs`` and the cache silently ignored)
CACHE_KEYWORD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"

#: ``forward(input_ids, attention_mask, position_ids, cache, use_cache, keep) -> (outputs, cache)``: one model call
#: returning its per-position outputs of the last ``keep`` positions ``(B, keep, D)`` (``keep`` an int), or of the
#: columns ``keep`` lists for every row (a 1D tensor, repeats allowed; transformers' ``logits_to_keep``), and the KV
#: cache.
Forward = Callable[..., tuple[torch.Tensor, object]]

#: ``head(outputs, token_ids) -> tuple of (b, w) tensors``: per-position values of one call's ``(b, w, D)`` outputs,
#: given the ``(b, w)`` completion tokens those positions predict.
Head = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]


def lm_forward(model) -> Forward:
    """:data:`Forward` of a causal LM (or a callable forwarding to one): its logits. Its ``packs_completions``
    (:func:`packs_completions` of :func:`model_config`) says whether stage 3 packs."""

    def forward(input_ids, attention_mask, position_ids, cache, use_cache, keep):
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    use_cache=use_cache, logits_to_keep=keep, **{CACHE_KEYWORD: cache})
        return out.logits, _cache_of(out)

    forward.packs_completions = packs_completions(model_config(model))
    return forward


def hidden_forward(backbone) -> Forward:
    """:data:`Forward` of a decoder without its LM head (``model.base_model`` of a causal LM): its last hidden states
    (``packs_completions`` as :func:`lm_forward`'s)."""

    def forward(input_ids, attention_mask, position_ids, cache, use_cache, keep):
        out = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=use_cache, **{CACHE_KEYWORD: cache})
        hidden = out.last_hidden_state
        return (hidden[:, keep] if isinstance(keep, torch.Tensor) else hidden[:, -keep:]), _cache_of(out)

    forward.packs_completions = packs_completions(model_config(backbone))
    return forward


#: The architectures (transformers' ``model_type``) whose stage 3 packs completions: their attention reads only the
#: mask it is given and their positions only ``position_ids`` (rotary embeddings), so a custom 4D mask and explicit
#: positions compute exactly what separate rows compute. Others (learned or ALiBi position biases built from a 2D
#: mask, sliding windows the mask would have to repeat) keep one row per completion.
PACKED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3", "olmo", "olmo2", "granite"})


def model_config(model):
    """The transformers config of ``model``: its ``config`` (a transformers or PEFT model, or any callable given
    one); for a callable bound to one policy of an :class:`~trl_multiagent.team.pool.AgentPool` (``functools.partial
    (pool, policy)``, as the trainers call it; the pool possibly wrapped, as ``accelerate`` wraps it), that policy's
    base's; else ``None``."""
    config = getattr(model, "config", None)
    if config is None and isinstance(model, functools.partial) and model.args:
        pool = getattr(model.func, "module", model.func)
        config_of = getattr(pool, "config_of", None)
        if callable(config_of) and isinstance(model.args[0], str):
            config = config_of(model.args[0])
    return config


def packs_completions(config) -> bool:
    """Whether stage 3 packs completions for a model of ``config``: an architecture of :data:`PACKED_MODEL_TYPES`
    without a sliding window, computing attention with ``sdpa`` or the grouped ``sdpa``, which take the boolean 4D
    mask as it is (True where a query attends). ``eager`` attention would add the mask to its scores, and other
    implementations read no 4D mask: those, and a model without a config, keep one row per completion."""
    from trl_multiagent.models.grouped_attention import GROUPED_SDPA

    if config is None or getattr(config, "model_type", None) not in PACKED_MODEL_TYPES:
        return False
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return False
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return False
    return getattr(config, "_attn_implementation", None) in ("sdpa", GROUPED_SDPA)


def _cache_of(out):
    return getattr(out, CACHE_KEYWORD)


def completion_outputs(forward: Forward, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                       completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                       share_prompts: bool = True, prefix_store: PrefixStore | None = None,
                       head: Head | None = None):
    """``(B, T, D)``: for each of the ``(B, T)`` right-padded completion tokens after their left-padded ``(B, P)``
    prompts, ``forward``'s output at the position before it (the last prompt token for the first one). With a
    ``head``: the tuple of ``(B, T)`` tensors it gives for those outputs and tokens, applied call by call.

    ``share_prompts``: run each distinct prompt, and each prefix shared by several prompts, once (the module's three
    stages); ``False``: one plain pass over every prompt + completion row. A model that keeps no KV cache (a
    transformers model with activation checkpointing, in training mode) also gets the plain pass. ``prefix_store``:
    prefixes already run for every micro-batch of an update (:class:`PrefixStore`); the prompts that begin with one
    start from its keys and values, and stage 1 is skipped."""
    prompts = [prompt_ids[row][prompt_mask[row].bool()].tolist() for row in range(prompt_ids.size(0))]
    distinct: dict[tuple[int, ...], int] = {}
    owner = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    unique = [list(p) for p in distinct]
    device = prompt_ids.device
    stored = [prefix_store.longest_prefix(p) for p in unique] if share_prompts and prefix_store else []
    if any(stored):  # 1. the stored prefixes (a prompt without one: an empty prefix)
        keys = list(dict.fromkeys(stored))
        group_of = [keys.index(k) for k in stored]
        prefix_len = [len(k) if k else 0 for k in keys]
        cache, mask = prefix_store.cache_of(keys)
        group = torch.tensor(group_of, device=device)
        return _rests_and_completions(forward, unique, owner, group_of, prefix_len, cache, group, mask[group],
                                      prompt_ids, prompt_mask, completion_ids, completion_mask, head)
    group_of, prefix_len = shared_prefixes(unique, [None] * len(unique))
    size = [group_of.count(g) for g in range(len(prefix_len))]
    repeats = len(prompts) - len(distinct) + sum((n - 1) * length for n, length in zip(size, prefix_len))
    if not share_prompts or repeats == 0:  # no prompt repeats, no prefix is shared: one plain pass
        return _plain(forward, prompt_ids, prompt_mask, completion_ids, completion_mask, head)
    if all(n == 1 for n in size):  # no two distinct prompts share a prefix: each runs whole in stage 2, one call less
        prefix_len = [0] * len(prefix_len)

    # 1. one pass per shared prefix (skipped when nothing is shared: every prefix is then empty)
    cache, mask = None, torch.zeros((len(unique), 0), dtype=torch.long, device=device)
    group = torch.tensor(group_of, device=device)
    if any(prefix_len):
        first = {}
        for i, g in enumerate(group_of):
            first.setdefault(g, i)
        prefixes = [unique[first[g]][:prefix_len[g]] for g in range(len(prefix_len))]
        # prefixes and rests are left-padded with id 0: padded positions are masked, the pad id is irrelevant
        ids, mask = left_pad(prefixes, dtype=prompt_ids.dtype, device=device)
        _, cache = forward(ids, mask, _positions(mask, 0), None, True, 1)
        if cache is None:  # activation checkpointing while training: the model keeps no cache
            return _plain(forward, prompt_ids, prompt_mask, completion_ids, completion_mask, head)
        mask = mask[group]
    return _rests_and_completions(forward, unique, owner, group_of, prefix_len, cache, group, mask, prompt_ids,
                                  prompt_mask, completion_ids, completion_mask, head)


def _rests_and_completions(forward: Forward, unique, owner, group_of, prefix_len, cache, cache_row, mask, prompt_ids,
                           prompt_mask, completion_ids, completion_mask, head: Head | None):
    """Stages 2 and 3 of :func:`completion_outputs`, on the prefixes' ``cache`` (one row per prefix; distinct prompt
    ``i`` continues row ``cache_row[i]``, gathered once per bucket that reads it) and the distinct prompts' ``mask``
    of it, each stage in :func:`length_buckets` of similar lengths (a batch padded to its longest row computes every
    padded position: a second-turn prompt is several times as long as a first-turn one)."""
    if getattr(forward, "packs_completions", False) and all(len(p) > prefix_len[g] for p, g in zip(unique, group_of)):
        return _packed_rests_and_completions(forward, unique, owner, group_of, prefix_len, cache, cache_row, mask,
                                             completion_ids, completion_mask, head)
    device, t = prompt_ids.device, completion_ids.size(1)
    done = torch.tensor([prefix_len[g] for g in group_of], device=device)  # real tokens already in the cache

    # 2. the rest of each distinct prompt; its last position predicts the first completion token
    rests = [p[prefix_len[g]:] for p, g in zip(unique, group_of)]
    pieces = []  # (distinct prompts, last outputs, cache, mask) of each bucket
    for bucket in length_buckets([len(r) for r in rests]):
        index = torch.tensor(bucket, device=device)
        ids, rest_mask = left_pad([rests[i] for i in bucket], dtype=prompt_ids.dtype, device=device)
        sub_mask = torch.cat([mask[index], rest_mask], dim=1)
        sub = None if cache is None else _cache_rows(cache, cache_row[index])
        last, sub = forward(ids, sub_mask, _positions(rest_mask, done[index]), sub, True, 1)
        if sub is None:
            return _plain(forward, prompt_ids, prompt_mask, completion_ids, completion_mask, head)
        pieces.append((bucket, last, sub, sub_mask))
    cache, mask, row_of = _merge_caches(pieces, len(unique))
    last = torch.cat([last for _, last, _, _ in pieces])
    done = done + torch.tensor([len(r) for r in rests], device=device)

    # 3. every row's completion on its prompt's cache row, gathered
    lengths = completion_mask.sum(-1).tolist()
    heads, order = [], []
    for bucket in length_buckets(lengths):
        width = max(1, max(lengths[r] for r in bucket))
        index = torch.tensor([row_of[owner[r]] for r in bucket], device=device)
        rows = torch.tensor(bucket, device=device)
        cached = mask[index]
        start = int(cached.any(0).long().argmax()) if cached.size(1) else 0  # columns no row of the bucket reads
        sub_mask = torch.cat([cached[:, start:], completion_mask[rows, :width].long()], dim=1)
        positions = done[torch.tensor([owner[r] for r in bucket], device=device)].unsqueeze(1) + \
            torch.arange(width, device=device)
        out, _ = forward(completion_ids[rows, :width], sub_mask, positions, _cache_rows(cache, index, start), True,
                         width)
        tokens = completion_ids[rows, :width]
        if head is None:
            values = (torch.cat([last[index], out[:, :-1]], dim=1),)
        else:  # the prompt's last position predicts the first token, the completion's own the others
            values = tuple(torch.cat(pair, dim=1) for pair in zip(head(last[index], tokens[:, :1]),
                                                                   head(out[:, :-1], tokens[:, 1:])))
        heads.append(tuple(_to_width(v, t) for v in values))
        order.extend(bucket)
    inverse = torch.empty(len(order), dtype=torch.long, device=device)
    inverse[torch.tensor(order, device=device)] = torch.arange(len(order), device=device)
    joined = tuple(torch.cat(parts)[inverse] for parts in zip(*heads))
    return joined[0] if head is None else joined


def _packed_rests_and_completions(forward: Forward, unique, owner, group_of, prefix_len, cache, cache_row, mask,
                                  completion_ids, completion_mask, head: Head | None):
    """Stages 2 and 3 of :func:`completion_outputs` in one call per bucket, for the models :func:`packs_completions`
    accepts: each distinct prompt's rest (after its prefix) and then its completions (its K samples), one after
    another, run as one sequence on the prefix's cache row, in groups of :func:`packed_buckets`.

    In a bucket the rests are left-padded to the longest, so that every rest ends in the same column; the completions
    follow, right-padded. The model's outputs are kept (``logits_to_keep``) at that column once per completion (the
    rest's last position predicts every completion's first token) and at the completions' columns, and nowhere else:
    read once per completion as one kept tensor, not indexed out of the outputs (whose gradient would then be a
    second tensor of the outputs' size). A boolean 4D mask lets the rest's
    positions see the prefix's cached columns and the rest up to themselves, and each completion's positions see the
    prefix, the whole rest and the completion's own positions up to themselves, never another completion; a padding
    position sees itself (and the cached columns), so that no row of the attention is empty, and no other position
    sees it. Positions count real tokens: the rest continues the prefix, every completion continues the rest.

    So no distinct prompt's cache is kept between two calls, merged or gathered, no completion is padded to a longer
    one, and a prompt's keys and values are computed and read once per prompt, not once per sample. The outputs are
    those of one row per completion up to float summation order (``tests/test_packed_completions.py``)."""
    device, (b, t) = completion_ids.device, completion_ids.shape
    lengths = completion_mask.sum(-1).tolist()
    members: list[list[int]] = [[] for _ in unique]  # distinct prompt -> its rows with a non-empty completion
    for r, i in enumerate(owner):
        if lengths[r]:
            members[i].append(r)
    rests = [p[prefix_len[g]:] for p, g in zip(unique, group_of)]
    tails = [sum(lengths[r] for r in members[i]) for i in range(len(unique))]
    # source[r, j]: where row r's value at completion position j lies among the calls' flattened kept outputs; the
    # last slot, a zero, for positions past a row
    pieces, offset, slots = [], 0, []
    for bucket in packed_buckets([len(r) for r in rests], tails):
        rest_width = max(len(rests[i]) for i in bucket)
        width = rest_width + max(tails[i] for i in bucket)
        firsts = max(1, max(len(members[i]) for i in bucket))
        # the columns whose outputs are kept: the rests' last one once per completion (it predicts every
        # completion's first token), then every completion column (each predicts the token after it)
        keep = torch.cat([torch.full((firsts,), rest_width - 1, device=device),
                          torch.arange(rest_width, width, device=device)])
        kept = int(keep.numel())
        ids = completion_ids.new_zeros(len(bucket), width)
        targets = completion_ids.new_zeros(len(bucket), kept)  # the token each kept output is read at
        positions = torch.zeros(len(bucket), width, dtype=torch.long, device=device)
        real = torch.zeros(len(bucket), width, dtype=torch.bool, device=device)
        segment = torch.arange(width, device=device).repeat(len(bucket), 1)  # the first column of each position's
        for s, i in enumerate(bucket):                                       # completion (a rest's: 0)
            rest, done = rests[i], prefix_len[group_of[i]]
            pad = rest_width - len(rest)
            ids[s, pad:rest_width] = torch.tensor(rest, dtype=ids.dtype, device=device)
            positions[s, pad:rest_width] = done + torch.arange(len(rest), device=device)
            real[s, pad:rest_width] = True
            segment[s, :rest_width] = 0
            start, done = rest_width, done + len(rest)
            for j, r in enumerate(members[i]):
                n = lengths[r]
                ids[s, start:start + n] = completion_ids[r, :n]
                positions[s, start:start + n] = done + torch.arange(n, device=device)
                real[s, start:start + n] = True
                segment[s, start:start + n] = start
                targets[s, j] = completion_ids[r, 0]
                slots.append((r, offset + s * kept + j, offset + s * kept + firsts + start - rest_width, n))
                start += n
        targets[:, firsts:firsts + width - rest_width - 1] = ids[:, rest_width + 1:]
        index = torch.tensor(bucket, device=device)
        key = torch.arange(width, device=device).view(1, 1, -1)
        query = key.view(1, -1, 1)
        own = (key <= query) & ((real.unsqueeze(-1) & real.unsqueeze(1) &
                                 ((key < rest_width) | (key >= segment.unsqueeze(-1)))) | (key == query))
        if cache is None:
            sub, visible = None, own
        else:
            cached = mask[index]
            column = int(cached.any(0).long().argmax()) if cached.size(1) else 0  # columns no sequence reads
            sub = _cache_rows(cache, cache_row[index], column)
            visible = torch.cat([cached[:, column:].bool().unsqueeze(1).expand(-1, width, -1), own], dim=-1)
        out, _ = forward(ids, visible.unsqueeze(1), positions, sub, True, keep)
        values = (out,) if head is None else head(out, targets)
        pieces.append(tuple(v.flatten(0, 1) for v in values))
        offset += len(bucket) * kept
    source = torch.full((b, t), offset, dtype=torch.long, device=device)
    for r, first, rest, n in slots:
        source[r, 0] = first
        source[r, 1:n] = torch.arange(rest, rest + n - 1, device=device)
    joined = []
    for k in range(len(pieces[0])):
        flat = torch.cat([p[k] for p in pieces])
        joined.append(torch.cat([flat, flat.new_zeros((1,) + flat.shape[1:])])[source])
    return joined[0] if head is None else tuple(joined)


def _to_width(values: torch.Tensor, t: int) -> torch.Tensor:
    """``values`` ``(b, w, ...)`` cut or zero-padded along dimension 1 to ``t`` columns."""
    w = values.size(1)
    return values[:, :t] if w >= t else F.pad(values, [0, 0] * (values.dim() - 2) + [0, t - w])


#: What one more model call costs in :func:`length_buckets`, in positions (``prefill_buckets``' ``overhead``): a
#: call of few rows still reads every weight, forward and backward. Measured on the 2-core AMD EPYC for the main job's
#: base (``benchmarks/call_cost.py`` -> ``experiments/speed/teacher_forcing/call_cost.json``).
CALL_COST_POSITIONS = 40


def length_buckets(lengths: Sequence[int]) -> list[list[int]]:
    """The indices of ``lengths`` in groups of similar length, each computed padded to its longest: generation's
    prefill grouping (:func:`~trl_multiagent.generation.decoding.prefill_buckets`, exact dynamic programming over the
    sorted lengths), any number of rows a group, :data:`CALL_COST_POSITIONS` per call."""
    return [rows for rows, _ in prefill_buckets(lengths, min_rows=1, overhead=CALL_COST_POSITIONS)]


def packed_buckets(heads: Sequence[int], tails: Sequence[int]) -> list[list[int]]:
    """The indices of sequences made of a left-padded head and a right-padded tail (a distinct prompt's rest and its
    packed completions, :func:`_packed_rests_and_completions`) in groups, each computed ``max head + max tail`` wide:
    runs of the sequences sorted by total length, chosen exactly by dynamic programming to minimise the positions
    computed, ``sum(len(group) x width)``, plus :data:`CALL_COST_POSITIONS` per group. One group, in the original
    order, when splitting saves nothing."""
    n = len(heads)
    single = [list(range(n))]
    if n < 2:
        return single
    order = sorted(range(n), key=lambda i: (heads[i] + tails[i], heads[i]))
    # best[j]: the least cost of the first j sorted sequences in groups; cut[j]: where the last group starts
    best = [0.0] + [math.inf] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        head = tail = 0
        for i in range(j - 1, -1, -1):  # the group order[i:j]
            head, tail = max(head, heads[order[i]]), max(tail, tails[order[i]])
            if (cost := best[i] + (j - i) * (head + tail) + CALL_COST_POSITIONS) < best[j]:
                best[j], cut[j] = cost, i
    if best[n] >= n * (max(heads) + max(tails)) + CALL_COST_POSITIONS:
        return single
    out, j = [], n
    while j > 0:
        out.append([order[k] for k in range(cut[j], j)])
        j = cut[j]
    return out[::-1]


def _cache_like(template, layers):
    """A copy of the KV cache ``template`` (same class, same layer classes) holding ``layers``' ``(keys, values)``."""
    out = copy.copy(template)
    out.layers = []
    for layer, (keys, values) in zip(template.layers, layers):
        new = copy.copy(layer)
        new.keys, new.values = keys, values
        out.layers.append(new)
    return out


def _cache_rows(cache, index: torch.Tensor, start: int = 0):
    """``cache``'s rows ``index`` from column ``start`` on, gathered differentiably (the gradient of a row read twice
    is the sum of both reads'); all rows in order: views, nothing copied."""
    rows = cache.layers[0].keys.size(0) if cache.layers else 0
    if index.numel() == rows and bool((index == torch.arange(rows, device=index.device)).all()):
        return _cache_like(cache, [(layer.keys[:, :, start:], layer.values[:, :, start:]) for layer in cache.layers])
    return _cache_like(cache, [(layer.keys.index_select(0, index)[:, :, start:],
                                layer.values.index_select(0, index)[:, :, start:]) for layer in cache.layers])


def _merge_caches(pieces, rows: int):
    """One cache of the buckets' caches, each left-padded (zeros, masked) to the longest: ``(cache, mask, row_of)``,
    ``row_of[i]`` the merged row of distinct prompt ``i``."""
    width = max(m.size(1) for _, _, _, m in pieces)
    row_of = [0] * rows
    for n, i in enumerate(i for bucket, _, _, _ in pieces for i in bucket):
        row_of[i] = n

    def padded(tensors):
        return torch.cat([F.pad(t, (0, 0, width - t.size(2), 0)) for t in tensors])

    layers = [(padded([p.keys for p in parts]), padded([p.values for p in parts]))
              for parts in zip(*(c.layers for _, _, c, _ in pieces))]
    masks = [F.pad(m, (width - m.size(1), 0)) for _, _, _, m in pieces]
    return _cache_like(pieces[0][2], layers), torch.cat(masks), row_of


def _plain(forward: Forward, prompt_ids, prompt_mask, completion_ids, completion_mask, head: Head | None = None):
    """One pass over every prompt + completion row; positions count real tokens, as in the shared stages and in
    generation (a row's left padding does not shift its rotary positions)."""
    mask = torch.cat([prompt_mask, completion_mask], dim=1)
    out, _ = forward(torch.cat([prompt_ids, completion_ids], dim=1), mask, _positions(mask, 0), None, False,
                     completion_ids.size(1) + 1)
    return out[:, :-1] if head is None else head(out[:, :-1], completion_ids)


def _positions(mask: torch.Tensor, offset) -> torch.Tensor:
    """Positions of left-padded rows that continue after ``offset`` real tokens (an int or one per row)."""
    offset = torch.as_tensor(offset, device=mask.device).reshape(-1, 1)
    return offset + (mask.long().cumsum(-1) - 1).clamp(min=0)


class PrefixStore:
    """The keys and values of the prompt prefixes shared across an update's micro-batches, run once for all of them.

    An update cuts a policy's samples into micro-batches; every prompt of an agent begins with the same system
    message and worked examples, so each micro-batch would run that prefix again. :meth:`build` runs each prefix that
    several of the update's prompts share (:func:`shared_prefixes` over all of them) once, with gradients, and keeps
    its keys and values as leaf tensors; each micro-batch's :func:`completion_outputs` starts from them, the
    gradients of all micro-batches gather on the leaves, and :meth:`backward` sends their sum through the prefix's
    computation into the adapter once. By the chain rule this is the gradient of running the prefix in every
    micro-batch, up to float summation order (``tests/test_logprobs.py``).
    """

    def __init__(self):
        #: prefix tokens -> per layer (keys, values), each ``(1, heads, length, head_dim)``, leaf tensors
        self.prefixes: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._sources: list[torch.Tensor] = []
        self._leaves: list[torch.Tensor] = []

    @classmethod
    def build(cls, forward: Forward, prompts, device) -> PrefixStore | None:
        """The shared prefixes of ``prompts`` (token lists), each run once by ``forward``; ``None`` when none is
        shared or the model keeps no cache (activation checkpointing)."""
        distinct = [list(p) for p in dict.fromkeys(tuple(p) for p in prompts)]
        group_of, prefix_len = shared_prefixes(distinct, [None] * len(distinct))
        store = cls()
        for g, length in enumerate(prefix_len):
            members = [i for i, x in enumerate(group_of) if x == g]
            if length < 1 or len(members) < 2:  # nobody shares it
                continue
            prefix = tuple(distinct[members[0]][:length])
            ids = torch.tensor([prefix], device=device)
            mask = torch.ones_like(ids)
            _, cache = forward(ids, mask, _positions(mask, 0), None, True, 1)
            layers = getattr(cache, "layers", None)
            if not layers or not all(hasattr(layer, "keys") and hasattr(layer, "values") for layer in layers):
                return None
            entry = []
            for layer in layers:
                pair = []
                for source in (layer.keys, layer.values):
                    leaf = source.detach().requires_grad_(source.requires_grad)
                    if source.requires_grad:
                        store._sources.append(source)
                        store._leaves.append(leaf)
                    pair.append(leaf)
                entry.append((pair[0], pair[1]))
            store.prefixes[prefix] = entry
        return store if store.prefixes else None

    def longest_prefix(self, prompt) -> tuple[int, ...] | None:
        """The longest stored prefix that ``prompt`` begins with and goes beyond (``None``: none)."""
        best = None
        for prefix in self.prefixes:
            if len(prefix) < len(prompt) and tuple(prompt[:len(prefix)]) == prefix and \
                    (best is None or len(prefix) > len(best)):
                best = prefix
        return best

    def cache_of(self, keys) -> tuple[object, torch.Tensor]:
        """A KV cache with one row per entry of ``keys`` (stored prefixes, or ``None`` for an empty one), the
        prefixes left-padded to the longest, and its ``(rows, length)`` attention mask."""
        from transformers import DynamicCache

        width = max(len(k) for k in keys if k)
        some = next(iter(self.prefixes.values()))
        device = some[0][0].device
        mask = torch.tensor([[0] * (width - len(k or ())) + [1] * len(k or ()) for k in keys], device=device)
        cache = DynamicCache()
        for layer, (k0, v0) in enumerate(some):
            rows_k, rows_v = [], []
            for key in keys:
                for rows, template, stored in ((rows_k, k0, 0), (rows_v, v0, 1)):
                    pad = template.new_zeros(1, template.size(1), width - len(key or ()), template.size(3))
                    rows.append(torch.cat([pad, self.prefixes[key][layer][stored]], dim=2) if key else
                                template.new_zeros(1, template.size(1), width, template.size(3)))
            cache.update(torch.cat(rows_k), torch.cat(rows_v), layer)
        return cache, mask

    def backward(self) -> None:
        """Send the gradients gathered on the stored keys and values through the prefixes' computation (once), then
        let the prefixes' graph go."""
        pairs = [(s, leaf.grad) for s, leaf in zip(self._sources, self._leaves) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([s for s, _ in pairs], [g for _, g in pairs])
        self._sources, self._leaves, self.prefixes = [], [], {}
