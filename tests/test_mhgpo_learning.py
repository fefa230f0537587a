"""Learning test: MHGPO (FoF, RR, and IS) teaches a two-stage pipeline on a tiny random model.

Stage 1 ("one:") answers A or B; stage 2 reads it ("two:A" / "two:B") and answers A or B. The end reward depends on
both stages: (A, B) -> 1, (B, A) -> 0.5, (A, A) and (B, B) -> 0, so stage 2 must condition on stage 1 and stage 1
is credited through stage 2 (backward propagation). Both stages act with ONE shared policy (a LoRA adapter); only
A and B can be sampled. Untrained, the expected end reward is about 0.4; the optimum (A, then B) is worth 1.

The tiny model's LM head is scaled up so that A-vs-B probabilities can move far from 50/50 (with the default
initialisation the frozen head caps the logit gap near 1, i.e. probabilities near 0.73).
"""

import pytest
import torch
from datasets import Dataset

from tests.tiny import build_model, build_tokenizer, prob_first_choice
from trl_multiagent.environments.pipeline import PipelineEnvironment
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers import MHGPOConfig, MHGPOTrainer

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 .,:?!AB")
#: Generation settings that let the tiny model sample only A or B (every other token id suppressed).
AB_ONLY = {"suppress_tokens": [i for i in range(3 + len(CHARS)) if i not in (3 + CHARS.index("A"), 3 + CHARS.index("B"))]}
PAYOFF = {("A", "B"): 1.0, ("B", "A"): 0.5, ("A", "A"): 0.0, ("B", "B"): 0.0}


@pytest.fixture(scope="module")
def pipeline_model(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("tiny_pipeline")
    tok = build_tokenizer(CHARS)
    model = build_model(len(tok), seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(5.0)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return str(directory)


class TwoStageGame(PipelineEnvironment):
    agents = ("first", "second")
    edges = (("first", "second"),)

    def prompt(self, agent, task, inputs):
        return "one:" if agent == "first" else f"two:{inputs['first']}"

    def final_reward(self, task, outputs):
        return PAYOFF.get((outputs["first"], outputs["second"]), 0.0)


def prob_a(trainer, prompt):
    return prob_first_choice(trainer.pool, "first", prompt)


def expected_end_reward(trainer):
    """E[R] under the current shared policy, from its exact probabilities of A and B after each prompt."""
    p1, q_a, q_b = prob_a(trainer, "one:"), prob_a(trainer, "two:A"), prob_a(trainer, "two:B")
    return p1 * (1 - q_a) * PAYOFF[("A", "B")] + (1 - p1) * q_b * PAYOFF[("B", "A")]


def run(model_dir, out_dir, sampling, seed, steps=40):
    extra = {"fork_probabilities": [0.7, 0.3]} if sampling == "round_robin" else {}
    args = MHGPOConfig(
        output_dir=str(out_dir), seed=seed, max_steps=steps, sampling=sampling, num_generations=8,
        episodes_per_step=4, max_completion_length=1, learning_rate=1e-2, lr_scheduler_type="constant",
        generation_kwargs=AB_ONLY, report_to=[], save_strategy="no", disable_tqdm=True,
        logging_steps=5, per_device_train_batch_size=64, **extra)
    agents = [AgentSpec("first", model=model_dir, lora_r=4, lora_alpha=8),
              AgentSpec("second", model=model_dir, lora_r=4, lora_alpha=8)]
    trainer = MHGPOTrainer(agents, TwoStageGame, args, Dataset.from_dict({"task_id": list(range(64))}))
    assert list(trainer.pool.policies) == ["shared"]  # parameter sharing by default
    before = expected_end_reward(trainer)
    trainer.train()
    return before, expected_end_reward(trainer)


@pytest.mark.parametrize("sampling", ["fork_on_first", "round_robin", "independent"])
def test_mhgpo_improves_the_end_reward_of_a_two_stage_pipeline(pipeline_model, tmp_path, sampling):
    results = [run(pipeline_model, tmp_path / f"{sampling}{seed}", sampling, seed) for seed in (0, 1, 2)]
    for before, _ in results:
        assert 0.3 < before < 0.5, results  # untrained: near the 0.375 of uniform choices
    # trained: near the optimum 1.0 (A, then B) on at least two of three seeds, and better than untrained on average.
    # Over seeds 0-15 (measured with this test's `run`): fork-on-first reached it on 15, round-robin on 14 (twice it
    # settled in a corner worth about 0), independent on 11 (five runs stopped near 0.5).
    assert sum(after > 0.8 for _, after in results) >= 2, results
    assert sum(after - before for before, after in results) / len(results) > 0.2, results
