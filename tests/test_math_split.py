"""The split math team (issue 60, item 4): the reasoner plans without the numbers, the tool computes without the
question. Expected values are worked out by hand from the problem texts."""

import operator

import pytest

from trl_multiagent.environments import ENVIRONMENTS
from trl_multiagent.environments.math_problems import arithmetic_key, arithmetic_split, generalisation_problems
from trl_multiagent.environments.math_prompts import SPLIT_EXAMPLES
from trl_multiagent.environments.math_split import MathToolSplitEnv, evaluate_plan, split_question

TASK = {"question": "Maya has 9 shells and gives 3 of them to Liam. How many shells does Maya have left?",
        "answer": "6"}


def test_split_question_hides_the_numbers_in_order():
    hidden, numbers = split_question(TASK["question"])
    assert hidden == "Maya has A shells and gives B of them to Liam. How many shells does Maya have left?"
    assert numbers == {"A": 9, "B": 3}
    # equal numbers keep their order of appearance
    assert split_question("Sam has 4 bags with 4 beads in each bag.")[1] == {"A": 4, "B": 4}
    with pytest.raises(ValueError, match="exactly two numbers"):
        split_question("Sam has 4 beads.")


@pytest.mark.parametrize("plan, value", [
    ("A - B", "6"), ("A+B", "12"), ("A * B", "27"), ("A \\times B", "27"), ("A x B", "27"), ("A × B", "27"),
    ("(A - B) * 2", "12"), ("A / B", "3"), ("B / A", "1/3"), ("-B + A", "6"),
])
def test_evaluate_plan(plan, value):
    assert evaluate_plan(plan, {"A": 9, "B": 3}) == value


@pytest.mark.parametrize("plan", [None, "", "6", "C + B", "A ** B", "max(A, B)", "A / (B - B)", "A +", "A" * 201])
def test_evaluate_plan_refuses_what_is_not_a_calculation_in_the_hidden_numbers(plan):
    # a bare number is no plan: the reasoner never saw the numbers
    assert evaluate_plan(plan, {"A": 9, "B": 3}) is None


def test_views_rewards_and_the_hand_over():
    env = ENVIRONMENTS["math_tool_split"]()
    prompts = env.reset(TASK)
    reasoner_request, tool_request = prompts["reasoner"][-1]["content"], prompts["tool"][-1]["content"]
    assert "9" not in reasoner_request and "3" not in reasoner_request and "A shells" in reasoner_request
    assert tool_request == "Numbers: A = 9, B = 3.\nThe reasoning agent's plan: (none yet)"
    assert "Maya" not in str(prompts["tool"])  # the tool never reads the question

    plan = "Maya gives B away: A - B. The calculation is \\boxed{A - B}."
    first = env.step({"reasoner": plan})
    # the plan is right (9 - 3 = 6) but it is not a number: the team has no right answer yet
    assert first.team_reward == 0.0 and not first.done
    assert first.info["plan_correct"] == 1.0 and first.info["reasoner_correct"] == 0.0
    assert first.local_rewards == {"reasoner": pytest.approx(0.2 * 1 + 0.8 * 1)}
    assert first.next_prompts["tool"][-1]["content"] == f"Numbers: A = 9, B = 3.\nThe reasoning agent's plan: {plan}"

    second = env.step({"tool": "```python\nA = 9\nB = 3\nprint(A - B)\n```"})
    assert second.done and second.team_reward == 1.0 and env.team_answer() == "6"
    assert second.local_rewards == {"tool": pytest.approx(1.0)}
    assert second.info["tool_followed_plan"] == 1.0 and second.info["tool_correct"] == 1.0


def test_a_wrong_plan_followed_and_a_right_plan_ignored():
    env = MathToolSplitEnv()
    env.reset(TASK)
    wrong = env.step({"reasoner": "A + B. The calculation is \\boxed{A + B}."})
    assert wrong.info["plan_correct"] == 0.0 and wrong.local_rewards["reasoner"] == pytest.approx(0.2)
    followed = env.step({"tool": "```python\nprint(9 + 3)\n```"})
    assert followed.team_reward == 0.0 and followed.info["tool_followed_plan"] == 1.0
    assert followed.local_rewards["tool"] == pytest.approx(0.2)

    env.reset(TASK)
    env.step({"reasoner": "\\boxed{A - B}"})
    ignored = env.step({"tool": "```python\nprint(9 * 3)\n```"})
    assert ignored.team_reward == 0.0 and ignored.info["tool_followed_plan"] == 0.0


def test_no_member_scores_alone_without_the_other_half():
    env = MathToolSplitEnv()
    # the reasoner alone: its right plan is never submitted as a number
    alone = env.score_alone("reasoner", "A - B. The calculation is \\boxed{A - B}.", TASK)
    assert alone.team_reward == 0.0 and alone.info["plan_correct"] == 1.0
    # the tool alone is right only when its guessed operation is
    assert env.score_alone("tool", "```python\nprint(9 - 3)\n```", TASK).team_reward == 1.0
    assert env.score_alone("tool", "```python\nprint(9 + 3)\n```", TASK).team_reward == 0.0


def test_worked_examples_are_training_arithmetic_and_each_operation():
    operations = {"+": operator.add, "-": operator.sub, "*": operator.mul}
    seen = set()
    for hidden, reply, tool_request, program in SPLIT_EXAMPLES:
        plan = reply.rsplit("\\boxed{", 1)[1].rstrip("}.")
        a, b = (int(part.split(" = ")[1]) for part in tool_request.split("\n")[0].removeprefix("Numbers: ")
                .rstrip(".").split(", "))
        symbol = plan.split()[1]
        assert arithmetic_split(arithmetic_key(operations[symbol], a, b)) == "train"
        assert "A" in hidden and "B" in hidden and not any(ch.isdigit() for ch in hidden)
        assert f"print({plan})" in program and f"A = {a}" in program
        seen.add(symbol)
    assert seen == {"+", "-", "*"}


def test_the_split_task_has_the_main_jobs_problems():
    # the same generator: a held-out problem of the split task is the main job's problem of the same task id
    main = ENVIRONMENTS["math_tool_generalisation"].make_dataset(12, 1, "test")
    split = MathToolSplitEnv.make_dataset(12, 1, "test")
    assert main["task_id"] == split["task_id"] and main["question"] == split["question"]
    for row in generalisation_problems(60, 0, "train") + generalisation_problems(30, 0, "test"):
        split_question(row["question"])  # every generated problem has exactly two numbers
