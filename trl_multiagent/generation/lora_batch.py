"""LoRA batching: one forward pass for the rows of several LoRA adapters of one base.

Agents on one base differ only by their LoRA adapters, so their rows can share every forward pass:
:class:`MultiAdapterBatch` makes each LoRA linear of the base compute

    y = x W^T + ((x A_cat^T) * s_row) B_cat^T

for a mixed batch, where ``A_cat`` / ``B_cat`` stack the adapters' LoRA matrices and ``s_row`` holds, for each row,
its adapter's LoRA scale on that adapter's columns and zeros elsewhere (a row with no adapter, the untrained base of
the baselines, has all zeros). That is two small matmuls per linear whatever the number of adapters, instead of one
pass per adapter; but each row pays the FLOPs of every adapter's columns. Where every row has an adapter, the rows are
laid out instead as one block per adapter (:class:`AdapterBlocks`) and each block multiplies only its own adapter's
matrices, in batched matmuls (:func:`add_block_lora`): the same number of operations, each row one adapter's FLOPs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F

#: Whether batches whose rows all have an adapter compute their LoRA deltas in the block form (:class:`AdapterBlocks`);
#: ``False`` keeps the masked form for every batch (``benchmarks/lora_blocks.py`` times the two against each other).
BLOCK_FORM = True


class AdapterBlocks:
    """The rows of a mixed batch laid out as one block per adapter, for batched LoRA matmuls (``torch.bmm``).

    Every block has ``size`` slots (the most rows any adapter has); a shorter block's spare slots read row 0 and their
    results are dropped. ``source`` (adapters x size,) gives each slot the row it reads, ``slot`` (rows,) each row
    the slot it takes its result from. ``in_place``: the rows already are the blocks (sorted by adapter, equally many
    each), so the rows are viewed as blocks and neither index is used. Made by :meth:`of`, which returns ``None``
    where a row has no adapter (index -1: the untrained base of a baseline), or under ``BLOCK_FORM = False``: such a
    batch keeps the masked form."""

    def __init__(self, row_index: torch.Tensor, adapters: int):
        index = row_index.to("cpu", torch.long)
        counts = torch.bincount(index, minlength=adapters)
        self.adapters, self.size = adapters, int(counts.max())
        order = torch.argsort(index, stable=True)  # rows by adapter, each adapter's rows in their order
        starts = torch.cumsum(counts, 0) - counts
        rank = torch.empty_like(index)
        rank[order] = torch.arange(index.numel()) - starts[index[order]]  # a row's place among its adapter's rows
        self.slot = index * self.size + rank
        self.source = torch.zeros(adapters * self.size, dtype=torch.long)
        self.source[self.slot] = torch.arange(index.numel())
        #: every adapter has ``size`` rows: no spare slots, so the results go back by one ``index_add_``
        self.full = bool((counts == self.size).all())
        self.in_place = self.full and bool(torch.equal(order, torch.arange(index.numel())))
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def of(cls, row_index: torch.Tensor, adapters: int) -> AdapterBlocks | None:
        if not BLOCK_FORM or adapters == 0 or row_index.numel() == 0 or bool((row_index < 0).any()):
            return None
        return cls(row_index, adapters)

    def indices(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(source, slot)`` on ``device`` (copied there once)."""
        found = self._on.get(device)
        if found is None:
            found = self._on[device] = (self.source.to(device), self.slot.to(device))
        return found


def add_block_lora(y: torch.Tensor, x: torch.Tensor, blocks: AdapterBlocks, a: torch.Tensor,
                   parts: list[tuple[int, int, slice, torch.Tensor]]) -> None:
    """``y += `` every row's LoRA delta by its own adapter only: ``(x A_i^T)(s_i B_i)^T`` for a row of adapter ``i``.

    ``x`` ``(rows, ..., in)``, ``y`` ``(rows, ..., out)``; ``a`` ``(adapters, in, R)``: each adapter's ``A^T`` (for a
    group of projections that read one input, theirs side by side); ``parts``: per projection ``(output offset,
    output size, its columns of R, its (adapters, r, size) s B^T)``, the LoRA scale folded in.

    Operations: where the rows are the blocks, one ``bmm`` for ``A`` and one ``baddbmm_`` per projection into its
    columns of ``y`` viewed as blocks; otherwise a gather of the rows into blocks, the same matmuls into a buffer, and
    an ``index_add_`` of the results into their rows (where a block has spare slots: a gather of the results into row
    order and one add)."""
    adapters, width = a.size(0), y.size(-1)
    viewed = blocks.in_place and y.dtype == a.dtype and y.is_contiguous()
    source, slot = blocks.indices(x.device) if not blocks.in_place else (None, None)
    xs = x if blocks.in_place else x.index_select(0, source)
    h = torch.bmm(xs.reshape(adapters, -1, x.size(-1)), a)
    if viewed:  # y viewed as blocks, added into in place
        out = y.view(adapters, -1, width)
        for offset, size, columns, block in parts:
            out[..., offset:offset + size].baddbmm_(h[..., columns], block)
        return
    if len(parts) == 1 and parts[0][1] == width:
        delta = torch.bmm(h[..., parts[0][2]], parts[0][3])
    else:
        delta = h.new_zeros((adapters, h.size(1), width))
        for offset, size, columns, block in parts:
            delta[..., offset:offset + size].baddbmm_(h[..., columns], block)
    delta = delta.view(adapters * blocks.size, *y.shape[1:])
    delta = delta if delta.dtype == y.dtype else delta.to(y.dtype)
    if blocks.in_place:
        y.add_(delta)
    elif blocks.full:  # every slot is a row: add each slot's result into its row
        y.index_add_(0, source, delta)
    else:
        y.add_(delta.index_select(0, slot))


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
        #: Each current row's adapter, as an index into :attr:`adapters` (-1: no adapter); a new tensor whenever the
        #: rows change (:meth:`select`, :meth:`rows`), so that a reader can tell (the lean decoding step).
        self.row_index = torch.tensor([self.adapters.index(a) if a is not None else -1 for a in row_adapters],
                                      dtype=torch.long)
        #: The current rows as blocks per adapter (``None``: a row without adapter; the masked form then)
        self.blocks = AdapterBlocks.of(self.row_index, len(self.adapters))

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
        # the block form (add_block_lora): per batch adapter its A^T and s B^T, zeros for one this layer lacks
        rank = max(layer.lora_A[a].weight.shape[0] for a in present)
        a_blocks = a_cat.new_zeros((len(self.adapters), a_cat.size(1), rank))
        b_blocks = a_cat.new_zeros((len(self.adapters), rank, b_cat.size(0)))
        for a in present:
            i, r = self.adapters.index(a), layer.lora_A[a].weight.shape[0]
            a_blocks[i, :, :r] = layer.lora_A[a].weight.t()
            b_blocks[i, :r] = layer.lora_B[a].weight.t() * float(layer.scaling[a])
        parts = [(0, b_cat.size(0), slice(0, rank), b_blocks)]
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
            if self.blocks is not None:
                add_block_lora(result, x.to(a_cat.dtype), self.blocks, a_blocks, parts)
                return result
            h = F.linear(x.to(a_cat.dtype), a_cat)
            h = h * self._scales[key].unsqueeze(1) if h.dim() == 3 else h * self._scales[key]
            return result + F.linear(h, b_cat).to(result.dtype)

        layer.forward = forward
        self._patched.append(layer)

    @contextlib.contextmanager
    def rows(self, rows: slice) -> Iterator[None]:
        """Within ``with``, the batch is the rows ``rows`` of the current one (a bucket of the prefill)."""
        whole, index, blocks = self._scales, self.row_index, self.blocks
        self._scales = {key: scales[rows] for key, scales in whole.items()}
        self.row_index = index[rows]
        self.blocks = AdapterBlocks.of(self.row_index, len(self.adapters))
        try:
            yield
        finally:
            self._scales, self.row_index, self.blocks = whole, index, blocks

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the rows ``keep`` (indices into the current batch) from now on."""
        for key, scales in self._scales.items():
            self._scales[key] = scales.index_select(0, keep)
        self.row_index = self.row_index.index_select(0, keep.to(self.row_index.device))
        self.blocks = AdapterBlocks.of(self.row_index, len(self.adapters))
