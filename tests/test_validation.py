"""Bad input gets one clear error before any model loads."""

import json
from pathlib import Path

import pytest
from datasets import Dataset

from trl_multiagent.command.cli import load_recipe
from trl_multiagent.command.recipe import (
    RecipeError,
    build_dataset,
    held_out_tasks,
    resolve_environment,
)
from trl_multiagent.environments import FunctionEnvironment, MatrixGameEnv
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer

NOWHERE = "/nonexistent/model/dir-that-would-fail-to-load"


def _args(tmp_path, **kw):
    return MAGRPOConfig(output_dir=str(tmp_path), report_to=[], **kw)


def test_agents_must_match_environment_roles(tmp_path):
    # the model path does not exist: reaching the loader would raise a different error
    agents = [AgentSpec("agent1", model=NOWHERE), AgentSpec("helper", model=NOWHERE)]
    with pytest.raises(ValueError, match=r"do not match the roles of MatrixGameEnv"):
        MAGRPOTrainer(agents, MatrixGameEnv, _args(tmp_path), Dataset.from_dict({"x": [1]}))


def test_dataset_missing_columns(tmp_path):
    env = lambda: FunctionEnvironment(["solo"], {"solo": lambda t: t["question"]}, lambda completions: 0.0,  # noqa: E731
                                      required_columns=["question"])
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['question'\]"):
        MAGRPOTrainer([AgentSpec("solo", model=NOWHERE)], env, _args(tmp_path),
                              Dataset.from_dict({"prompt": ["hi"]}))


def test_empty_dataset(tmp_path):
    with pytest.raises(ValueError, match="empty"):
        MAGRPOTrainer([AgentSpec("agent1", model=NOWHERE), AgentSpec("agent2", model=NOWHERE)],
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


def _build(recipe, config):
    """The runner's path to a trainer: every check that needs no model, then the trainer (and its model load)."""
    from trl_multiagent.command.runner import Run

    run = Run(recipe, config)
    run.prepare()
    return run.build_trainer()


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
        _build(recipe, config)
    recipe, config = load_recipe(["--output_dir", str(tmp_path)],
                                 yaml_text="agents:\n  - {name: agent1, lr: 1}\n  - {name: agent2}\n")
    with pytest.raises(RecipeError, match=r"agents\[0\]: unknown key 'lr'"):
        _build(recipe, config)


def test_a_key_set_twice_in_a_recipe_file_is_refused_with_both_lines(tmp_path):
    recipe = tmp_path / "twice.yaml"
    recipe.write_text("learning_rate: 1.0e-5\nnum_generations: 2\nlearning_rate: 3.0e-4\n")
    with pytest.raises(RecipeError, match=r"the key 'learning_rate' is set twice \(lines 1 and 3\)"):
        load_recipe(["--config", str(recipe), "--output_dir", str(tmp_path / "out")])
    nested = tmp_path / "nested.yaml"  # inside a mapping value too, and in a flow mapping on one line
    nested.write_text("env_kwargs: {max_turns: 2, max_turns: 3}\n")
    with pytest.raises(RecipeError, match="the key 'max_turns' is set twice"):
        load_recipe(["--config", str(nested), "--output_dir", str(tmp_path / "out")])


def test_recipe_unknown_environment_and_missing_files(tmp_path):
    with pytest.raises(RecipeError, match="Unknown environment"):
        recipe, config = load_recipe(["--environment", "chess", "--output_dir", str(tmp_path)])
        _build(recipe, config)
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe(["--config", str(tmp_path / "missing.yaml")])


def test_recipe_hub_dataset_offline_is_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    recipe, config = load_recipe(["--dataset", "someone/not-a-local-dataset", "--output_dir", str(tmp_path),
                                  "--evaluator", "none"])
    with pytest.raises(RecipeError, match="reachable Hugging Face Hub"):
        _build(recipe, config)


def test_recipe_policy_mapping(tmp_path):
    from trl_multiagent.command.recipe import build_team

    recipe, _ = load_recipe(["--policy_mapping", "shared", "--output_dir", str(tmp_path)])
    assert {s.policy for s in build_team(recipe, ["agent1", "agent2"])} == {"shared"}
    recipe, _ = load_recipe(["--output_dir", str(tmp_path)])
    assert [s.policy for s in build_team(recipe, ["agent1", "agent2"])] == ["agent1", "agent2"]
    with pytest.raises(RecipeError, match="policy_mapping must be 'specialized' or 'shared', got 'mixed'"):
        load_recipe(["--policy_mapping", "mixed", "--output_dir", str(tmp_path)])


def test_sequential_at_grpo_needs_partial_actions_before_loading(tmp_path):
    from trl_multiagent.trainers import ATGRPOConfig, ATGRPOTrainer

    args = ATGRPOConfig(output_dir=str(tmp_path), report_to=[], agent_order="sequential")
    with pytest.raises(ValueError, match="partial"):
        ATGRPOTrainer([AgentSpec("agent1", model=NOWHERE), AgentSpec("agent2", model=NOWHERE)],
                      MatrixGameEnv, args, Dataset.from_dict({"x": [1]}))
    with pytest.raises(ValueError, match="agent_order"):
        ATGRPOConfig(output_dir=str(tmp_path), report_to=[], agent_order="by_vibes")


ALL_CONFIGS = sorted((Path(__file__).resolve().parents[1] / "recipes" / "configs").glob("*.yaml"))
#: the training recipes (the others, e.g. `command: train-verifier`, belong to another command and its tests)
CONFIGS = [p for p in ALL_CONFIGS if "\ncommand:" not in "\n" + p.read_text()]


def test_every_shipped_critic_recipe_can_show_m_t():
    """CoLLM's critics (CC and DC, App. E) read m_t, which shows a turn's largest reward: every shipped actor-critic
    recipe sets reward_max or runs an environment that has one (else its trainer refuses it before loading)."""
    from trl_multiagent.command.recipe import environment_factory

    critic_recipes = [p for p in CONFIGS if "trainer: collm" in p.read_text()]
    assert len(critic_recipes) >= 10
    for path in critic_recipes:
        recipe, config = load_recipe(["--config", str(path)])
        _, _, probe = environment_factory(recipe)
        if config.critic_global_info:
            assert config.reward_max is not None or getattr(probe, "reward_max", None) is not None, path.name


def test_a_config_of_another_command_is_refused_by_train_with_the_right_command():
    others = [p for p in ALL_CONFIGS if p not in CONFIGS]
    assert others  # verifier_math_easy.yaml
    for path in others:
        with pytest.raises(RecipeError, match="run python -m trl_multiagent train-verifier --config"):
            load_recipe(["--config", str(path)])


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


def test_a_generated_dataset_trains_and_evaluates_on_the_splits_a_recipe_names(tmp_path):
    from trl_multiagent.environments.math_problems import generalisation_problems

    base = ["--environment", "math_tool_generalisation", "--num_tasks", "6", "--seed", "2",
            "--output_dir", str(tmp_path)]
    recipe, config = load_recipe(base)
    env_cls = resolve_environment("math_tool_generalisation")
    questions = lambda rows: [r["question"] for r in rows]  # noqa: E731
    # defaults: the environment's training split and its held-out split ("eval" refused, so "test")
    assert build_dataset(recipe, env_cls, config)["question"] == questions(generalisation_problems(6, 2, "train"))
    assert held_out_tasks(recipe, config, 4)["question"] == questions(generalisation_problems(4, 2, "test"))
    # named generated splits: that split and no other
    recipe, config = load_recipe(base + ["--dataset_split", "train_balanced", "--eval_dataset_split", "validation"])
    assert build_dataset(recipe, env_cls, config)["question"] == \
        questions(generalisation_problems(6, 2, "train_balanced"))
    assert held_out_tasks(recipe, config, 4)["question"] == questions(generalisation_problems(4, 2, "validation"))
    recipe.eval_dataset_split = "dev"
    with pytest.raises(RecipeError, match="eval_dataset_split 'dev'.*refused it.*split must be one of"):
        held_out_tasks(recipe, config, 4)
    recipe.dataset_split = "dev"
    with pytest.raises(RecipeError, match="make_dataset: split must be one of"):
        build_dataset(recipe, env_cls, config)
    # a data file as the held-out tasks of a generated dataset
    eval_file = tmp_path / "held.jsonl"
    eval_file.write_text(json.dumps({"question": "Ann has 3 pens. Bo gives Ann 2 more. How many pens now?",
                                     "answer": "5"}) + "\n")
    recipe.eval_dataset_split = str(eval_file)
    assert held_out_tasks(recipe, config, 4)["answer"] == ["5"]
    # an environment whose make_dataset has no splits cannot be asked for one
    recipe, config = load_recipe(["--environment", "matrix_game", "--dataset_split", "train_balanced",
                                  "--output_dir", str(tmp_path)])
    with pytest.raises(RecipeError, match="dataset_split 'train_balanced'.*generates no splits"):
        build_dataset(recipe, resolve_environment("matrix_game"), config)


@pytest.mark.parametrize("script,config", [
    ("at_grpo", "gsm8k_at_grpo"), ("collm", "tldr_hub_cc"), ("maporl", "gsm8k_debate"),
    ("mhgpo", "hotpotqa_mhgpo_rr")])
def test_recipe_scripts_stop_before_loading_when_the_held_out_split_is_missing(script, config, tmp_path, capsys):
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location(f"recipe_{script}", root / "recipes" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = ["--config", str(root / "recipes" / "configs" / f"{config}.yaml"), "--output_dir", str(tmp_path),
            "--eval_dataset_split", "", "--model", NOWHERE]  # a model that would fail differently if it were loaded
    assert module.main(argv) == 2
    err = capsys.readouterr().err
    assert "needs eval_dataset_split" in err and "Traceback" not in err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # nothing written


# ------------------------------------------------------------------------------------------------ environments
def _env(name):
    from trl_multiagent.environments import ENVIRONMENTS

    return ENVIRONMENTS[name]


@pytest.mark.parametrize("name,kwargs,match", [
    ("matrix_game", {"invalid_reward": "low"}, "invalid_reward must be a number"),
    ("matrix_game", {"agents": ["a", "a"]}, "two agents with distinct names"),
    ("matrix_game", {"prompt": ""}, "prompt must be a non-empty string"),
    ("humaneval_aux_main", {"max_turns": 0}, "max_turns must be an integer >= 1, got 0"),
    ("humaneval_aux_main", {"max_turns": 1.5}, "max_turns must be an integer"),
    ("humaneval_aux_main", {"sandbox": {"timeout": 3}}, "sandbox has unknown settings \\['timeout'\\]"),
    ("humaneval_aux_main", {"sandbox": {"timeout_s": 0}}, "sandbox.timeout_s must be a number > 0"),
    ("humaneval_aux_main", {"sandbox": [1]}, "sandbox must be a mapping"),
    ("plan_path", {"max_turns": 0}, "max_turns"),
    ("plan_path", {"reward_mode": "dense"}, "reward_mode"),
    ("plan_path", {"cache_tool_runs": "yes"}, "cache_tool_runs must be true or false"),
    ("sudoku", {"sandbox": {"memory_mb": -5}}, "sandbox.memory_mb"),
    ("sokoban", {"max_turns": "4"}, "max_turns must be an integer"),
    ("coder_tester", {"max_tests": 0}, "max_tests"),
    ("coder_tester", {"max_feedback_chars": 0}, "max_feedback_chars"),
    ("coder_tester", {"coder_weights": {"format": "high"}}, "coder_weights\\['format'\\] must be a number"),
    ("math_tool", {"max_answer_chars": 0}, "max_answer_chars"),
    ("math_tool", {"tool_weights": [1, 2]}, "tool_weights must be a mapping"),
    ("math_debate", {"num_agents": 1}, "at least two agents"),
    ("math_debate", {"num_agents": "3"}, "num_agents must be an integer"),
    ("nli_debate", {"max_feedback_chars": 10}, "max_feedback_chars"),
    ("nli_debate", {"early_stop": "no"}, "early_stop must be true or false"),
    ("collaboration_game", {"threshold": 0}, "threshold"),
    ("collaboration_game", {"synergy": "big"}, "synergy must be a number"),
    ("collaboration_game", {"partner_collaborate_prob": 1.5}, "partner_collaborate_prob"),
    ("search_qa", {"top_k": 0}, "top_k must be an integer >= 1"),
    ("search_qa", {"max_queries": "many"}, "max_queries must be an integer"),
    ("search_qa", {"penalties": {"format": "x"}}, "penalties"),
    ("strbuild", {"max_commands": 0}, "max_commands"),
    ("strbuild", {"list_target_cells": 1}, "list_target_cells must be true or false"),
    ("strbuild", {"prompt_style": "fancy"}, "prompt_style"),
    ("housebuild", {"max_attacks": -1}, "max_attacks"),
    ("tldr", {"max_turns": 0}, "max_turns"),
    ("arxiv_expansion", {"reward_weights": {"length": "long"}}, "reward_weights"),
])
def test_environment_constructors_check_their_arguments(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _env(name)(**kwargs)


@pytest.mark.parametrize("name,kwargs,match", [
    ("plan_path", {"num_tasks": 0}, "num_tasks must be an integer >= 1"),
    ("math_debate", {"num_tasks": -3}, "num_tasks"),
    ("search_qa", {"num_tasks": 4, "num_bridge_distractors": -1}, "num_bridge_distractors"),
    ("strbuild", {"num_tasks": 2, "max_letters": 0}, "max_letters"),
    ("housebuild", {"num_tasks": 2, "max_width": "5"}, "max_width must be an integer"),
    ("tldr", {"num_tasks": "ten"}, "num_tasks must be an integer"),
])
def test_make_dataset_checks_its_arguments(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _env(name).make_dataset(**kwargs)


def test_recipe_arguments_check_their_ranges():
    from trl_multiagent.command.recipe import RecipeArguments

    for kwargs, match in [({"num_tasks": 0}, "num_tasks"), ({"eval_num_samples": 0}, "eval_num_samples"),
                          ({"eval_num_samples": 4, "eval_baseline_num_samples": 5}, "eval_baseline_num_samples"),
                          ({"eval_baseline_num_samples": -1}, "eval_baseline_num_samples"),
                          ({"eval_stages": ["before", "before"]}, "eval_stages"), ({"lora_alpha": 0}, "lora_alpha"),
                          ({"quantization": "8bit"}, "quantization"), ({"env_kwargs": [1]}, "env_kwargs"),
                          ({"agents": ["aux"]}, "agents"), ({"eval_max_batch_sequences": -1}, "max_batch"),
                          ({"evaluator": "judge"}, "evaluator")]:
        with pytest.raises(ValueError, match=match):
            RecipeArguments(**kwargs)
    assert RecipeArguments(evaluator="my.module:Judge").evaluator == "my.module:Judge"


def test_env_block_sets_environment_variables(tmp_path, monkeypatch):
    monkeypatch.delenv("TRL_MULTIAGENT_TEST_VAR", raising=False)
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text("env:\n  TRL_MULTIAGENT_TEST_VAR: 7\nlearning_rate: 1e-5\n")
    _, config = load_recipe(["--config", str(recipe_file), "--output_dir", str(tmp_path / "out")])
    import os

    assert os.environ["TRL_MULTIAGENT_TEST_VAR"] == "7" and config.learning_rate == 1e-5


def test_structured_fields_from_yaml_and_json(tmp_path):
    recipe, config = load_recipe(
        ["--agents", '[{"name": "agent1", "lora_r": 4}, {"name": "agent2"}]', "--env_kwargs", '{"invalid_reward": -1}',
         "--generation_kwargs", '{"suppress_tokens": [0]}', "--eval_methods", "team", "naive",
         "--eval_stages", "[]", "--output_dir", str(tmp_path)])
    assert recipe.agents[0] == {"name": "agent1", "lora_r": 4} and recipe.env_kwargs == {"invalid_reward": -1}
    assert config.generation_kwargs == {"suppress_tokens": [0]}
    assert recipe.eval_methods == ["team", "naive"] and recipe.eval_stages == []
    recipe, _ = load_recipe([], yaml_text="agents:\n  - {name: agent1}\n  - {name: agent2}\n"
                                          "env_kwargs: {local_payoff: posg1}\n")
    assert [a["name"] for a in recipe.agents] == ["agent1", "agent2"] and recipe.env_kwargs["local_payoff"] == "posg1"


GENERATED = [p for p in CONFIGS if "dataset: generated" in p.read_text() or "dataset:" not in p.read_text()]


@pytest.mark.parametrize("path", GENERATED, ids=[p.stem for p in GENERATED])
def test_every_generated_config_plans_its_run_without_a_model(path, tmp_path):
    """Environment, team, training data, held-out tasks and the evaluation plan, all before any model loads."""
    from trl_multiagent.command.cli import parse_recipe
    from trl_multiagent.command.runner import Run

    recipe, config, given = parse_recipe(["--config", str(path), "--output_dir", str(tmp_path)])
    run = Run(recipe, config, given)
    run.prepare()
    assert len(run.dataset) > 0
    if recipe.environment == "matrix_game":  # no held-out tasks: trained without an evaluation
        assert run.evaluator is None
        return
    expected = {"humaneval_aux_main": "coding", "math_debate": "debate", "math_debate_easy": "debate",
                "nli_debate": "debate", "search_qa": "pipeline", "tldr": "writing", "arxiv": "writing"}.get(recipe.environment, "episodes")
    if recipe.trainer == "collm":
        expected = "episodes"
    assert run.evaluator.name == expected and run.tasks and run.stages_planned
    if "task_id" in run.dataset.column_names and "task_id" in run.tasks[0]:  # never a training task
        assert not {str(t["task_id"]) for t in run.tasks} & {str(t) for t in run.dataset["task_id"]}


def test_a_held_out_file_shorter_than_asked_or_repeating_a_task_is_said(tmp_path, caplog):
    """A held-out file with fewer rows than eval_num_problems is used whole, with a warning that says so; rows that
    repeat a task (equal but for the id) are kept, with a warning that counts them."""
    import logging

    caplog.set_level(logging.WARNING, logger="trl_multiagent.command.recipe")
    rows = [{"id": f"q{i}", "question": f"What is {i % 2} + 1?", "answer": str(i % 2 + 1)} for i in range(3)]
    train_file, eval_file = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    train_file.write_text(json.dumps(rows[0]) + "\n")
    eval_file.write_text("\n".join(json.dumps(r) for r in rows))
    recipe, config = load_recipe(["--environment", "math_debate", "--dataset", str(train_file),
                                  "--eval_dataset_split", str(eval_file), "--output_dir", str(tmp_path)])
    assert len(held_out_tasks(recipe, config, 8)) == 3
    assert f"8 held-out tasks were asked for (eval_num_problems, or the evaluator's default when it is 0), but the " \
           f"file {eval_file} has only 3: the evaluation uses those 3 (truncated, nothing repeated)" in caplog.text
    assert f"the file {eval_file} has only 2 distinct tasks among the 3 held-out tasks evaluated" in caplog.text
    caplog.clear()
    assert len(held_out_tasks(recipe, config, 2)) == 2  # the first two differ: nothing to say
    assert caplog.text == ""


def test_a_make_dataset_without_a_held_out_split_is_one_clear_error(tmp_path, monkeypatch):
    (tmp_path / "envs.py").write_text(
        "from datasets import Dataset\n"
        "from trl_multiagent.environments import Environment\n"
        "class NoSplit(Environment):\n"
        "    agents = ('a',)\n"
        "    @classmethod\n"
        "    def make_dataset(cls, num_tasks, seed=0):\n"
        "        return Dataset.from_list([{'x': i} for i in range(num_tasks)])\n"
        "class TrainOnly(NoSplit):\n"
        "    @classmethod\n"
        "    def make_dataset(cls, num_tasks, seed=0, split='train'):\n"
        "        if split != 'train':\n"
        "            raise ValueError(f'no split {split!r} here')\n"
        "        return super().make_dataset(num_tasks, seed)\n")
    monkeypatch.chdir(tmp_path)
    recipe, config = load_recipe(["--environment", "envs.py:NoSplit", "--output_dir", str(tmp_path / "o")])
    with pytest.raises(RecipeError, match=r"NoSplit\.make_dataset takes no split argument, so it has no held-out "
                                          r"split"):
        held_out_tasks(recipe, config, 4)
    recipe, config = load_recipe(["--environment", "envs.py:TrainOnly", "--output_dir", str(tmp_path / "o")])
    with pytest.raises(RecipeError, match=r"accepts none of the held-out splits \('eval', 'test'\) \(split='eval': "
                                          r"no split 'eval' here; split='test': no split 'test' here\)"):
        held_out_tasks(recipe, config, 4)
