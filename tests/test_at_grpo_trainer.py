"""ATGRPOTrainer (AT-GRPO): role-sharing pools data, role-specialized routes it; Table 5(b) learning."""

import functools

import pytest
from datasets import Dataset

from trl_multiagent.environments import MatrixGameEnv
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers import ATGRPOConfig, ATGRPOTrainer


def _trainer(model_dir, tmp_path, shared, alpha=1.0, local_payoff="posg2", seed=0, **kw):
    args = ATGRPOConfig(
        output_dir=str(tmp_path), agent_order="parallel", alpha=alpha, seed=seed,
        num_generations=8, max_completion_length=1, generation_kwargs={"suppress_tokens": [0, 1, 2]},
        report_to=[], save_strategy="no", disable_tqdm=True, **kw)
    policy = {"policy": "team"} if shared else {}
    agents = [AgentSpec("agent1", model=model_dir, lora_r=4, lora_alpha=8, **policy),
              AgentSpec("agent2", model=model_dir, lora_r=4, lora_alpha=8, **policy)]
    env = functools.partial(MatrixGameEnv, local_payoff=local_payoff)
    return ATGRPOTrainer(agents, env, args, Dataset.from_dict({"task_id": list(range(256))}))


def _spy_loss_calls(trainer):
    calls = []
    original = trainer._compute_loss

    def spy(model, batch):
        calls.append((model.args[0], batch["completion_ids"].shape[0]))
        return original(model, batch)

    trainer._compute_loss = spy
    trainer.current_gradient_accumulation_steps = 1
    return calls


def test_role_sharing_pools_all_roles_into_one_policy(tiny_ab_model, tmp_path):
    trainer = _trainer(tiny_ab_model, tmp_path, shared=True, per_device_train_batch_size=32)
    assert list(trainer.pool.policies) == ["team"]
    exp = trainer.rollout([{}])
    assert {s.agent for s in exp.samples_of("team")} == {"agent1", "agent2"}
    calls = _spy_loss_calls(trainer)
    trainer.pool.train()
    trainer.update(trainer.model, exp)
    assert calls == [("team", 16)]  # both agents' 8 candidates in one policy's update


def test_role_specialized_routes_each_agents_data_to_its_own_policy(tiny_ab_model, tmp_path):
    trainer = _trainer(tiny_ab_model, tmp_path, shared=False, per_device_train_batch_size=32)
    exp = trainer.rollout([{}])
    assert {s.agent for s in exp.samples_of("agent1")} == {"agent1"}
    assert {s.agent for s in exp.samples_of("agent2")} == {"agent2"}
    calls = _spy_loss_calls(trainer)
    trainer.pool.train()
    # agent2's data alone: its gradient reaches agent2's adapter only
    exp.samples = [s for s in exp.samples if s.agent == "agent2"]
    for s in exp.samples:
        s.advantage = 1.0 if s.generation.text == "A" else -1.0
    trainer.update(trainer.model, exp)
    assert calls == [("agent2", 8)]
    assert all(p.grad is None for p in trainer.pool.policy_parameters("agent1"))
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.pool.policy_parameters("agent2"))


def _joint_utility(trainer):
    """Expected Table 4 utility of the agents' current policies (their P(A | A or B) after the prompt)."""
    from tests.test_learning import prob_a

    p1, p2 = prob_a(trainer, "agent1"), prob_a(trainer, "agent2")
    return p1 * p2 * 10 + (p1 * (1 - p2) + (1 - p1) * p2) * 7, p1 * p2


@pytest.mark.slow
def test_table5b_local_rewards_miss_the_optimum_team_reward_finds_it(tiny_ab_model, tmp_path):
    from tests.test_learning import greedy_joint_action
    from trl_multiagent.environments.matrix_game import TEAM_PAYOFF

    common = dict(max_steps=40, episodes_per_step=2, learning_rate=0.15, lr_scheduler_type="constant",
                  logging_steps=10)
    local_only, team_only = [], []
    for seed in (0, 1, 2):
        t = _trainer(tiny_ab_model, tmp_path / f"local{seed}", shared=False, alpha=0.0, seed=seed, **common)
        t.train()
        local_only.append((*_joint_utility(t), TEAM_PAYOFF[greedy_joint_action(t)]))
        t = _trainer(tiny_ab_model, tmp_path / f"team{seed}", shared=False, alpha=1.0, local_payoff=None,
                     seed=seed, **common)
        t.train()
        team_only.append((*_joint_utility(t), TEAM_PAYOFF[greedy_joint_action(t)]))
    # individual rewards (Table 5(b)): the agents drift to the anti-coordinated equilibria: the joint action they
    # play is worth at most 7, and so is the expected utility of their stochastic policies
    assert all(u <= 7.0 + 0.25 and greedy <= 7.0 and p_aa < 0.5 for u, p_aa, greedy in local_only), local_only
    # the team reward: both agents move to A, the joint optimum worth 10. (The tiny model's lm_head is random and
    # not adapted, which caps P(A) near 0.73, hence an expected utility near 8 rather than 10.)
    assert all(greedy == 10.0 and u > 8.0 for u, _, greedy in team_only), team_only
