"""Grouped-query attention without copying the keys and values: the attention function the library's models run
with on the CPU.

A model with grouped-query attention (SmolLM2-135M: 9 query heads, 3 key/value heads) has ``g`` query heads per
key/value head. transformers' ``sdpa`` attention hands ``scaled_dot_product_attention`` a mask on the CPU, so it
cannot use the kernel's own grouping (``enable_gqa``; on the CPU with a mask its outputs also differ from the
ungrouped ones in torch 2.13) and copies every key and value head ``g`` times first (``repeat_kv``), and the backward
pass sums the copies' gradients back: a call of the main job's teacher-forced pass (12 rows x 40 completion tokens
after 377 cached positions, forward and backward) takes 1.23x as long with them as with :func:`grouped_sdpa`
(``benchmarks/call_cost.py`` -> ``experiments/speed/teacher_forcing/call_cost.json``, the 2-core AMD EPYC).

:func:`grouped_sdpa` computes the same attention with the ``g`` query heads of one key/value head stacked along the
query positions, ``(batch, kv_heads, g x queries, dim)``, and the mask repeated ``g`` times along its query rows (as
transformers' ``pack_gqa`` does for a single query): each query row meets exactly the keys, values and mask entries
of the ungrouped computation, so the numbers are those of ``sdpa`` up to the order of float sums
(``tests/test_grouped_attention.py``). Without a mask, without grouping, or off the CPU (a model loaded on the CPU
and moved to a GPU: measured on the CPU only), it is transformers' ``sdpa`` itself.

:func:`use_grouped_attention` registers it (with ``sdpa``'s mask function) as :data:`GROUPED_SDPA` and switches a
model that uses ``sdpa`` to it; :func:`~trl_multiagent.models.loading.load_base_model` does so for models on the CPU.
"""

from __future__ import annotations

import torch

#: The name :func:`grouped_sdpa` is registered under in transformers' attention and mask interfaces.
GROUPED_SDPA = "trl_multiagent_grouped_sdpa"


def grouped_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query`` ``(batch, heads, queries, dim)``, ``key`` and
    ``value`` ``(batch, kv_heads, keys, dim)``, ``attention_mask`` broadcastable to ``(batch, 1, queries, keys)``
    (boolean: True where a query may attend; float: added to the scores). Returns ``(batch, queries, heads, dim)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if groups == 1 or query.device.type != "cpu" or attention_mask is None or attention_mask.dim() != 4 \
            or kwargs.get("position_bias") is not None \
            or kwargs.get("softcap") is not None or kwargs.get("output_attentions", False):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    batch, heads, queries, dim = query.shape
    kv_heads = key.size(1)
    # query head h = k x groups + j uses key/value head k (repeat_kv's order): stack j along the query positions
    packed = query.reshape(batch, kv_heads, groups * queries, dim)
    mask = attention_mask.repeat(1, 1, groups, 1) if attention_mask.size(2) == queries else attention_mask
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, dropout_p=dropout,
                                                           scale=scaling)
    return out.reshape(batch, heads, queries, value.size(-1)).transpose(1, 2).contiguous(), None


def register_grouped_attention() -> None:
    """Register :func:`grouped_sdpa` as :data:`GROUPED_SDPA` (attention function, and ``sdpa``'s mask function:
    transformers builds no mask for a name it has no mask function for)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED_SDPA, sdpa_mask)


def use_grouped_attention(model: torch.nn.Module) -> bool:
    """Switch ``model`` (a transformers model) from ``sdpa`` to :func:`grouped_sdpa` when it groups its query heads;
    returns whether it did. Other attention implementations (eager, flash, flex) are left as they are."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if not heads or heads == kv_heads:
        return False
    register_grouped_attention()
    model.set_attn_implementation(GROUPED_SDPA)
    return True
