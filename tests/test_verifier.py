"""MAPoRL's learned verifier (App. E): balanced data, token-level BCE over the latter half of each solution, training,
saving and loading it as the debate's scorer."""

import math
import random

import pytest
import torch
from datasets import Dataset

from trl_multiagent.environments import MathDebateEnv
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers import MAPoRLConfig, MAPoRLTrainer
from trl_multiagent.verifier.learned import (
    LearnedVerifier,
    VerifierExample,
    balance_solutions,
    boxed_reference_solution,
    boxed_wrong_solution,
    train_verifier,
)

from .numerics import assert_same_computation
from .tiny import model_terms


def _records():
    # q1: three right solutions and one wrong; q2: two wrong and none right
    rows = [("q1", f"right {k} \\boxed{{5}}", True) for k in range(3)] + [("q1", "wrong \\boxed{4}", False)]
    rows += [("q2", f"wrong {k} \\boxed{{9}}", False) for k in range(2)]
    return [{"question_id": q, "question": f"question {q}", "solution": s, "correct": c,
             "answer": "5" if q == "q1" else "7"} for q, s, c in rows]


def test_balanced_data_per_question():
    plain = balance_solutions(_records(), per_class=2, seed=0)
    # without fill-ins a question keeps min(#right, #wrong) of each class: q1 one each, q2 nothing
    assert [(e.question, e.correct) for e in plain] == [("question q1", True), ("question q1", False)]
    assert plain[1].solution == "wrong \\boxed{4}"

    filled = balance_solutions(_records(), per_class=2, seed=0, make_correct=boxed_reference_solution,
                               make_incorrect=boxed_wrong_solution)
    counts = {(e.question, e.correct): 0 for e in filled}
    for e in filled:
        counts[(e.question, e.correct)] += 1
    assert counts == {("question q1", True): 2, ("question q1", False): 2, ("question q2", True): 2,
                      ("question q2", False): 2}
    q2_right = [e.solution for e in filled if e.question == "question q2" and e.correct]
    assert q2_right == ["The final answer is \\boxed{7}."] * 2  # the reference fill-in carries the gold answer
    q1_filled_wrong = [e.solution for e in filled if e.question == "question q1" and not e.correct][1]
    assert q1_filled_wrong in {f"The final answer is \\boxed{{{v}}}." for v in (3, 4, 6, 7)}  # a trivial error
    with pytest.raises(ValueError, match="per_class"):
        balance_solutions(_records(), per_class=0)


def test_loss_is_token_bce_over_the_latter_half_of_the_solution(tiny_text_model):
    verifier = LearnedVerifier(model=tiny_text_model, lora_r=4, lora_alpha=8)
    torch.manual_seed(0)
    with torch.no_grad():
        verifier.pool.value_heads["verifier_head"].linear.weight.normal_(0, 1.0)
    examples = [VerifierExample("what is 2 plus 3?", "so it is 5", True),
                VerifierExample("what is 2 plus 3?", "it is 6.", False)]
    loss = verifier.loss(examples)
    expected_terms = []
    for e in examples:
        ids, start = verifier.encode(e.question, e.solution)
        n = len(ids) - start
        assert n == len(e.solution)  # one token per character: the latter half is counted by hand
        with torch.no_grad():
            logits = verifier.logits(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0]
        latter = range(len(ids) - math.ceil(n / 2), len(ids))  # 5 of 10 tokens, 4 of 8 tokens
        assert len(latter) == {10: 5, 8: 4}[n]
        for k in latter:
            p = torch.sigmoid(logits[k]).item()
            expected_terms.append(-math.log(p) if e.correct else -math.log(1 - p))
    # the batch (padded) and the rows one at a time sum in another order: a tolerance from the summed terms
    tokens = sum(len(verifier.encode(e.question, e.solution)[0]) for e in examples)
    assert_same_computation(loss, torch.tensor(sum(expected_terms) / len(expected_terms)), terms=model_terms(tokens),
                            what="verifier loss")
    assert verifier.loss(examples, latter_fraction=1.0).item() != pytest.approx(loss.item(), rel=1e-2)


class ShortMathDebate(MathDebateEnv):
    """Math debate with a prompt short enough for the tiny test model."""

    prompt_template = "q: {question}"


def test_trained_verifier_saved_reloaded_and_used_as_the_debate_scorer(tiny_text_model, tmp_path):
    rng = random.Random(0)
    examples = []
    for _ in range(8):
        a, b = rng.randint(1, 4), rng.randint(1, 4)
        question = f"what is {a} plus {b}?"
        examples += [VerifierExample(question, f"it is {a + b}. yes", True),
                     VerifierExample(question, f"it is {a + b + 1}. no", False)]
    torch.manual_seed(0)  # the adapter's random init
    verifier = LearnedVerifier(model=tiny_text_model, lora_r=4, lora_alpha=8)
    history = train_verifier(verifier, examples, epochs=12, learning_rate=1e-2, batch_size=8)
    assert sum(history[-2:]) / 2 < 0.7 * sum(history[:2]) / 2
    scores = verifier.score([e.question for e in examples], [e.solution for e in examples])
    right = [s for s, e in zip(scores, examples) if e.correct]
    wrong = [s for s, e in zip(scores, examples) if not e.correct]
    assert min(right) > max(wrong), (right, wrong)

    verifier.save(tmp_path / "verifier")
    reloaded = LearnedVerifier.load(tmp_path / "verifier")
    again = reloaded.score([e.question for e in examples], [e.solution for e in examples])
    assert again == pytest.approx(scores, abs=1e-5)

    # the debate trainer scores every answer with it: s(q, y) = the verifier's output at the answer's last token
    args = MAPoRLConfig(output_dir=str(tmp_path / "out"), verifier=str(tmp_path / "verifier"), num_turns=1,
                           reward_mode="immediate", episodes_per_step=2, max_completion_length=6,
                           per_device_train_batch_size=4, critic_lora_r=4, report_to=[], save_strategy="no",
                           disable_tqdm=True, penalize_no_boxed=False,
                           penalize_no_eos=False, min_response_tokens=0, penalize_repetition=False,
                           penalize_post_boxed=False)
    agents = [AgentSpec(a, model=tiny_text_model, lora_r=4, lora_alpha=8) for a in ("agent1", "agent2")]
    data = Dataset.from_dict({"question": ["what is 1 plus 2?", "what is 3 plus 1?"], "answer": ["3", "4"]})
    trainer = MAPoRLTrainer(agents, ShortMathDebate, args, data)
    experience = trainer.rollout(list(data))
    questions = [f"q: {data[s.episode]['question']}" for s in experience.samples]
    expected = reloaded.score(questions, [s.generation.text for s in experience.samples])
    # the trainer scores another batch of the same texts: the same values up to summation order
    terms = model_terms(sum(len(reloaded.encode(q, s.generation.text)[0]) for q, s in zip(questions,
                                                                                          experience.samples)))
    assert_same_computation(torch.tensor([s.score for s in experience.samples]), torch.tensor(expected), terms=terms,
                            what="debate scores")
    assert_same_computation(torch.tensor([s.reward for s in experience.samples]), torch.tensor(expected),
                            terms=terms, what="immediate rewards (no penalties)")
