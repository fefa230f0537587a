"""MAGRPOTrainer wiring: param groups per policy, per-agent metrics, files written by every run."""

import json

import pytest
from datasets import Dataset

from trl_multiagent.environments import MatrixGameEnv
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer


def _trainer(model_dir, tmp_path, **kw):
    args = MAGRPOConfig(output_dir=str(tmp_path), report_to=[], max_completion_length=1, num_generations=4,
                                generation_kwargs={"suppress_tokens": [0, 1, 2]},
                                save_strategy="no", disable_tqdm=True, learning_rate=1e-2, **kw)
    agents = [AgentSpec("agent1", model=model_dir, lora_r=4), AgentSpec("agent2", model=model_dir, lora_r=4,
                                                                         learning_rate=3e-2)]
    return MAGRPOTrainer(agents, MatrixGameEnv, args, Dataset.from_dict({"task_id": list(range(16))}))


def test_one_param_group_per_policy_with_its_learning_rate(tiny_ab_model, tmp_path):
    trainer = _trainer(tiny_ab_model, tmp_path, max_steps=2, lr_scheduler_type="linear")
    trainer.train()
    groups = trainer.optimizer.param_groups
    assert [g["policy"] for g in groups] == ["agent1", "agent2"]
    assert [g["initial_lr"] for g in groups] == [1e-2, 3e-2]
    for g in groups:
        assert {id(p) for p in g["params"]} == {id(p) for p in trainer.pool.policy_parameters(g["policy"])}
    # the scheduler scales each group from its own base rate
    assert groups[1]["lr"] == pytest.approx(3 * groups[0]["lr"])


def test_run_writes_metrics_summary_and_adapters(tiny_ab_model, tmp_path):
    trainer = _trainer(tiny_ab_model, tmp_path, max_steps=3, logging_steps=1)
    trainer.train()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "reward" in x]
    assert [x["step"] for x in steps] == [1, 2, 3]
    for key in ("agent/agent1/reward", "agent/agent2/reward", "return", "frac_reward_zero_std", "loss", "entropy",
                "env/both_A", "generated_samples"):
        assert key in steps[0], key
    assert steps[0]["generated_samples"] == 2 * 4  # n * K for one episode of one turn
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["algorithm"] == "MAGRPO" and summary["global_step"] == 3
    assert set(summary["agents"]) == {"agent1", "agent2"}
    for policy in ("agent1", "agent2"):
        assert (tmp_path / "adapters" / policy / "adapter_model.safetensors").is_file()


def test_max_grad_norm_bounds_each_policy_separately(tiny_ab_model, tmp_path):
    """One agent's 100x larger gradient does not shrink the other's step: the other's update equals the update it
    gets when it trains alone (plain SGD, so the step is proportional to the clipped gradient)."""
    import torch

    from trl_multiagent.rollout import Experience, Sample
    from trl_multiagent.team.pool import Generation

    trainer = _trainer(tiny_ab_model, tmp_path, max_steps=1, max_grad_norm=0.01, optim="sgd")
    pool = trainer.pool
    with torch.no_grad():
        for n, p in pool.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    lora = {n: p for n, p in pool.named_parameters() if "lora_" in n}
    start = {n: p.detach().clone() for n, p in lora.items()}
    tok = pool.tokenizer_of("agent1")
    a, b = tok.convert_tokens_to_ids("A"), tok.convert_tokens_to_ids("B")

    def samples(agent, advantage):
        prompt = pool.encode_prompt(agent, "AB")
        return [Sample(agent=agent, policy=agent, episode=0, turn=0, node=0, joint_ids=[],
                       generation=Generation(list(prompt), [t], ""), advantage=s * advantage)
                for t, s in ((a, 1.0), (b, -1.0))]

    optimizer = trainer.create_optimizer()

    def one_step(rows):
        with torch.no_grad():
            for n, p in lora.items():
                p.copy_(start[n])
        optimizer.zero_grad(set_to_none=True)
        trainer.update(pool, Experience(rows, [], {}))
        trainer._clip_grad_norm(pool)
        optimizer.step()
        return {n: p.detach().clone() for n, p in lora.items()}

    together = one_step(samples("agent1", 100.0) + samples("agent2", 1.0))
    norms = trainer._metrics["train"]
    assert norms["policy/agent2/grad_norm"][-1] > 0.01  # clipping is active for agent2 too
    # the counts behind make bench's train-pass bound: per policy one prompt of n tokens run once (n positions
    # attending 1 + ... + n keys) and two one-token completions (n + 1 positions, attending n + 1 keys each)
    lengths = [len(pool.encode_prompt(agent, "AB")) for agent in ("agent1", "agent2")]
    assert norms["tokens/loss_completions"][-1] == 4
    assert norms["tokens/loss_needed"][-1] == sum(n + 2 for n in lengths)
    assert norms["tokens/loss_attention_pairs"][-1] == sum(n * (n + 1) // 2 + 2 * (n + 1) for n in lengths)
    assert norms["policy/agent1/grad_norm"][-1] > 50 * norms["policy/agent2/grad_norm"][-1]
    alone = one_step(samples("agent2", 1.0))
    moved = [n for n in lora if ".agent2" in n and not torch.equal(alone[n], start[n])]
    assert moved
    from tests.numerics import assert_same_computation
    from tests.tiny import model_terms

    agent2 = [n for n in lora if ".agent2" in n]
    tokens = sum(len(s.generation.prompt_ids) + 1 for s in samples("agent2", 1.0))
    assert_same_computation([together[n] - start[n] for n in agent2], [alone[n] - start[n] for n in agent2],
                            terms=model_terms(tokens), what="agent2's step")
    for n in lora:
        if ".agent2" not in n:
            assert torch.equal(alone[n], start[n])


def test_assign_credit_runs_once_per_rollout_before_the_log_prob_pass(tiny_ab_model, tmp_path):
    """The credit stage: the base calls the trainer's assign_credit once per rollout (not once per step: a rollout
    serves num_iterations steps), right after the sampler's rollout, which brings no advantages, and before the
    behaviour log-probs; the update then reads the advantages it wrote."""
    trainer = _trainer(tiny_ab_model, tmp_path, max_steps=4, num_iterations=2, logging_steps=1)
    seen = []
    assign = trainer.assign_credit

    def spy(experience):
        before = [(s.advantage, s.old_logps) for s in experience.samples]
        assign(experience)
        seen.append((trainer.state.global_step, before, [s.advantage for s in experience.samples]))

    trainer.assign_credit = spy
    trainer.train()
    assert [step for step, _, _ in seen] == [0, 2]  # two rollouts for four steps
    for _, before, _ in seen:
        assert before == [(0.0, None)] * 8  # n * K samples, nothing credited or scored yet
    buffered = trainer._buffered_inputs.samples
    assert all(s.old_logps is not None for s in buffered)  # num_iterations > 1: behaviour log-probs after the credit
    assert [s.advantage for s in buffered] == seen[-1][2]  # what the last two updates read
