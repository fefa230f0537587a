"""frozen_policies: a partner that acts but never learns (AT-GRPO's Table 4 ablation)."""

import pytest
import torch
from datasets import Dataset

from trl_multiagent.environments import MatrixGameEnv
from trl_multiagent.team.agent_spec import check_frozen_policies
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers import CoLLMConfig, MAGRPOConfig, MAGRPOTrainer


def _trainer(model_dir, tmp_path, **kw):
    args = MAGRPOConfig(output_dir=str(tmp_path), report_to=[], max_completion_length=1, num_generations=4,
                        generation_kwargs={"suppress_tokens": [0, 1, 2]}, save_strategy="no", disable_tqdm=True,
                        learning_rate=1e-2, seed=3, **kw)
    agents = [AgentSpec("agent1", model=model_dir, lora_r=4), AgentSpec("agent2", model=model_dir, lora_r=4)]
    return MAGRPOTrainer(agents, MatrixGameEnv, args, Dataset.from_dict({"task_id": list(range(16))}))


def _weights(trainer, policy):
    return [p.detach().clone() for p in trainer.pool.policy_parameters(policy)]


def test_a_frozen_policy_keeps_its_adapter_and_the_other_learns_as_beside_a_learning_partner(tiny_ab_model, tmp_path):
    frozen = _trainer(tiny_ab_model, tmp_path / "frozen", max_steps=1, frozen_policies=["agent2"])
    start = {p: _weights(frozen, p) for p in ("agent1", "agent2")}
    frozen.train()
    assert [g["policy"] for g in frozen.optimizer.param_groups] == ["agent1"]
    assert all(not p.requires_grad for p in frozen.pool.policy_parameters("agent2"))
    assert all(torch.equal(a, b) for a, b in zip(_weights(frozen, "agent2"), start["agent2"]))
    moved = [not torch.equal(a, b) for a, b in zip(_weights(frozen, "agent1"), start["agent1"])]
    assert any(moved)
    # the same seed with both policies learning: the first step's rollout is the same, and each policy's loss,
    # clipping and optimizer state are its own, so agent1's first update is the same update
    both = _trainer(tiny_ab_model, tmp_path / "both", max_steps=1)
    assert all(torch.equal(a, b) for a, b in zip(_weights(both, "agent1"), start["agent1"]))
    both.train()
    for a, b in zip(_weights(both, "agent1"), _weights(frozen, "agent1")):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert any(not torch.equal(a, b) for a, b in zip(_weights(both, "agent2"), start["agent2"]))
    # the frozen policy's samples are rolled out (it acts) but not counted in what the update computes
    metrics = [line for line in (tmp_path / "frozen" / "metrics.jsonl").read_text().splitlines() if "loss" in line]
    assert metrics and "agent/agent2/reward" in metrics[0]


def test_frozen_policies_are_checked_before_any_model_loads():
    with pytest.raises(ValueError, match=r"no policy of; its policies are \['a', 'b'\]"):
        check_frozen_policies(["c"], {"a", "b"})
    with pytest.raises(ValueError, match="freezes every policy"):
        check_frozen_policies(["a", "b"], {"a", "b"})
    with pytest.raises(ValueError, match="policy_mapping: specialized"):
        check_frozen_policies(["shared"], {"shared"})
    check_frozen_policies([], {"a"})
    check_frozen_policies(["a"], {"a", "b"})


def test_frozen_policies_from_a_command_line_and_refused_where_critics_train(tmp_path):
    assert MAGRPOConfig(output_dir=str(tmp_path), report_to=[], frozen_policies="tool").frozen_policies == ["tool"]
    assert MAGRPOConfig(output_dir=str(tmp_path), report_to=[]).frozen_policies == []
    with pytest.raises(ValueError, match="frozen_policies=.*has no frozen partner"):
        CoLLMConfig(output_dir=str(tmp_path), report_to=[], num_generations=1, frozen_policies=["a"])


def test_an_unknown_frozen_policy_is_one_error_before_the_model_loads(tmp_path):
    with pytest.raises(ValueError, match=r"frozen_policies names \['tool'\]"):
        _trainer("/nonexistent-model-never-loaded", tmp_path, max_steps=1, frozen_policies=["tool"])


# ------------------------------------------------------------------- agents trained apart, evaluated together
def _saved(folder, policies=("reasoner", "tool"), lora_r=16):
    """A saved team's layout (adapters/team.json) without a model: one policy per agent."""
    import json

    (folder / "adapters").mkdir(parents=True)
    agents = [{"name": p, "policy": p, "model": "smollm2-135m-instruct", "lora_r": lora_r, "lora_alpha": 32}
              for p in policies]
    (folder / "adapters" / "team.json").write_text(json.dumps({"agents": agents}))
    return folder


def test_adapter_sources_take_one_policy_from_another_team_and_check_it_fits(tmp_path):
    from trl_multiagent.command.evaluate import adapter_sources
    from trl_multiagent.errors import RecipeError

    team, other = _saved(tmp_path / "team"), _saved(tmp_path / "tool_trained")
    assert adapter_sources(team, []) == {"reasoner": str(team), "tool": str(team)}
    assert adapter_sources(team, [f"tool={other}"]) == {"reasoner": str(team), "tool": str(other)}
    narrow = _saved(tmp_path / "narrow", lora_r=8)
    alone = _saved(tmp_path / "alone", policies=("reasoner",))
    for given, message in (([f"tool{other}"], "give POLICY=DIR"), ([f"coder={other}"], "not 'coder'"),
                           ([f"tool={narrow}"], r"differs from the team's in \['lora_r'\]"),
                           ([f"tool={alone}"], "has no policy 'tool'"),
                           ([f"tool={tmp_path / 'none'}"], "does not exist")):
        with pytest.raises(RecipeError, match=message):
            adapter_sources(team, given)


def test_a_policy_adapter_loaded_from_another_team_replaces_that_policy_alone(tiny_ab_model, tmp_path):
    from trl_multiagent.command.evaluate import load_policy_adapter
    from trl_multiagent.team.pool import AgentPool

    specs = [AgentSpec("agent1", model=tiny_ab_model, lora_r=4), AgentSpec("agent2", model=tiny_ab_model, lora_r=4)]
    torch.manual_seed(0)
    first = AgentPool(specs)
    first.save_adapters(tmp_path / "first")
    with torch.no_grad():
        for p in first.policy_parameters("agent1") + first.policy_parameters("agent2"):
            p.add_(0.5)
    first.save_adapters(tmp_path / "second")
    pool = AgentPool.from_pretrained(tmp_path / "first")
    one = [p.detach().clone() for p in pool.policy_parameters("agent1")]
    load_policy_adapter(pool, "agent2", str(tmp_path / "second"))
    assert all(torch.equal(a, b) for a, b in zip(pool.policy_parameters("agent1"), one))
    assert all(torch.equal(a, b) for a, b in zip(pool.policy_parameters("agent2"), first.policy_parameters("agent2")))


def test_adapter_sources_take_another_policy_of_a_team_for_the_swapped_row(tmp_path):
    from trl_multiagent.command.evaluate import adapter_sources, split_adapter_source
    from trl_multiagent.errors import RecipeError

    team = _saved(tmp_path / "team")
    swapped = adapter_sources(team, [f"reasoner=tool@{team}", f"tool=reasoner@{team}"])
    assert swapped == {"reasoner": f"tool@{team}", "tool": f"reasoner@{team}"}
    assert adapter_sources(team, [f"tool=tool@{team}"]) == {"reasoner": str(team), "tool": str(team)}
    assert split_adapter_source("tool@runs/a") == ("tool", "runs/a")
    assert split_adapter_source("runs/x@y/a") == (None, "runs/x@y/a")  # an @ inside a folder's path is no source
    narrow = _saved(tmp_path / "narrow", policies=("reasoner", "planner"), lora_r=8)
    with pytest.raises(RecipeError, match="has no policy 'coder'"):
        adapter_sources(team, [f"tool=coder@{team}"])
    with pytest.raises(RecipeError, match=r"its 'planner' differs from the team's 'tool' in \['lora_r'\]"):
        adapter_sources(team, [f"tool=planner@{narrow}"])


def test_two_policies_swapped_take_each_others_saved_adapters(tiny_ab_model, tmp_path):
    from trl_multiagent.command.evaluate import load_policy_adapter
    from trl_multiagent.team.pool import AgentPool

    specs = [AgentSpec("agent1", model=tiny_ab_model, lora_r=4), AgentSpec("agent2", model=tiny_ab_model, lora_r=4)]
    torch.manual_seed(0)
    saved = AgentPool(specs)
    with torch.no_grad():
        for p in saved.policy_parameters("agent1"):
            p.add_(0.25)
        for p in saved.policy_parameters("agent2"):
            p.sub_(0.75)
    saved.save_adapters(tmp_path / "team")
    pool = AgentPool.from_pretrained(tmp_path / "team")
    load_policy_adapter(pool, "agent1", f"agent2@{tmp_path / 'team'}")
    load_policy_adapter(pool, "agent2", f"agent1@{tmp_path / 'team'}")  # from the files: the first swap changes nothing
    assert all(torch.equal(a, b) for a, b in zip(pool.policy_parameters("agent1"), saved.policy_parameters("agent2")))
    assert all(torch.equal(a, b) for a, b in zip(pool.policy_parameters("agent2"), saved.policy_parameters("agent1")))
    assert not all(torch.equal(a, b) for a, b in zip(pool.policy_parameters("agent1"),
                                                     saved.policy_parameters("agent1")))
