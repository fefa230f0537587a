"""The lean decoding step: one token of every row of a Llama-architecture base, without transformers' forward.

A decoding step multiplies a few rows by every weight of the model. Through transformers' ``LlamaForCausalLM`` and
PEFT's LoRA layers it runs some 40 small operations per layer (mask building, cache classes, module calls), each with
its Python and dispatch cost: on the 2-core machine, at one row, that overhead took twice the time the weights take to
read (``benchmarks/decode_step.py``). :class:`LeanStep` computes the same step with few operations; per layer:

1. RMSNorm (``F.rms_norm``);
2. ONE matmul for q, k and v, against their frozen weights concatenated (reordered for oneDNN on the CPU);
3. the LoRA deltas of a mixed-adapter batch (:class:`~.lora_batch.MultiAdapterBatch`). Where the rows of several
   adapters already are one block per adapter (:class:`~.lora_batch.AdapterBlocks` ``in_place``: the decoding loop
   sorts them so), in the block form (:func:`~.lora_batch.add_block_lora`): the rows viewed as blocks, one batched
   matmul with each adapter's A matrices of q, k and v side by side, then per projection one with its scaled B
   matrices, added into its columns: each row computes its own adapter only. Otherwise (one adapter; rows in mixed
   order, where gathering them into blocks costs about what it saves at a decoding step's few rows:
   ``benchmarks/lora_blocks.py``) in the masked form: one matmul with the A matrices of q, k and v of every adapter
   stacked, a per-row scale that keeps only each row's own adapter (its LoRA scale on its adapter's columns, zeros
   elsewhere), then per projection one matmul with its adapters' B matrices, added into its columns of the output;
4. the rotary embedding of q and k, from a table of cos / sin that the model's own rotary module computes;
5. the new key and value written in place into the preallocated cache (:mod:`.kv_cache`);
6. attention of each row's query over its cache with the padding mask, ``scaled_dot_product_attention`` for few rows,
   two batched matmuls and a softmax from :data:`MATMUL_ATTENTION_MIN_ROWS` on; the query heads that share a
   key/value head are grouped (as transformers does for a single query);
7. o_proj (+ LoRA) and the residual; RMSNorm; ONE matmul for gate and up (+ LoRA); act(gate) x up; down (+ LoRA);
   the residual;

then the final norm and the LM head. The numbers are transformers' up to the order of floating-point sums
(``tests/test_lean_step.py`` compares the logits within the rounding tolerance of ``tests/numerics.py``).

What it reads, and when:

* the frozen weights: the modules' own tensors (one matmul per projection, their outputs concatenated), or, with
  ``packed=True`` (CPU, float32; the pool's ``packed_weights`` decision), copies reordered for oneDNN, q/k/v and
  gate/up concatenated. Those copies are kept on the modules (like
  :class:`~.frozen_weights.PackedFrozenLinears`'s, whose copies of o_proj, down_proj and the LM head they share)
  and made again when a frozen weight changes (its storage, version or shape): one copy of the frozen weights in all,
  which :func:`~.frozen_weights.packed_weight_bytes` counts;
* the LoRA matrices: stacked when the step is made, which the decoding loop's caller does at every call (every chunk
  of a generation), from the parameters as they are then; nothing of them is kept from one call to the next, so a
  step of the optimizer between two generations, a fused one included (it does not bump a tensor's version
  counter, so no version check could see it), is always seen;
* the scales of the rows (masked form) and their blocks (block form): made again whenever the batch's rows change
  (``MultiAdapterBatch.row_index``, ``MultiAdapterBatch.blocks``).

Small matters of speed, measured on the 2-core machine (``benchmarks/decode_step.py``,
``experiments/speed/generation/README.md``): with packed weights a step of fewer than :data:`PACKED_MIN_ROWS` rows computes
its frozen matmuls on that many rows (zeros added); the LoRA matmuls run on the real rows only, and they and the
attention of few rows run on one thread when small (:data:`ONE_THREAD`).

:func:`lean_support` says whether a model is one the step computes exactly, or why not: transformers'
``LlamaForCausalLM`` with its own Llama layers (exactly those classes: SmolLM2, Llama 2 / 3, ...), a rotary
embedding that does not depend on the sequence length, dense frozen linears (a 4-bit base needs its de-quantised
copy) and LoRA only on the seven projections of the layers. Biases (``attention_bias``, ``mlp_bias``), any
``hidden_act`` and tied embeddings are handled. Other models decode through transformers' forward:
:class:`~trl_multiagent.team.pool.AgentPool` decides once per base (``lean_decode``) and logs it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trl_multiagent.generation.frozen_weights import packed_matmul, packed_weight
from trl_multiagent.generation.lora_batch import AdapterBlocks, add_block_lora

#: With packed weights, a step of fewer rows computes its matmuls on this many (zero rows added): oneDNN's kernel for
#: one row reads the weights more slowly than its kernel for a few (measured on the 2-core AMD EPYC, one thread:
#: 1 row 451 us, 4 rows 368 us for SmolLM2's gate/up; benchmarks/decode_step.py).
PACKED_MIN_ROWS = 4

#: A LoRA group's matmuls, and a layer's attention, of fewer multiply-adds than this run on one thread. Split over
#: threads, an operation of a few microseconds waits for every thread to take part: on a machine whose cores are
#: shared (more runnable processes than cores) that wait is a scheduler time slice, about 8 ms per operation on the
#: 2-core machine (benchmarks/decode_step.py --threads 2), where a step has a few hundred operations; MKL splits even
#: the LoRA matmuls of one row. (2^21 multiply-adds take about 25 us on one core.)
ONE_THREAD = 1 << 21

#: From this many rows on, a layer's attention is two batched matmuls and a softmax instead of
#: ``scaled_dot_product_attention``, whose CPU kernel for a few queries per head is slower there (the 2-core AMD EPYC,
#: 2 threads, 204 cached positions, microseconds per layer, kernel against matmuls: 8 rows 135 / 111, 16 rows 259 /
#: 201, 64 rows 1454 / 1158; 1 row 27 / 36, 4 rows 70 / 65; ``benchmarks/decode_attention.py`` ->
#: ``experiments/speed/generation/decode_attention.json``).
MATMUL_ATTENTION_MIN_ROWS = 8

_ATTN = ("q_proj", "k_proj", "v_proj")
_MLP = ("gate_proj", "up_proj")
#: Names of the attributes the concatenated packed copies are kept under (on the attention / MLP module).
_PACKED_QKV, _PACKED_GATE_UP = "_trl_multiagent_packed_qkv", "_trl_multiagent_packed_gate_up"


def _lora_layer_type():
    from peft.tuners.lora.layer import LoraLayer

    return LoraLayer


def frozen_linear(module: torch.nn.Module) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor | None] | None:
    """``(layer, weight, bias)`` of the frozen linear that ``module`` computes with (the base layer under a LoRA
    wrapper; a 4-bit layer's de-quantised copy), or ``None`` where that is not a dense weight (a 4-bit or 8-bit layer
    without a copy, or another kind of layer)."""
    base = module.base_layer if isinstance(module, _lora_layer_type()) else module
    weight = getattr(base, "_trl_multiagent_dense_weight", None)
    if weight is None:
        if type(base) is not torch.nn.Linear:
            return None
        weight = base.weight
    bias = base.bias
    return base, weight.detach(), None if bias is None else bias.detach().to(weight.dtype)


def lean_support(model: torch.nn.Module) -> str | None:
    """``None`` when :class:`LeanStep` computes ``model``'s decoding step exactly as its forward does, else why not
    (see the module's docstring for what is supported)."""
    try:
        from transformers.models.llama import modeling_llama as llama
    except ImportError:  # pragma: no cover - transformers always has Llama
        return "this transformers has no Llama model"
    lora = _lora_layer_type()
    if type(model) is not llama.LlamaForCausalLM:
        return f"{type(model).__name__} is not transformers' LlamaForCausalLM"
    inner = model.model
    if type(inner) is not llama.LlamaModel or type(inner.norm) is not llama.LlamaRMSNorm \
            or type(inner.embed_tokens) is not torch.nn.Embedding:
        return "its LlamaModel, final norm or token embedding is not transformers' own"
    rope = str(getattr(inner.rotary_emb, "rope_type", "default"))
    if "dynamic" in rope or rope == "longrope":
        return f"its rotary embedding ({rope}) depends on the sequence length"
    covered: set[int] = set()
    for i, layer in enumerate(inner.layers[: model.config.num_hidden_layers]):
        if type(layer) is not llama.LlamaDecoderLayer or type(layer.self_attn) is not llama.LlamaAttention \
                or type(layer.mlp) is not llama.LlamaMLP or type(layer.input_layernorm) is not llama.LlamaRMSNorm \
                or type(layer.post_attention_layernorm) is not llama.LlamaRMSNorm:
            return f"layer {i} is not transformers' Llama layer"
        for owner, names in ((layer.self_attn, (*_ATTN, "o_proj")), (layer.mlp, (*_MLP, "down_proj"))):
            for name in names:
                module = getattr(owner, name)
                if frozen_linear(module) is None:
                    return (f"layer {i}'s {name} is not a dense linear (a 4-bit base computes with its de-quantised "
                            "copy only under dense_copy)")
                covered.add(id(module))
    if frozen_linear(model.lm_head) is None or isinstance(model.lm_head, lora):
        return "its LM head is not a dense frozen linear"
    for name, module in model.named_modules():
        if isinstance(module, lora) and id(module) not in covered:
            return f"it has LoRA on {name}, outside the seven projections of its layers"
    if len({p.device for p in model.parameters()}) > 1:
        return "its weights are on several devices"
    return None


class _Frozen:
    """The frozen part of a group of projections that read one input: one matmul (packed copy) or one per
    projection, the outputs concatenated."""

    def __init__(self, owner: torch.nn.Module, modules: list[torch.nn.Module], packed: bool, name: str,
                 frozen_dtype: torch.dtype = torch.float32):
        parts = [frozen_linear(m) for m in modules]
        self.weights = [w for _, w, _ in parts]
        self.biases = [b for _, _, b in parts]
        self.packed = None
        if packed:
            if any(w.dtype != torch.float32 or w.device.type != "cpu" for w in self.weights):
                raise ValueError("packed weights are for float32 linears on the CPU")
            # one projection: the copy PackedFrozenLinears keeps on that layer (shared); several: concatenated
            self.packed = packed_weight(parts[0][0], self.weights, dtype=frozen_dtype) if len(parts) == 1 else \
                packed_weight(owner, self.weights, name, dtype=frozen_dtype)
            self.bias = None if all(b is None for b in self.biases) else torch.cat(
                [b if b is not None else w.new_zeros(w.size(0)) for w, b in zip(self.weights, self.biases)])
            if self.bias is not None:
                self.bias = self.bias.to(frozen_dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return packed_matmul(x, self.packed, self.bias)
        if len(self.weights) == 1:
            return F.linear(x, self.weights[0], self.biases[0])
        return torch.cat([F.linear(x, w, b) for w, b in zip(self.weights, self.biases)], dim=-1)


class _Lora:
    """The LoRA deltas of a group of projections that read one input, for a batch whose rows use different adapters:
    ``h = (x A^T) * S`` with ``A`` every (projection, adapter) A matrix stacked and ``S`` (rows x columns) each row's
    own adapter's LoRA scale on that adapter's columns, zeros elsewhere; then, per projection, its output columns
    ``+= h[:, its columns] B_p^T`` with ``B_p`` its adapters' B matrices side by side (one matmul each, into a view of
    the group's output)."""

    def __init__(self, modules: list[torch.nn.Module], adapters: list[str]):
        lora = _lora_layer_type()
        a_parts, columns = [], []
        #: per projection: (output offset, output size, its columns of h, B_p^T (columns, output size))
        self.projections = []
        #: per projection with LoRA, for the block form: (output offset, output size, {adapter index: (A, s B^T)})
        by_adapter = []
        offset = 0
        for module in modules:
            size = frozen_linear(module)[1].size(0)
            if isinstance(module, lora) and not module.disable_adapters:
                first = sum(r for _, r, _ in columns)
                b_parts, mine = [], {}
                for index, adapter in enumerate(adapters):
                    if adapter in module.lora_A:
                        a = module.lora_A[adapter].weight.detach()
                        a_parts.append(a)
                        b_parts.append(module.lora_B[adapter].weight.detach().t())
                        columns.append((index, a.size(0), float(module.scaling[adapter])))
                        mine[index] = (a, b_parts[-1] * columns[-1][2])
                if b_parts:
                    last = sum(r for _, r, _ in columns)
                    self.projections.append((offset, size, slice(first, last), torch.cat(b_parts).contiguous()))
                    by_adapter.append((offset, size, mine))
            offset += size
        self.width = offset
        self.a = torch.cat(a_parts) if a_parts else None  # (columns, in)
        if self.a is None:
            return
        self._blocks_form(by_adapter, len(adapters))
        #: multiply-adds per row: x A^T, then each projection's h B_p^T
        self.row_work = self.a.numel() + sum(bt.numel() for *_, bt in self.projections)
        #: what the scales of the rows depend on (groups with the same key share them)
        self.key = tuple(columns)
        self.column_adapter = torch.cat([torch.full((r,), i, dtype=torch.long) for i, r, _ in columns]).to(
            self.a.device)
        self.column_scale = torch.cat([torch.full((r,), s, dtype=self.a.dtype) for _, r, s in columns]).to(
            self.a.device)

    def _blocks_form(self, by_adapter: list, adapters: int) -> None:
        """The matrices of :func:`~.lora_batch.add_block_lora`: per adapter its A^T of every projection side by side
        ``(adapters, in, R)``, and per projection its adapters' scaled B^T ``(adapters, r, size)`` (zeros where an
        adapter lacks the projection or has a smaller rank)."""
        ranks = [max(a.size(0) for a, _ in mine.values()) for *_, mine in by_adapter]
        self.a_blocks = self.a.new_zeros((adapters, self.a.size(1), sum(ranks)))
        self.parts = []
        first = 0
        for (offset, size, mine), rank in zip(by_adapter, ranks):
            block = self.a.new_zeros((adapters, rank, size))
            for index, (a, sbt) in mine.items():
                self.a_blocks[index, :, first:first + a.size(0)] = a.t()
                block[index, :a.size(0)] = sbt
            self.parts.append((offset, size, slice(first, first + rank), block))
            first += rank

    def scales(self, row_index: torch.Tensor) -> torch.Tensor:
        """``S`` for rows whose adapters are ``row_index`` (indices into the batch's adapters, -1 for none)."""
        return (row_index[:, None] == self.column_adapter[None, :]).to(self.a.dtype) * self.column_scale

    def add(self, y: torch.Tensor, x: torch.Tensor, scales: torch.Tensor | None, threads: int,
            blocks: AdapterBlocks | None = None) -> None:
        """``y += `` the rows' LoRA deltas: by blocks of rows per adapter where ``blocks`` is given
        (:func:`~.lora_batch.add_block_lora`), else masked by the rows' ``scales``; on one thread when they are
        small (:data:`ONE_THREAD`)."""
        one = threads > 1 and x.size(0) * self.row_work < ONE_THREAD
        if one:
            torch.set_num_threads(1)
        try:
            if blocks is not None:
                add_block_lora(y, x if x.dtype == self.a.dtype else x.to(self.a.dtype), blocks, self.a_blocks,
                               self.parts)
                return
            h = F.linear(x if x.dtype == self.a.dtype else x.to(self.a.dtype), self.a)
            h.mul_(scales)
            for offset, size, columns, bt in self.projections:
                out = y if size == self.width else y[:, offset:offset + size]
                part = h if columns.stop - columns.start == h.size(1) else h[:, columns]
                if out.dtype == h.dtype:
                    out.addmm_(part, bt)
                else:
                    out.add_((part @ bt).to(out.dtype))
        finally:
            if one:
                torch.set_num_threads(threads)


class _Layer:
    def __init__(self, layer: torch.nn.Module, adapters: list[str], packed: bool, frozen_dtype: torch.dtype):
        attn, mlp = layer.self_attn, layer.mlp
        self.norm1 = (layer.input_layernorm.weight.detach(), layer.input_layernorm.variance_epsilon)
        self.norm2 = (layer.post_attention_layernorm.weight.detach(), layer.post_attention_layernorm.variance_epsilon)
        attn_in = [getattr(attn, n) for n in _ATTN]
        mlp_in = [getattr(mlp, n) for n in _MLP]
        self.qkv = _Frozen(attn, attn_in, packed, _PACKED_QKV, frozen_dtype)
        self.o = _Frozen(attn, [attn.o_proj], packed, "", frozen_dtype)
        self.gate_up = _Frozen(mlp, mlp_in, packed, _PACKED_GATE_UP, frozen_dtype)
        self.down = _Frozen(mlp, [mlp.down_proj], packed, "", frozen_dtype)
        self.intermediate = self.gate_up.weights[0].size(0)
        self.act = mlp.act_fn
        self.loras = [_Lora(attn_in, adapters), _Lora([attn.o_proj], adapters), _Lora(mlp_in, adapters),
                      _Lora([mlp.down_proj], adapters)]
        self.loras = [lora if lora.a is not None else None for lora in self.loras]


class LeanStep:
    """One decoding step of every row of a Llama-architecture ``model`` (see :func:`lean_support`), computed without
    its forward: ``step(tokens, mask, positions, cache)`` returns the ``(rows, vocab)`` logits of the rows' next
    token, having written the tokens' keys and values into ``cache`` (the decoding loop's preallocated cache, after
    its prefill). ``batch`` gives each row its adapter (``None``: a model without LoRA layers); ``packed``: the
    frozen weights as oneDNN-packed copies (CPU, float32), in ``frozen_dtype`` (float32, or bfloat16: the pool's
    ``frozen_matmul_dtype``, the copies :class:`~.frozen_weights.PackedFrozenLinears` shares). Make one per decoding
    call, inside ``batch``'s ``with``: the LoRA matrices are read when it is made."""

    def __init__(self, model: torch.nn.Module, batch=None, packed: bool = False,
                 frozen_dtype: torch.dtype = torch.float32):
        if frozen_dtype != torch.float32 and not packed:
            raise ValueError("a frozen_dtype other than float32 is a property of the packed copies: pass packed=True")
        reason = lean_support(model)
        if reason is not None:
            raise ValueError(f"the lean decoding step does not apply: {reason}")
        lora = _lora_layer_type()
        if batch is None and any(isinstance(m, lora) and not m.disable_adapters for m in model.modules()):
            raise ValueError("a model with active LoRA layers needs its MultiAdapterBatch (which row uses which)")
        self.model = model
        self.batch = batch
        adapters = list(batch.adapters) if batch is not None else []
        config, inner = model.config, model.model
        attn = inner.layers[0].self_attn
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, \
            attn.head_dim
        self.scaling = attn.scaling
        self.embed = inner.embed_tokens.weight.detach()
        self.dtype = self.embed.dtype
        self.hidden = self.embed.size(1)
        self.silu = config.hidden_act == "silu"
        self.layers = [_Layer(layer, adapters, packed, frozen_dtype)
                       for layer in inner.layers[: config.num_hidden_layers]]
        self.norm = (inner.norm.weight.detach(), inner.norm.variance_epsilon)
        self.head = _Frozen(model, [model.lm_head], packed, "", frozen_dtype)
        self.rotary = inner.rotary_emb
        self.packed = packed
        self._cos = self._sin = None
        self._rows = None  # the batch's row_index the scales below were made for
        self._index = None  # each row's adapter, -1 for none
        self._scales: dict[tuple, torch.Tensor] = {}  # a group's column layout -> its (rows, columns) scales

    @staticmethod
    def concatenated_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
        """The frozen layers that a packed step computes from concatenated copies (q, k, v, gate, up): the prefill
        leaves them out of :class:`~.frozen_weights.PackedFrozenLinears`, so that they are packed once, not twice,
        unless training packs them anyway (:func:`~.team.prefill_unpacked`)."""
        out = []
        for layer in model.model.layers[: model.config.num_hidden_layers]:
            for owner, names in ((layer.self_attn, _ATTN), (layer.mlp, _MLP)):
                out.extend(frozen_linear(getattr(owner, n))[0] for n in names)
        return out

    def _norm(self, x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
        weight, eps = norm
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.size(-1),), weight, eps)
        # transformers normalises in float32 whatever the dtype, then scales in the weights' dtype
        return weight * F.rms_norm(x.float(), (x.size(-1),), None, eps).to(x.dtype)

    def _rotary_table(self, capacity: int) -> None:
        """cos and sin of every position up to ``capacity``, by the model's rotary module itself (its numbers, its
        scaling); sin with the sign of ``rotate_half`` folded in: ``rotate_half(x) * sin == roll(x) * signed_sin``."""
        positions = torch.arange(capacity, device=self.embed.device)[None]
        cos, sin = self.rotary(self.embed[:1], position_ids=positions)
        half = self.head_dim // 2
        sign = torch.cat([-torch.ones(half), torch.ones(self.head_dim - half)]).to(sin)
        self._cos, self._sin = cos[0], sin[0] * sign

    def _check_rows(self, rows: int) -> None:
        """Make the rows' LoRA scales anew when the batch's rows changed (each group's are made on first use)."""
        index = self.batch.row_index
        if index.numel() != rows:
            raise RuntimeError(f"the adapter batch holds {index.numel()} rows, the step {rows}")
        if index is not self._rows:
            self._rows, self._index, self._scales = index, index, {}

    def _scales_of(self, lora: _Lora) -> torch.Tensor:
        found = self._scales.get(lora.key)
        if found is None:
            found = self._scales[lora.key] = lora.scales(self._index.to(lora.a.device))
        return found

    def attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, attend: torch.Tensor,
                  one_thread_of: int = 0) -> torch.Tensor:
        """One layer's attention of the step, ``(rows, heads x head_dim)``: ``q`` ``(rows, kv_heads, heads /
        kv_heads, head_dim)`` (the query heads of a key/value head stacked), ``keys`` and ``values`` ``(rows,
        kv_heads, cached + 1, head_dim)``, ``attend`` ``(rows, 1, 1, cached + 1)`` (0 or -inf). Two batched matmuls
        and a softmax from :data:`MATMUL_ATTENTION_MIN_ROWS` rows on, else ``scaled_dot_product_attention``; on one
        thread where ``one_thread_of`` (the threads to restore afterwards) is given."""
        rows = q.size(0)
        if one_thread_of:
            torch.set_num_threads(1)
        try:
            if rows >= MATMUL_ATTENTION_MIN_ROWS:
                scores = torch.matmul(q, keys.transpose(-1, -2)).mul_(self.scaling).add_(attend)
                a = torch.matmul(torch.softmax(scores, dim=-1), values)
            else:
                a = F.scaled_dot_product_attention(q, keys, values, attn_mask=attend, scale=self.scaling)
        finally:
            if one_thread_of:
                torch.set_num_threads(one_thread_of)
        return a.reshape(rows, self.heads * self.head_dim)

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """The logits ``(rows, vocab)`` after ``tokens`` (``(rows,)`` or ``(rows, 1)``) at ``positions`` (``(rows,)``
        or ``(rows, 1)``), the rows' attention ``mask`` ``(rows, cached + 1)`` including them."""
        if self.model.training:  # it computes no dropout: the decoding loop runs the model in eval mode
            raise RuntimeError("the lean decoding step computes a model in eval mode (no dropout)")
        tokens, positions = tokens.reshape(-1), positions.reshape(-1)
        rows = tokens.numel()
        first = cache.layers[0]
        if not hasattr(first, "_k"):
            raise TypeError("the lean decoding step writes into the decoding loop's preallocated cache (kv_cache.py)")
        length = first.length
        capacity = first._k.size(2)
        if length >= capacity:
            raise RuntimeError(f"the generation cache holds {capacity} positions, {length + 1} are needed")
        if self._cos is None or self._cos.size(0) < capacity:
            self._rotary_table(capacity)
        cos, sin = self._cos[positions][:, None], self._sin[positions][:, None]  # (rows, 1, head_dim)
        # (rows, 1, 1, cached + 1): 0 on a row's keys, -inf on its padding (made once for all layers: a boolean mask
        # would be turned into this in every layer's attention)
        attend = torch.zeros(mask.shape, dtype=self.dtype, device=mask.device).masked_fill_(mask == 0, -torch.inf)
        attend = attend[:, None, None, :]
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        qk_width = (heads + kv_heads) * dim
        threads = torch.get_num_threads()
        small_attention = threads > 1 and 2 * rows * heads * (length + 1) * dim < ONE_THREAD
        padded = PACKED_MIN_ROWS if self.packed and rows < PACKED_MIN_ROWS else rows
        blocks = None
        if self.batch is not None:
            self._check_rows(rows)
            # the block form where the rows of several adapters already are blocks (sorted by adapter, as the
            # decoding loop sorts them); rows in mixed order keep the masked form (at a decoding step's few rows,
            # gathering them into blocks and back costs about what the other adapters' columns cost), and so do one
            # adapter's rows (no other columns to skip; the batched matmuls were no faster): benchmarks/lora_blocks.py,
            # "decode_layer"
            found = self.batch.blocks
            blocks = found if found is not None and found.in_place and found.adapters > 1 else None
        x = F.embedding(tokens, self.embed)
        padding = None
        if padded > rows:  # zero rows after the real ones, through the frozen matmuls only (not the LoRA ones)
            x = torch.cat([x, x.new_zeros((padded - rows, x.size(1)))])
            padding = x.new_zeros((padded - rows, heads * dim))
        for layer, kv in zip(self.layers, cache.layers):
            lora_qkv, lora_o, lora_gate_up, lora_down = layer.loras
            h = self._norm(x, layer.norm1)
            y = layer.qkv(h)
            if lora_qkv is not None:
                lora_qkv.add(y[:rows], h[:rows], None if blocks else self._scales_of(lora_qkv), threads, blocks)
            qk = y[:rows, :qk_width].view(rows, heads + kv_heads, dim)
            qk = torch.addcmul(qk * cos, qk.roll(dim // 2, -1), sin)
            kv._k[:, :, length].copy_(qk[:, heads:])
            kv._v[:, :, length].copy_(y[:rows, qk_width:].view(rows, kv_heads, dim))
            kv.length = length + 1
            kv.keys, kv.values = kv._k[:, :, :length + 1], kv._v[:, :, :length + 1]
            # the heads of one key/value head are the rows of one query of that head (transformers' pack_gqa)
            q = qk[:, :heads].view(rows, kv_heads, heads // kv_heads, dim)
            a = self.attention(q, kv.keys, kv.values, attend, threads if small_attention else 0)
            if padding is not None:
                a = torch.cat([a, padding])
            o = layer.o(a)
            if lora_o is not None:
                lora_o.add(o[:rows], a[:rows], None if blocks else self._scales_of(lora_o), threads, blocks)
            x = o.add_(x)
            h = self._norm(x, layer.norm2)
            gu = layer.gate_up(h)
            if lora_gate_up is not None:
                lora_gate_up.add(gu[:rows], h[:rows], None if blocks else self._scales_of(lora_gate_up), threads, blocks)
            gate, up = gu[:, :layer.intermediate], gu[:, layer.intermediate:]
            m = (F.silu(gate) if self.silu else layer.act(gate)).mul_(up)
            d = layer.down(m)
            if lora_down is not None:
                lora_down.add(d[:rows], m[:rows], None if blocks else self._scales_of(lora_down), threads, blocks)
            x = d.add_(x)
        logits = self.head(self._norm(x, self.norm))
        return logits[:rows] if padded > rows else logits
