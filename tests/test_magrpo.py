"""MAGRPO against its paper (Liu et al., arXiv 2508.04652): Algorithm 1's per-turn objectives with H > 1 turns, and
the config's defaults against Appendix C's settings (issue 35, points 3 and 7).

Algorithm 1, lines 10-15: for t = H-1 down to 0, compute J(theta_i) of Eq. 2 for turn t (1/|B| 1/|G| times the sum
over that turn's responses) and apply theta_i <- theta_i + alpha * grad J_t. In one optimizer step those H updates
are the SUM of the per-turn objectives, each averaged over its own turn's samples, so every turn weighs the same.
"""

from pathlib import Path

import pytest
import torch
import yaml
from datasets import Dataset

from trl_multiagent.credit import turn_loss_weights
from trl_multiagent.environments import FunctionEnvironment
from trl_multiagent.rollout import Experience, Sample
from trl_multiagent.team.pool import AgentSpec, Generation
from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer

from .numerics import assert_same_computation
from .tiny import model_terms

TEMPERATURE = 0.5
RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "configs"


# ------------------------------------------------------------------------------------------- point 3, pure function
def test_turn_weights_make_every_turn_weigh_the_same_k4_h2():
    # an aligned tree with K = 4, H = 2: 4 responses of an agent at turn 0, 4 x 4 = 16 at turn 1
    turns = [0] * 4 + [1] * 16
    weights = turn_loss_weights(turns)
    # Algorithm 1: J = J_0 + J_1, J_t the mean over turn t's responses -> 1/4 per turn-0 response, 1/16 per turn-1
    assert weights[:4] == pytest.approx([1 / 4] * 4) and weights[4:] == pytest.approx([1 / 16] * 16)
    assert sum(weights[:4]) == pytest.approx(1.0) and sum(weights[4:]) == pytest.approx(1.0)
    # the old reading, one mean over all 20 responses, gave turn 0 the share 4 / 20 = 0.2 instead of 1/2 of the total
    assert sum(weights[:4]) / sum(weights) == pytest.approx(1 / 2)
    assert turn_loss_weights([0, 0, 0]) == pytest.approx([1 / 3] * 3)  # one turn: the plain mean of Eq. 2


def test_turn_weights_on_per_response_losses_by_hand():
    # K = 2, H = 2: turn-0 losses 1.0, 3.0; turn-1 losses 0.5, 0.5, 0.5, 2.5
    losses = [1.0, 3.0, 0.5, 0.5, 0.5, 2.5]
    weights = turn_loss_weights([0, 0, 1, 1, 1, 1])
    # Algorithm 1: (1.0 + 3.0) / 2 + (0.5 + 0.5 + 0.5 + 2.5) / 4 = 2.0 + 1.0 = 3.0
    assert sum(w * x for w, x in zip(weights, losses)) == pytest.approx(3.0)
    # old reading: (1.0 + 3.0 + 0.5 + 0.5 + 0.5 + 2.5) / 6 = 8 / 6 = 1.3333
    assert sum(losses) / len(losses) == pytest.approx(8 / 6)


# ------------------------------------------------------------------------------------------- point 3, the trainer
def _trainer(model_dir, tmp_path, **kw):
    env = lambda: FunctionEnvironment(["solo"], {"solo": lambda t: t["prompt"]}, lambda completions, **_: 0.0)  # noqa: E731
    args = MAGRPOConfig(output_dir=str(tmp_path), report_to=[], max_completion_length=4, num_generations=2,
                                temperature=TEMPERATURE, save_strategy="no", disable_tqdm=True,
                                per_device_train_batch_size=2, **kw)
    trainer = MAGRPOTrainer([AgentSpec("solo", model=model_dir, lora_r=4, lora_alpha=8)], env, args,
                                    Dataset.from_dict({"prompt": ["ab"] * 2}))
    with torch.no_grad():  # non-zero B so the adapter changes the log-probs
        for n, p in trainer.pool.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    return trainer


def _sample(trainer, turn, completion, advantage):
    prompt = trainer.pool.encode_prompt("solo", "ab")
    return Sample(agent="solo", policy=trainer.pool.policy_of("solo"), episode=0, turn=turn, node=turn, joint_ids=[],
                  generation=Generation(list(prompt), list(completion), ""), advantage=advantage)


def _summed_logp(trainer, sample):
    """log pi(a | h) of a whole response: the sum of its token log-probs, from a plain forward of the adapted model."""
    base = trainer.pool.activate(sample.policy)
    p, c = sample.generation.prompt_ids, sample.generation.completion_ids
    logits = base(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1:len(p) + len(c) - 1] / TEMPERATURE
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None])[:, 0].sum()


def _grads(trainer):
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
            for p in trainer.pool.policy_parameters("solo")]


def test_two_turn_update_sums_the_per_turn_means(tiny_text_model, tmp_path):
    trainer = _trainer(tiny_text_model, tmp_path, num_turns=2, model_dtype="float64")  # two orders of one sum (tests/numerics.py)
    ids = trainer.pool.tokenizer_of("solo").convert_tokens_to_ids
    # turn 0: 2 responses (one node, K = 2); turn 1: 4 responses (two nodes); rho = 1 (one update per rollout)
    samples = [_sample(trainer, 0, [ids("c")], 1.5), _sample(trainer, 0, [ids("d"), ids("e")], -0.5),
               _sample(trainer, 1, [ids("f")], 2.0), _sample(trainer, 1, [ids("g"), ids("h")], 0.4),
               _sample(trainer, 1, [ids("i")], 0.4), _sample(trainer, 1, [ids("j"), ids("k"), ids("l")], 0.4)]
    # Eq. 2 per response with rho = 1: -A. Algorithm 1: J_0 + J_1 =
    #   -(1.5 - 0.5) / 2 + -(2.0 + 0.4 + 0.4 + 0.4) / 4 = -0.5 + -0.8 = -1.3
    # (old: one mean over the 6 responses, -(1.5 - 0.5 + 2.0 + 0.4 + 0.4 + 0.4) / 6 = -4.2 / 6 = -0.7)
    trainer.pool.train()
    trainer.pool.zero_grad()
    loss = trainer.update(trainer.pool, Experience(samples, [], {}))
    assert loss.item() == pytest.approx(-1.3, abs=1e-6)
    ours = _grads(trainer)
    # gradient: sum_t 1/N_t sum_{s in turn t} -A_s * grad sum_tokens log pi   (N_0 = 2, N_1 = 4)
    trainer.pool.zero_grad()
    sum(-s.advantage * _summed_logp(trainer, s) / (2 if s.turn == 0 else 4) for s in samples).backward()
    assert any(g.abs().sum() > 0 for g in ours)
    tokens = sum(len(s.generation.prompt_ids) + len(s.generation.completion_ids) for s in samples)
    assert_same_computation(ours, _grads(trainer), terms=model_terms(tokens),
                            what="per-turn-mean gradients vs the hand-built sum")


def test_one_turn_keeps_the_plain_mean_and_token_losses_refuse_several_turns(tiny_text_model, tmp_path):
    trainer = _trainer(tiny_text_model, tmp_path)
    rows = [_sample(trainer, 0, [5], 1.0), _sample(trainer, 0, [6], -1.0)]
    assert trainer.sample_weights("solo", rows) is None  # H = 1: Eq. 2's 1/|B| 1/|G|, unchanged
    with pytest.raises(ValueError, match="per-response loss_type"):
        MAGRPOConfig(output_dir=str(tmp_path), num_turns=2, loss_type="dapo")
    assert MAGRPOConfig(output_dir=str(tmp_path), num_turns=2, loss_type="grpo").loss_type == "grpo"


# ------------------------------------------------------------------------------------------- point 7, the defaults
def test_defaults_are_the_papers_or_say_why_not(tmp_path):
    import dataclasses

    args = MAGRPOConfig(output_dir=str(tmp_path))
    # task-independent settings: K = 4 (the authors' trainer), gamma = 1.0 (App. C), Eq. 2's whole-response loss
    assert args.num_generations == 4 and args.gamma == 1.0 and args.loss_type == "response"
    # the per-task ones (App. C): lr 1e-6 is the paper's one-turn coding rate; T, top-p and beta stay TRL's and
    # each field's help names the paper's values
    assert args.learning_rate == 1e-6
    helps = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(MAGRPOConfig)}
    assert args.temperature == 1.0 and "0.8 (writing)" in helps["temperature"] and "0.7 (coding)" in helps["temperature"]
    assert args.top_p == 1.0 and "0.95 (writing)" in helps["top_p"] and "0.9 (coding)" in helps["top_p"]
    assert "5e-6" in helps["learning_rate"] and "1e-6" in helps["learning_rate"]
    assert args.beta == 0.0 and "0.02 for writing" in helps["beta"]


@pytest.mark.parametrize("name, temperature, top_p, learning_rate", [
    ("coop_humaneval.yaml", 0.7, 0.9, 1e-6),  # the paper's one-turn coding settings, App. C
    ("mbpp.yaml", 0.7, 0.9, 1e-6),
    ("coding.yaml", 0.7, 0.9, None),  # the embedded 135M model: its own rate
    ("tldr_magrpo.yaml", 0.8, 0.95, None),  # writing (TLDR)
])
def test_recipes_carry_the_papers_per_task_sampling(name, temperature, top_p, learning_rate):
    recipe = yaml.safe_load((RECIPES / name).read_text())
    assert recipe["trainer"] == "magrpo"
    assert recipe["temperature"] == temperature and recipe["top_p"] == top_p
    if learning_rate is not None:
        assert float(recipe["learning_rate"]) == learning_rate
