"""The update's micro-batches: ordered by prompt tokens, so each prompt (and each shared prefix) runs in as few
micro-batches as possible; the weights still sum to the policy's loss; the positions a pass needs at least."""

from __future__ import annotations

import pytest

from trl_multiagent.generation.prefixes import distinct_prefix_tokens, needed_attention_pairs
from trl_multiagent.generation.teacher_forcing import length_buckets
from trl_multiagent.rollout import Sample
from trl_multiagent.team.pool import Generation
from trl_multiagent.trainers.micro_batches import prompt_grouped_chunks, prompt_order, weighted_chunks

SYSTEM = [7, 7, 7, 7]  # what every prompt of the agent repeats (system message, worked examples)


def _sample(prompt_rest, completion_len, i):
    gen = Generation(SYSTEM + list(prompt_rest), [1] * completion_len, "")
    return Sample(agent="a", policy="a", episode=i, turn=0, node=i, joint_ids=[], generation=gen, advantage=0.0)


def _rows():
    # three prompts, three samples each, interleaved, completions of mixed lengths
    rests = {"p": [1, 2], "q": [1, 3, 3, 3], "r": [2]}
    layout = [("q", 5), ("p", 1), ("r", 9), ("p", 8), ("q", 2), ("r", 3), ("p", 4), ("r", 6), ("q", 7)]
    return [_sample(rests[name], n, i) for i, (name, n) in enumerate(layout)], layout


def test_distinct_prefix_tokens_counts_trie_nodes():
    assert distinct_prefix_tokens([[1, 2, 3], [1, 2, 4], [1, 2, 3]]) == 4
    assert distinct_prefix_tokens([[5], [6], [5, 6]]) == 3 and distinct_prefix_tokens([]) == 0


def test_needed_attention_pairs_by_hand_and_by_enumeration():
    # prefixes 1, 1 2, 1 3 attend 1 + 2 + 2 keys; the first completion (2 tokens after 2) 3 + 4; the second none
    assert needed_attention_pairs([[1, 2], [1, 3]], [2, 0]) == 12
    assert needed_attention_pairs([], []) == 0
    with pytest.raises(ValueError, match="2 prompts but 1 completion"):
        needed_attention_pairs([[1], [2]], [3])
    # against an enumeration of the pairs themselves: a prompt position is the prefix ending there (shared prefixes
    # are one position), a completion position its sample and index; each attends every earlier key and itself
    rows, _ = _rows()
    prompts = [s.generation.prompt_ids for s in rows]
    lengths = [len(s.generation.completion_ids) for s in rows]
    pairs = {(tuple(p[:i]), key) for p in prompts for i in range(1, len(p) + 1) for key in range(i)}
    pairs |= {(row, j, key) for row, (p, n) in enumerate(zip(prompts, lengths)) for j in range(n)
              for key in range(len(p) + j + 1)}
    assert needed_attention_pairs(prompts, lengths) == len(pairs)


def test_length_buckets_pad_least_for_their_cost_per_call(monkeypatch):
    """The teacher-forced pass groups rows with generation's prefill grouping, one row a group allowed."""
    from trl_multiagent.generation import teacher_forcing

    def buckets(lengths, cost):
        monkeypatch.setattr(teacher_forcing, "CALL_COST_POSITIONS", cost)
        return length_buckets(lengths)

    # [1, 9, 2, 10], 4 per call: {1, 2} {9, 10} computes 2x2 + 2x10 + 8 = 32 positions' worth, one call 4x10 + 4 = 44
    assert buckets([1, 9, 2, 10], 4) == [[0, 2], [1, 3]]
    # 100 per call: one call, in the rows' order (44 + ... < 2 calls at least 200)
    assert buckets([1, 9, 2, 10], 100) == [[0, 1, 2, 3]]
    # [3, 3, 5], 1 per call: {3, 3} {5} = 6 + 5 + 2 = 13; alone 3 + 3 + 5 + 3 = 14; together 15 + 1 = 16
    assert buckets([3, 3, 5], 1) == [[0, 1], [2]]
    # no cost per call: every length alone; equal lengths together (a tie, 1 + 4 + 4 either way: the fewer calls)
    assert buckets([4, 1, 4], 0) == [[1], [0, 2]]
    assert buckets([7], 4) == [[0]]


def test_samples_of_one_prompt_share_a_micro_batch_longest_completion_first():
    rows, layout = _rows()
    order = prompt_order(rows)
    # prompts sorted by tokens: SYSTEM+[1,2] (p) < SYSTEM+[1,3,3,3] (q) < SYSTEM+[2] (r)
    assert [layout[i] for i in order] == [("p", 8), ("p", 4), ("p", 1), ("q", 7), ("q", 5), ("q", 2),
                                          ("r", 9), ("r", 6), ("r", 3)]
    chunked = weighted_chunks(rows, None, 3, equal_within=False)
    assert [[len(s.generation.completion_ids) for s in chunk] for chunk, _ in chunked] == [[8, 4, 1], [7, 5, 2],
                                                                                          [9, 6, 3]]
    assert sum(w for _, ws in chunked for w in ws) == pytest.approx(1.0)
    assert all(ws == [pytest.approx(1 / 9)] * 3 for _, ws in chunked)
    # prompt positions run per micro-batch: each prompt once, the shared 4 tokens once per micro-batch:
    # (4 + 2) + (4 + 4) + (4 + 1) = 19; ordered by total length the three prompts are spread over every micro-batch
    ran = sum(distinct_prefix_tokens([s.generation.prompt_ids for s in chunk]) for chunk, _ in chunked)
    assert ran == 19
    by_length = sorted(rows, key=lambda s: -(len(s.generation.prompt_ids) + len(s.generation.completion_ids)))
    spread = sum(distinct_prefix_tokens([s.generation.prompt_ids for s in by_length[i:i + 3]]) for i in (0, 3, 6))
    assert spread > ran
    assert [[s.episode for s in c] for c in prompt_grouped_chunks(rows, 3)] == [[c.episode for c in chunk]
                                                                               for chunk, _ in chunked]


def test_equal_weights_stay_together_and_keep_their_sum():
    rows, _ = _rows()
    weights = [0.2 if i % 2 else 0.05 for i in range(9)]
    chunked = weighted_chunks(rows, weights, 2, equal_within=True)
    assert all(len(set(ws)) == 1 and len(ws) <= 2 for _, ws in chunked)
    assert sum(w for _, ws in chunked for w in ws) == pytest.approx(sum(weights))
    assert sorted(s.episode for chunk, _ in chunked for s in chunk) == list(range(9))
    with pytest.raises(ValueError, match="sample weights"):
        weighted_chunks(rows, weights[:3], 2, equal_within=False)


def test_the_update_runs_a_shared_prefix_once_for_all_its_micro_batches(tiny_text_model, tmp_path, monkeypatch):
    import torch
    from datasets import Dataset

    from trl_multiagent.environments import FunctionEnvironment
    from trl_multiagent.generation.teacher_forcing import PrefixStore
    from trl_multiagent.rollout import Experience
    from trl_multiagent.team.pool import AgentSpec
    from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer

    from .numerics import assert_same_computation
    from .tiny import model_terms

    built = []
    build = PrefixStore.build.__func__

    def spy(cls, *args, **kwargs):
        store = build(cls, *args, **kwargs)
        built.append((store, len(store.prefixes) if store else 0))
        return store

    monkeypatch.setattr(PrefixStore, "build", classmethod(spy))
    grads = {}
    for share in (True, False):
        env = lambda: FunctionEnvironment(["solo"], {"solo": lambda t: t["prompt"]}, lambda completions, **_: 0.0)  # noqa: E731
        args = MAGRPOConfig(output_dir=str(tmp_path / str(share)), report_to=[], max_completion_length=4,
                                    num_generations=2, save_strategy="no", disable_tqdm=True, model_dtype="float64",
                                    per_device_train_batch_size=2, share_prompt_prefixes=share)
        trainer = MAGRPOTrainer([AgentSpec("solo", model=tiny_text_model, lora_r=4, lora_alpha=8)], env, args,
                                        Dataset.from_dict({"prompt": ["ab"] * 2}))
        torch.manual_seed(0)
        with torch.no_grad():
            for n, p in trainer.pool.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.3)
        tok = trainer.pool.tokenizer_of("solo")
        samples = []
        for i, (question, completion, advantage) in enumerate([("one plus one", "two", 1.0), ("two plus two", "four", -1.0),
                                                               ("one plus one", "2", 0.5), ("six minus one", "five", -0.5)]):
            prompt = trainer.pool.encode_prompt("solo", "answer in one word please. " + question)
            gen = Generation(list(prompt), tok(completion, add_special_tokens=False)["input_ids"], completion)
            samples.append(Sample(agent="solo", policy="solo", episode=i, turn=0, node=i, joint_ids=[], generation=gen,
                                  advantage=advantage))
        trainer.pool.train()
        trainer.pool.zero_grad()
        trainer.update(trainer.pool, Experience(samples, [], {}))
        grads[share] = [p.grad.clone() for p in trainer.pool.policy_parameters("solo")]
        assert trainer.prefix_store is None  # never left behind
    # with sharing: one store for the update's two micro-batches, holding the opening all three prompts share
    ((store, prefixes),) = built
    assert prefixes == 1 and not store.prefixes  # built, then sent back and let go
    tokens = sum(len(s.generation.prompt_ids) + len(s.generation.completion_ids) for s in samples)
    assert_same_computation(grads[True], grads[False], terms=model_terms(tokens), what="LoRA gradients")
