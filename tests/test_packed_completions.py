"""Stage 3 of the teacher-forced pass with packed completions (trl_multiagent/teacher_forcing.py:
``_packed_completions``): the completions of one distinct prompt run as one sequence on its cache row, under a 4D
mask. The log-probs, entropies and LoRA gradients must equal the plain pass (every row's prompt and completion run
whole) and a row-at-a-time computation; the calls must have the packed shapes; models that cannot take the mask keep
one row per completion.

The tiny model runs in float64; tolerances come from the number of summed terms (tests/numerics.py)."""

import functools
import types

import torch

from trl_multiagent.agents import AgentPool, AgentSpec
from trl_multiagent.grouped_attention import GROUPED_SDPA
from trl_multiagent.logprobs import completion_logps
from trl_multiagent.teacher_forcing import lm_forward, model_config, packs_completions

from .numerics import assert_same_computation
from .test_logprobs import PREFIX_COMPLETIONS, PREFIX_PROMPTS, _batch, _by_hand, _randomise_lora, _terms


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
        calls.append((tuple(inputs["input_ids"].shape), inputs["attention_mask"]))
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
    # the last call is stage 3: the 4 distinct prompts in one call, each the sum of its completions' lengths wide
    # (prompts 0 and 2 are the same: "two." and "2" one after another)
    lengths = [len(c) for c in comp]
    (rows, width), last_mask = calls[-1]
    assert (rows, width) == (4, max(lengths[0] + lengths[2], lengths[1], lengths[3], lengths[4]))
    assert last_mask.dim() == 4 and last_mask.dtype == torch.bool
    assert pool.config_of("aux")._attn_implementation == GROUPED_SDPA


def test_a_completion_sees_its_prompt_and_its_own_earlier_tokens_only(tiny_text_model):
    """The mask of the packed call, read back: the packed sequence of prompt 0 holds "two." then "2"; the first token
    of "2" sees the prompt's cached columns and itself, not "two."."""
    pool = _pool(tiny_text_model)
    prompt_ids, prompt_mask, completion_ids, completion_mask, enc, comp = _batch(pool, PREFIX_PROMPTS,
                                                                                  PREFIX_COMPLETIONS)
    calls = []
    with torch.no_grad():
        completion_logps(_recording(pool, calls, with_config=True), prompt_ids, prompt_mask, completion_ids,
                         completion_mask, 0.7)
    (rows, width), mask = calls[-1]
    first = len(comp[0])  # where "2" starts in its packed sequence
    own = mask[:, 0, :, -width:]
    cached = mask[:, 0, :, :-width]
    sequence = 0  # distinct prompts keep their first appearance's order: prompt 0 is the first sequence
    assert own[sequence, first].tolist() == [False] * first + [True] + [False] * (width - first - 1)
    assert own[sequence, first - 1].tolist() == [True] * first + [False] * (width - first)
    # every query of the sequence sees exactly its prompt's cached columns (left-padded: its last columns)
    cached_prompt = cached[sequence, 0]
    assert (cached[sequence] == cached_prompt).all()
    assert cached_prompt.sum() > 0 and cached_prompt[-1]


def _last_call(pool, with_config: bool):
    """The last model call (input shape, mask) of the log-probs of 3 samples of one prompt, and their completions."""
    prompt_ids, prompt_mask, completion_ids, completion_mask, _, comp = _batch(
        pool, ["what is one plus one"] * 3, ["two.", "2", "it is two"])
    calls = []
    with torch.no_grad():
        completion_logps(_recording(pool, calls, with_config=with_config), prompt_ids, prompt_mask, completion_ids,
                         completion_mask, 0.7)
    return calls[-1], comp


def test_a_model_given_without_its_config_keeps_one_row_per_completion(tiny_text_model):
    pool = _pool(tiny_text_model)
    (shape, mask), comp = _last_call(pool, with_config=False)
    assert shape == (3, max(map(len, comp))) and mask.dim() == 2
    (shape, mask), comp = _last_call(pool, with_config=True)
    assert shape == (1, sum(map(len, comp))) and mask.dim() == 4


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
    (shape, mask), comp = _last_call(_pool(tiny_text_model, attention="eager"), with_config=True)
    assert shape == (3, max(map(len, comp))) and mask.dim() == 2


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
    prompt_ids, prompt_mask, completion_ids, completion_mask, _, _ = _batch(
        pool, ["what is one plus one"] * 3, ["two.", "2", "it is two"])
    completion_mask[1] = 0  # the second sample's completion is empty
    calls = []
    with torch.no_grad():
        packed, _ = completion_logps(_recording(pool, calls, with_config=True), prompt_ids, prompt_mask,
                                     completion_ids, completion_mask, 0.7)
        plain, _ = completion_logps(functools.partial(pool, "aux"), prompt_ids, prompt_mask, completion_ids,
                                    completion_mask, 0.7, share_prompts=False)
    lengths = completion_mask.sum(-1).tolist()
    assert calls[-1][0] == (1, lengths[0] + lengths[2])
    mask = completion_mask.bool()
    assert_same_computation(packed[mask], plain[mask], terms=_terms(prompt_ids, completion_ids), what="logps")
    assert (packed[1, 1:] == 0).all()
    completion_mask[:] = 0
    with torch.no_grad():
        none, _ = completion_logps(_recording(pool, calls, with_config=True), prompt_ids, prompt_mask, completion_ids,
                                   completion_mask, 0.7)
    assert none.shape == completion_ids.shape and (none[:, 1:] == 0).all()
