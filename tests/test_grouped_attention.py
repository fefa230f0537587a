"""Grouped-query attention without copied keys and values (trl_multiagent/models/grouped_attention.py): the same numbers and
gradients as transformers' ``sdpa`` attention, which copies each key/value head once per query head of its group.

Both run in float64 and are compared with the rounding tolerance of tests/numerics.py (the sums run in another
order)."""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from trl_multiagent.models.grouped_attention import GROUPED_SDPA, grouped_sdpa, use_grouped_attention
from trl_multiagent.models.loading import load_base_model

from .numerics import assert_same_computation
from .tiny import build_model, model_terms


class _Attention(torch.nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _inputs(batch=3, heads=6, kv_heads=2, queries=5, keys=9, dtype=torch.float64):
    torch.manual_seed(0)
    q = torch.randn(batch, heads, queries, 8, dtype=dtype, requires_grad=True)
    k = torch.randn(batch, kv_heads, keys, 8, dtype=dtype, requires_grad=True)
    v = torch.randn(batch, kv_heads, keys, 8, dtype=dtype, requires_grad=True)
    # left padding (row 1: 3 positions, row 2: 1) and causality over the last `queries` keys
    allowed = torch.ones(batch, 1, queries, keys, dtype=torch.bool)
    allowed[1, ..., :3] = False
    allowed[2, ..., :1] = False
    causal = torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries)
    return q, k, v, allowed & causal


def test_grouped_attention_equals_sdpa_with_copied_heads_and_so_do_its_gradients():
    q, k, v, mask = _inputs()
    module = _Attention(groups=3)
    results = []
    for attention in (grouped_sdpa, sdpa_attention_forward):
        out, _ = attention(module, q, k, v, mask, scaling=0.3)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        results.append((out.detach(), [t.grad.clone() for t in (q, k, v)]))
        for t in (q, k, v):
            t.grad = None
    (grouped, grouped_grads), (copied, copied_grads) = results
    assert grouped.shape == (3, 5, 6, 8)  # (batch, queries, heads, dim), as transformers' attention functions return
    assert_same_computation(grouped, copied, terms=9 * 8, what="attention outputs")
    assert_same_computation(grouped_grads, copied_grads, terms=9 * 8 * 3, what="gradients of q, k, v")
    # a masked key gets no gradient: row 1's first 3 keys
    assert grouped_grads[1][1, :, :3].abs().max() == 0
    # against attention computed by hand for one query head (head 4 uses key/value head 4 // 3 = 1)
    row, head, query = 1, 4, 2
    scores = (q[row, head, query] @ k[row, 1].T * 0.3).masked_fill(~mask[row, 0, query], -torch.inf)
    by_hand = torch.softmax(scores, -1) @ v[row, 1]
    assert_same_computation(grouped[row, query, head], by_hand.detach(), terms=9 * 8, what="one head by hand")


def test_without_grouping_or_mask_it_is_sdpa_itself():
    q, k, v, mask = _inputs(heads=2, kv_heads=2)
    out, _ = grouped_sdpa(_Attention(groups=1), q, k, v, mask)
    ref, _ = sdpa_attention_forward(_Attention(groups=1), q, k, v, mask)
    assert torch.equal(out, ref)
    q, k, v, _ = _inputs(queries=9)
    out, _ = grouped_sdpa(_Attention(groups=3), q, k, v, None)
    ref, _ = sdpa_attention_forward(_Attention(groups=3), q, k, v, None)
    assert torch.equal(out, ref)


def test_a_tiny_model_gives_the_same_logits_and_gradients_with_grouped_attention():
    model = build_model(vocab_size=40, initializer_range=0.1).double()
    assert model.config.num_attention_heads // model.config.num_key_value_heads == 2
    ids = torch.randint(3, 40, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    mask[2, :7] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    results = {}
    for implementation in ("sdpa", GROUPED_SDPA):
        if implementation == GROUPED_SDPA:
            assert use_grouped_attention(model)
        assert model.config._attn_implementation == implementation
        model.zero_grad()
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        (logits[mask.bool()].logsumexp(-1)).sum().backward()
        results[implementation] = (logits.detach()[mask.bool()], [p.grad.clone() for p in model.parameters()])
    terms = model_terms(ids.numel())
    assert_same_computation(results[GROUPED_SDPA][0], results["sdpa"][0], terms=terms, what="logits")
    assert_same_computation(results[GROUPED_SDPA][1], results["sdpa"][1], terms=terms, what="gradients")


def test_use_grouped_attention_switches_only_grouped_sdpa_models(tiny_text_model):
    ungrouped = build_model(vocab_size=40)
    ungrouped.config.num_key_value_heads = ungrouped.config.num_attention_heads
    assert not use_grouped_attention(ungrouped) and ungrouped.config._attn_implementation == "sdpa"
    eager = build_model(vocab_size=40)
    eager.set_attn_implementation("eager")
    assert not use_grouped_attention(eager) and eager.config._attn_implementation == "eager"
    # the library's loader switches a grouped model on the CPU
    assert load_base_model(tiny_text_model).config._attn_implementation == GROUPED_SDPA
