"""The coder/unit-tester environment of AT-GRPO: rewards, agreement, prompts, partial actions (real sandbox runs)."""

from pathlib import Path

import pytest

from trl_multiagent.environments.coder_tester import (
    CODER_WEIGHTS,
    TESTER_WEIGHTS,
    CoderTesterEnv,
    extract_tests,
    masked_convex_combination,
)

ROOT = Path(__file__).resolve().parents[1]

# A tiny HumanEval-style problem whose outcomes are easy to compute by hand.
PROBLEM = {
    "task_id": "Tiny/0",
    "prompt": 'def add(a: int, b: int) -> int:\n    """Return the sum of a and b.\n    >>> add(1, 2)\n    3\n    """\n',
    "canonical_solution": "    return a + b\n",
    "entry_point": "add",
    "test": ("def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\n"
             "    assert candidate(-1, 1) == 0\n    assert candidate(2, 2) == 4\n"),
}
BUGGY = "```python\ndef add(a, b):\n    return abs(a) + b\n```"  # golden: 3 of 4 (fails add(-1, 1))
FIXED = "Here is the fix:\n```python\ndef add(a, b):\n    return a + b\n```"
# 3 usable tests; the reference fails the second (2 + 3 is not 6); `assert True` never calls add and is dropped.
TESTS_WITH_A_WRONG_ONE = ("```python\nassert add(1, 2) == 3\nassert add(2, 3) == 6\nassert add(-1, 1) == 0\n"
                          "assert True\n```")
TESTS_CORRECTED = "```python\nassert add(1, 2) == 3\nassert add(2, 3) == 5\nassert add(-1, 1) == 0\n```"


def test_extract_tests_keeps_asserts_that_call_the_function():
    assert extract_tests(TESTS_WITH_A_WRONG_ONE, "add") == ["assert add(1, 2) == 3", "assert add(2, 3) == 6",
                                                            "assert add(-1, 1) == 0"]
    # unfenced, with prose and a broken line: the assert lines that parse are kept, duplicates once
    text = "Tests:\nassert add(1, 1) == 2\nassert add(1, 1) == 2\nassert add(2,\nthis is not code\n"
    assert extract_tests(text, "add") == ["assert add(1, 1) == 2"]
    # check(candidate) style and the max_tests cap
    text = "```python\ndef check(candidate):\n" + "".join(f"    assert candidate({i}, 0) == {i}\n" for i in range(5)) + "```"
    assert extract_tests(text, "add", max_tests=3) == [f"assert candidate({i}, 0) == {i}" for i in range(3)]
    assert extract_tests("no tests here", "add") == []


def test_masked_convex_combination():
    assert masked_convex_combination({"a": 1.0, "b": 0.5}, {"a": 0.2, "b": 0.8}) == pytest.approx(0.6)
    assert masked_convex_combination({"a": 1.0, "b": 0.5}, {"a": 0.2, "b": 0.8}, {"b": False}) == 1.0
    assert masked_convex_combination({}, {"a": 1.0}) == 0.0


def test_joint_step_rewards_by_hand():
    env = CoderTesterEnv(max_turns=3)
    prompts = env.reset(PROBLEM)
    assert set(prompts) == {"coder", "tester"}
    assert "def add(a: int, b: int) -> int:" in prompts["coder"] and "def add" in prompts["tester"]
    assert "assert add(" in prompts["tester"]
    result = env.step({"coder": BUGGY, "tester": TESTS_WITH_A_WRONG_ONE})
    # team = golden pass rate of the code: 3/4
    assert result.team_reward == pytest.approx(0.75)
    # coder: 0.1 * syntax(1) + 0.1 * defines(1) + 0.8 * golden(0.75) = 0.8
    assert result.local_rewards["coder"] == pytest.approx(0.8)
    # tester: the reference passes 2 of its 3 tests: 0.1 * format(1) + 0.9 * 2/3 = 0.7
    assert result.local_rewards["tester"] == pytest.approx(0.7)
    assert result.info["tester/reference_pass_rate"] == pytest.approx(2 / 3)
    # the buggy code passes only add(1, 2) == 3 of the tester's tests: no agreement, the episode goes on
    assert result.info["code_vs_tests_pass_rate"] == pytest.approx(1 / 3)
    assert not result.done and result.info["agreed"] == 0.0 and env.turn == 1

    coder, tester = result.next_prompts["coder"], result.next_prompts["tester"]
    assert "return abs(a) + b" in coder and "assert add(2, 3) == 6" in coder  # its code and the other's tests
    assert "passes 1 of the 3 tests" in coder
    assert "assert add(2, 3) == 6  ->  AssertionError: expected 6, got 5" in coder
    assert "assert add(-1, 1) == 0  ->  AssertionError: expected 0, got 2" in coder
    assert "assert add(1, 2) == 3  ->" not in coder
    assert "return abs(a) + b" in tester and "Your previous tests" in tester and "expected 6, got 5" in tester
    # the golden tests and the reference solution are never shown
    assert "add(2, 2) == 4" not in coder + tester and "candidate(0, 0)" not in coder + tester


def test_sequential_partial_actions_until_agreement():
    env = CoderTesterEnv(max_turns=3)
    env.reset(PROBLEM)
    env.step({"coder": BUGGY, "tester": TESTS_WITH_A_WRONG_ONE})  # turn 1 (joint)

    # turn 2, coder alone: correct code, golden 4/4, but the tester's wrong test still fails -> no agreement
    clone = env.clone()
    result = env.step({"coder": FIXED})
    assert result.team_reward == 1.0 and result.local_rewards == {"coder": pytest.approx(1.0)}
    assert not result.done and env.turn == 1 and env.acted == {"coder"}
    assert "passes 2 of the 3 tests" in result.next_prompts["tester"]
    assert "assert add(2, 3) == 6  ->  AssertionError: expected 6, got 5" in result.next_prompts["tester"]
    # the clone taken before is untouched
    assert clone.code.strip().endswith("abs(a) + b") and clone.acted == set() and env.code.endswith("a + b")

    # the same agent cannot act twice within a turn
    with pytest.raises(ValueError, match="already acted"):
        env.clone().step({"coder": FIXED})

    # turn 2, tester alone: corrected tests; the code passes all of them -> agreement ends the episode
    result = env.step({"tester": TESTS_CORRECTED})
    assert result.done and result.next_prompts is None and result.info["agreed"] == 1.0
    assert result.team_reward == 1.0  # the (unchanged) code's golden pass rate
    assert result.local_rewards == {"tester": pytest.approx(1.0)}  # 0.1 * 1 + 0.9 * 3/3
    assert env.turn == 2


def test_first_tester_prompt_and_budget_and_bad_outputs():
    env = CoderTesterEnv(max_turns=1)
    first = env.reset(PROBLEM)
    result = env.step({"coder": "```python\ndef add(a, b)\n    return a + b\n```"})  # a syntax error: never run
    assert result.team_reward == 0.0 and result.local_rewards["coder"] == 0.0
    assert result.next_prompts["tester"] == first["tester"]  # the tester has not acted: problem only (C.2)
    result = env.step({"tester": "I think the function works."})  # no usable test
    assert result.local_rewards["tester"] == 0.0
    assert result.done and env.turn == 1  # budget of one turn spent, no agreement


def test_weights_are_configurable_and_checked():
    env = CoderTesterEnv(coder_weights={"golden": 1.0, "syntax": 0.0, "defines": 0.0},
                         tester_weights={"discriminate": 0.5})
    assert env.coder_weights == {"syntax": 0.0, "defines": 0.0, "golden": 1.0}
    assert env.tester_weights == {**TESTER_WEIGHTS, "discriminate": 0.5}
    assert CODER_WEIGHTS == {"syntax": 0.1, "defines": 0.1, "golden": 0.8}
    with pytest.raises(ValueError, match="unknown components"):
        CoderTesterEnv(coder_weights={"style": 1.0})
    with pytest.raises(ValueError):
        env.step({"reviewer": "x"})


def test_make_dataset_splits_are_humaneval():
    assert CoderTesterEnv.concurrent_steps and CoderTesterEnv.supports_partial_actions
    train, test = CoderTesterEnv.make_dataset(split="train"), CoderTesterEnv.make_dataset(split="test")
    assert (len(train), len(test)) == (131, 33)
    assert set(train["task_id"]).isdisjoint(test["task_id"])
    CoderTesterEnv.validate_dataset_columns(train.column_names)
    few = CoderTesterEnv.make_dataset(num_tasks=5, seed=1)
    assert len(few) == 5 and few["task_id"] == CoderTesterEnv.make_dataset(num_tasks=5, seed=1)["task_id"]
    # the HumanEval reference solution passes its own golden tests in this environment (one sandbox run)
    problem = test[0]
    env = CoderTesterEnv()
    env.reset(problem)
    result = env.step({"coder": "```python\n" + problem["prompt"] + problem["canonical_solution"] + "```"})
    assert result.team_reward == 1.0


@pytest.mark.parametrize("name,mapping", [("code_at_grpo_shared", "shared"),
                                          ("code_at_grpo_specialized", "specialized")])
def test_code_recipes_load(tmp_path, name, mapping):
    from trl_multiagent.command.cli import load_recipe
    from trl_multiagent.command.recipe import build_team, resolve_environment

    recipe, config = load_recipe(["--config", str(ROOT / f"recipes/configs/{name}.yaml"), "--output_dir",
                                  str(tmp_path)])
    assert recipe.policy_mapping == mapping and type(config).__name__ == "ATGRPOConfig"
    env_cls = resolve_environment(recipe.environment)
    assert env_cls is CoderTesterEnv
    env = env_cls(**recipe.env_kwargs)
    specs = build_team(recipe, env.agents)
    assert [s.name for s in specs] == ["coder", "tester"]
    assert len({s.policy for s in specs}) == (1 if mapping == "shared" else 2)
    assert config.num_turns <= env.max_turns
