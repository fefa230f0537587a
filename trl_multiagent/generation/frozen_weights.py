"""Copies of a base's frozen weights that generation (and training, for the first) computes with.

* :func:`use_dense_copy`: a 4-bit (QLoRA) base computes with a de-quantised copy of its frozen weights (chosen by
  :class:`~trl_multiagent.team.pool.AgentPool`): the numbers are those of the 4-bit matmul, which de-quantises the same
  weights at every call, in generation and training alike, without de-quantising at every call;
* :class:`PackedFrozenLinears`: on the CPU, frozen float32 linears compute with their weight reordered once into
  oneDNN's blocked layout, instead of re-packing it at every call; in float32, or, with ``frozen_matmul_dtype``
  bfloat16 (:data:`FROZEN_MATMUL_DTYPES`), from bfloat16 copies (weights, the matmul's input and its output rounded to
  bfloat16, float32 accumulation), the same copies in generation and in the teacher-forced passes.

:func:`dense_weight_bytes` and :func:`packed_weight_bytes` say what each copy costs, for the pool's memory check.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


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


#: The dtypes the frozen linears' packed copies can compute in (``frozen_matmul_dtype``): ``float32``, the weights as
#: they are; ``bfloat16``: the weights rounded to bfloat16 once, and each frozen matmul's input and output rounded to
#: bfloat16 around oneDNN's bfloat16 kernel (float32 accumulation), forward and backward. LoRA, attention, norms,
#: the residual stream and the loss stay float32.
FROZEN_MATMUL_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def frozen_matmul_torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a ``frozen_matmul_dtype`` name (:data:`FROZEN_MATMUL_DTYPES`); a clear error otherwise."""
    if name not in FROZEN_MATMUL_DTYPES:
        raise ValueError(f"frozen_matmul_dtype must be one of {sorted(FROZEN_MATMUL_DTYPES)}, got {name!r}")
    return FROZEN_MATMUL_DTYPES[name]


@functools.cache
def bfloat16_matmuls_available() -> bool:
    """Whether oneDNN computes packed bfloat16 matmuls on this CPU: tried once on a small matrix (its reorder needs
    AVX512-BW/VL/DQ or AVX-NE-CONVERT, and ``_is_mkldnn_bf16_supported`` does not see an ISA capped by
    ``ONEDNN_MAX_CPU_ISA``)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.ones(16, 16, dtype=torch.bfloat16), 4)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(4, 16, dtype=torch.bfloat16), packed, None, "none", [], "")
    except RuntimeError:
        return False
    return bool((out == 16).all())


def packed_weight_bytes(model: torch.nn.Module, dtype: torch.dtype = torch.float32) -> int:
    """Memory one set of the packed copies of :class:`PackedFrozenLinears` takes in ``dtype`` (0 where packing does
    not apply)."""
    if not packing_available(model):
        return 0
    weights = {w.data_ptr(): w.numel() for m in model.modules() if (w := PackedFrozenLinears.frozen_weight(m)) is not None}
    return torch.empty((), dtype=dtype).element_size() * sum(weights.values())


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


def packed_weight(module: torch.nn.Module, weights: list[torch.Tensor], name: str = "_trl_multiagent_packed",
                  transposed: bool = False, dtype: torch.dtype = torch.float32):
    """The frozen ``weights`` (``(out, in)`` each, one ``in``), stacked along ``out``, cast to ``dtype`` and reordered
    into oneDNN's blocked layout for ``torch.ops.mkldnn._linear_pointwise``: kept on ``module`` (attribute ``name``,
    with the dtype's name appended unless float32) and made again when a weight changes (its storage, version or
    shape). One weight is reordered as it is; several are concatenated first (the concatenation is dropped once
    reordered, so the packed copy is the only extra memory). ``transposed``: the stack transposed before it is
    reordered (``_linear_pointwise(g, it)`` is then ``g @ W``)."""
    if dtype != torch.float32:
        name = f"{name}_{str(dtype).removeprefix('torch.')}"
    key = tuple((w.data_ptr(), w._version, tuple(w.shape)) for w in weights)
    cached = module.__dict__.get(name)
    if cached is None or cached[0] != key:
        whole = weights[0].detach() if len(weights) == 1 else torch.cat([w.detach() for w in weights])
        whole = whole.t().contiguous() if transposed else whole
        cached = (key, torch.ops.mkldnn._reorder_linear_weight(whole.to(dtype), 64))
        module.__dict__[name] = cached
    return cached[1]


def packed_matmul(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W^T + b`` of a contiguous 2-D ``x``, ``W`` from its packed copy (:func:`packed_weight`). A copy in another
    dtype than ``x`` (bfloat16, ``frozen_matmul_dtype``) computes on ``x`` and ``b`` in its dtype (a ``b`` made in
    it once is not cast again) and returns ``x``'s dtype."""
    if packed.dtype != x.dtype:
        bias = None if bias is None else bias.to(packed.dtype)
        return torch.ops.mkldnn._linear_pointwise(x.to(packed.dtype), packed, bias, "none", [], "").to(x.dtype)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """:func:`packed_matmul` over ``x``'s last dimension, for ``x`` of any shape."""
    flat = x.reshape(-1, x.size(-1))
    y = packed_matmul(flat if flat.is_contiguous() else flat.contiguous(), packed, bias)
    return y.view(*x.shape[:-1], y.size(-1))


def _is_sharded(weight: torch.Tensor) -> bool:
    """A shard of a weight (FSDP2's DTensor): packing it would pack the shard, not the weight."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return isinstance(weight, DTensor)


def packed_transposed(module: torch.nn.Module, weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``weight`` (``(out, in)``) transposed and packed in ``dtype`` (:func:`packed_weight`), so that
    ``packed_linear(g, it, None)`` is ``g @ weight``: kept on ``module`` beside the forward's copy."""
    return packed_weight(module, [weight], "_trl_multiagent_packed_t", transposed=True, dtype=dtype)


class _PackedFrozenLinear(torch.autograd.Function):
    """``x @ W^T + b`` with a frozen ``W`` from its oneDNN-packed copy, and the input's gradient ``g @ W`` from the
    packed copy of ``W^T`` (``transposed()`` gives it; no gradient for ``W`` or ``b``, which are frozen)."""

    @staticmethod
    def forward(ctx, x, packed, bias, transposed):
        ctx.transposed = transposed
        return packed_linear(x, packed, bias)

    @staticmethod
    def backward(ctx, grad):
        return packed_linear(grad, ctx.transposed(), None), None, None, None


class PackedFrozenLinears:
    """Within ``with``, every frozen float32 linear of ``model`` on the CPU (the base layers under the LoRA adapters,
    their de-quantised copies, the LM head) computes with its weight reordered once into oneDNN's blocked layout
    (``torch.ops.mkldnn._linear_pointwise``), instead of ``F.linear``, which re-packs the weight at every call. A
    decoding step multiplies a few rows by every weight, so the re-packing dominated: measured on the 2-core machine
    (``benchmarks/decode_step.py``), the LM head of SmolLM2-135M (576 x 49152) took 2.3x less time for 16 rows.

    The op has no derivative of its own: under ``torch.is_grad_enabled()`` the layer computes as before, unless
    ``differentiable``: then :class:`_PackedFrozenLinear` computes the forward with the packed weight and the input's
    gradient with a second packed copy, of the transposed weight (made at the first backward). The teacher-forced
    passes run so (:meth:`~trl_multiagent.team.pool.AgentPool.forward`): measured on the 2-core machine
    (``benchmarks/packed_training.py`` -> ``experiments/speed/teacher_forcing/packed_training.json``), the frozen matmuls
    of SmolLM2-135M take 2.7x (4 rows), 1.6x (40), 1.3x (160) and 1.17x (480) less time packed than through
    ``F.linear`` (which re-packs the weight at every call), the backward's ``grad @ W`` 2.6x to 1.15x. The packed
    weights are kept on the module and made again when the weight changes (its storage or version): one more copy of the frozen weights for generation, two or three for training, which
    :meth:`AgentPool` allows where memory does.

    ``skip``: layers left as they are. The lean decoding step (:mod:`.lean_step`) packs q/k/v and gate/up of every
    layer concatenated, and shares the packed copies of the other layers with this class; the prefill before it
    skips the concatenated layers, so that the frozen weights are packed once in all (what
    :func:`packed_weight_bytes` counts), unless the teacher-forced passes pack each of those layers anyway
    (:func:`~.team.prefill_unpacked`).

    ``dtype``: the dtype of the packed copies (``frozen_matmul_dtype``). ``torch.bfloat16`` rounds the weights once
    and each matmul's input and output (forward, and the input's gradient in backward) to bfloat16, with float32
    accumulation and a float32 result: oneDNN's bfloat16 kernels take 1.4-1.8x less time for SmolLM2-135M's frozen
    matmuls at 1 to 480 rows on the 2-core AMD EPYC with AVX512-BF16 (``benchmarks/frozen_matmul_dtype.py``,
    ``experiments/speed/frozen_matmul_dtype/``). The pool uses one dtype for generation and for the teacher-forced
    passes, but the two sum in other orders, and in bfloat16 a float32 sum in another order can round to the
    neighbouring value: there the sampling and the trained policy differ by up to a few hundredths in total
    variation per token, against about 1e-6 in float32."""

    def __init__(self, model: torch.nn.Module, skip=(), differentiable: bool = False,
                 dtype: torch.dtype = torch.float32):
        self.model = model
        #: the dtype of the packed copies (:data:`FROZEN_MATMUL_DTYPES`): float32, or bfloat16 (rounded copies)
        self.dtype = dtype
        #: under autograd too (:class:`_PackedFrozenLinear`), not only without it
        self.differentiable = differentiable
        #: layers left as they are (those the lean decoding step packs in concatenations of its own)
        self.skip = {id(m) for m in skip}
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
        if weight.requires_grad or weight.dtype != torch.float32 or weight.numel() < PACK_MIN_WEIGHTS \
                or _is_sharded(weight):
            return None
        return weight

    def __enter__(self) -> PackedFrozenLinears:
        try:
            for module in self.model.modules():
                weight = self.frozen_weight(module)
                if weight is not None and id(module) not in self.skip:
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
        dtype = self.dtype
        packed = packed_weight(module, [weight], dtype=dtype)
        bias = module.bias.detach().to(dtype) if module.bias is not None else None
        previous = module.__dict__.get("forward")
        unpacked = previous if previous is not None else type(module).forward.__get__(module)

        def forward(x, *args, **kwargs):
            if x.dtype != torch.float32 or (torch.is_grad_enabled() and not self.differentiable):
                return unpacked(x, *args, **kwargs)
            if torch.is_grad_enabled() and x.requires_grad:
                return _PackedFrozenLinear.apply(x, packed, bias, lambda: packed_transposed(module, weight, dtype))
            return packed_linear(x, packed, bias)

        module.forward = forward
        self._patched.append((module, previous))
