"""The KV cache of the decoding loop: a transformers ``DynamicCache`` whose full-attention layers write into
preallocated tensors (:func:`preallocated_cache`), with row views for a prefill in buckets (``row_view``,
``allocate``, ``set_length``).
"""

from __future__ import annotations

import torch


def preallocated_cache(model: torch.nn.Module, capacity: int):
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
            # index_select, not DynamicLayer's advanced indexing: the same rows through the CPU's plain row copy
            if self.is_initialized:
                self._k, self._v = self._k.index_select(0, indices), self._v.index_select(0, indices)
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
