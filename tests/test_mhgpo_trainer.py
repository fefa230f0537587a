"""MHGPOTrainer (MHGPO): config validation, errors before any model loads, parameter sharing, the Eq. 6
loss weights reaching the gradient, and the recipes."""

import functools
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from tests.numerics import assert_same_computation, relative_deviation, rounding_tolerance
from tests.recipe_runs import build_trainer
from tests.test_mhgpo_learning import AB_ONLY, TwoStageGame
from tests.tiny import model_terms
from trl_multiagent.command.cli import load_recipe
from trl_multiagent.command.recipe import RecipeError
from trl_multiagent.credit.mhgpo import agent_loss_weights
from trl_multiagent.environments import MatrixGameEnv
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers import MHGPOConfig, MHGPOTrainer

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "recipes" / "configs").glob("*mhgpo*.yaml"))
TASKS = Dataset.from_dict({"task_id": list(range(16))})


def _args(tmp_path, **kw):
    return MHGPOConfig(output_dir=str(tmp_path), num_generations=4, max_completion_length=1,
                                    generation_kwargs=AB_ONLY, report_to=[], save_strategy="no", disable_tqdm=True,
                                    **kw)


def _agents(model, **kw):
    return [AgentSpec("first", model=model, lora_r=4, lora_alpha=8, **kw),
            AgentSpec("second", model=model, lora_r=4, lora_alpha=8, **kw)]


@pytest.mark.parametrize("kwargs, message", [
    ({"sampling": "fof"}, "sampling must be one of"),
    ({"fork_probabilities": [0.5, 0.5]}, "round_robin' only"),
    ({"sampling": "round_robin", "fork_probabilities": [0.7, 0.7]}, "sum to 1"),
    ({"sampling": "round_robin", "fork_probabilities": [1.5, -0.5]}, "non-negative"),
    ({"reward_aggregation": "median"}, "reward_aggregation must be"),
    ({"loss_type": "dapo"}, "per-sequence loss_type"),
])
def test_config_validation(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _args(tmp_path, **kwargs)


def test_config_has_only_its_own_fields(tmp_path):
    import dataclasses

    names = {f.name for f in dataclasses.fields(MHGPOConfig)}
    assert not names & {"joint_mode", "grouping", "agent_order", "alpha"}
    # num_turns / gamma are the shared base's fields: the pipeline runs once per question
    with pytest.raises(ValueError, match="num_turns must be 1 for MHGPO"):
        _args(tmp_path, num_turns=2)


def test_config_defaults_follow_the_paper(tmp_path):
    args = _args(tmp_path)
    assert args.sampling == "fork_on_first" and args.loss_type == "grpo" and args.beta == 0.001  # Table 2's beta
    assert args.epsilon == 0.2 and args.reward_aggregation == "mean" and args.agent_loss_weighting
    assert MHGPOConfig(output_dir=str(tmp_path)).num_generations == 4  # Table 2's rollout.n
    # RR without fork_probabilities forks with the paper's (0.7, 0.1, 0.2) (tests/test_mhgpo_rollout.py draws them)
    rr = _args(tmp_path, sampling="round_robin")
    assert rr.fork_probabilities is None
    assert rr.regroup_singletons  # Algorithm 5's regrouping of singleton groups (tests/test_mhgpo_rollout.py)
    assert _args(tmp_path, loss_type="dapo", agent_loss_weighting=False).loss_type == "dapo"


def test_errors_come_before_any_model_loads(tmp_path):
    missing = "/nonexistent/model"  # loading it would fail differently
    with pytest.raises(TypeError, match="must return a PipelineEnvironment"):
        MHGPOTrainer(_agents(missing), MatrixGameEnv, _args(tmp_path), TASKS)
    with pytest.raises(ValueError, match="fork_probabilities has 3 entries"):
        MHGPOTrainer(_agents(missing), TwoStageGame,
                                  _args(tmp_path, sampling="round_robin", fork_probabilities=[0.5, 0.25, 0.25]),
                                  TASKS)
    with pytest.raises(ValueError, match="do not match"):
        MHGPOTrainer(_agents(missing)[:1], TwoStageGame, _args(tmp_path), TASKS)

    class NeedsQuestion(TwoStageGame):
        required_columns = ("question",)

    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['question'\]"):
        MHGPOTrainer(_agents(missing), NeedsQuestion, _args(tmp_path), TASKS)
    with pytest.raises(TypeError, match="MHGPOConfig"):
        from trl_multiagent.trainers import MAGRPOConfig

        MHGPOTrainer(_agents(missing), TwoStageGame, MAGRPOConfig(output_dir=str(tmp_path)),
                                  TASKS)


def test_one_shared_policy_by_default_per_agent_adapters_on_request(tiny_text_model, tmp_path):
    shared = MHGPOTrainer(_agents(tiny_text_model), TwoStageGame, _args(tmp_path / "a"), TASKS)
    assert list(shared.pool.policies) == ["shared"]
    assert shared.pool.policy_of("first") == shared.pool.policy_of("second") == "shared"
    separate = MHGPOTrainer(_agents(tiny_text_model), TwoStageGame,
                                         _args(tmp_path / "b", share_policy=False), TASKS)
    assert sorted(separate.pool.policies) == ["first", "second"]
    exp = separate.rollout([{"task_id": 0}, {"task_id": 1}])
    assert {s.agent for s in exp.samples_of("second")} == {"second"}
    assert len(exp.samples_of("first")) == 2 * 4  # FoF: G samples per question for every agent


def test_eq6_agent_weights_reach_the_gradient(tiny_text_model, tmp_path):
    trainer = MHGPOTrainer(
        _agents(tiny_text_model), TwoStageGame,
        _args(tmp_path, sampling="round_robin", fork_probabilities=[0.5, 0.5], per_device_train_batch_size=64,
              seed=3), TASKS)
    # question 0 forks at `first` (4 + 4 samples); questions 1 and 2 fork at `second` (1 + 4 samples each)
    trainer.sampler.fork_agents = lambda graph, n: ["first", "second", "second"][:n]
    exp = trainer.rollout([{"task_id": i} for i in range(3)])
    rows = exp.samples_of("shared")
    assert [sum(1 for s in rows if (s.episode, s.agent) == key) for key in
            [(0, "first"), (0, "second"), (1, "first"), (1, "second")]] == [4, 4, 1, 4]
    assert any(s.advantage != 0 for s in rows)
    weights = agent_loss_weights([s.agent for s in rows], [s.episode for s in rows])
    assert weights[[i for i, s in enumerate(rows) if (s.episode, s.agent) == (1, "first")][0]] == pytest.approx(1 / 6)
    trainer.current_gradient_accumulation_steps = 1
    trainer.pool.train()
    params = trainer.pool.policy_parameters("shared")

    def grads_of(loss_fn):
        trainer.pool.zero_grad(set_to_none=True)
        loss_fn()
        return torch.cat([p.grad.reshape(-1).clone() for p in params])

    def per_sample(ws):
        model = functools.partial(trainer.model, "shared")
        total = sum(w * trainer._compute_loss(model, trainer.collate("shared", [s])) for s, w in zip(rows, ws))
        total.backward()

    from_update = grads_of(lambda: trainer.update(trainer.model, exp))
    weighted = grads_of(lambda: per_sample(weights))
    plain = grads_of(lambda: per_sample([1 / len(rows)] * len(rows)))
    # the update's batch and one pass per sample sum in another order (tests/numerics.py)
    terms = model_terms(sum(len(s.generation.prompt_ids) + len(s.generation.completion_ids) for s in rows))
    assert_same_computation(from_update, weighted, terms=terms, what="Eq. 6 weighted gradients")
    # Eq. 6 is not the plain mean here: far more than rounding apart
    assert relative_deviation(from_update, plain) > 10 * rounding_tolerance(terms)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_recipes_parse(path):
    recipe, config = load_recipe(["--config", str(path)])
    assert recipe.trainer == "mhgpo" and isinstance(config, MHGPOConfig)
    assert recipe.environment == "search_qa"


def test_recipe_strategies_and_hub_recipes_fail_clearly_offline():
    strategies = {load_recipe(["--config", str(p)])[1].sampling for p in CONFIGS}
    assert strategies == {"independent", "fork_on_first", "round_robin"}
    hub = [p for p in CONFIGS if load_recipe(["--config", str(p)])[0].dataset != "generated"]
    assert len(hub) == 3  # HotpotQA, 2WikiMultihopQA, MuSiQue
    for path in hub:
        recipe, config = load_recipe(["--config", str(path), "--model", "/nonexistent/model"])
        with pytest.raises(RecipeError, match="Could not load the dataset"):
            build_trainer(recipe, config)
