"""log_completions (trl_multiagent/trainers/completions.py): each logging step's joint actions, with every agent's
completion, the joint reward and each response's advantage, in completions.jsonl and a rich table."""

import json

from datasets import Dataset
from rich.console import Console

from trl_multiagent.environments import MatrixGameEnv
from trl_multiagent.environments.matrix_game import TEAM_PAYOFF, parse_choice
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.trainers.completions import completions_table


def test_completions_file_holds_each_joint_action_of_the_logging_steps(tiny_ab_model, tmp_path):
    args = MAGRPOConfig(output_dir=str(tmp_path), report_to=[], max_completion_length=1, num_generations=2,
                                generation_kwargs={"suppress_tokens": [0, 1, 2]}, save_strategy="no",
                                disable_tqdm=True, max_steps=4, logging_steps=2, log_completions=True,
                                num_completions_to_print=1, learning_rate=1e-2)
    agents = [AgentSpec("agent1", model=tiny_ab_model, lora_r=4), AgentSpec("agent2", model=tiny_ab_model, lora_r=4)]
    trainer = MAGRPOTrainer(agents, MatrixGameEnv, args, Dataset.from_dict({"task_id": list(range(16))}))
    seen = []
    original = trainer.sample

    def spy(tasks):
        experience = original(tasks)
        seen.append((trainer.state.global_step + 1, experience))
        return experience

    trainer.sample = spy
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    logged = {step: exp for step, exp in seen if step % 2 == 0}
    assert sorted({r["step"] for r in rows}) == [2, 4]  # logging steps only
    for step, experience in logged.items():
        mine = [r for r in rows if r["step"] == step]
        # K = 2 samples per agent, paired by index (MAGRPO's joint actions): 2 joint actions of one task
        assert len(mine) == len(experience.joint_actions) == 2
        for row, joint in zip(mine, experience.joint_actions):
            assert row["reward"] == joint.reward
            members = {s.agent: s for s in experience.samples if joint.id in s.joint_ids}
            assert row["completions"] == {a: members[a].generation.text for a in ("agent1", "agent2")}
            assert row["advantages"] == {a: members[a].advantage for a in ("agent1", "agent2")}
    # each row's reward is the payoff of the two actions its completions name
    for row in rows:
        choices = tuple(parse_choice(row["completions"][a]) for a in ("agent1", "agent2"))
        assert row["reward"] == TEAM_PAYOFF[choices]
        assert row["components"]["both_A"] == float(choices == ("A", "A"))


def test_table_puts_the_agents_side_by_side():
    rows = [{"step": 3, "episode": 0, "turn": 0, "task": "post 7", "completions": {"summary": "Short.",
             "elaboration": "Longer text, however detailed."}, "advantages": {"summary": 0.5, "elaboration": 0.5},
             "reward": 0.4, "components": {"structure": 0.6}}] * 3
    console = Console(record=True, width=120)
    console.print(completions_table(rows, ["summary", "elaboration"], limit=2))
    text = console.export_text()
    assert "summary" in text and "elaboration" in text and "Longer text, however detailed." in text
    assert text.count("post 7") == 2  # limited to 2 rows
    assert "+0.500" in text and "0.400" in text and "structure 0.60" in text


def test_a_per_token_credit_is_logged_as_the_mean_of_its_token_advantages():
    from trl_multiagent.rollout.debate import DebateSample
    from trl_multiagent.trainers.completions import sample_advantage

    debate = DebateSample.__new__(DebateSample)  # only the two fields the function reads
    debate.advantage, debate.token_advantages = 0.0, [1.0, -0.5, 0.5, 1.0]
    assert sample_advantage(debate) == 0.5  # (1 - 0.5 + 0.5 + 1) / 4, where Sample.advantage stays 0
    debate.token_advantages = None
    debate.advantage = -0.25
    assert sample_advantage(debate) == -0.25
