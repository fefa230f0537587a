"""TRL's reward functions in a team (issue 66, items 1-2) and rewards that are missing or not finite (issue 65, item 1).

- ``trl.rewards.accuracy_reward`` and ``think_format_reward`` score EACH agent of a ``FunctionEnvironment`` or a
  ``TRLEnvironmentTeam``: every agent's reward equals the function called by hand on that agent's text alone, the
  team reward is the weighted sum, each agent's sum its local reward.
- ``None`` is a missing reward (left out, as TRL's nansum does); a joint action nobody scores gets 0 and a warning.
- A NaN or infinite reward is one ``UserCodeError`` naming the function, the agent, the task and the text, or a missing
  reward with ``nonfinite_rewards: missing``; through the command line, a recipe whose reward turns NaN after the
  first checkpoint ends in one error line, a failed status, and the checkpoint saved before intact and finite.
"""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from safetensors.torch import load_file
from trl.rewards import accuracy_reward, think_format_reward

from tests.cli_harness import CommandRunner
from tests.test_run_failures import USER_CODE_RECIPE
from tests.test_trl_env import call
from tests.test_trl_env import team as counter_team
from trl_multiagent.environments import Environment, FunctionEnvironment, StepResult
from trl_multiagent.environments.stepping import step_env
from trl_multiagent.environments.trl_rewards import resolve_reward_func
from trl_multiagent.errors import UserCodeError

TASK = {"id": "q1", "prompt": [{"role": "user", "content": "What is 2 + 3?"}], "solution": "$5$"}
SOLVER = r"<think>add</think> The answer is \boxed{5}"
CHECKER = r"I get \boxed{6}"


def chat_prompt(task):
    return task["prompt"]


def team(**kw):
    return FunctionEnvironment(["solver", "checker"], {"solver": chat_prompt, "checker": chat_prompt}, **kw)


def alone(fn, text, **columns):
    """The function called by hand on one agent's text, as TRL calls it for a batch of one chat completion."""
    return fn(completions=[[{"role": "assistant", "content": text}]], **{k: [v] for k, v in columns.items()})[0]


def test_trl_rewards_score_each_agent_on_its_own_text():
    env = team(reward_funcs=[accuracy_reward, "think_format_reward"], reward_weights=[1.0, 0.5])
    assert env.reward_names == ["accuracy_reward", "think_format_reward"]
    env.reset(TASK)
    result = env.step({"solver": SOLVER, "checker": CHECKER})
    expected = {(a, fn.__name__): alone(fn, text, solution=TASK["solution"])
                for a, text in (("solver", SOLVER), ("checker", CHECKER))
                for fn in (accuracy_reward, think_format_reward)}
    # by hand: the solver is right and thinks in tags, the checker is wrong and does not
    assert expected == {("solver", "accuracy_reward"): 1.0, ("solver", "think_format_reward"): 1.0,
                        ("checker", "accuracy_reward"): 0.0, ("checker", "think_format_reward"): 0.0}
    assert result.info == {f"{a}/{n}": v for (a, n), v in expected.items()}
    assert result.local_rewards == {"solver": 1.0 + 0.5 * 1.0, "checker": 0.0}
    assert result.team_reward == 1.5
    # the checker's turn alone scores only the checker, the solver's only the solver
    env.reset(TASK)
    swapped = env.step({"solver": CHECKER, "checker": SOLVER})
    assert swapped.local_rewards == {"solver": 0.0, "checker": 1.5}


def test_functions_named_per_agent_and_weights_by_function():
    def says_six(completions, **kwargs):
        return [float("6" in c[0]["content"]) for c in completions]

    env = team(reward_funcs={"solver": [accuracy_reward], "checker": [accuracy_reward, says_six]},
               reward_weights=[2.0, -1.0])
    env.reset(TASK)
    result = env.step({"solver": SOLVER, "checker": CHECKER})
    assert result.info == {"solver/accuracy_reward": 1.0, "checker/accuracy_reward": 0.0, "checker/says_six": 1.0}
    assert result.local_rewards == {"solver": 2.0, "checker": -1.0} and result.team_reward == 1.0
    with pytest.raises(ValueError, match="1 reward weights for 2 reward functions"):
        team(reward_funcs={"solver": [accuracy_reward], "checker": [says_six]}, reward_weights=[1.0])
    with pytest.raises(ValueError, match="not in the team"):
        team(reward_funcs={"writer": [accuracy_reward]})


def test_a_string_prompt_gets_the_text_and_a_joint_reward_adds_to_the_agents_rewards():
    seen = []

    def length(completions, **kwargs):
        seen.append(completions)
        return [float(len(c)) for c in completions]

    def agree(completions):
        return float(completions["solver"] == completions["checker"])

    env = FunctionEnvironment(["solver", "checker"], {"solver": lambda t: "Say a word.", "checker": lambda t: "Same."},
                              reward_fns=[agree], reward_funcs=[length], reward_weights=[10.0, 1.0])
    assert env.reward_names == ["agree", "length"]
    env.reset({"id": 1})
    result = env.step({"solver": "abc", "checker": "abc"})
    assert seen == [["abc"], ["abc"]]  # standard format: the text itself, one call per agent
    assert result.team_reward == 10.0 * 1.0 + 3.0 + 3.0 and result.info["agree"] == 1.0


def test_none_is_a_missing_reward_and_a_joint_action_nobody_scores_gets_zero_with_a_warning(caplog):
    def only_solver(completions, **kwargs):
        return [1.0 if "boxed{5}" in c[0]["content"] else None for c in completions]

    env = team(reward_funcs=[only_solver])
    env.reset(TASK)
    result = env.step({"solver": SOLVER, "checker": CHECKER})
    assert result.info == {"solver/only_solver": 1.0} and result.local_rewards == {"solver": 1.0}
    assert result.team_reward == 1.0
    env.reset(TASK)
    with caplog.at_level(logging.WARNING):
        result = env.step({"solver": CHECKER, "checker": CHECKER})
    assert result.team_reward == 0.0 and result.info == {} and result.local_rewards is None
    assert "No reward function gave a reward" in caplog.text and "id='q1'" in caplog.text


def nan_for_the_checker(completions, **kwargs):
    return [math.nan if "6" in c[0]["content"] else 1.0 for c in completions]


def test_a_nan_reward_is_one_error_naming_the_function_the_agent_the_task_and_the_text():
    env = team(reward_funcs=[nan_for_the_checker])
    env.reset(TASK)
    with pytest.raises(UserCodeError) as error:
        step_env(env, {"solver": SOLVER, "checker": CHECKER}, task=TASK, turn=0)
    message = str(error.value)
    for needle in ("'nan_for_the_checker' returned nan", "agent 'checker'", "I get", "task id='q1'", "turn 0",
                   "nonfinite_rewards: missing"):
        assert needle in message, (needle, message)
    # unless the recipe says to treat it as missing
    env = team(reward_funcs=[nan_for_the_checker], nonfinite_rewards="missing")
    env.reset(TASK)
    result = step_env(env, {"solver": SOLVER, "checker": CHECKER}, task=TASK, turn=0)
    assert result.local_rewards == {"solver": 1.0} and result.team_reward == 1.0


def test_a_joint_reward_that_is_infinite_and_an_environment_that_returns_nan_are_errors():
    env = FunctionEnvironment(["a"], {"a": lambda t: "Go."}, reward_fns=[lambda completions: math.inf])
    env.reset({"id": 7})
    with pytest.raises(UserCodeError, match="returned inf for agent '.joint action.'"):
        step_env(env, {"a": "x"}, task={"id": 7}, turn=0)

    class NaNEnv(Environment):
        agents = ("a",)

        def reset(self, task):
            return {"a": "Go."}

        def step(self, joint_action):
            return StepResult(team_reward=0.0, done=True, local_rewards={"a": float("nan")})

    with pytest.raises(UserCodeError, match=r"NaNEnv.step raised ValueError: step returned a non-finite local reward "
                                            r"of 'a' \(nan\).*task id=7"):
        step_env(NaNEnv(), {"a": "x"}, task={"id": 7}, turn=0)


def test_bare_names_are_trls_rewards():
    assert resolve_reward_func("accuracy_reward") is accuracy_reward
    with pytest.raises(ValueError, match="not in trl.rewards .it has: .*think_format_reward"):
        resolve_reward_func("accuracy")


# ------------------------------------------------------------------------------------------------ TRL environments
def test_a_trl_environment_scores_each_agents_own_messages():
    seen = {}

    def spy(completions, **kwargs):
        seen.setdefault("calls", []).append(completions)
        return [0.0]

    env = counter_team(reward_fns=[accuracy_reward, spy], env_reward_weight=0.0, max_turns=1)
    env.reset({"prompt": "Go.", "target": 3, "solution": "$3$"})
    result = env.step({"adder": call("increment", amount=3) + r" so \boxed{3}", "subtractor": r"\boxed{4}"})
    adder, subtractor = seen["calls"]
    # each agent's completion holds its own messages only: the adder's call and its result, the subtractor's text
    assert [m["role"] for m in adder[0]] == ["assistant", "tool"] and "name" not in adder[0][0]
    assert subtractor == [[{"role": "assistant", "content": r"\boxed{4}"}]]
    assert result.info["adder/accuracy_reward"] == alone(accuracy_reward, adder[0][0]["content"], solution="$3$") == 1.0
    assert result.info["subtractor/accuracy_reward"] == 0.0
    assert result.local_rewards == {"adder": 1.0, "subtractor": 0.0} and result.team_reward == 1.0


def test_turns_without_tool_calls_go_on_when_the_environment_says_so():
    env = counter_team(max_turns=3, stop_without_tool_calls=False)
    env.reset({"prompt": "Go.", "target": 0})
    assert not env.step({"adder": "thinking", "subtractor": "me too"}).done
    assert not env.step({"adder": "still", "subtractor": "yes"}).done
    assert env.step({"adder": "done", "subtractor": "done"}).done
    assert counter_team(max_turns=3).reset({"prompt": "Go.", "target": 0}) is not None


# ------------------------------------------------------------------------------------------------ a run
NAN_TASK = """\
import math, os

def prompt(task):
    return task["question"]

def reward(completions, **kwargs):
    # a user's reward that turns NaN once the first checkpoint is on disk
    return math.nan if os.path.isdir({checkpoint!r}) else 1.0
"""

# the recipe of tests/test_run_failures.py's raising reward, three steps with a checkpoint after each
NAN_RECIPE = USER_CODE_RECIPE.replace("max_steps: 2\n", "max_steps: 3\nsave_steps: 1\n").replace(
    'save_strategy: "no"\n', "")


@pytest.mark.slow
def test_a_recipe_whose_reward_turns_nan_stops_with_one_line_and_keeps_its_checkpoint(tiny_ab_model, tmp_path):
    out = tmp_path / "run"
    (tmp_path / "user_task.py").write_text(NAN_TASK.format(checkpoint=str(out / "checkpoint-1")))
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps({"id": f"sum-{i}", "question": f"{i} + 1?"}) + "\n" for i in range(4)))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(NAN_RECIPE.format(task_file=tmp_path / "user_task.py", data=data))
    runner = CommandRunner()
    try:
        result = runner(["train", "--config", recipe, "--model", tiny_ab_model, "--output_dir", out])
    finally:
        runner.close()
    assert result.returncode == 1 and "Traceback" not in result.output, result.output[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr[-3000:]
    for needle in ("'reward' returned nan", "task id='sum-", "agent 'solo' wrote"):
        assert needle in errors[0], (needle, errors[0])
    status = json.loads((out / "run_status.json").read_text())
    assert status["status"] == "failed" and "returned nan" in status["error"]
    # what was saved before the fault is there, finite, and nothing after it was written
    saved = load_file(out / "checkpoint-1" / "adapters" / "solo" / "adapter_model.safetensors")
    assert saved and all(torch.isfinite(t).all() for t in saved.values())
    assert not (out / "checkpoint-2").exists() and not (out / "adapters").exists()


# ------------------------------------------------------------------------------------------------ reward_weights
WEIGHTED = """\
trainer: magrpo
environment: trl_multiagent.environments:FunctionEnvironment
env_kwargs:
  agents: [solo]
  prompt_fns: {solo: tests/test_trl_rewards.py:plain_prompt}
  reward_fns: [tests/test_trl_rewards.py:one, tests/test_trl_rewards.py:also_one]
dataset: tests/data/questions.jsonl
eval_stages: []
reward_weights: [1.0, 0.5]
report_to: none
"""


def plain_prompt(task):
    return "Say something."


def one(completions):
    return 1.0


def also_one(completions):
    return 1.0


def test_the_recipes_reward_weights_weigh_the_environments_reward_functions(tmp_path):
    from trl_multiagent.command.cli import parse_recipe
    from trl_multiagent.command.runner import Run
    from trl_multiagent.errors import RecipeError

    data = tmp_path / "q.jsonl"
    data.write_text('{"id": 1}\n{"id": 2}\n')
    recipe_text = WEIGHTED.replace("tests/data/questions.jsonl", str(data))
    run = Run(*parse_recipe(["--output_dir", str(tmp_path / "out")], yaml_text=recipe_text))
    run.prepare()
    env = run.env_factory()  # the environment every rollout of the trainer builds
    env.reset({"id": 1})
    result = env.step({"solo": "hi"})
    assert result.info == {"one": 1.0, "also_one": 1.0} and result.team_reward == 1.0 + 0.5
    # weights that disagree with env_kwargs', and an environment with no reward functions to weigh: one line each
    clash = recipe_text.replace("  reward_fns:", "  reward_weights: [2.0, 2.0]\n  reward_fns:")
    with pytest.raises(RecipeError, match=r"reward_weights \[1.0, 0.5\] and env_kwargs.reward_weights \[2.0, 2.0\]"):
        Run(*parse_recipe(["--output_dir", str(tmp_path / "out2")], yaml_text=clash)).prepare()
    with pytest.raises(RecipeError, match="reward_weights: MatrixGameEnv has no list of reward functions to weigh"):
        Run(*parse_recipe(["--config", "tests/configs/tiny_matrix_game.yaml", "--output_dir", str(tmp_path / "o3"),
                           "--reward_weights", "[1.0]"])).prepare()


def test_a_trainer_refuses_config_reward_weights_the_environment_does_not_have(tmp_path):
    from datasets import Dataset

    from trl_multiagent import AgentSpec, MAGRPOConfig, MAGRPOTrainer

    env = lambda: FunctionEnvironment(["solo"], {"solo": plain_prompt}, [one, also_one])  # noqa: E731
    args = MAGRPOConfig(output_dir=str(tmp_path), report_to=[], reward_weights=[1.0, 0.5])
    with pytest.raises(ValueError, match=r"reward_weights=\[1.0, 0.5\] in the config.*FunctionEnvironment: \[1.0, 1.0\]"):
        MAGRPOTrainer([AgentSpec("solo", model=str(tmp_path / "nowhere"))], env, args,
                              Dataset.from_dict({"id": [1]}))


def test_each_agent_scored_by_trl_rewards_can_be_evaluated_alone():
    from trl_multiagent.evaluation.alone import alone_methods

    env = team(reward_funcs={"solver": [accuracy_reward, think_format_reward]})
    assert alone_methods(env) == {"solver_alone": ("solver", 1)}  # the checker has no reward of its own
    result = env.score_alone("solver", SOLVER, TASK)
    assert result.team_reward == 2.0 and result.info == {"solver/accuracy_reward": 1.0,
                                                         "solver/think_format_reward": 1.0}
    assert alone_methods(team(reward_fns=[lambda completions: 0.0])) == {}
