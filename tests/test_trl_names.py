"""TRL's names where they mean the same (issue 66, item 4): in a recipe and on the command line ``model_name_or_path``
is ``model``, ``dataset_name`` is ``dataset`` (and the other aliases of trl_multiagent/command/trl_names.py), ``reward_funcs``
goes to the environment's TRL reward functions or is refused naming where they go; from Python a ``GRPOConfig`` as
``args`` is taken over into the trainer's config class, and ``reward_funcs=`` on the trainer is refused with one line
that says to give them to the environment."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from trl_multiagent.command.trl_names import ALIASES, REFUSED, TRL_NAMES, split_argv, translate
from trl_multiagent.errors import RecipeError

ROOT = Path(__file__).resolve().parents[1]

TEAM = """\
trainer: magrpo
environment: trl_multiagent.environments:FunctionEnvironment
env_kwargs:
  agents: [solver, checker]
  prompt_fns: {solver: my_task.py:prompt, checker: my_task.py:prompt}
"""


@pytest.fixture
def task_folder(tmp_path, monkeypatch):
    (tmp_path / "my_task.py").write_text("def prompt(task):\n    return task['prompt']\n\n\n"
                                         "def short(completions, **kwargs):\n    return [1.0 for _ in completions]\n")
    (tmp_path / "my_data.jsonl").write_text("".join(
        json.dumps({"prompt": f"What is {a} + 1?", "solution": f"${a + 1}$"}) + "\n" for a in range(4)))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def parse(yaml_text: str, *argv: str):
    from trl_multiagent.command.cli import parse_recipe

    return parse_recipe(["--output_dir", "out", *argv], yaml_text=yaml_text)


# ------------------------------------------------------------------------------------------------ translation
def test_trl_names_are_no_field_of_this_library():
    """An alias that became a field would silently shadow it."""
    from trl_multiagent.command.recipe import RecipeArguments
    from trl_multiagent.trainers import TRAINERS

    fields = {f.name for f in dataclasses.fields(RecipeArguments)}
    for config_class, _ in TRAINERS.values():
        fields |= {f.name for f in dataclasses.fields(config_class)}
    assert not TRL_NAMES & fields
    assert set(ALIASES.values()) <= fields


def test_translate_renames_refuses_and_says_so():
    values, funcs = translate({"model_name_or_path": "m", "dataset_name": "d", "dtype": "float32", "use_peft": True,
                               "load_in_4bit": "true", "reward_funcs": ["accuracy_reward"], "seed": 3}, "r.yaml")
    assert values == {"model": "m", "dataset": "d", "model_dtype": "float32", "quantization": "4bit", "seed": 3}
    assert funcs == ["accuracy_reward"]
    with pytest.raises(RecipeError, match=r"^r.yaml: 'model_name_or_path' is TRL's name of 'model'; give one"):
        translate({"model_name_or_path": "m", "model": "n"}, "r.yaml")
    with pytest.raises(RecipeError, match="use_peft: false asks for full fine-tuning"):
        translate({"use_peft": "false"}, "command line")
    with pytest.raises(RecipeError, match="load_in_4bit: true is quantization: 4bit, but quantization is None"):
        translate({"load_in_4bit": True, "quantization": None}, "r.yaml")
    for name in REFUSED:
        with pytest.raises(RecipeError, match=f"'{name}' is TRL's field; here "):
            translate({name: 1}, "r.yaml")


def test_the_command_line_forms_of_trl_names():
    rest, found = split_argv(["--config", "r.yaml", "--model_name_or_path", "m", "--reward_funcs", "a", "b.py:c",
                              "--dataset_name=d", "--use_peft", "--seed", "1"])
    assert rest == ["--config", "r.yaml", "--seed", "1"]
    assert found == {"model_name_or_path": "m", "reward_funcs": ["a", "b.py:c"], "dataset_name": "d",
                     "use_peft": "true"}


# ------------------------------------------------------------------------------------------------ recipes
def test_a_recipe_with_trls_names_reaches_the_environment(task_folder):
    recipe, config, given = parse(TEAM + "model_name_or_path: my-model\ndataset_name: my_data.jsonl\n"
                                         "dataset_test_split: my_data.jsonl\nreward_funcs: [accuracy_reward, "
                                         "my_task.py:short]\nreward_weights: [1.0, 0.5]\nuse_peft: true\n")
    assert recipe.model == "my-model" and recipe.dataset == "my_data.jsonl"
    assert recipe.eval_dataset_split == "my_data.jsonl"
    assert recipe.env_kwargs["reward_funcs"] == ["accuracy_reward", "my_task.py:short"]
    assert given["env_kwargs"]["reward_funcs"] == ["accuracy_reward", "my_task.py:short"]  # summary.json's recipe
    assert config.reward_weights == [1.0, 0.5]


def test_the_command_line_takes_trls_names_over_the_file(task_folder):
    recipe, _, _ = parse(TEAM + "model: file-model\n", "--model_name_or_path", "cli-model", "--reward_funcs",
                         "accuracy_reward", "my_task.py:short", "--dataset_name", "my_data.jsonl")
    assert recipe.model == "cli-model" and recipe.dataset == "my_data.jsonl"
    assert recipe.env_kwargs["reward_funcs"] == ["accuracy_reward", "my_task.py:short"]
    recipe, _, _ = parse(TEAM, "--reward_funcs", '{"solver": ["accuracy_reward"]}')
    assert recipe.env_kwargs["reward_funcs"] == {"solver": ["accuracy_reward"]}


def test_reward_funcs_of_a_trl_environment_team_are_its_reward_fns(task_folder):
    counter = ROOT / "examples" / "trl_environments" / "counter_env.py"
    recipe, _, _ = parse(f"environment: trl_multiagent.environments:TRLEnvironmentTeam\nenv_kwargs:\n  "
                         f"environment_factory: {counter}:CounterEnv\nreward_funcs: [accuracy_reward]\n")
    assert recipe.env_kwargs["reward_fns"] == ["accuracy_reward"]


@pytest.mark.parametrize("text,needles", [
    ("environment: matrix_game\nreward_funcs: [accuracy_reward]\n",
     ["reward_funcs: MatrixGameEnv scores with rewards of its own", "FunctionEnvironment (env_kwargs.reward_funcs)",
      "TRLEnvironmentTeam (env_kwargs.reward_fns)"]),
    (TEAM.replace("  prompt_fns:", "  reward_funcs: [x]\n  prompt_fns:") + "reward_funcs: [accuracy_reward]\n",
     ["reward_funcs and env_kwargs.reward_funcs both name FunctionEnvironment's TRL reward functions; give one"]),
    (TEAM + "reward_funcs: 3\n", ["'reward_funcs' expects a list of reward functions"]),
    (TEAM + "use_peft: false\n", ["use_peft: false asks for full fine-tuning", "LoRA adapter"]),
    (TEAM + "lora_target_modules: [q_proj]\n", ["'lora_target_modules' is TRL's field; here it is set per agent"]),
    (TEAM + "dataset_name: a.jsonl\ndataset: b.jsonl\n", ["'dataset_name' is TRL's name of 'dataset'"]),
])
def test_trl_names_that_do_not_fit_are_one_line_naming_the_librarys_field(task_folder, text, needles):
    with pytest.raises(RecipeError) as info:
        parse(text)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


# ------------------------------------------------------------------------------------------------ Python
def test_a_grpo_config_is_taken_over_and_logged(tmp_path, caplog):
    from trl import GRPOConfig

    from trl_multiagent.trainers import ATGRPOConfig, MAGRPOConfig
    from trl_multiagent.trainers.trl_args import trainer_config

    grpo = GRPOConfig(output_dir=str(tmp_path), num_generations=4, max_completion_length=32, max_steps=2,
                      reward_weights=[1.0, 0.5], report_to="none", bf16=False, learning_rate=3e-6, seed=7)
    with caplog.at_level(logging.INFO, logger="trl_multiagent.trainers.trl_args"):
        config = trainer_config(MAGRPOConfig, grpo)
    assert type(config) is MAGRPOConfig
    assert (config.output_dir, config.num_generations, config.max_completion_length, config.max_steps,
            config.reward_weights, config.learning_rate, config.seed) == (str(tmp_path), 4, 32, 2, [1.0, 0.5], 3e-6, 7)
    assert config.loss_type == "response"  # left at GRPOConfig's default: the trainer's own
    line = caplog.records[-1].getMessage()
    assert "took over bf16, learning_rate, max_completion_length, max_steps, num_generations, output_dir, " \
           "reward_weights, seed into MAGRPOConfig" in line
    assert "loss_type 'response' (GRPOConfig: 'dapo')" in line
    assert trainer_config(MAGRPOConfig, config) is config
    with pytest.raises(TypeError, match="args must be a MAGRPOConfig, got ATGRPOConfig"):
        trainer_config(MAGRPOConfig, ATGRPOConfig(output_dir=str(tmp_path)))
    with pytest.raises(ValueError, match=r"args is a GRPOConfig; its fields .* were taken over into "
                                         r"MAGRPOConfig, which refuses them: gradient_accumulation_steps"):
        trainer_config(MAGRPOConfig, GRPOConfig(output_dir=str(tmp_path), bf16=False,
                                                        gradient_accumulation_steps=2))


def test_the_trainer_takes_a_grpo_config_and_refuses_reward_funcs(tiny_ab_model, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig

    from trl_multiagent import AgentSpec, MAGRPOConfig, MAGRPOTrainer
    from trl_multiagent.environments import MatrixGameEnv

    agents = [AgentSpec("agent1", model=tiny_ab_model), AgentSpec("agent2", model=tiny_ab_model)]
    data = Dataset.from_dict({"task_id": [0, 1]})
    args = GRPOConfig(output_dir=str(tmp_path), num_generations=2, max_completion_length=2, max_steps=1,
                      report_to="none", bf16=False)
    with pytest.raises(TypeError) as info:
        MAGRPOTrainer(agents, MatrixGameEnv, args, data, reward_funcs=[lambda completions, **kw: [0.0]])
    assert "FunctionEnvironment(..., reward_funcs=[...])" in str(info.value)
    trainer = MAGRPOTrainer(agents, MatrixGameEnv, args, data)
    assert isinstance(trainer.args, MAGRPOConfig) and trainer.args.num_generations == 2
    trainer.train()
    assert trainer.state.global_step == 1


def test_the_command_line_refuses_in_one_line(tiny_ab_model, tmp_path):
    """Through ``python -m trl_multiagent train``: one error line, exit code 2, before any model loads."""
    from tests.cli_harness import CommandRunner

    base = ["train", "--config", "tests/configs/tiny_matrix_game.yaml", "--model_name_or_path", tiny_ab_model,
            "--output_dir", str(tmp_path / "run")]
    runner = CommandRunner()
    try:
        for extra, needle in ((["--reward_funcs", "accuracy_reward"], "reward_funcs: MatrixGameEnv scores with "
                                                                        "rewards of its own"),
                              (["--use_peft", "false"], "use_peft: false asks for full fine-tuning"),
                              (["--model", tiny_ab_model], "'model_name_or_path' is TRL's name of 'model'")):
            result = runner(base + extra)
            errors = [line for line in result.stderr.splitlines() if "error:" in line]
            assert result.returncode == 2 and len(errors) == 1 and needle in errors[0], result.stderr[-2000:]
            assert "Traceback" not in result.output
    finally:
        runner.close()
