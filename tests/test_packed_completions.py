"""Stages 2 and 3 of the teacher-forced pass packed (trl_multiagent/generation/teacher_forcing.py:
``_packed_rests_and_completions``): the rest of each distinct prompt and then its completions run as one sequence on
its prefix's cache row, under a 4D mask. The log-probs, entropies and LoRA gradients must equal the plain pass (every
row's prompt and completion run whole) and a row-at-a-time computation; the calls must have the packed shapes
(``packed_buckets``' grouping, worked out by hand); models that cannot take the mask keep a call for the rests and
one row per completion.

The tiny model runs in float64; tolerances come from the number of summed terms (tests/numerics.py)."""

import functools
import types

import torch

from trl_multiagent.generation.logprobs import completion_logps
from trl_multiagent.generation.teacher_forcing import lm_forward, model_config, packs_completions
from trl_multiagent.models.grouped_attention import GROUPED_SDPA
from trl_multiagent.team.pool import AgentPool, AgentSpec

from .numerics import assert_same_computation
from .test_logprobs import PREFIX_COMPLETIONS, PREFIX_PROMPTS, _batch, _by_hand, _common, _randomise_lora, _terms


def _pool(tiny_text_model, attention: str | None = None):
    pool = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4)], dtype="float64")
    _randomise_lora(pool)
    if attention is not None:
        pool.base_of("aux").get_base_model().set_attn_implementation(attention)
    return pool


def _recording(pool, calls: list, with_config: bool):
    """A callable forwarding to the pool's "aux" that records each call's input shape and mask; with its config
    (so that stage 3 packs) or without (one row per completion)."""

    def model(**inputs):
        calls.append((tuple(inputs["input_ids"].shape), inputs["attention_mask"], inputs["input_ids"]))
        return pool("aux", **inputs)

    if with_config:
        model.config = pool.config_of("aux")
    return model


def _logps_and_grads(pool, model, batch, share: bool = True):
    pool.zero_grad()
    logps, entropies = completion_logps(model, *batch, 0.7, compute_entropy=True, share_prompts=share)
    (logps * batch[3]).sum().backward()
    return logps.detach(), entropies.detach(), [p.grad.clone() for p in pool.policy_parameters("aux")]


def test_packed_completions_give_the_logps_entropies_and_gradients_of_the_plain_pass(tiny_text_model):
    """Four prompts sharing an opening, one without it, two of them repeated: packed, the completions of each distinct
    prompt in one sequence."""
    pool = _pool(tiny_text_model)
    prompt_ids, prompt_mask, completion_ids, completion_mask, enc, comp = _batch(pool, PREFIX_PROMPTS,
                                                                                  PREFIX_COMPLETIONS)
    batch = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    calls = []
    packed = _logps_and_grads(pool, _recording(pool, calls, with_config=True), batch)
    plain = _logps_and_grads(pool, functools.partial(pool, "aux"), batch, share=False)
    mask = completion_mask.bool()
    terms = _terms(prompt_ids, completion_ids)
    assert_same_computation(packed[0][mask], plain[0][mask], terms=terms, what="logps")
    assert_same_computation(packed[1][mask], plain[1][mask], terms=terms, what="entropies")
    assert_same_computation(packed[2], plain[2], terms=terms, what="LoRA gradients")
    assert all(g.abs().sum() > 0 for g in packed[2])
    assert (packed[0][~mask] == 0).all()
    with torch.no_grad():
        hand = _by_hand(pool, enc, comp, 0.7)
    assert_same_computation([packed[0][row, :len(h)] for row, h in enumerate(hand)], hand, terms=terms,
                            what="logps vs one row at a time")
    # after the prefixes' call (the opening, and all but the last token of the prompt without it), the 4 distinct
    # prompts as (rest, packed completions): (20, 4 + 1), (2, 11), (12, 7), (1, 2). In one call: 4 x (20 + 11) + 40
    # = 164 positions; sorted by total length and cut in two, {(1, 2), (2, 11)} {(12, 7), (20, 5)}: 2 x (2 + 11) +
    # 2 x (20 + 7) + 2 x 40 = 160, the least (packed_buckets)
    lengths = [len(c) for c in comp]
    opening = _common([enc[0], enc[1], enc[3]])
    assert [len(enc[i]) - opening for i in (0, 1, 3)] == [20, 2, 12]
    assert [shape for shape, _, _ in calls[1:]] == [(2, 2 + lengths[1]), (2, 20 + lengths[3])]
    assert lengths[0] + lengths[2] < lengths[3] and len(calls) == 3
    assert all(m.dim() == 4 and m.dtype == torch.bool for _, m, _ in calls[1:])
    assert pool.config_of("aux")._attn_implementation == GROUPED_SDPA


def test_a_completion_sees_its_prompt_and_its_own_earlier_tokens_only(tiny_text_model):
    """The mask of the last packed call, read back. It holds prompt 0 (rest of 20 tokens after the opening, then "two."
    and "2") and prompt 3 (rest of 12, left-padded to 20, then "it is 7"). A rest's position sees the cached opening
    and the rest up to itself; the first token of "2" sees the opening, the whole rest and itself, not "two."; no
    position sees the padding; a padding position sees itself only (and the opening)."""
    pool = _pool(tiny_text_model)
    prompt_ids, prompt_mask, completion_ids, completion_mask, enc, comp = _batch(pool, PREFIX_PROMPTS,
                                                                                  PREFIX_COMPLETIONS)
    calls = []
    with torch.no_grad():
        completion_logps(_recording(pool, calls, with_config=True), prompt_ids, prompt_mask, completion_ids,
                         completion_mask, 0.7)
    (rows, width), mask, ids = calls[-1]
    rest, two = 20, len(comp[0])
    assert (rows, width) == (2, rest + len(comp[3]))
    own, cached = mask[:, 0, :, -width:], mask[:, 0, :, :-width]
    zero = next(s for s in range(rows) if ids[s, rest:rest + two + 1].tolist() == comp[0] + comp[2])
    three = 1 - zero
    assert ids[three, rest:rest + len(comp[3])].tolist() == comp[3]
    assert ids[zero, :rest].tolist() == enc[0][-rest:] and ids[three, 8:rest].tolist() == enc[3][-12:]
    # prompt 0: the last rest position, the last of "two.", the one of "2"
    assert own[zero, rest - 1].tolist() == [True] * rest + [False] * (width - rest)
    assert own[zero, rest + two - 1].tolist() == [True] * (rest + two) + [False] * (width - rest - two)
    assert own[zero, rest + two].tolist() == [True] * rest + [False] * two + [True] + [False] * (width - rest - two - 1)
    pad = rest + two + 1  # the first padding position after "2"
    assert own[zero, pad].tolist() == [k == pad for k in range(width)]
    # prompt 3: its 8 left-padding positions see only themselves, and no position sees them
    for q in range(8):
        assert own[three, q].tolist() == [k == q for k in range(width)]
    assert not own[three, 8:, :8].any()
    assert own[three, rest].tolist() == [False] * 8 + [True] * 13 + [False] * (width - rest - 1)
    # every position of a sequence sees exactly its prompt's cached opening (left-padded: the last columns)
    for s in range(rows):
        assert (cached[s] == cached[s, 0]).all() and cached[s, 0].sum() > 0 and cached[s, 0, -1]


def _calls(pool, with_config: bool):
    """The model calls (input shape, mask, ids) of the log-probs of 3 samples of one prompt, the prompt's tokens and
    the completions'."""
    prompt_ids, prompt_mask, completion_ids, completion_mask, enc, comp = _batch(
        pool, ["what is one plus one"] * 3, ["two.", "2", "it is two"])
    calls = []
    with torch.no_grad():
        completion_logps(_recording(pool, calls, with_config=with_config), prompt_ids, prompt_mask, completion_ids,
                         completion_mask, 0.7)
    return calls, enc[0], comp


def test_a_model_given_without_its_config_keeps_one_row_per_completion(tiny_text_model):
    """Packed, one prompt's samples are one call: the prompt, then the three completions. Without the config (the
    mask's support unknown), the prompt runs in one call and the completions in another, a row each."""
    pool = _pool(tiny_text_model)
    calls, prompt, comp = _calls(pool, with_config=False)
    assert [shape for shape, _, _ in calls] == [(1, len(prompt)), (3, max(map(len, comp)))]
    assert all(mask.dim() == 2 for _, mask, _ in calls)
    calls, prompt, comp = _calls(pool, with_config=True)
    assert [shape for shape, _, _ in calls] == [(1, len(prompt) + sum(map(len, comp)))] and calls[0][1].dim() == 4
    assert calls[0][2][0].tolist() == prompt + [t for c in comp for t in c]


def test_which_models_pack():
    def config(**fields):
        return types.SimpleNamespace(**{"model_type": "llama", "_attn_implementation": "sdpa", **fields})

    assert packs_completions(config())
    assert packs_completions(config(_attn_implementation=GROUPED_SDPA))
    assert not packs_completions(config(_attn_implementation="eager"))  # it would add a boolean mask to its scores
    assert not packs_completions(config(_attn_implementation="flash_attention_2"))
    assert not packs_completions(config(model_type="gpt2"))  # learned positions, the mask built by the model
    assert not packs_completions(config(model_type="mistral", sliding_window=4096))
    assert packs_completions(config(model_type="qwen2", sliding_window=4096, use_sliding_window=False))
    assert not packs_completions(config(layer_types=["full_attention", "sliding_attention"]))
    assert not packs_completions(None)


def test_eager_attention_keeps_one_row_per_completion(tiny_text_model):
    calls, prompt, comp = _calls(_pool(tiny_text_model, attention="eager"), with_config=True)
    assert [shape for shape, _, _ in calls] == [(1, len(prompt)), (3, max(map(len, comp)))]
    assert all(mask.dim() == 2 for _, mask, _ in calls)


def test_the_config_is_found_through_a_pool_bound_to_a_policy_and_through_a_wrapper(tiny_text_model):
    pool = _pool(tiny_text_model)
    assert model_config(functools.partial(pool, "aux")) is pool.config_of("aux")
    class Wrapper(torch.nn.Module):  # holds the pool as ``module``, as DistributedDataParallel does
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *args, **kwargs):
            return self.module(*args, **kwargs)

    wrapped = Wrapper(pool)
    assert model_config(functools.partial(wrapped, "aux")) is pool.config_of("aux")
    assert model_config(lambda **inputs: None) is None
    assert lm_forward(functools.partial(pool, "aux")).packs_completions


def test_empty_completions_give_zeros_as_one_row_per_completion_does(tiny_text_model):
    """Rows whose completion is empty (all of them, or some) add no position to the packed calls; their values are
    zeros, as the plain pass's masked positions are read as."""
    pool = _pool(tiny_text_model)
    prompt_ids, prompt_mask, completion_ids, completion_mask, enc, _ = _batch(
        pool, ["what is one plus one"] * 3, ["two.", "2", "it is two"])
    completion_mask[1] = 0  # the second sample's completion is empty
    calls = []
    with torch.no_grad():
        packed, _ = completion_logps(_recording(pool, calls, with_config=True), prompt_ids, prompt_mask,
                                     completion_ids, completion_mask, 0.7)
        plain, _ = completion_logps(functools.partial(pool, "aux"), prompt_ids, prompt_mask, completion_ids,
                                    completion_mask, 0.7, share_prompts=False)
    lengths = completion_mask.sum(-1).tolist()
    assert [c[0] for c in calls] == [(1, len(enc[0]) + lengths[0] + lengths[2])]
    mask = completion_mask.bool()
    assert_same_computation(packed[mask], plain[mask], terms=_terms(prompt_ids, completion_ids), what="logps")
    assert (packed[1, 1:] == 0).all()
    completion_mask[:] = 0
    calls.clear()
    with torch.no_grad():
        none, _ = completion_logps(_recording(pool, calls, with_config=True), prompt_ids, prompt_mask, completion_ids,
                                   completion_mask, 0.7)
    assert none.shape == completion_ids.shape and (none[:, 1:] == 0).all()
    assert [c[0] for c in calls] == [(1, len(enc[0]))]  # the prompt alone: its last position predicts the first token
