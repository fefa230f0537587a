"""The one log-prob path (trl_multiagent/generation/logprobs.py): sharing a prompt among its completions changes neither the
log-probs nor their gradients, and both equal a plain per-row computation.

The tiny model runs in float64 and the paths are compared with a tolerance derived from the number of summed terms
(tests/numerics.py): the sums run in another order in each path, and in another order again on another CPU."""

import functools
import math

import pytest
import torch

from trl_multiagent.generation import teacher_forcing
from trl_multiagent.generation.logprobs import completion_logps, head_block_rows, token_logps_and_entropies
from trl_multiagent.team.critics import CriticSpec
from trl_multiagent.team.pool import AgentPool, AgentSpec

from .numerics import assert_same_computation
from .tiny import model_terms


def _batch(pool, prompts, completions):
    tok = pool.tokenizer_of("aux")
    enc = [pool.encode_prompt("aux", p) for p in prompts]
    comp = [tok(c, add_special_tokens=False)["input_ids"] for c in completions]
    p_len, c_len = max(map(len, enc)), max(map(len, comp))
    pad = tok.pad_token_id
    prompt_ids = torch.tensor([[pad] * (p_len - len(e)) + e for e in enc])
    prompt_mask = torch.tensor([[0] * (p_len - len(e)) + [1] * len(e) for e in enc])
    completion_ids = torch.tensor([c + [pad] * (c_len - len(c)) for c in comp])
    completion_mask = torch.tensor([[1] * len(c) + [0] * (c_len - len(c)) for c in comp])
    return prompt_ids, prompt_mask, completion_ids, completion_mask, enc, comp


def _by_hand(pool, enc, comp, temperature):
    """One row at a time, no padding: log softmax(logits / T) of each completion token."""
    rows = []
    for e, c in zip(enc, comp):
        logits = pool("aux", input_ids=torch.tensor([e + c])).logits[0, len(e) - 1:len(e) + len(c) - 1]
        rows.append(torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(c)[:, None])[:, 0])
    return rows


def _terms(prompt_ids, completion_ids) -> int:
    """Summed terms behind the batch's log-probs and their gradients (a LoRA gradient sums over every position)."""
    return model_terms(prompt_ids.numel() + completion_ids.numel())


def _randomise_lora(pool, marker: str = "lora_B", std: float = 0.3):
    """Non-zero LoRA B matrices (zero at init), so that the adapters change the outputs and receive gradients."""
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in pool.named_parameters():
            if marker in n:
                p.normal_(0, std)


def test_shared_prompts_give_the_same_logps_and_gradients(tiny_text_model):
    pool = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4)], dtype="float64")
    _randomise_lora(pool)
    prompts = ["what is one plus one", "hi", "what is one plus one", "hi", "what is one plus one"]
    completions = ["two.", "hello there", "2", "yo", "it is two, i think"]
    prompt_ids, prompt_mask, completion_ids, completion_mask, enc, comp = _batch(pool, prompts, completions)
    model = functools.partial(pool, "aux")
    results = {}
    for share in (True, False):
        pool.zero_grad()
        logps, entropies = completion_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, 0.7,
                                            compute_entropy=True, share_prompts=share)
        (logps * completion_mask).sum().backward()
        grads = [p.grad.clone() for p in pool.policy_parameters("aux")]
        results[share] = (logps.detach(), entropies, grads)
    shared, separate = results[True], results[False]
    mask = completion_mask.bool()
    terms = _terms(prompt_ids, completion_ids)
    assert_same_computation(shared[0][mask], separate[0][mask], terms=terms, what="logps")
    assert_same_computation(shared[1][mask], separate[1][mask], terms=terms, what="entropies")
    assert_same_computation(shared[2], separate[2], terms=terms, what="LoRA gradients")
    assert any(g.abs().sum() > 0 for g in shared[2])
    with torch.no_grad():
        hand = _by_hand(pool, enc, comp, 0.7)
    assert_same_computation([shared[0][row, :len(e)] for row, e in enumerate(hand)], hand, terms=terms,
                            what="logps vs one row at a time")


# A shared opening (as a system message and worked examples give): prompts that differ only after it.
OPENING = "you answer with one number. example: two and two is 4. example: one and three is 4. now: "
PREFIX_PROMPTS = [OPENING + "what is one plus one", OPENING + "hi", OPENING + "what is one plus one",
                  OPENING + "two and five", "no opening here"]
PREFIX_COMPLETIONS = ["two.", "hello there", "2", "it is 7", "ok"]


@pytest.mark.parametrize("call_cost", [None, 0, 16])
def test_a_shared_prompt_prefix_runs_once_with_the_same_logps_and_gradients(tiny_text_model, monkeypatch, call_cost):
    """``call_cost`` 0: every distinct rest length and completion length runs in a call of its own (no padding); 16:
    two calls per stage; the default: one."""
    if call_cost is not None:
        monkeypatch.setattr(teacher_forcing, "CALL_COST_POSITIONS", call_cost)
    pool = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4)], dtype="float64")
    _randomise_lora(pool)
    prompt_ids, prompt_mask, completion_ids, completion_mask, enc, comp = _batch(pool, PREFIX_PROMPTS,
                                                                                  PREFIX_COMPLETIONS)
    calls, computed = [], []

    def model(**inputs):
        calls.append(int(inputs["attention_mask"][:, -inputs["input_ids"].size(1):].sum()))  # tokens run this call
        computed.append((inputs["input_ids"].numel(), calls[-1]))  # positions computed (padding included), real ones
        return pool("aux", **inputs)

    results = {}
    for share in (True, False):
        pool.zero_grad()
        calls.clear()
        computed.clear()
        logps, _ = completion_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, 0.7,
                                    share_prompts=share)
        (logps * completion_mask).sum().backward()
        results[share] = (logps.detach(), [p.grad.clone() for p in pool.policy_parameters("aux")], sum(calls),
                          list(computed))
    shared, separate = results[True], results[False]
    mask = completion_mask.bool()
    terms = _terms(prompt_ids, completion_ids)
    assert_same_computation(shared[0][mask], separate[0][mask], terms=terms, what="logps")
    assert_same_computation(shared[1], separate[1], terms=terms, what="LoRA gradients")
    assert any(g.abs().sum() > 0 for g in shared[1])
    with torch.no_grad():
        hand = _by_hand(pool, enc, comp, 0.7)
    assert_same_computation([shared[0][row, :len(e)] for row, e in enumerate(hand)], hand, terms=terms,
                            what="logps vs one row at a time")
    # tokens run: every row's prompt and completion without sharing; with it, the opening once (the four prompts
    # that start with it share at least its tokens), each of the four distinct prompts' rest once, and every completion
    assert separate[2] == sum(len(e) + len(c) for e, c in zip(enc, comp))
    distinct = list(dict.fromkeys(tuple(e) for e in enc))
    assert shared[2] == sum(len(p) for p in distinct) - 2 * _common(distinct[:3]) + sum(map(len, comp))
    # the calls after the prefixes' one: the rests of the 4 distinct prompts (20, 2, 12 tokens after the opening; the
    # prompt without it, alone in its group, keeps its last token: 1) and the 5 completions, grouped by length
    rests = [len(p) - _common(distinct[:3]) for p in distinct[:3]] + [1]
    assert (rests, [len(c) for c in comp]) == ([20, 2, 12, 1], [4, 11, 1, 7, 2])
    if call_cost == 0:  # no cost per call: each length alone, not one padded position
        assert shared[3][1:] == [(1, 1), (2, 2), (12, 12), (20, 20), (1, 1), (2, 2), (4, 4), (7, 7), (11, 11)]
    elif call_cost == 16:  # rests {1, 2} {12, 20} (2x2 + 2x20 + 2x16 = 76 against 4x20 + 16 = 96 in one call),
        # completions {1, 2, 4} {7, 11} (3x4 + 2x11 + 32 = 66 against 5x11 + 16 = 71)
        assert shared[3][1:] == [(4, 3), (40, 32), (12, 7), (22, 18)]
    else:  # the default, 40 per call: one call per stage (rests 4x20 + 40 = 120 against 124 for {1, 2} {12, 20};
        # completions 5x11 + 40 = 95 against 114 for {1, 2, 4} {7, 11})
        assert shared[3][1:] == [(80, 35), (55, 25)]


def test_the_samples_of_one_prompt_run_it_once_in_one_call(tiny_text_model):
    """K samples of one prompt (no second prompt to share a prefix with): the prompt in one call, the completions in
    another, and the log-probs and gradients of separate passes."""
    pool = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4)], dtype="float64")
    _randomise_lora(pool)
    prompt_ids, prompt_mask, completion_ids, completion_mask, enc, comp = _batch(
        pool, ["what is one plus one"] * 3, ["two.", "2", "it is two"])
    calls = []

    def model(**inputs):
        calls.append(tuple(inputs["input_ids"].shape))
        return pool("aux", **inputs)

    logps, _ = completion_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, 0.7)
    (logps * completion_mask).sum().backward()
    grads = [p.grad.clone() for p in pool.policy_parameters("aux")]
    assert calls == [(1, len(enc[0])), (3, max(map(len, comp)))]
    pool.zero_grad()
    plain, _ = completion_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, 0.7,
                                share_prompts=False)
    (plain * completion_mask).sum().backward()
    mask = completion_mask.bool()
    terms = _terms(prompt_ids, completion_ids)
    assert_same_computation(logps.detach()[mask], plain.detach()[mask], terms=terms, what="logps")
    assert_same_computation(grads, [p.grad for p in pool.policy_parameters("aux")], terms=terms, what="gradients")


def _common(rows):
    """The common leading tokens of ``rows`` (all longer than it)."""
    n = 0
    while all(len(r) > n + 1 for r in rows) and len({r[n] for r in rows}) == 1:
        n += 1
    return n


def test_critic_values_after_a_shared_prefix_equal_the_plain_values_and_their_gradients(tiny_text_model):
    pool = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4)], dtype="float64",
                     critics=[CriticSpec("judge", agent="aux", lora_r=4, num_heads=2)])
    _randomise_lora(pool, ".lora_B.judge.")
    with torch.no_grad():
        pool.value_heads["judge"].linear.weight.normal_(0, 0.1)
    prompt_ids, prompt_mask, completion_ids, completion_mask, enc, comp = _batch(pool, PREFIX_PROMPTS,
                                                                                  PREFIX_COMPLETIONS)
    head = torch.tensor([0, 1, 1, 0, 1])
    targets = torch.linspace(-1, 1, completion_ids.numel()).view_as(completion_ids)
    results = {}
    for share in (True, False, "plain"):
        pool.zero_grad()
        if share == "plain":  # the values of every position, read at the columns before each completion token
            full = pool.values("judge", torch.cat([prompt_ids, completion_ids], 1),
                               torch.cat([prompt_mask, completion_mask], 1), head=head)
            values = full[:, prompt_ids.size(1) - 1:-1]
        else:
            values = pool.completion_values("judge", prompt_ids, prompt_mask, completion_ids, completion_mask,
                                            head=head, share_prompts=share)
        ((values - targets).pow(2) * completion_mask).sum().backward()
        results[share] = (values.detach(), [p.grad.clone() for p in pool.critic_parameters("judge")])
    mask = completion_mask.bool()
    terms = _terms(prompt_ids, completion_ids)
    for share in (True, False):
        assert_same_computation(results[share][0][mask], results["plain"][0][mask], terms=terms, what="values")
        assert_same_computation(results[share][1], results["plain"][1], terms=terms, what="critic gradients")
    assert all(g.abs().sum() > 0 for g in results[True][1])
    assert all(p.grad is None for p in pool.policy_parameters("aux"))  # only the critic's adapter and head


def test_activation_checkpointing_keeps_no_cache_so_the_prompts_run_in_full(tiny_text_model):
    """transformers drops the KV cache under activation checkpointing in training mode; the log-probs and their
    gradients are then those of the plain pass (the shared stages are not used)."""
    pool = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4)], dtype="float64")
    _randomise_lora(pool)
    batch = _batch(pool, PREFIX_PROMPTS, PREFIX_COMPLETIONS)[:4]
    model = functools.partial(pool, "aux")
    plain, _ = completion_logps(model, *batch, 0.7, share_prompts=False)
    (plain * batch[3]).sum().backward()
    expected = [p.grad.clone() for p in pool.policy_parameters("aux")]
    pool.zero_grad()
    pool.activation_checkpointing_enable()
    for base in pool.bases.values():
        base.train()
    logps, _ = completion_logps(model, *batch, 0.7)
    (logps * batch[3]).sum().backward()
    mask = batch[3].bool()
    terms = _terms(batch[0], batch[2])
    assert_same_computation(logps[mask], plain[mask], terms=terms, what="logps")
    assert_same_computation([p.grad for p in pool.policy_parameters("aux")], expected, terms=terms,
                            what="LoRA gradients")


def test_a_prefix_stored_for_all_micro_batches_gives_the_gradient_of_running_it_in_each(tiny_text_model):
    """PrefixStore: the prefix several prompts share runs once for two micro-batches, the gradients gathered on its
    keys and values are sent back once, and logps and LoRA gradients equal the micro-batches each running it, and
    one plain pass per row."""
    from trl_multiagent.generation.teacher_forcing import PrefixStore, lm_forward

    pool = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4)], dtype="float64")
    _randomise_lora(pool)
    opening = "you are a careful helper. answer in one word. "
    micro_batches = [(["what is one plus one", "what is two plus two"], ["two.", "four"]),
                     (["what is three plus three", "what is one plus one"], ["six!", "2"])]
    params = pool.policy_parameters("aux")
    model = functools.partial(pool, "aux")
    batches = [_batch(pool, [opening + q for q in qs], cs) for qs, cs in micro_batches]

    def passes(store=None, share=True):
        """Every micro-batch's log-probs, each sent backward; the gradients gather on the adapter (and the store)."""
        logps = []
        for prompt_ids, prompt_mask, completion_ids, completion_mask, _, _ in batches:
            lp, _ = completion_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, 0.7,
                                     share_prompts=share, prefix_store=store)
            (lp * completion_mask).sum().backward()
            logps.append(lp[completion_mask.bool()])
        return torch.cat(logps).detach()

    results = {}
    for stored in (False, True):
        pool.zero_grad()
        store = PrefixStore.build(lm_forward(model), [e for b in batches for e in b[4]], torch.device("cpu")) \
            if stored else None
        if stored:  # the opening (and the chat tokens before it): one prefix, shared by all three prompts
            (prefix,) = store.prefixes
            assert all(list(prefix) == e[:len(prefix)] for b in batches for e in b[4])
        logps = passes(store)
        if stored:  # the prefix's share of the gradient waits on its stored keys and values...
            assert all(leaf.grad is not None for layer in store.prefixes[prefix] for leaf in layer)
            before = [p.grad.clone() for p in params]
            store.backward()  # ...until the store sends it back, once, and lets its graph go
            assert any(not torch.equal(a, p.grad) for a, p in zip(before, params)) and not store.prefixes
        results[stored] = (logps, [p.grad.clone() for p in params])
    pool.zero_grad()  # and both equal one plain pass per row (the pool's model packs: the other two run packed)
    results["plain"] = (passes(share=False), [p.grad.clone() for p in params])
    terms = sum(_terms(b[0], b[2]) for b in batches)
    for way in (True, "plain"):
        assert_same_computation(results[way][0], results[False][0], terms=terms, what=f"logps ({way})")
        assert_same_computation(results[way][1], results[False][1], terms=terms, what=f"LoRA gradients ({way})")


def test_token_logps_and_entropies_by_hand_on_three_tokens():
    """softmax(log [1, 2, 3]) = [1/6, 1/3, 1/2]: log-prob, entropy and both gradients written out by hand."""
    p = torch.tensor([1 / 6, 1 / 3, 1 / 2], dtype=torch.float64)
    temperature = 0.5
    logits = (torch.log(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)) * temperature).view(1, 1, 3)
    logits.requires_grad_()
    logps, entropies = token_logps_and_entropies(logits, torch.tensor([[2]]), temperature)
    entropy = -(1 / 6 * math.log(1 / 6) + 1 / 3 * math.log(1 / 3) + 1 / 2 * math.log(1 / 2))
    assert logps.item() == pytest.approx(math.log(1 / 2), abs=1e-14)
    assert entropies.item() == pytest.approx(entropy, abs=1e-14)
    # d logp / d logits = (onehot - p) / T; d H / d logits = -p (log p + H) / T
    (grad_logp,) = torch.autograd.grad(logps.sum(), logits, retain_graph=True)
    (grad_h,) = torch.autograd.grad(entropies.sum(), logits)
    assert torch.allclose(grad_logp.view(3), (torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64) - p) / temperature,
                          atol=1e-14)
    assert torch.allclose(grad_h.view(3), -p * (p.log() + entropy) / temperature, atol=1e-14)


@pytest.mark.parametrize("block_rows", [1, 4, 7, 1000])
def test_token_logps_and_entropies_in_blocks_equal_the_whole_tensor_formulas(block_rows):
    """Every block size gives the whole-tensor log_softmax's values and autograd's gradients of any weighted sum of
    log-probs and entropies (float64, so the only difference is the summation order)."""
    torch.manual_seed(0)
    logits = (torch.randn(3, 5, 50, dtype=torch.float64) * 3).requires_grad_()
    ids = torch.randint(0, 50, (3, 5))
    weights_lp, weights_h = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    logps_all = torch.log_softmax(logits / 0.7, -1)
    expected = (logps_all.gather(-1, ids[..., None])[..., 0], -(logps_all.exp() * logps_all).sum(-1))
    got = token_logps_and_entropies(logits, ids, 0.7, block_rows=block_rows)
    for a, b in zip(got, expected):
        assert a.dtype == torch.float64 and torch.allclose(a, b, rtol=0, atol=1e-12)
    for objective in (lambda lp, h: (lp * weights_lp).sum(), lambda lp, h: (h * weights_h).sum(),
                      lambda lp, h: (lp * weights_lp).sum() + (h * weights_h).sum()):
        (want,) = torch.autograd.grad(objective(*expected), logits, retain_graph=True)
        (have,) = torch.autograd.grad(objective(*got), logits, retain_graph=True)
        assert torch.allclose(have, want, rtol=0, atol=1e-12)


def test_a_slice_of_the_logits_is_normalised_in_place_with_the_gradient_reaching_the_whole():
    """The completion stage hands the head ``outputs[:, :-1]``, which no (rows, V) view covers: same values, and the
    gradient lands on the sliced positions of the whole tensor (zero on the dropped last position)."""
    torch.manual_seed(1)
    whole = (torch.randn(3, 6, 50, dtype=torch.float64) * 3).requires_grad_()
    ids = torch.randint(0, 50, (3, 5))
    logps, entropies = token_logps_and_entropies(whole[:, :-1], ids, 0.7, block_rows=2)
    logps_all = torch.log_softmax(whole[:, :-1] / 0.7, -1)
    want = logps_all.gather(-1, ids[..., None])[..., 0], -(logps_all.exp() * logps_all).sum(-1)
    assert torch.allclose(logps, want[0], rtol=0, atol=1e-12) and torch.allclose(entropies, want[1], rtol=0, atol=1e-12)
    (have,) = torch.autograd.grad(logps.sum() + entropies.sum(), whole)
    (expected,) = torch.autograd.grad(want[0].sum() + want[1].sum(), whole)
    assert torch.allclose(have, expected, rtol=0, atol=1e-12) and not have[:, -1].any()


def test_half_precision_logits_are_normalised_in_float32():
    """bfloat16 logits: float32 log-probs and entropies equal to those of the same logits cast to float32, and a
    bfloat16 gradient equal to float32's rounded (within float32 rounding, and bfloat16's half step: 2^-8 relative)."""
    torch.manual_seed(0)
    logits = (torch.randn(2, 3, 40) * 2).to(torch.bfloat16).requires_grad_()
    ids = torch.randint(0, 40, (2, 3))
    wide = logits.detach().float().requires_grad_()
    logps, entropies = token_logps_and_entropies(logits, ids, 0.7, block_rows=2)
    want_lp, want_h = token_logps_and_entropies(wide, ids, 0.7)
    assert logps.dtype == entropies.dtype == torch.float32
    torch.testing.assert_close(logps, want_lp, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(entropies, want_h, rtol=1e-6, atol=1e-6)
    logps.sum().backward()
    want_lp.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    torch.testing.assert_close(logits.grad.float(), wide.grad, rtol=2**-8, atol=1e-7)


def test_the_default_block_is_a_cache_on_the_cpu_and_a_memory_bound_elsewhere():
    """2 MiB of float32 rows on the CPU (49,152-token vocabulary: 2,097,152 // 196,608 = 10 rows), 512 MiB on a GPU
    (32,000 tokens: 536,870,912 // 128,000 = 4,194 rows), never less than one row; no GPU is needed to ask."""
    assert head_block_rows("cpu", 49152) == 10
    assert head_block_rows(torch.device("cuda", 0), 32000) == 4194
    assert head_block_rows("mps", 32000) == 4194
    assert head_block_rows("cpu", 10**9) == 1


def test_token_logps_and_entropies_refuse_bad_input():
    logits = torch.zeros(2, 3, 5)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logps_and_entropies(logits, torch.zeros(2, 3, dtype=torch.long), 0.0)
    with pytest.raises(ValueError, match=r"token_ids \(2, 4\) must have the logits' shape"):
        token_logps_and_entropies(logits, torch.zeros(2, 4, dtype=torch.long), 1.0)
