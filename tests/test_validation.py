"""Bad input gets one clear error before any model loads."""

import json
from pathlib import Path

import pytest
from datasets import Dataset

from trl_multiagent.agents import AgentSpec
from trl_multiagent.environments import FunctionEnvironment, MatrixGameEnv
from trl_multiagent.recipe import (
    RecipeError,
    build_dataset,
    build_trainer,
    held_out_tasks,
    load_recipe,
    resolve_environment,
)
from trl_multiagent.trainers import MultiAgentGRPOConfig, MultiAgentGRPOTrainer

NOWHERE = "/nonexistent/model/dir-that-would-fail-to-load"


def _args(tmp_path, **kw):
    return MultiAgentGRPOConfig(output_dir=str(tmp_path), report_to=[], **kw)


def test_agents_must_match_environment_roles(tmp_path):
    # the model path does not exist: reaching the loader would raise a different error
    agents = [AgentSpec("agent1", model=NOWHERE), AgentSpec("helper", model=NOWHERE)]
    with pytest.raises(ValueError, match=r"do not match the roles of MatrixGameEnv"):
        MultiAgentGRPOTrainer(agents, MatrixGameEnv, _args(tmp_path), Dataset.from_dict({"x": [1]}))


def test_dataset_missing_columns(tmp_path):
    env = lambda: FunctionEnvironment(["solo"], {"solo": lambda t: t["question"]}, lambda completions: 0.0,  # noqa: E731
                                      required_columns=["question"])
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['question'\]"):
        MultiAgentGRPOTrainer([AgentSpec("solo", model=NOWHERE)], env, _args(tmp_path),
                              Dataset.from_dict({"prompt": ["hi"]}))


def test_empty_dataset(tmp_path):
    with pytest.raises(ValueError, match="empty"):
        MultiAgentGRPOTrainer([AgentSpec("agent1", model=NOWHERE), AgentSpec("agent2", model=NOWHERE)],
                              MatrixGameEnv, _args(tmp_path), Dataset.from_dict({"x": []}))


@pytest.mark.parametrize("kw,match", [
    ({"num_turns": 0}, "num_turns"),
    ({"joint_mode": "diagonal"}, "joint_mode"),
    ({"gamma": 1.5}, "gamma"),
    ({"gradient_accumulation_steps": 2}, "episodes_per_step"),
    ({"model_dtype": "int3"}, "model_dtype"),
])
def test_config_errors(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        _args(tmp_path, **kw)


def test_recipe_unknown_key_suggests(tmp_path):
    with pytest.raises(RecipeError, match=r"unknown key 'lerning_rate'; did you mean 'learning_rate'"):
        load_recipe([], yaml_text="lerning_rate: 0.1\n")


def test_recipe_wrong_types():
    with pytest.raises(RecipeError, match=r"'max_steps' expects an integer, got 'ten'"):
        load_recipe([], yaml_text="max_steps: ten\n")
    with pytest.raises(RecipeError, match=r"'learning_rate' expects a number"):
        load_recipe(["--learning_rate", "fast"])
    with pytest.raises(RecipeError, match=r"'env_kwargs' expects a mapping"):
        load_recipe([], yaml_text="env_kwargs: [1, 2]\n")


def test_recipe_values_and_overrides(tmp_path):
    recipe, config = load_recipe(["--num_generations", "6", "--bf16", "false", "--output_dir", str(tmp_path)],
                                 yaml_text="learning_rate: 1e-5\nnum_generations: 2\nnum_turns: 2\n")
    assert config.learning_rate == 1e-5  # YAML reads 1e-5 as a string; the recipe reads it as a number
    assert config.num_generations == 6 and config.num_turns == 2  # the command line wins
    assert recipe.environment == "matrix_game"


def test_recipe_agents_checked_before_loading(tmp_path):
    recipe, config = load_recipe(["--output_dir", str(tmp_path)],
                                 yaml_text=f"model: {NOWHERE}\nagents:\n  - {{name: agent1}}\n  - {{name: bob}}\n")
    with pytest.raises(RecipeError, match=r"do not match the environment's roles"):
        build_trainer(recipe, config)
    recipe, config = load_recipe(["--output_dir", str(tmp_path)],
                                 yaml_text="agents:\n  - {name: agent1, lr: 1}\n  - {name: agent2}\n")
    with pytest.raises(RecipeError, match=r"agents\[0\]: unknown key 'lr'"):
        build_trainer(recipe, config)


def test_recipe_unknown_environment_and_missing_files(tmp_path):
    with pytest.raises(RecipeError, match="Unknown environment"):
        recipe, config = load_recipe(["--environment", "chess", "--output_dir", str(tmp_path)])
        build_trainer(recipe, config)
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe(["--config", str(tmp_path / "missing.yaml")])


def test_recipe_hub_dataset_offline_is_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    recipe, config = load_recipe(["--dataset", "someone/not-a-local-dataset", "--output_dir", str(tmp_path)])
    with pytest.raises(RecipeError, match="reachable Hugging Face Hub"):
        build_trainer(recipe, config)


def test_recipe_policy_mapping(tmp_path):
    from trl_multiagent.recipe import build_team

    recipe, _ = load_recipe(["--policy_mapping", "shared", "--output_dir", str(tmp_path)])
    assert {s.policy for s in build_team(recipe, ["agent1", "agent2"])} == {"shared"}
    recipe, _ = load_recipe(["--output_dir", str(tmp_path)])
    assert [s.policy for s in build_team(recipe, ["agent1", "agent2"])] == ["agent1", "agent2"]
    recipe, _ = load_recipe(["--policy_mapping", "mixed", "--output_dir", str(tmp_path)])
    with pytest.raises(RecipeError, match="policy_mapping"):
        build_team(recipe, ["agent1", "agent2"])


def test_sequential_at_grpo_needs_partial_actions_before_loading(tmp_path):
    from trl_multiagent.trainers import ATGRPOConfig, ATGRPOTrainer

    args = ATGRPOConfig(output_dir=str(tmp_path), report_to=[], agent_order="sequential")
    with pytest.raises(ValueError, match="partial"):
        ATGRPOTrainer([AgentSpec("agent1", model=NOWHERE), AgentSpec("agent2", model=NOWHERE)],
                      MatrixGameEnv, args, Dataset.from_dict({"x": [1]}))
    with pytest.raises(ValueError, match="agent_order"):
        ATGRPOConfig(output_dir=str(tmp_path), report_to=[], agent_order="by_vibes")


CONFIGS = sorted((Path(__file__).resolve().parents[1] / "recipes" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_shipped_config_loads_and_names_its_held_out_split(path, tmp_path):
    recipe, config = load_recipe(["--config", str(path), "--output_dir", str(tmp_path)])
    assert config.output_dir == str(tmp_path)
    # a team trained on a hub dataset is evaluated on a split the config names (the coding recipe has its own)
    if recipe.dataset != "generated" and recipe.environment != "humaneval_aux_main":
        assert recipe.eval_dataset_split, f"{path.name} trains on {recipe.dataset} but names no eval_dataset_split"


def test_held_out_tasks_of_generated_environments_are_their_eval_or_test_split(tmp_path):
    recipe, config = load_recipe(["--environment", "plan_path", "--output_dir", str(tmp_path)])
    held_out = held_out_tasks(recipe, config, 5)
    assert len(held_out) == 5 and all("/eval/" in t for t in held_out["task_id"])
    train = build_dataset(recipe, resolve_environment("plan_path"), config)
    assert not set(map(tuple, train["grid"])) & set(map(tuple, held_out["grid"]))
    recipe, config = load_recipe(["--environment", "math_debate", "--output_dir", str(tmp_path)])
    held_out = held_out_tasks(recipe, config, 3)
    train_questions = set(build_dataset(recipe, resolve_environment("math_debate"), config)["question"])
    assert len(held_out) == 3 and not train_questions & set(held_out["question"])


def test_held_out_tasks_of_hub_and_file_datasets_need_a_named_split(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    recipe, config = load_recipe(["--environment", "math_debate", "--dataset", "someone/not-a-local-dataset",
                                  "--output_dir", str(tmp_path)])
    with pytest.raises(RecipeError, match="needs eval_dataset_split"):
        held_out_tasks(recipe, config, 4)
    recipe.eval_dataset_split = "test"
    with pytest.raises(RecipeError, match="reachable Hugging Face Hub"):
        held_out_tasks(recipe, config, 4)
    recipe.eval_dataset_split = "generated"  # explicit: the environment's generated held-out problems
    assert len(held_out_tasks(recipe, config, 4)) == 4
    # a file has no splits: the held-out tasks come from another file, never from the training file itself
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(6)]
    train_file, eval_file = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    train_file.write_text("\n".join(json.dumps(r) for r in rows[:4]))
    eval_file.write_text("\n".join(json.dumps(r) for r in rows[4:]))
    recipe, config = load_recipe(["--environment", "math_debate", "--dataset", str(train_file),
                                  "--eval_dataset_split", "test", "--output_dir", str(tmp_path)])
    with pytest.raises(RecipeError, match="must be another data file"):
        held_out_tasks(recipe, config, 4)
    recipe.eval_dataset_split = str(eval_file)
    assert held_out_tasks(recipe, config, 4)["question"] == ["What is 4 + 1?", "What is 5 + 1?"]


@pytest.mark.parametrize("script,config", [
    ("at_grpo", "gsm8k_at_grpo"), ("actor_critic", "tldr_hub_cc"), ("debate", "gsm8k_debate"),
    ("mhgpo", "hotpotqa_mhgpo_rr")])
def test_recipe_scripts_stop_before_loading_when_the_held_out_split_is_missing(script, config, tmp_path, caplog):
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location(f"recipe_{script}", root / "recipes" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = ["--config", str(root / "recipes" / "configs" / f"{config}.yaml"), "--output_dir", str(tmp_path),
            "--eval_dataset_split", "", "--model", NOWHERE]  # a model that would fail differently if it were loaded
    assert module.main(argv) == 2
    assert "needs eval_dataset_split" in caplog.text
