"""Learning test: two agents on a tiny random model learn the joint optimum of the MAGRPO matrix game.

MAGRPO paper, Appendix A, Table 4: joint utility (A,A)=10, (A,B)=(B,A)=7, (B,B)=0. Each agent's completion is one
token, restricted to A or B (the other tokens are suppressed), so before training both agents are near 50/50.
"""

import pytest
from datasets import Dataset

from tests.tiny import prob_first_choice
from trl_multiagent.environments import MatrixGameEnv
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer

SEEDS = [0, 1, 2, 3, 4]
STEPS = 25


def prob_a(trainer, agent):
    """P(A | A or B) of an agent's next token after its prompt (its adapter active)."""
    return prob_first_choice(trainer.pool, agent, MatrixGameEnv().reset({})[agent])


def greedy_joint_action(trainer):
    from transformers import GenerationConfig

    greedy = GenerationConfig(max_new_tokens=1, do_sample=False, suppress_tokens=[0, 1, 2])
    env = MatrixGameEnv()
    prompts = env.reset({})
    return tuple(trainer.pool.generate(a, [prompts[a]], 1, greedy)[0][0].text for a in env.agents)


def run(seed, model_dir, out_dir):
    args = MAGRPOConfig(
        output_dir=str(out_dir), seed=seed, max_steps=STEPS, num_generations=8, episodes_per_step=2,
        max_completion_length=1, learning_rate=5e-2, lr_scheduler_type="constant", report_to=[],
        generation_kwargs={"suppress_tokens": [0, 1, 2]}, save_strategy="no", disable_tqdm=True,
        logging_steps=5,
    )
    agents = [AgentSpec("agent1", model=model_dir, lora_r=4, lora_alpha=8),
              AgentSpec("agent2", model=model_dir, lora_r=4, lora_alpha=8)]
    trainer = MAGRPOTrainer(agents, MatrixGameEnv, args, Dataset.from_dict({"task_id": list(range(256))}))
    before = (prob_a(trainer, "agent1"), prob_a(trainer, "agent2"))
    trainer.train()
    after = (prob_a(trainer, "agent1"), prob_a(trainer, "agent2"))
    return before, after, greedy_joint_action(trainer)


@pytest.mark.slow
def test_magrpo_reaches_joint_optimum(tiny_ab_model, tmp_path):
    results = [run(seed, tiny_ab_model, tmp_path / f"seed{seed}") for seed in SEEDS]
    for before, _, _ in results:
        assert all(0.3 < p < 0.7 for p in before), before  # untrained: near random between A and B
    # trained: both agents moved clearly towards A (the joint optimum), in at least 4 of 5 seeds
    assert sum(min(after) > max(before) + 0.1 for before, after, _ in results) >= 4, results
    optimal = [joint for _, _, joint in results].count(("A", "A"))
    assert optimal >= 4, results
