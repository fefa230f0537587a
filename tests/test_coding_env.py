"""HumanEval data, the aux+main environment and its feedback (real sandboxed tests)."""

import pytest

from trl_multiagent.environments.coding import (
    AuxMainCodingEnv,
    extract_code,
    humaneval_problems,
    is_cooperative,
    split_of,
)


def test_split_and_cooperative_subset_sizes():
    everything = humaneval_problems("all", cooperative=False)
    assert len(everything) == 164
    train, test = humaneval_problems("train"), humaneval_problems("test")
    assert (len(train), len(test)) == (80, 18)
    assert {p["task_id"] for p in train}.isdisjoint({p["task_id"] for p in test})
    assert all(split_of(p["task_id"]) == "test" and int(p["task_id"].split("/")[1]) % 5 == 0 for p in test)
    assert sum(is_cooperative(p) for p in everything) == 98


def test_extract_code_strips_fences_and_chatter():
    assert extract_code("Here you go:\n```python\ndef f():\n    return 1\n```\nDone") == "def f():\n    return 1"
    assert extract_code("Sure! def is below\ndef f():\n    return 1") == "def f():\n    return 1"


@pytest.fixture
def problem():
    return next(p for p in humaneval_problems("test") if p["entry_point"] == "intersperse")


def test_prompts_follow_appendix_d(problem):
    prompts = AuxMainCodingEnv().reset(problem)
    assert prompts["aux"].startswith("Create a helper function for this coding problem.")
    assert "Create a helper function named aux" in prompts["aux"]
    assert "Implement ONLY the 'intersperse' function as specified" in prompts["main"]
    assert "def intersperse(numbers: List[int], delimeter: int):" in prompts["main"]


def test_reference_solution_scores_full_tests_and_ends_episode(problem):
    env = AuxMainCodingEnv(max_turns=2)
    env.reset(problem)
    main = problem["prompt"] + problem["canonical_solution"]
    result = env.step({"aux": "def aux(x):\n    return x\n", "main": main})
    assert result.done and result.info["pass_rate"] == 1.0 and result.info["passed_all"] == 1.0
    assert result.team_reward == pytest.approx(1.0 + 1.0 + 2.0)  # no aux call: no cooperation bonus


def test_second_turn_gets_collm_feedback(problem):
    env = AuxMainCodingEnv(max_turns=2)
    env.reset(problem)
    wrong = "def intersperse(numbers, delimeter):\n    x = aux(numbers)\n    return x\n"
    result = env.step({"aux": "def aux(xs):\n    return list(xs)\n", "main": wrong})
    assert not result.done
    feedback = result.next_prompts["main"]
    assert "Your previous response:\ndef intersperse(numbers, delimeter):" in feedback
    assert "- Main definition: FOUND (Main function intersperse defined)" in feedback
    assert "- Syntax: OK (Combined code syntax OK)" in feedback
    assert "- Tests: 1/3 passed" in feedback  # intersperse([], 7) == [] passes
    assert "AssertionError: expected" in feedback and "Revise your intersperse accordingly." in feedback
    assert "Revise your aux accordingly." in result.next_prompts["aux"]
    # the second turn is the last one
    assert env.step({"aux": "def aux(xs):\n    return xs\n", "main": wrong}).done


def test_advisor_hook_text_reaches_both_agents(problem):
    seen = {}

    def advisor(problem, aux, main, feedback):
        seen["feedback"] = feedback
        return "Use a loop over numbers."

    env = AuxMainCodingEnv(max_turns=2, advisor=advisor)
    env.reset(problem)
    result = env.step({"aux": "def aux(xs):\n    return xs\n", "main": "def intersperse(numbers, d):\n    return 0\n"})
    assert "Tests:" in seen["feedback"]
    assert all("Advisor suggestions:\nUse a loop over numbers." in p for p in result.next_prompts.values())


def test_syntax_error_feedback(problem):
    env = AuxMainCodingEnv(max_turns=2)
    env.reset(problem)
    result = env.step({"aux": "def aux(xs):\n    return xs +\n", "main": "def intersperse(a, b):\n    return a\n"})
    assert "- Syntax: ERROR (invalid syntax" in result.next_prompts["main"]
    assert "- Tests: 0/3 passed" in result.next_prompts["main"]
    assert result.info["level/syntax"] == 0.0


def test_mbpp_rows_map_to_humaneval_columns():
    from trl_multiagent.environments.coding import mbpp_to_humaneval

    row = {"task_id": 2, "text": "Shared elements of two tuples.",
           "code": "def similar_elements(a, b):\n    return tuple(set(a) & set(b))\n",
           "test_list": ["assert set(similar_elements((3, 4), (4, 7))) == {4}", "assert similar_elements((1,), (2,)) == ()"]}
    mapped = mbpp_to_humaneval(row)
    assert mapped["entry_point"] == "similar_elements" and "candidate((1,), (2,))" in mapped["test"]
    env = AuxMainCodingEnv()
    env.reset(mapped)
    assert env.step({"aux": "", "main": row["code"]}).info["pass_rate"] == 1.0


@pytest.mark.parametrize("config", ["recipes/configs/coop_humaneval.yaml", "recipes/configs/mbpp.yaml"])
def test_hub_recipes_fail_clearly_offline(config, tmp_path, monkeypatch):
    from trl_multiagent.command.cli import load_recipe
    from trl_multiagent.command.recipe import RecipeError
    from trl_multiagent.command.runner import Run

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    recipe, cfg = load_recipe(["--config", config, "--output_dir", str(tmp_path)])
    with pytest.raises(RecipeError, match="reachable Hugging Face Hub"):
        run = Run(recipe, cfg)
        run.prepare()
        run.build_trainer()


def test_llm_advisor_is_one_advisor_implementation(problem, tiny_text_model):
    from trl_multiagent.environments.coding import LLMAdvisor

    advisor = LLMAdvisor(tiny_text_model, max_new_tokens=5)
    env = AuxMainCodingEnv(max_turns=2, advisor=advisor)
    env.reset(problem)
    result = env.step({"aux": "def aux(xs):\n    return xs\n", "main": "def intersperse(numbers, d):\n    return 0\n"})
    assert "Advisor suggestions:" in result.next_prompts["main"]
    advice = advisor(problem=problem, aux="", main="def intersperse(a, b):\n    return a\n")
    assert isinstance(advice, str) and 0 < len(advice) <= 5
    # named from a recipe (env_kwargs): the class is built once with advisor_kwargs and shared by every instance
    named = dict(advisor="trl_multiagent.environments.coding:LLMAdvisor",
                 advisor_kwargs={"model": tiny_text_model, "max_new_tokens": 5})
    first, second = AuxMainCodingEnv(max_turns=2, **named), AuxMainCodingEnv(max_turns=2, **named)
    assert isinstance(first.advisor, LLMAdvisor) and first.advisor is second.advisor
    first.reset(problem)
    result = first.step({"aux": "def aux(xs):\n    return xs\n", "main": "def intersperse(numbers, d):\n    return 0\n"})
    assert "Advisor suggestions:" in result.next_prompts["main"]
    with pytest.raises(ValueError, match="advisor_kwargs are the arguments of an advisor class"):
        AuxMainCodingEnv(max_turns=2, advisor=lambda **kw: "", advisor_kwargs={"model": "x"})
