"""LoRA batching: one forward pass for the rows of several LoRA adapters of one base.

Agents on one base differ only by their LoRA adapters, so their rows can share every forward pass:
:class:`MultiAdapterBatch` makes each LoRA linear of the base compute

    y = x W^T + ((x A_cat^T) * s_row) B_cat^T

for a mixed batch, where ``A_cat`` / ``B_cat`` stack the adapters' LoRA matrices and ``s_row`` holds, for each row,
its adapter's LoRA scale on that adapter's columns and zeros elsewhere (a row with no adapter, the untrained base of
the baselines, has all zeros). That is two small matmuls per linear whatever the number of adapters, instead of one
pass per adapter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F


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
        whole, index = self._scales, self.row_index
        self._scales = {key: scales[rows] for key, scales in whole.items()}
        self.row_index = index[rows]
        try:
            yield
        finally:
            self._scales, self.row_index = whole, index

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the rows ``keep`` (indices into the current batch) from now on."""
        for key, scales in self._scales.items():
            self._scales[key] = scales.index_select(0, keep)
        self.row_index = self.row_index.index_select(0, keep.to(self.row_index.device))
