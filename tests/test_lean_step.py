"""The lean decoding step (trl_multiagent/generation/lean_step.py) against transformers' forward: the same logits
from the same KV cache (one row, many rows, a mixed-adapter batch with rows of different lengths), each row against
its own agent's forward alone, the new LoRA weights after an optimizer step, and the bases it does not apply to.
Numbers of two paths are compared as tests/numerics.py says (tolerances from the number of summed terms)."""

import contextlib
import logging

import pytest
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from trl_multiagent.generation import LeanStep, MultiAdapterBatch, lean_support
from trl_multiagent.generation.frozen_weights import packing_available
from trl_multiagent.generation.kv_cache import preallocated_cache
from trl_multiagent.runtime.provenance import pool_paths
from trl_multiagent.team.pool import AgentPool, AgentSpec, GenerationRequest

from .numerics import assert_same_computation, assert_same_greedy, rounding_tolerance
from .test_generation import _hf_greedy
from .tiny import model_terms

STEPS = 3  # one-token steps compared after the prefill (each reads the keys and values the earlier ones wrote)


def _pool(model_dir, **kw):
    # "third" differs in rank and in the projections it adapts: the groups then hold adapters of several shapes
    pool = AgentPool([AgentSpec("aux", model=model_dir, lora_r=4), AgentSpec("main", model=model_dir, lora_r=4),
                      AgentSpec("third", model=model_dir, lora_r=8, lora_target_modules=["q_proj", "v_proj",
                                                                                        "down_proj"])], **kw)
    with torch.no_grad():
        for n, p in pool.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    return pool


def _batch(pool, prompts):
    tok = pool.tokenizer_of("aux")
    encoded = [pool.encode_prompt("aux", p) for p in prompts]
    width = max(map(len, encoded))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(e)) + e for e in encoded])
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
    return encoded, ids, mask


def _run(model, ids, mask, adapters, tokens, lean: bool, packed: bool = False):
    """Prefill (transformers' forward), then the one-token steps of ``tokens`` (``(rows, STEPS)``) through the lean
    step or the forward (eval mode: no dropout); returns each step's logits and the cache."""
    model.eval()
    cache = preallocated_cache(model, ids.size(1) + STEPS)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = []
    with torch.no_grad(), MultiAdapterBatch(model, adapters) as batch:
        model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
              logits_to_keep=1)
        step = LeanStep(model, batch, packed=packed) if lean else None
        position = positions[:, -1] + 1
        for i in range(STEPS):
            mask = torch.cat([mask, mask.new_ones((mask.size(0), 1))], dim=1)
            if lean:
                logits.append(step(tokens[:, i], mask, position, cache))
            else:
                logits.append(model(input_ids=tokens[:, i:i + 1], attention_mask=mask,
                                    position_ids=position[:, None], cache=cache, use_cache=True).logits[:, -1])
            position = position + 1
    return logits, cache


CASES = {
    "one row": (["what is two plus two"], ["main"]),
    "many rows": ([f"question {i}: {'x' * i}" for i in range(9)], ["aux"] * 9),
    # rows of different lengths (left padding), each with its own adapter or none (the base), in mixed order
    "mixed adapters, left padding": (["a", "hello there", "what is two plus two", "x y", "abc", "longer prompt here",
                                      "z", "the last one"], ["aux", "main", "third", None, "third", "aux", None,
                                                             "main"]),
    # every row with an adapter, in mixed order: the prefill in the block form (rows gathered into blocks of 3, 3
    # and 2), the lean step in the masked form
    "mixed adapters, every row one": (["a", "hello there", "what is two plus two", "x y", "abc", "longer prompt here",
                                       "z", "the last one"], ["aux", "main", "third", "main", "third", "aux", "aux",
                                                              "main"]),
    # rows already in blocks (sorted by adapter, as many each): the block form on views of the rows, in both
    "rows in adapter blocks": (["a", "hello there", "what is two", "x y", "abc", "longer prompt"],
                               ["aux", "aux", "main", "main", "third", "third"]),
}


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_lean_step_logits_are_the_forwards_logits_from_the_same_cache(tiny_text_model, case, packed):
    pool = _pool(tiny_text_model)
    model = pool.bases["base0"].get_base_model().eval()
    if packed and not packing_available(model):
        pytest.skip("this torch build has no oneDNN linear op")
    assert lean_support(model) is None and pool.lean_decodes("base0")
    prompts, adapters = CASES[case]
    encoded, ids, mask = _batch(pool, prompts)
    torch.manual_seed(0)
    tokens = torch.randint(3, len(pool.tokenizer_of("aux")), (len(prompts), STEPS))
    expected, hf_cache = _run(model, ids, mask, adapters, tokens, lean=False)
    got, lean_cache = _run(model, ids, mask, adapters, tokens, lean=True, packed=packed)
    terms = model_terms(ids.numel() + len(prompts) * STEPS)  # the tokens of the batch x the widest layer
    for i in range(STEPS):
        assert_same_computation(got[i], expected[i], terms=terms, what=f"{case}: logits of step {i}")
    # the keys and values the steps wrote into the cache (all layers, the steps' positions)
    width = ids.size(1)
    for layer_hf, layer_lean in zip(hf_cache.layers, lean_cache.layers):
        assert layer_lean.length == layer_hf.length == width + STEPS
        assert_same_computation([layer_lean.keys[:, :, width:], layer_lean.values[:, :, width:]],
                                [layer_hf.keys[:, :, width:], layer_hf.values[:, :, width:]], terms=terms,
                                what=f"{case}: cached keys and values")
    # each row against its own agent alone (PEFT's adapter switching, no padding, no cache): the last step's logits
    for row, (prompt, adapter) in enumerate(zip(encoded, adapters)):
        base = pool.activate(pool.policy_of(adapter or "aux"))
        full = torch.tensor([prompt + tokens[row, :STEPS].tolist()])
        with torch.no_grad():
            with base.disable_adapter():
                plain = base(input_ids=full).logits[0, -1]
            alone = plain if adapter is None else base(input_ids=full).logits[0, -1]
        terms = model_terms(full.numel())
        assert_same_computation(got[-1][row], alone, terms=terms,
                                what=f"{case}: row {row} ({adapter}) against its agent alone")
        if adapter is not None:  # the adapter does change the row's logits (not a comparison of identical models)
            assert (alone - plain).norm() > 100 * rounding_tolerance(terms) * plain.norm()


def test_lean_step_with_two_threads_runs_its_small_matmuls_on_one_and_restores_the_count(tiny_text_model):
    """With several threads the LoRA matmuls and a small attention run on one (lean_step.ONE_THREAD); the step gives
    the same logits as the forward, and the thread count is the caller's again after it."""
    pool = _pool(tiny_text_model)
    model = pool.bases["base0"].get_base_model()
    prompts, adapters = CASES["mixed adapters, left padding"]
    _, ids, mask = _batch(pool, prompts)
    tokens = torch.randint(3, len(pool.tokenizer_of("aux")), (len(prompts), STEPS))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got, _ = _run(model, ids, mask, adapters, tokens, lean=True)
        assert torch.get_num_threads() == 2
        expected, _ = _run(model, ids, mask, adapters, tokens, lean=False)
    finally:
        torch.set_num_threads(threads)
    terms = model_terms(ids.numel() + len(prompts) * STEPS)
    for i in range(STEPS):
        assert_same_computation(got[i], expected[i], terms=terms, what=f"two threads: logits of step {i}")


def test_generation_after_an_optimizer_step_uses_the_new_lora_weights(tiny_text_model):
    """A fused AdamW step (which does not bump a parameter's version counter) between two generations: the second
    generation's lean steps compute with the new LoRA weights (nothing of them is kept from the first)."""
    pool = _pool(tiny_text_model)
    assert pool.lean_decodes("base0")
    config = GenerationConfig(max_new_tokens=6, do_sample=False)
    requests = [GenerationRequest(a, p) for a in ("aux", "main") for p in ("abc", "hello there")]
    model = pool.bases["base0"].get_base_model().eval()
    _, ids, mask = _batch(pool, ["abc", "hello there"])
    tokens = torch.randint(3, len(pool.tokenizer_of("aux")), (2, STEPS))
    before, _ = _run(model, ids, mask, ["aux", "main"], tokens, lean=True)
    pool.generate_many(requests, config)  # a generation before the step

    params = pool.policy_parameters("aux") + pool.policy_parameters("main")
    optimizer = torch.optim.AdamW(params, lr=0.5, fused=True)
    for agent in ("aux", "main"):
        ids_a = torch.tensor([pool.encode_prompt(agent, "abc de")])
        pool(agent, input_ids=ids_a, labels=ids_a).loss.backward()
    optimizer.step()

    after, _ = _run(model, ids, mask, ["aux", "main"], tokens, lean=True)
    expected, _ = _run(model, ids, mask, ["aux", "main"], tokens, lean=False)
    terms = model_terms(ids.numel() + 2 * STEPS)
    for i in range(STEPS):
        assert_same_computation(after[i], expected[i], terms=terms, what=f"logits of step {i} after the update")
    assert (after[-1] - before[-1]).abs().max() > 1e-3  # the update did change them
    # and the pool's own generation: every row is its updated agent's greedy answer (transformers' generate)
    _assert_greedy_answers(pool, requests, pool.generate_many(requests, config), 6, "after the update")


def _assert_greedy_answers(pool, requests, out, max_new_tokens, what, widest=None):
    """Each row of ``out`` is its agent's greedy answer by transformers' generate, up to a rounding tie."""
    for req, gens in zip(requests, out):
        base = pool.activate(pool.policy_of(req.agent))
        prompt = pool.encode_prompt(req.agent, req.prompt)

        def logits_after(prefix, base=base, prompt=prompt, use_adapter=req.use_adapter):
            with torch.no_grad(), contextlib.nullcontext() if use_adapter else base.disable_adapter():
                return base(input_ids=torch.tensor([prompt + prefix])).logits[0, -1]

        expected = _hf_greedy(pool, req.agent, req.prompt, max_new_tokens, use_adapter=req.use_adapter)
        terms = model_terms(len(prompt) + max_new_tokens, *([widest] if widest else []))
        assert_same_greedy(gens[0].completion_ids, expected, logits_after, terms=terms,
                           what=f"{what}: {req.agent} (adapter {req.use_adapter}) on {req.prompt!r}")


def _tiny_qwen2():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2))


def test_lean_support_names_what_it_does_not_compute(tiny_text_model):
    assert "not transformers' LlamaForCausalLM" in lean_support(_tiny_qwen2())
    config = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    assert "depends on the sequence length" in lean_support(LlamaForCausalLM(config))
    with pytest.raises(ValueError, match="does not apply"):
        LeanStep(_tiny_qwen2())
    # a 4-bit base without its de-quantised copy: transformers' forward, decided when the pool is built
    pytest.importorskip("bitsandbytes")
    pool = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4, quantization="4bit")], dense_copy="never")
    assert not pool.lean_decodes("base0") and pool_paths(pool)["base0"]["lean_decode"] is False
    assert "de-quantised copy" in lean_support(pool.bases["base0"].get_base_model())


def test_lean_decode_switch(tiny_text_model, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="trl_multiagent.generation.compute_paths")
    on = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4)])
    assert on.lean_decodes("base0") and pool_paths(on)["base0"]["lean_decode"] is True
    assert "decodes with the lean step" in caplog.text
    off = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4)], lean_decode="never")
    assert not off.lean_decodes("base0") and pool_paths(off)["base0"]["lean_decode"] is False
    with pytest.raises(ValueError, match="lean_decode must be one of"):
        AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4)], lean_decode="sometimes")
    # a base the step does not support: 'auto' falls back (logged with the reason), 'always' refuses
    from trl_multiagent.generation import compute_paths

    monkeypatch.setattr(compute_paths, "lean_support", lambda model: "a reason")
    caplog.clear()
    auto = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4)])
    assert not auto.lean_decodes("base0") and "the lean step does not apply (a reason)" in caplog.text
    with pytest.raises(ValueError, match="lean_decode='always'.*a reason"):
        AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4)], lean_decode="always")
    # the generation of the two paths: the same greedy answers
    config = GenerationConfig(max_new_tokens=6, do_sample=False)
    requests = [GenerationRequest("aux", p) for p in ("abc", "hello there", "x")]
    # a base that no longer suits the step when it generates (wrapped since the pool decided): the forward, logged
    from trl_multiagent.generation import team

    monkeypatch.setattr(team, "lean_support", lambda model: "wrapped")
    caplog.clear()
    assert on.lean_decodes("base0") and len(on.generate_many(requests[:1], config)[0][0].completion_ids) > 0
    assert "no longer applies (wrapped)" in caplog.text
    monkeypatch.undo()
    with torch.no_grad():
        for n, p in off.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
        on.load_state_dict(off.state_dict())
    ids = {r.prompt: on.encode_prompt("aux", r.prompt) for r in requests}
    for req, a, b in zip(requests, on.generate_many(requests, config), off.generate_many(requests, config)):
        def logits_after(prefix, prompt=ids[req.prompt]):
            with torch.no_grad():
                return off("aux", input_ids=torch.tensor([prompt + prefix])).logits[0, -1]

        assert_same_greedy(a[0].completion_ids, b[0].completion_ids, logits_after,
                           terms=model_terms(len(ids[req.prompt]) + 6), what=f"lean and forward on {req.prompt!r}")


def test_embedded_model_lean_step_and_greedy_answers():
    """SmolLM2-135M (the embedded default, packed weights on a CPU): the lean step's logits for a mixed batch are the
    forward's, and the team's greedy answers are transformers' generate's."""
    pool = AgentPool([AgentSpec("aux", lora_r=4), AgentSpec("main", lora_r=4)])
    with torch.no_grad():
        for n, p in pool.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.01)
    (key,) = pool.bases
    assert pool.lean_decodes(key)
    model = pool.bases[key].get_base_model().eval()
    config = model.config
    widest = max(config.intermediate_size, config.hidden_size)  # the widest sum: down_proj's
    prompts, adapters = ["What is 2+2?", "Name a colour.", "Hi"], ["aux", "main", None]
    _, ids, mask = _batch(pool, prompts)
    tokens = torch.randint(100, 1000, (3, STEPS))
    expected, _ = _run(model, ids, mask, adapters, tokens, lean=False)
    got, _ = _run(model, ids, mask, adapters, tokens, lean=True, packed=pool.packs_weights(key))
    for i in range(STEPS):
        assert_same_computation(got[i], expected[i], terms=model_terms(ids.numel() + 3 * STEPS, widest),
                                what=f"SmolLM2 logits of step {i}")
    requests = [GenerationRequest(a, p) for a in ("aux", "main") for p in prompts[:2]]
    requests.append(GenerationRequest("main", prompts[2], use_adapter=False))
    out = pool.generate_many(requests, GenerationConfig(max_new_tokens=8, do_sample=False))
    _assert_greedy_answers(pool, requests, out, 8, "SmolLM2", widest)


@pytest.mark.parametrize("rows", [1, 8])  # scaled_dot_product_attention below MATMUL_ATTENTION_MIN_ROWS, matmuls from it
def test_lean_step_attention_is_softmax_attention_with_the_padding_masked(tiny_text_model, rows):
    """LeanStep.attention (one layer's attention of the step, which decode_limits.py also times alone) against
    softmax(q k^T * scaling + mask) v written out in float64 per row and head, the query heads of a key/value head
    reading that head's keys; the masked positions get no weight; the caller's thread count comes back."""
    from trl_multiagent.generation.lean_step import MATMUL_ATTENTION_MIN_ROWS

    assert 1 < MATMUL_ATTENTION_MIN_ROWS <= 8
    pool = _pool(tiny_text_model)
    model = pool.bases["base0"].get_base_model().eval()
    with MultiAdapterBatch(model, ["aux"] * rows) as batch:
        step = LeanStep(model, batch)
    heads, kv_heads, dim = step.heads, step.kv_heads, step.head_dim
    group, cached = heads // kv_heads, 7
    torch.manual_seed(0)
    q = torch.randn(rows, kv_heads, group, dim)
    keys, values = torch.randn(rows, kv_heads, cached, dim), torch.randn(rows, kv_heads, cached, dim)
    padding = torch.zeros(rows, cached, dtype=torch.bool)
    padding[0, :3] = True  # the first row's first 3 positions are padding
    attend = torch.zeros(rows, cached).masked_fill_(padding, -torch.inf)[:, None, None, :]
    threads = torch.get_num_threads()
    got = step.attention(q, keys, values, attend, one_thread_of=threads)
    assert torch.get_num_threads() == threads
    expected = torch.empty(rows, heads, dim, dtype=torch.float64)
    for r in range(rows):
        for h in range(heads):
            g = h // group  # the key/value head of query head h
            scores = [float(q[r, g, h % group].double() @ keys[r, g, j].double()) * step.scaling
                      for j in range(cached)]
            weights = [0.0 if padding[r, j] else torch.tensor(s).exp().item() for j, s in enumerate(scores)]
            total = sum(weights)
            expected[r, h] = sum(w / total * values[r, g, j].double() for j, w in enumerate(weights))
    assert got.shape == (rows, heads * dim)
    assert_same_computation(got, expected.reshape(rows, heads * dim), terms=cached * dim,
                            what=f"attention of {rows} row(s)")
