"""The one log-prob path (trl_multiagent/logprobs.py): sharing a prompt among its completions changes neither the
log-probs nor their gradients, and both equal a plain per-row computation."""

import functools

import torch

from trl_multiagent.agents import AgentPool, AgentSpec
from trl_multiagent.logprobs import completion_logps


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


def test_shared_prompts_give_the_same_logps_and_gradients(tiny_text_model):
    pool = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4)])
    with torch.no_grad():
        for n, p in pool.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
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
    assert torch.allclose(shared[0][mask], separate[0][mask], atol=1e-5)
    assert torch.allclose(shared[1][mask], separate[1][mask], atol=1e-4)
    for a, b in zip(shared[2], separate[2]):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4)  # summation order differs
    assert any(g.abs().sum() > 0 for g in shared[2])
    with torch.no_grad():
        hand = _by_hand(pool, enc, comp, 0.7)
    for row, expected in enumerate(hand):
        assert torch.allclose(shared[0][row, :len(expected)], expected, atol=1e-5)
