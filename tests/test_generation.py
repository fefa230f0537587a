"""Team-level generation (trl_multiagent/generation/): the mixed-adapter batch, the sampler and the decoding loop
against transformers' own generate and logits processors. Greedy answers and numbers of two paths are compared as
tests/numerics.py says (equal up to a rounding tie; tolerances from the number of summed terms)."""

import contextlib
import os

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from trl_multiagent.generation import (
    LeanStep,
    MultiAdapterBatch,
    decode,
    dequantized_weight,
    nucleus_candidates,
    sample_next,
    shared_prefixes,
)
from trl_multiagent.generation.decoding import sampling_order
from trl_multiagent.team.pool import AgentPool, AgentSpec, GenerationRequest

from .numerics import assert_same_computation, assert_same_greedy
from .tiny import model_terms


def _pool(model_dir, agents=("aux", "main"), dense_copy="auto", **kw):
    pool = AgentPool([AgentSpec(a, model=model_dir, lora_r=4, **kw) for a in agents], dense_copy=dense_copy)
    with torch.no_grad():
        for n, p in pool.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    return pool


def _hf_greedy(pool, agent, prompt, max_new_tokens, use_adapter=True):
    """transformers' generate with PEFT's own adapter switching: the reference."""
    base = pool.activate(pool.policy_of(agent))
    ids = torch.tensor([pool.encode_prompt(agent, prompt)])
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=pool.eos_token_ids(agent),
                              pad_token_id=pool.tokenizer_of(agent).pad_token_id)
    base.eval()
    with torch.no_grad():
        if use_adapter:
            out = base.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
        else:
            with base.disable_adapter():
                out = base.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    comp = out[0, ids.size(1):].tolist()
    eos = set(pool.eos_token_ids(agent))
    cut = next((i + 1 for i, t in enumerate(comp) if t in eos), None)
    return comp[:cut] if cut else comp


def _assert_greedy(pool, req, got, expected, max_new_tokens):
    """``got`` is the reference's greedy answer ``expected`` to ``req``, up to a rounding tie (tests/numerics.py)."""
    prompt = pool.encode_prompt(req.agent, req.prompt)

    def logits_after(prefix):
        base = pool.activate(pool.policy_of(req.agent))
        off = contextlib.nullcontext() if req.use_adapter else base.disable_adapter()
        with torch.no_grad(), off:
            return base(input_ids=torch.tensor([prompt + prefix])).logits[0, -1]

    assert_same_greedy(got, expected, logits_after, terms=model_terms(len(prompt) + max_new_tokens),
                       what=f"greedy answer of {req.agent} (adapter {req.use_adapter}) to {req.prompt!r}")


def _generate_with_forward_shapes(pool, requests, config):
    """``pool.generate_many(requests, config)`` and the ``input_ids`` shape of every forward of the (one) base, and of
    every one-token step the lean step computes instead (``(rows, 1)``)."""
    (base,) = pool.bases.values()
    shapes = []
    hook = base.get_base_model().register_forward_pre_hook(
        lambda m, a, k: shapes.append(tuple(k["input_ids"].shape)), with_kwargs=True)
    lean_step = LeanStep.__call__

    def recorded(self, tokens, *args, **kwargs):
        shapes.append((tokens.numel(), 1))
        return lean_step(self, tokens, *args, **kwargs)

    LeanStep.__call__ = recorded
    try:
        return pool.generate_many(requests, config), shapes
    finally:
        hook.remove()
        LeanStep.__call__ = lean_step


@pytest.mark.parametrize("quantization,dense_copy", [(None, "auto"), ("4bit", "always"), ("4bit", "never")])
def test_mixed_adapter_batch_gives_each_row_its_own_agents_greedy_answer(tiny_text_model, quantization, dense_copy):
    pool = _pool(tiny_text_model, agents=("aux", "main", "third"), quantization=quantization, dense_copy=dense_copy)
    prompts = ["abc", "hello there", "x", "what is two plus two"]
    requests = [GenerationRequest(a, p) for p in prompts for a in ("aux", "main", "third")]
    requests += [GenerationRequest("main", p, use_adapter=False) for p in prompts]
    out = pool.generate_many(requests, GenerationConfig(max_new_tokens=8, do_sample=False))
    for req, gens in zip(requests, out):
        expected = _hf_greedy(pool, req.agent, req.prompt, 8, use_adapter=req.use_adapter)
        _assert_greedy(pool, req, gens[0].completion_ids, expected, 8)
    # the adapters do change the answers (the comparison is not between identical models)
    assert len({tuple(g[0].completion_ids) for g in out[:3]}) > 1


def test_samples_of_one_prompt_share_one_prefill(tiny_text_model):
    """num_samples completions of a request, and requests repeating a prompt with the same adapter: the prompt is
    prefilled once (the first forward holds one row per distinct prompt and adapter), and every sample continues from
    it as a fresh prompt would (greedy: the reference's answer)."""
    pool = _pool(tiny_text_model)
    requests = [GenerationRequest("aux", "hello there", num_samples=3), GenerationRequest("main", "abc", num_samples=2),
                GenerationRequest("main", "abc", num_samples=1), GenerationRequest("main", "abc", use_adapter=False)]
    out, batch_sizes = _generate_with_forward_shapes(pool, requests, GenerationConfig(max_new_tokens=6,
                                                                                      do_sample=False))
    assert batch_sizes[0][0] == 3 and batch_sizes[0][1] > 1  # the prefill: 3 distinct prompts, not 7 samples
    assert batch_sizes[1][1] == 1  # then one token at a time for the samples (less the rows that ended at once)
    for req, gens in zip(requests, out):
        assert len(gens) == req.num_samples
        expected = _hf_greedy(pool, req.agent, req.prompt, 6, use_adapter=req.use_adapter)
        for g in gens:
            _assert_greedy(pool, req, g.completion_ids, expected, 6)


def test_shared_prefixes_groups_prompts_by_adapter_and_saves_the_most_tokens():
    a = [1, 2, 3, 4, 5, 6, 7, 8]
    prompts = [a + [9], a + [10, 11], a[:2] + [20, 21], a + [9], [1, 2, 30, 31, 32], [5, 6]]
    keys = ["x", "x", "x", "y", "x", "x"]
    group_of, prefix_len = shared_prefixes(prompts, keys)
    # "x": the two prompts that share 8 tokens form one group (saving 8); the others, which share 2 tokens with them,
    # would save less as one group of four (3 x 2 = 6); "y" holds one prompt; [5, 6] shares nothing
    assert group_of[0] == group_of[1] and prefix_len[group_of[0]] == 8
    assert len(set(group_of)) == 5
    assert prefix_len[group_of[3]] == 8 and prefix_len[group_of[5]] == 1  # alone: all but the last token
    assert {prefix_len[group_of[2]], prefix_len[group_of[4]]} == {3, 4}
    for p, g in zip(prompts, group_of):  # every prompt keeps at least one token of its own
        assert 1 <= prefix_len[g] < len(p)
    # many prompts sharing a short prefix beat a pair sharing a longer one
    many = [[1, 2, 3, i] for i in range(10, 20)] + [[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 8]]
    group_of, prefix_len = shared_prefixes(many, ["x"] * len(many))
    assert len(set(group_of)) == 1 and prefix_len == [3]
    assert shared_prefixes([[1], [1, 2]], ["x", "x"]) == ([0, 1], [0, 0])  # a one-token prompt: no grouping


def test_prompts_with_a_shared_prefix_prefill_it_once(tiny_text_model):
    """Prompts of one adapter that begin alike (a long task text, then different answers to revise): the first
    forward holds one row per group of prompts (their shared prefix), the second the prompts' own tokens, and every
    prompt's greedy answer is the reference's, which prefills each prompt whole."""
    pool = _pool(tiny_text_model)
    task = "please read this long text about apples and pears, then answer: "
    prompts = [task + "abc", task + "what now", task + "x", "hello"]
    requests = [GenerationRequest("main", p, num_samples=2) for p in prompts] + \
        [GenerationRequest("aux", p) for p in prompts[:2]]
    out, shapes = _generate_with_forward_shapes(pool, requests, GenerationConfig(max_new_tokens=6, do_sample=False))
    encoded = [pool.encode_prompt("main", p) for p in prompts[:3]]
    prefix = len(os.path.commonprefix(encoded))
    assert prefix >= len(task)  # (one token per character) the chat template's opening and the task text
    # the prefixes: main's three task prompts, main's "hello" alone, aux's two task prompts
    assert shapes[0] == (3, max(prefix, len(pool.encode_prompt("main", "hello")) - 1))
    # the prompts' own tokens: 6 distinct prompts, as wide as the longest remainder
    assert shapes[1] == (6, max(len(e) for e in encoded) - prefix)
    for req, gens in zip(requests, out):
        expected = _hf_greedy(pool, req.agent, req.prompt, 6)
        for g in gens:
            _assert_greedy(pool, req, g.completion_ids, expected, 6)


@pytest.mark.parametrize("lean", [False, True])
def test_dropping_finished_rows_changes_no_other_row(tiny_text_model, lean):
    pool = _pool(tiny_text_model)
    model = pool.bases["base0"].get_base_model()
    tok = pool.tokenizer_of("aux")
    prompts = [pool.encode_prompt(a, p) for a in ("aux", "main") for p in ("a", "bb", "ccc d", "efg hij")]
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    adapters = ["aux"] * 4 + ["main"] * 4
    # an EOS list that makes rows stop at different steps: the first tokens the rows produce
    config = GenerationConfig(max_new_tokens=12, do_sample=False)
    with MultiAdapterBatch(model, adapters) as batch:
        free = decode(model, ids, mask, config, eos_ids=[], batch=batch, lean_step=LeanStep(model, batch) if lean else None)
    stops = sorted({row[3] for row in free})[:2]
    results = []
    for fraction in (0.0, 10.0):  # drop finished rows at once / never
        with MultiAdapterBatch(model, adapters) as batch:
            results.append(decode(model, ids, mask, config, eos_ids=stops, batch=batch, compact_fraction=fraction,
                                  lean_step=LeanStep(model, batch) if lean else None))
    assert results[0] == results[1]
    assert any(len(r) < 12 for r in results[0]) and any(len(r) == 12 for r in results[0])
    for row, full in zip(results[0], free):  # each row is the unstopped row cut at its first EOS
        assert row == full[:len(row)]


def _reference_kept(scores, config, seen):
    out = TemperatureLogitsWarper(config.temperature)(seen, scores.clone())
    if config.top_k:
        out = TopKLogitsWarper(config.top_k)(seen, out)
    if config.top_p < 1.0:
        out = TopPLogitsWarper(config.top_p)(seen, out)
    if config.min_p:
        out = MinPLogitsWarper(config.min_p)(seen, out)
    return torch.isfinite(out)


def _our_kept(scores, config):
    kept = torch.zeros_like(scores, dtype=torch.bool)
    for rows, values, ids in nucleus_candidates(scores / config.temperature, config):
        kept[rows[:, None], ids] = torch.isfinite(values)
    return kept


@pytest.mark.parametrize("top_k,top_p,min_p", [(0, 0.3, 0.0), (0, 0.9, 0.0), (0, 0.999, 0.0), (300, 0.9, 0.01),
                                               (20, 1.0, 0.0), (0, 1.0, 0.05)])
def test_truncation_keeps_the_tokens_transformers_processors_keep(top_k, top_p, min_p):
    torch.manual_seed(0)
    vocab = 500
    scores = torch.randn(16, vocab) * torch.linspace(0.2, 4.0, 16)[:, None]  # flat rows (large nuclei: the
    # escalation to more candidates and to the whole vocabulary) to peaked rows (a few candidates)
    seen = torch.randint(0, vocab, (16, 7))
    config = GenerationConfig(do_sample=True, temperature=0.7, top_k=top_k, top_p=top_p, min_p=min_p,
                              repetition_penalty=1.0)
    theirs = _reference_kept(scores, config, seen)
    ours = _our_kept(scores, config)
    differ = ours != theirs
    if differ.any():  # only float ties at the top-p boundary may differ: the mass above such a token is top_p
        probs = (scores / 0.7).softmax(-1)
        for r, t in differ.nonzero().tolist():
            above = probs[r][probs[r] > probs[r, t]].sum()
            assert abs(above - top_p) < 1e-4, (r, t)
    # draws only ever come from the kept tokens
    torch.manual_seed(1)
    draws = torch.stack([sample_next(scores, config, seen) for _ in range(200)], dim=1)
    assert bool(ours.gather(1, draws).all())


def test_draws_follow_the_truncated_distribution():
    torch.manual_seed(0)
    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]]).repeat(4000, 1)
    config = GenerationConfig(do_sample=True, temperature=1.0, top_p=0.9)
    draws = sample_next(scores, config)
    probs = scores[0].softmax(-1)
    # top-p 0.9 keeps tokens 0, 1, 2 (mass above token 2 is 0.84 < 0.9; above token 3 it is 0.97)
    expected = probs[:3] / probs[:3].sum()
    counts = torch.bincount(draws, minlength=5).float() / len(draws)
    assert counts[3:].sum() == 0
    assert torch.allclose(counts[:3], expected, atol=0.03)
    untruncated = sample_next(scores, GenerationConfig(do_sample=True, temperature=1.0))
    counts = torch.bincount(untruncated, minlength=5).float() / len(untruncated)
    assert torch.allclose(counts, probs, atol=0.03)


def test_greedy_and_suppressed_tokens_and_min_new_tokens():
    scores = torch.tensor([[0.0, 5.0, 1.0, 2.0], [3.0, 0.0, 1.0, 0.0]])
    greedy = GenerationConfig(do_sample=False, suppress_tokens=[1])
    assert sample_next(scores, greedy).tolist() == [3, 0]
    held = GenerationConfig(do_sample=False, min_new_tokens=2)
    assert sample_next(scores, held, step=0, eos_ids=[0]).tolist() == [1, 2]
    assert sample_next(scores, held, step=2, eos_ids=[0]).tolist() == [1, 0]


def test_unsupported_options_go_through_transformers_generate(tiny_text_model):
    pool = _pool(tiny_text_model)
    config = GenerationConfig(max_new_tokens=5, do_sample=False, no_repeat_ngram_size=2)
    out = pool.generate_many([GenerationRequest("aux", "abc")], config)
    assert out[0][0].completion_ids == _hf_greedy_with(pool, "aux", "abc", config)  # one path: transformers' own


def _hf_greedy_with(pool, agent, prompt, config):
    base = pool.activate(pool.policy_of(agent))
    ids = torch.tensor([pool.encode_prompt(agent, prompt)])
    full = GenerationConfig(**{**config.to_dict(), "eos_token_id": pool.eos_token_ids(agent),
                               "pad_token_id": pool.tokenizer_of(agent).pad_token_id})
    with torch.no_grad():
        out = base.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=full)
    comp = out[0, ids.size(1):].tolist()
    cut = next((i + 1 for i, t in enumerate(comp) if t in set(pool.eos_token_ids(agent))), None)
    return comp[:cut] if cut else comp


def test_dense_copy_computes_what_the_4bit_layer_computes(tiny_text_model):
    from trl_multiagent.generation.frozen_weights import _is_4bit

    quantized = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4, quantization="4bit")],
                          dense_copy="never")
    layer = next(m for m in quantized.bases["base0"].get_base_model().modules() if _is_4bit(m))
    x = torch.randn(3, 5, layer.in_features, requires_grad=True)
    expected = layer(x)
    (expected ** 2).sum().backward()
    expected_grad = x.grad.clone()
    x.grad = None
    got = torch.nn.functional.linear(x, dequantized_weight(layer))
    (got ** 2).sum().backward()
    # outputs: dot products of in_features terms; the input gradient sums out_features terms of each
    assert_same_computation(got, expected, terms=layer.in_features, what="4-bit layer outputs")
    assert_same_computation(x.grad, expected_grad, terms=layer.in_features + layer.out_features,
                            what="4-bit layer input gradients")
    # a whole team: the same greedy answers and the same loss gradients with and without the copy
    dense = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4, quantization="4bit")], dense_copy="always")
    assert dense.dense_copy_of("base0") and not quantized.dense_copy_of("base0")
    with torch.no_grad():
        for n, p in dense.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    lora = {n: p for n, p in dense.named_parameters() if "lora_" in n}
    with torch.no_grad():
        for n, p in quantized.named_parameters():
            if "lora_" in n:
                p.copy_(lora[n])
    config = GenerationConfig(max_new_tokens=6, do_sample=False)
    ids = torch.tensor([dense.encode_prompt("aux", "abc de")])

    def logits_after(prefix):  # the reference: the 4-bit layers themselves
        with torch.no_grad():
            return quantized("aux", input_ids=torch.tensor([ids[0].tolist() + prefix])).logits[0, -1]

    assert_same_greedy(dense.generate("aux", ["abc de"], 1, config)[0][0].completion_ids,
                       quantized.generate("aux", ["abc de"], 1, config)[0][0].completion_ids, logits_after,
                       terms=model_terms(ids.size(1) + 6), what="greedy answer with and without the copy")
    grads = []
    for pool in (dense, quantized):
        pool.zero_grad()
        pool("aux", input_ids=ids, labels=ids).loss.backward()
        grads.append([p.grad.clone() for p in pool.policy_parameters("aux")])
    assert_same_computation(grads[0], grads[1], terms=model_terms(ids.size(1)), what="LoRA gradients")


@pytest.mark.parametrize("quantization,dense_copy", [(None, "auto"), ("4bit", "always")])
def test_packed_frozen_linears_give_the_same_answers_as_f_linear(tiny_text_model, quantization, dense_copy,
                                                                 monkeypatch):
    from trl_multiagent.generation import frozen_weights

    monkeypatch.setattr(frozen_weights, "PACK_MIN_WEIGHTS", 0)  # the tiny model's layers are all small
    pool = _pool(tiny_text_model, quantization=quantization, dense_copy=dense_copy)
    (key,) = pool.bases
    if not frozen_weights.packing_available(pool.bases[key]):
        pytest.skip("this torch build has no oneDNN linear op")
    assert pool.packs_weights(key)
    model = pool.bases[key].get_base_model().eval()
    ids = torch.tensor([pool.encode_prompt("aux", "what is two plus two")])
    before = {name: m.__dict__.get("forward") for name, m in model.named_modules()}
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        with frozen_weights.PackedFrozenLinears(model) as packed:
            # every frozen linear is switched, the LM head included; the LoRA matrices are not
            names = {n for n, m in model.named_modules() if m in {mod for mod, _ in packed._patched}}
            assert "lm_head" in names and not any("lora_" in n for n in names)
            assert len(names) == sum(1 for m in model.modules() if frozen_weights.PackedFrozenLinears.frozen_weight(m)
                                     is not None)
            got = model(input_ids=ids).logits
    assert_same_computation(got, expected, terms=model_terms(ids.size(1)), what="packed logits")
    # leaving restores every layer's own forward (the 4-bit layers' de-quantised-copy forward included)
    assert {name: m.__dict__.get("forward") for name, m in model.named_modules()} == before
    # the decoding loop with packed weights: each row still gets its own agent's greedy answer
    prompts = ["abc", "hello there", "what is two plus two"]
    requests = [GenerationRequest(a, p) for p in prompts for a in ("aux", "main")]
    out = pool.generate_many(requests, GenerationConfig(max_new_tokens=8, do_sample=False))
    for req, gens in zip(requests, out):
        _assert_greedy(pool, req, gens[0].completion_ids, _hf_greedy(pool, req.agent, req.prompt, 8), 8)
    # under autograd the layers compute as before (the packed op has no derivative)
    with frozen_weights.PackedFrozenLinears(model):
        loss = model(input_ids=ids).logits.sum()
    loss.backward()
    assert any(p.grad is not None for n, p in model.named_parameters() if "lora_" in n)


def test_packed_frozen_linear_computes_x_wt_and_the_input_gradient_g_w():
    from trl_multiagent.generation import frozen_weights

    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        pytest.skip("this torch build has no oneDNN linear op")
    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 40).requires_grad_(False)
    x = torch.randn(2, 3, 24, requires_grad=True)
    g = torch.randn(2, 3, 40)
    packed = frozen_weights.packed_weight(layer, [layer.weight])
    y = frozen_weights._PackedFrozenLinear.apply(x, packed, layer.bias,
                                                lambda: frozen_weights.packed_transposed(layer, layer.weight))
    y.backward(g)
    w, b = layer.weight.double(), layer.bias.double()
    assert_same_computation(y, x.double() @ w.T + b, terms=24, what="x W^T + b")
    assert_same_computation(x.grad, g.double() @ w, terms=40, what="g W")
    # the transposed copy is kept on the layer and made again only when the weight changes
    first = frozen_weights.packed_transposed(layer, layer.weight)
    assert frozen_weights.packed_transposed(layer, layer.weight) is first
    layer.weight.mul_(2)
    assert frozen_weights.packed_transposed(layer, layer.weight) is not first


def test_packed_training_gives_the_loss_and_lora_gradients_of_f_linear(tiny_text_model, monkeypatch):
    from trl_multiagent.generation import frozen_weights

    monkeypatch.setattr(frozen_weights, "PACK_MIN_WEIGHTS", 0)  # the tiny model's layers are all small
    pool = _pool(tiny_text_model)
    (key,) = pool.bases
    if not frozen_weights.packing_available(pool.bases[key]):
        pytest.skip("this torch build has no oneDNN linear op")
    assert pool.packs_training(key)
    model = pool.bases[key].get_base_model()
    frozen = [m for m in model.modules() if frozen_weights.PackedFrozenLinears.frozen_weight(m) is not None]
    transposed = []
    original = frozen_weights.packed_transposed
    monkeypatch.setattr(frozen_weights, "packed_transposed",
                        lambda module, weight, *dtype: transposed.append(module) or original(module, weight, *dtype))
    ids = torch.tensor([pool.encode_prompt("aux", "what is two plus two"), pool.encode_prompt("aux", "hi there, ab cd efgh")])
    results = {}
    for packs in (False, True):
        pool.paths[key].packed_training = packs
        pool.zero_grad()
        loss = pool("aux", input_ids=ids, labels=ids).loss
        loss.backward()
        results[packs] = (loss.detach(), [p.grad.clone() for p in pool.policy_parameters("aux")])
    terms = model_terms(ids.numel())
    assert_same_computation(results[True][0], results[False][0], terms=terms, what="loss")
    assert_same_computation(results[True][1], results[False][1], terms=terms, what="LoRA gradients")
    assert any(g.abs().sum() > 0 for g in results[True][1])
    # the backward ran through the packed transposed copies: every frozen linear but layer 0's q, k and v, whose
    # input (the normalised embeddings) needs no gradient
    layer0 = model.model.layers[0].self_attn
    inputs_without_gradient = {id(getattr(layer0, n).base_layer) for n in ("q_proj", "k_proj", "v_proj")}
    assert {id(m) for m in transposed} == {id(m) for m in frozen} - inputs_without_gradient
    # and the layers compute with their own forward again afterwards
    assert all("forward" not in m.__dict__ for m in frozen)


def test_prefill_computes_with_the_training_copies_only_where_training_packs(tiny_text_model, monkeypatch):
    """The lean step packs q/k/v and gate/up concatenated; the prefill computes those layers with per-layer packed
    copies only where the teacher-forced passes make them anyway (packs_training), and training then reuses the very
    copies the prefill made. Both ways sample the same greedy tokens."""
    from trl_multiagent.generation import frozen_weights
    from trl_multiagent.generation.lean_step import LeanStep

    monkeypatch.setattr(frozen_weights, "PACK_MIN_WEIGHTS", 0)  # the tiny model's layers are all small
    requests = [GenerationRequest(a, p, num_samples=2) for p in ("abc", "what is two plus two") for a in ("aux", "main")]
    outputs, copies = {}, {}
    for packs in (False, True):
        torch.manual_seed(1)
        pool = _pool(tiny_text_model)
        (key,) = pool.bases
        model = pool.bases[key].get_base_model()
        if not frozen_weights.packing_available(model):
            pytest.skip("this torch build has no oneDNN linear op")
        assert pool.packs_weights(key) and pool.lean_decodes(key) and pool.packs_training(key)
        pool.paths[key].packed_training = packs
        out = pool.generate_many(requests, GenerationConfig(max_new_tokens=6, do_sample=False))
        outputs[packs] = [g.completion_ids for gens in out for g in gens]
        concatenated = LeanStep.concatenated_modules(model)
        others = [m for m in model.modules() if frozen_weights.PackedFrozenLinears.frozen_weight(m) is not None
                  and all(m is not c for c in concatenated)]
        assert len(concatenated) == 5 * model.config.num_hidden_layers and others
        # the layers outside the concatenations are packed per layer either way; q/k/v, gate and up only with training
        assert all("_trl_multiagent_packed" in m.__dict__ for m in others)
        assert [("_trl_multiagent_packed" in m.__dict__) for m in concatenated] == [packs] * len(concatenated)
        copies[packs] = {id(m): m.__dict__.get("_trl_multiagent_packed", (None, None))[1] for m in concatenated}
        if packs:  # a training pass computes with the copies the prefill made, not new ones
            ids = torch.tensor([pool.encode_prompt("aux", "what is two plus two")])
            pool("aux", input_ids=ids, labels=ids).loss.backward()
            assert all(m.__dict__["_trl_multiagent_packed"][1] is copies[True][id(m)] for m in concatenated)
    assert outputs[True] == outputs[False] and all(len(c) > 0 for c in outputs[True])


def test_prefill_buckets_minimise_padded_positions_exactly():
    from itertools import combinations

    from trl_multiagent.generation import prefill_buckets

    lengths = [5, 50, 6, 48, 7, 5, 49, 51, 6, 30]
    buckets = prefill_buckets(lengths, min_rows=2, overhead=3)
    # every row once, each bucket as wide as its longest row, at least 2 rows each
    assert sorted(r for rows, _ in buckets for r in rows) == list(range(len(lengths)))
    assert all(len(rows) >= 2 and width == max(lengths[r] for r in rows) for rows, width in buckets)
    cost = sum(len(rows) * width + 3 for rows, width in buckets)
    # brute force over every split of the sorted rows into runs of at least 2
    ordered = sorted(lengths)
    best = None
    for k in range(0, len(ordered)):
        for cuts in combinations(range(2, len(ordered) - 1), k):
            bounds = [0, *cuts, len(ordered)]
            runs = [ordered[a:b] for a, b in zip(bounds, bounds[1:])]
            if all(len(r) >= 2 for r in runs):
                c = sum(len(r) * max(r) + 3 for r in runs)
                best = c if best is None else min(best, c)
    assert cost == best < len(lengths) * max(lengths) + 3
    # too few rows, or nothing to gain: one bucket in the original order
    assert prefill_buckets([5, 50, 6], min_rows=2) == [([0, 1, 2], 50)]
    assert prefill_buckets([7] * 40, min_rows=2, overhead=1) == [(list(range(40)), 7)]


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_bucketed_prefill_gives_every_row_its_greedy_answer_and_pads_less(tiny_text_model, shared_prefix,
                                                                          monkeypatch):
    """Prompts of very different lengths (short questions and long texts, two adapters and the base): the prefill
    runs in buckets no wider than their longest prompt, and every row's greedy answer is HF generate's."""
    from trl_multiagent.generation import decoding

    monkeypatch.setattr(decoding, "PREFILL_BUCKET_MIN_ROWS", 3)
    pool = _pool(tiny_text_model)
    task = "please read this long text about apples and pears and plums, then answer: " if shared_prefix else ""
    short = [task + w for w in ("a", "bc", "hey", "x y")]
    long = [task + "a much longer prompt that goes on " * 2 + w for w in ("and on", "for a while", "to the end")]
    requests = [GenerationRequest(a, p, num_samples=2) for p in short + long for a in ("aux", "main")]
    requests += [GenerationRequest("main", p, use_adapter=False) for p in (short[0], long[0])]
    out, shapes = _generate_with_forward_shapes(pool, requests, GenerationConfig(max_new_tokens=5, do_sample=False))
    for req, gens in zip(requests, out):
        expected = _hf_greedy(pool, req.agent, req.prompt, 5, use_adapter=req.use_adapter)
        for g in gens:
            _assert_greedy(pool, req, g.completion_ids, expected, 5)
    prefills = [s for s in shapes if s[1] > 1]
    widest = max(len(pool.encode_prompt("main", p)) for p in long)
    # more than one prefill of the prompts' own tokens, and the short prompts' bucket is narrow
    own = prefills[1:] if shared_prefix else prefills
    assert len(own) >= 2 and sum(rows for rows, _ in own) == len(short + long) * 2 + 2
    assert min(width for _, width in own) < widest // 2


def test_the_decoding_loop_refuses_a_transformers_older_than_its_pin(monkeypatch):
    import transformers

    from trl_multiagent.generation import check_transformers_for_decode, generate_team

    check_transformers_for_decode("5.24.0")
    check_transformers_for_decode("6.0.1")
    with pytest.raises(RuntimeError, match=r"needs transformers >= 5\.24, this environment has 5\.19\.0.*use_vllm"):
        check_transformers_for_decode("5.19.0")
    monkeypatch.setattr(transformers, "__version__", "5.19.0")
    with pytest.raises(RuntimeError, match="decoding loop needs transformers"):
        generate_team(None, [], GenerationConfig(max_new_tokens=1))  # refused before anything is encoded


def test_sampling_order_puts_rows_back_in_their_original_order():
    assert sampling_order(torch.tensor([0, 1, 5])) is None
    assert sampling_order(torch.tensor([3])) is None
    assert sampling_order(torch.tensor([2, 0, 3, 1])).tolist() == [1, 3, 0, 2]  # rows holding 0, 1, 2, 3


@pytest.mark.parametrize("lean", [False, True])
def test_rows_of_several_adapters_decode_sorted_by_adapter_and_sample_in_their_order(tiny_text_model, monkeypatch,
                                                                                      lean):
    """Rows of two adapters in mixed order (as many each) decode sorted by adapter, each adapter's rows one block the
    LoRA deltas view in place; the sampler still sees them in their original order: a stand-in sampler that answers
    each row with its place in the sampler's batch gives row r the token 3 + r."""
    import trl_multiagent.generation.decoding as decoding

    pool = _pool(tiny_text_model)
    model = pool.bases["base0"].get_base_model()
    tok = pool.tokenizer_of("aux")
    adapters = ["aux", "main", "main", "aux", "aux", "main"]
    prompts = [pool.encode_prompt(a, p) for a, p in zip(adapters, ("a", "bb", "ccc d", "efg hij", "k", "lm"))]
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    seen_blocks = []
    monkeypatch.setattr(decoding, "sample_next",
                        lambda logits, *a, **k: 3 + torch.arange(logits.size(0)))
    step_call = LeanStep.__call__

    def spy(self, *args, **kwargs):
        seen_blocks.append((self.batch.row_index.tolist(), self.batch.blocks.in_place))
        return step_call(self, *args, **kwargs)

    monkeypatch.setattr(LeanStep, "__call__", spy)
    import trl_multiagent.generation.lean_step as lean_step

    block_calls = []
    add_block_lora = lean_step.add_block_lora
    monkeypatch.setattr(lean_step, "add_block_lora", lambda *a, **k: block_calls.append(1) or add_block_lora(*a, **k))
    with MultiAdapterBatch(model, adapters) as batch:
        out = decode(model, ids, mask, GenerationConfig(max_new_tokens=3, do_sample=True), eos_ids=[], batch=batch,
                     lean_step=LeanStep(model, batch) if lean else None)
    assert out == [[3 + r] * 3 for r in range(6)]
    if lean:  # the steps ran on the rows sorted by adapter, their LoRA in blocks viewed in place (2 steps x 4 groups x each layer)
        assert seen_blocks == [([0, 0, 0, 1, 1, 1], True)] * 2
        assert len(block_calls) == 2 * 4 * model.config.num_hidden_layers


def test_mixed_order_rows_of_several_adapters_give_each_agents_greedy_answer(tiny_text_model):
    """Every row with an adapter, agents in mixed order (the rows sorted by adapter for the decoding steps, the
    prefill's LoRA in blocks gathered by index): each answer is its agent's own."""
    pool = _pool(tiny_text_model, agents=("aux", "main", "third"))
    prompts = ["abc", "hello there", "x", "what is two plus two"]
    requests = [GenerationRequest(a, p) for p in prompts for a in ("main", "third", "aux")]
    out = pool.generate_many(requests, GenerationConfig(max_new_tokens=8, do_sample=False))
    for req, gens in zip(requests, out):
        _assert_greedy(pool, req, gens[0].completion_ids, _hf_greedy(pool, req.agent, req.prompt, 8), 8)


def test_the_cache_rows_move_once_per_forward(tiny_text_model, monkeypatch):
    """Two agents in mixed order, two samples per prompt, a shared prefix and prompts in several prefill buckets:
    the prefixes' cache rows go to their prompts in bucket order in one copy, and the prompts' rows to their samples
    sorted by adapter in another (each copy moves every layer's whole cache), and every answer is its agent's own
    greedy answer."""
    from trl_multiagent.generation import decoding

    monkeypatch.setattr(decoding, "PREFILL_BUCKET_MIN_ROWS", 2)
    made = decoding.preallocated_cache
    moves = []

    def counted(model, capacity):
        cache = made(model, capacity)
        select = cache.batch_select_indices
        cache.batch_select_indices = lambda indices: moves.append(indices.numel()) or select(indices)
        return cache

    monkeypatch.setattr(decoding, "preallocated_cache", counted)
    pool = _pool(tiny_text_model)
    task = "please read this text about apples and pears, then answer: "
    prompts = [task + w for w in ("a", "what is it", "a much longer question that goes on and on", "x")]
    # the buckets ("a", "x") and the two longer prompts put the agents in mixed order: main aux aux main
    requests = [GenerationRequest(a, p, num_samples=2) for p, a in zip(prompts, ("main", "aux", "main", "aux"))]
    config = GenerationConfig(max_new_tokens=4, min_new_tokens=4, do_sample=False)  # no row leaves the batch early
    out = pool.generate_many(requests, config)
    for req, gens in zip(requests, out):
        expected = _hf_greedy_with(pool, req.agent, req.prompt, config)
        for g in gens:
            _assert_greedy(pool, req, g.completion_ids, expected, 4)
    # the 4 prompts' rows from their prefixes, then the 8 samples' rows from their prompts (one copy each where
    # there were two: prefixes to prompts, prompts to buckets; prompts to samples, samples sorted by adapter)
    assert moves == [4, 8]


def test_prefill_rows_of_several_adapters_are_grouped_into_blocks_in_place(tiny_text_model, monkeypatch):
    """Prompts of two agents in mixed order, as many each: the prefill runs them grouped by adapter, so every LoRA
    layer views the rows as blocks in place (no gather into blocks and back), and each answer is its agent's own."""
    from trl_multiagent.generation import lora_batch

    calls = []
    add = lora_batch.add_block_lora
    monkeypatch.setattr(lora_batch, "add_block_lora",
                        lambda y, x, blocks, *a: calls.append((x.dim(), blocks.in_place)) or add(y, x, blocks, *a))
    pool = _pool(tiny_text_model)
    agents = ("main", "aux", "main", "aux")
    prompts = ("a", "bc", "what is it", "x y")
    requests = [GenerationRequest(a, p) for a, p in zip(agents, prompts)]
    config = GenerationConfig(max_new_tokens=3, min_new_tokens=3, do_sample=False)
    out = pool.generate_many(requests, config)
    for req, gens in zip(requests, out):
        _assert_greedy(pool, req, gens[0].completion_ids, _hf_greedy_with(pool, req.agent, req.prompt, config), 3)
    prefill = [in_place for dim, in_place in calls if dim == 3]  # (rows, positions, features): the prefill's calls
    assert prefill and all(prefill)
