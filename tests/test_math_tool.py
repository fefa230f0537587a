"""The reasoner / Python-tool environment of AT-GRPO: answer checking, rewards, agreement, prompts, data, recipes."""

import json
import re
import threading
import time
from fractions import Fraction
from pathlib import Path

import pytest

from tests.recipe_runs import build_trainer
from trl_multiagent.environments.math_problems import (
    EASY_FORMS,
    HELD_OUT_FORMS,
    TEMPLATES,
    THINGS,
    arithmetic_key,
    arithmetic_split,
    format_answer,
    generalisation_problems,
    gsm8k_to_task,
    operation_weights,
    polaris_to_task,
    question_split,
    word_problems,
)
from trl_multiagent.environments.math_tool import MathToolEnv, MathToolGeneralisationEnv
from trl_multiagent.metrics.answers import answers_match, final_answer, last_boxed

ROOT = Path(__file__).resolve().parents[1]
TASK = {"question": "A rope of 7 m is cut into 2 equal pieces. How long is each piece, in metres?", "answer": "7/2"}
TOOL_EXACT = "Let me compute it.\n```python\nfrom fractions import Fraction\nprint(Fraction(7, 2))\n```"
TOOL_FLOAT = "```python\nlength = 7 / 2\nprint(length)\n```"


def test_last_boxed_and_printed_answer():
    assert last_boxed("first \\boxed{1}, finally \\boxed{\\frac{7}{2}}.") == "\\frac{7}{2}"
    assert last_boxed("\\boxed{\\frac{1}{\\sqrt{2}}}") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("so \\boxed 5.") == "5"
    assert last_boxed("no final answer") is None and last_boxed("\\boxed{}") is None
    assert last_boxed("\\boxed{3} and an unclosed \\boxed{4") == "3"
    assert final_answer("step 1\n42\n\n", printed=True) == "42" and final_answer("  \n", printed=True) is None
    assert final_answer("\\boxed{1}\n2", printed=True) == "2"  # a program's output: its last line, boxed or not
    with pytest.raises(ValueError, match="accept_last_number"):
        final_answer("7", accept_last_number=True, printed=True)


@pytest.mark.parametrize("a,b,printed", [
    ("0.5", "\\frac{1}{2}", (False, False)),
    ("1,000", "1000", (False, False)),
    ("\\$1,000", "1000", (False, False)),
    ("3.5", "7/2", (True, False)),
    ("\\dfrac{7}{2}", "3.5", (False, True)),
    ("12.50", "12.5", (False, False)),
    ("The answer is 42", "42", (True, False)),
    ("1e+3", "1000", (True, False)),
    ("12.50 dollars", "12.5", (False, False)),
    ("11 years old", "11", (False, False)),
])
def test_math_verify_equivalences(a, b, printed):
    assert answers_match(a, b, printed)
    assert answers_match(b, a, printed[::-1])


def test_math_verify_differences_and_threads():
    assert not answers_match("4", "3.5")
    assert not answers_match("7/2", "2/7")
    assert not answers_match(None, "1") and not answers_match("1", None)
    assert not answers_match("1" * 300, "1" * 300)  # longer than max_chars: never a match
    results = {}

    def worker():  # math-verify's signal timeouts cannot run here: the checker must still work, and stay bounded
        start = time.perf_counter()
        results["equal"] = answers_match("0.5", "\\frac{1}{2}") and answers_match("1,000", "1000")
        results["tower"] = answers_match("10^{10^{10}}", "5")
        results["seconds"] = time.perf_counter() - start

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(30)
    assert results["equal"] is True and results["tower"] is False and results["seconds"] < 5


def test_joint_step_agreement_ends_with_full_rewards():
    env = MathToolEnv()
    prompts = env.reset(TASK)
    assert TASK["question"] in prompts["reasoner"] and "\\boxed{answer}" in prompts["reasoner"]
    assert TASK["question"] in prompts["tool"] and "```python" in prompts["tool"]
    result = env.step({"reasoner": "Each piece is 7/2 = 3.5 m, so \\boxed{3.5}.", "tool": TOOL_EXACT})
    assert result.done and result.next_prompts is None
    assert result.team_reward == 1.0 and result.info["agreed"] == 1.0
    assert result.local_rewards == {"reasoner": 1.0, "tool": 1.0}  # 0.2 * 1 + 0.8 * 1 each
    assert env.tool_answer == "7/2" and env.turn == 1


def test_disagreement_rewards_and_next_prompts():
    env = MathToolEnv(max_turns=3)
    env.reset(TASK)
    result = env.step({"reasoner": "7 - 3 = 4, so \\boxed{4}", "tool": TOOL_FLOAT})
    # team answer = the reasoner's (no agreement): 4 is wrong -> 0
    assert result.team_reward == 0.0 and not result.done and result.info["agreed"] == 0.0
    assert result.local_rewards["reasoner"] == pytest.approx(0.2)  # format 1, correct 0
    assert result.local_rewards["tool"] == pytest.approx(1.0)  # printed 3.5 equals 7/2
    reasoner, tool = result.next_prompts["reasoner"], result.next_prompts["tool"]
    assert "7 - 3 = 4" in reasoner and "length = 7 / 2" in reasoner and "Its output: 3.5" in reasoner
    assert "the reasoning agent says 4, the tool agent's program prints 3.5" in reasoner
    assert "length = 7 / 2" in tool and "7 - 3 = 4" in tool and "Its answer: 4" in tool
    assert "7/2" not in reasoner.replace("7 / 2", "") and "7/2" not in tool.replace("7 / 2", "")  # gold never shown


def test_the_team_can_submit_the_tools_answer_while_the_two_disagree():
    env = MathToolEnv(max_turns=1, final_answer="tool")
    env.reset(TASK)
    result = env.step({"reasoner": "7 - 3 = 4, so \\boxed{4}", "tool": TOOL_FLOAT})
    # the same disagreement as above: the tool's printed 3.5 equals 7/2, so the team is right; the local rewards are
    # the agents' own, whoever answers for the team
    assert result.team_reward == 1.0 and result.info["team_correct"] == 1.0 and result.done
    assert result.local_rewards == {"reasoner": pytest.approx(0.2), "tool": pytest.approx(1.0)}
    env.reset(TASK)  # a program that prints nothing: the reasoner's answer is the team's
    result = env.step({"reasoner": "\\boxed{7/2}", "tool": "```python\nx = 1\n```"})
    assert result.team_reward == 1.0 and result.info["tool_executes"] == 0.0
    with pytest.raises(ValueError, match="final_answer must be one of"):
        MathToolEnv(final_answer="judge")


def test_teamwork_measures_say_who_the_exchange_corrected_or_misled():
    env = MathToolEnv(max_turns=3)
    env.reset(TASK)
    first = env.step({"reasoner": "7 - 3 = 4, so \\boxed{4}", "tool": TOOL_FLOAT})  # reasoner wrong, tool right
    assert {k: first.info[k] for k in ("reasoner_corrected", "reasoner_misled", "tool_corrected", "tool_misled")} == \
        {"reasoner_corrected": 0.0, "reasoner_misled": 0.0, "tool_corrected": 0.0, "tool_misled": 0.0}
    second = env.step({"reasoner": "The program prints 3.5, so \\boxed{3.5}", "tool": TOOL_FLOAT})
    assert second.done and second.info["reasoner_corrected"] == 1.0 and second.info["tool_corrected"] == 0.0
    assert second.info["reasoner_misled"] == 0.0 and second.info["tool_misled"] == 0.0

    env.reset(TASK)  # a fresh episode forgets the first answers
    env.step({"reasoner": "\\boxed{3.5}", "tool": "```python\nprint(4)\n```"})  # reasoner right, tool wrong
    last = env.step({"reasoner": "The program says 4: \\boxed{4}", "tool": "```python\nprint(4)\n```"})
    assert last.info["reasoner_misled"] == 1.0 and last.info["reasoner_corrected"] == 0.0
    assert last.info["tool_corrected"] == 0.0 and last.info["tool_misled"] == 0.0


def test_each_agent_alone_is_scored_as_the_teams_answer():
    env = MathToolEnv(max_turns=2)
    # the tool alone: its program runs in the sandbox and its last printed line, 3.5, is the team's answer (7/2)
    tool = env.score_alone("tool", "```python\nprint(1)\nprint(7 / 2)\n```", TASK)
    assert tool.team_reward == 1.0 and tool.info["team_correct"] == 1.0 and tool.info["tool_correct"] == 1.0
    assert tool.info["tool_executes"] == 1.0 and tool.info["reasoner_correct"] == 0.0
    assert tool.local_rewards == {"tool": 1.0}  # 0.2 * executes + 0.8 * correct
    wrong = env.score_alone("tool", "```python\nprint(7 // 2)\n```", TASK)  # prints 3
    assert wrong.team_reward == 0.0 and wrong.info["tool_executes"] == 1.0
    crash = env.score_alone("tool", "```python\nprint(1 / 0)\n```", TASK)
    assert crash.team_reward == 0.0 and crash.info["tool_executes"] == 0.0
    # the reasoner alone (the baseline once called single): its boxed answer
    reasoner = env.score_alone("reasoner", "7 / 2 = 3.5, so \\boxed{3.5}", TASK)
    assert reasoner.team_reward == 1.0 and reasoner.info["tool_executes"] == 0.0
    assert env.score_alone("reasoner", "\\boxed{4}", TASK).team_reward == 0.0
    # a second call starts from the task again: nothing of the earlier answers is left
    assert env.score_alone("tool", "no program", TASK).info["reasoner_correct"] == 0.0
    with pytest.raises(ValueError, match="not 'coder'"):
        env.score_alone("coder", "x", TASK)
    assert MathToolEnv.method_aliases == {"single": "reasoner_alone"}
    assert MathToolEnv.episode_baselines == {"no_exchange": ("reasoner", "tool")}


def test_sequential_partial_actions_clone_and_failures():
    env = MathToolEnv(max_turns=3)
    first = env.reset(TASK)
    result = env.step({"reasoner": "\\boxed{\\frac{7}{2}}"})  # the reasoner alone: no sandbox run
    assert result.local_rewards == {"reasoner": 1.0} and result.team_reward == 1.0
    assert not result.done and env.acted == {"reasoner"} and env.turn == 0
    assert result.next_prompts["tool"] == first["tool"]  # the tool agent has not acted: the problem only

    clone = env.clone()
    crash = clone.step({"tool": "```python\nprint(1 / 0)\n```"})
    assert crash.local_rewards == {"tool": 0.0} and not crash.done and clone.turn == 1
    assert "ZeroDivisionError" in crash.next_prompts["tool"] and "did not print a usable answer" in \
        crash.next_prompts["reasoner"]
    assert crash.team_reward == 1.0  # the team answer is still the reasoner's correct one
    assert env.code is None and env.turn == 0 and env.acted == {"reasoner"}  # the original is untouched

    result = env.step({"tool": TOOL_FLOAT})
    assert result.done and result.info["agreed"] == 1.0 and result.local_rewards == {"tool": 1.0}
    with pytest.raises(ValueError):
        MathToolEnv().step({"critic": "x"})


def test_budget_format_and_team_answer_fallback():
    env = MathToolEnv(max_turns=1)
    env.reset(TASK)
    result = env.step({"reasoner": "It is three and a half.", "tool": "```python\nprint(7/2\n```"})  # never run
    assert result.done and result.team_reward == 0.0
    assert result.local_rewards == {"reasoner": 0.0, "tool": 0.0}
    assert "SyntaxError" in env.output
    env.reset(TASK)
    result = env.step({"reasoner": "It is three and a half.", "tool": TOOL_FLOAT})
    # no boxed answer: the team's answer is the tool's, which is right; the budget of one turn ends the episode
    assert result.done and result.team_reward == 1.0 and result.local_rewards == {"reasoner": 0.0, "tool": 1.0}


def _recompute(template: str, p: dict) -> Fraction:
    """Each template's answer, worked out again from its parameters."""
    if template == "shopping":
        spent = p["n1"] * p["price1_cents"] + p["n2"] * p["price2_cents"]
        return Fraction(p["bill"] * 100 - spent, 100)
    if template == "work_rate":
        return 1 / (Fraction(1, p["a"]) + Fraction(1, p["b"]))
    if template == "speed":
        return Fraction(p["v1"], 60) * p["t1"] + Fraction(p["v2"], 60) * p["t2"]
    if template == "ages":  # k*s + y = m*(s + y)  =>  s = y*(m - 1)/(k - m)
        return Fraction(p["years"] * (p["m"] - 1), p["k"] - p["m"])
    if template == "ratio":
        return Fraction(p["total"] * p["q"], p["p"] + p["q"])
    if template == "spending":
        left = Fraction(p["total"]) - Fraction(p["total"], p["d1"])
        return left - left / p["d2"]
    if template == "orchard":
        apples = p["rows"] * p["per_row"] * p["per_tree"]
        return Fraction(apples, p["bag"]) * Fraction(p["price_cents"], 100)
    raise AssertionError(template)


def test_word_problems_are_correct():
    rows = word_problems(400, seed=3, split="train")
    assert {r["template"] for r in rows} == set(TEMPLATES)
    assert len({r["question"] for r in rows}) == 400
    for r in rows:
        p = json.loads(r["params"])
        expected = _recompute(r["template"], p)
        assert Fraction(r["answer"]) == expected, r
        assert r["answer"] == format_answer(expected)
        numbers = set(re.findall(r"\d+(?:\.\d+)?", r["question"]))
        for key, value in p.items():  # every parameter is stated in the question
            shown = f"{value / 100:.2f}" if key.endswith("_cents") else str(value)
            assert shown in numbers, (key, value, r["question"])
        if r["template"] == "shopping":  # the smallest bill that covers the purchase
            spent = p["n1"] * p["price1_cents"] + p["n2"] * p["price2_cents"]
            smaller = [b for b in (10, 20, 50, 100, 200) if b < p["bill"]]
            assert 100 * p["bill"] >= spent and all(100 * b < spent for b in smaller)
        if r["template"] == "orchard":
            assert p["rows"] * p["per_row"] * p["per_tree"] % p["bag"] == 0
    assert format_answer(Fraction(25, 2)) == "12.5" and format_answer(Fraction(12, 7)) == "12/7"


def test_word_problem_splits_are_disjoint_and_seeded():
    train0, train0_again = word_problems(300, 0, "train"), word_problems(300, 0, "train")
    assert train0 == train0_again
    train1 = word_problems(300, 1, "train")
    assert {r["question"] for r in train0} != {r["question"] for r in train1}
    train = {r["question"] for seed in (0, 1) for r in word_problems(300, seed, "train")}
    test = {r["question"] for seed in (0, 1) for r in word_problems(300, seed, "test")}
    assert len(test) > 300 and train.isdisjoint(test)
    assert all(question_split(q) == "test" for q in test) and all(question_split(q) == "train" for q in train)
    data = MathToolEnv.make_dataset(num_tasks=8, seed=0, split="test")
    assert len(data) == 8 and data["question"] == [r["question"] for r in word_problems(8, 0, "test")]
    MathToolEnv.validate_dataset_columns(data.column_names)
    with pytest.raises(ValueError, match="split"):
        word_problems(1, 0, "validation")


def test_generalisation_held_out_problems_share_no_arithmetic_and_no_form_with_training():
    import operator

    assert arithmetic_key(operator.add, 5, 3) == arithmetic_key(operator.add, 3, 5) == "add:3:5"
    assert arithmetic_key(operator.mul, 7, 2) == "mul:2:7" and arithmetic_key(operator.sub, 7, 2) == "sub:7:2"
    train = [r for seed in (0, 1, 2) for r in generalisation_problems(400, seed, "train")]
    unseen_ops = [r for seed in (0, 1, 2) for r in generalisation_problems(120, seed, "unseen_operands")]
    unseen_form = generalisation_problems(60, 0, "unseen_form")
    # the arithmetic of every problem, recomputed from its form and operands
    for r in train + unseen_ops + unseen_form:
        forms = HELD_OUT_FORMS if r["held_out_set"] == "unseen_form" else EASY_FORMS
        question, operation = forms[r["template"]]
        p = json.loads(r["params"])
        assert r["arithmetic"] == arithmetic_key(operation, p["a"], p["b"]) and r["answer"] == str(operation(p["a"], p["b"]))
    assert {r["arithmetic"] for r in train}.isdisjoint({r["arithmetic"] for r in unseen_ops})
    assert all(arithmetic_split(r["arithmetic"]) == "test" for r in unseen_ops)
    assert {r["template"] for r in train} == set(EASY_FORMS) and {r["template"] for r in unseen_form} == {"compare"}
    assert set(HELD_OUT_FORMS).isdisjoint(EASY_FORMS)
    assert len({r["arithmetic"] for r in unseen_ops}) >= 20  # a spread of held-out arithmetic, not a handful
    assert {r["question"] for r in train}.isdisjoint({r["question"] for r in unseen_ops + unseen_form})
    held = generalisation_problems(120, 0, "test")
    assert [r["held_out_set"] for r in held] == ["unseen_operands"] * 80 + ["unseen_form"] * 40
    assert held == generalisation_problems(80, 0, "unseen_operands") + generalisation_problems(40, 0, "unseen_form")
    assert len({r["question"] for r in held}) == 120
    data = MathToolGeneralisationEnv.make_dataset(num_tasks=120, seed=0, split="test")
    assert data["question"] == [r["question"] for r in held]
    MathToolGeneralisationEnv.validate_dataset_columns(data.column_names)
    with pytest.raises(ValueError, match="split"):
        MathToolGeneralisationEnv.make_dataset(num_tasks=4, split="eval")  # the runner then asks for "test"


def test_generalisation_balanced_and_validation_splits_draw_each_operation_equally_from_training_arithmetic():
    import collections
    import operator

    assert operation_weights(EASY_FORMS) == {"gain": 0.5, "together": 0.5, "loss": 1.0, "groups": 1.0}
    assert operation_weights({"x": ("", operator.add), "y": ("", operator.sub)}) == {"x": 1.0, "y": 1.0}
    train = generalisation_problems(600, 0, "train")
    balanced = generalisation_problems(600, 0, "train_balanced")
    validation = generalisation_problems(600, 0, "validation")

    def share(rows):
        counts = collections.Counter(r["arithmetic"].split(":")[0] for r in rows)
        return {op: counts[op] / len(rows) for op in ("add", "sub", "mul")}

    # a uniform choice among the four forms gives addition (two forms) about half of the problems; the balanced
    # splits a third per operation (600 draws: a share's standard deviation is about 0.02)
    assert share(train)["add"] > 0.45
    for rows in (balanced, validation):
        assert all(abs(v - 1 / 3) < 0.07 for v in share(rows).values()), share(rows)
        assert all(arithmetic_split(r["arithmetic"]) == "train" for r in rows)  # training arithmetic only
        assert {r["template"] for r in rows} == set(EASY_FORMS)
    assert {r["held_out_set"] for r in validation} == {"validation"}
    assert [r["question"] for r in validation] != [r["question"] for r in balanced]  # their own seed streams
    # the training split itself is unchanged by the new splits: the problems of the recorded runs
    assert train[:3] == generalisation_problems(3, 0, "train")
    data = MathToolGeneralisationEnv.make_dataset(num_tasks=5, seed=1, split="validation")
    assert data["question"] == [r["question"] for r in generalisation_problems(5, 1, "validation")]
    with pytest.raises(ValueError, match="train_balanced"):
        MathToolGeneralisationEnv.make_dataset(num_tasks=4, split="dev")


def test_generalisation_worked_examples_each_operation_show_training_arithmetic_only():
    import operator
    import re

    from trl_multiagent.environments.math_prompts import EACH_OPERATION_EXAMPLES, EASY_EXAMPLES

    symbols = {"+": operator.add, "-": operator.sub, "*": operator.mul}
    keys = []
    for request, reasoner, tool in EACH_OPERATION_EXAMPLES:
        a, sign, b, result = re.match(r"(\d+) ([-+*]) (\d+) = (\d+)\.", reasoner).groups()
        assert symbols[sign](int(a), int(b)) == int(result) and f"print({a} {sign} {b})" in tool
        assert f" {a} " in request and f" {b} " in request  # the calculation uses the request's own numbers
        assert not any(thing in request for thing in THINGS)  # objects the generator never uses: not a task
        keys.append(arithmetic_key(symbols[sign], int(a), int(b)))
    assert [k.split(":")[0] for k in keys] == ["add", "sub", "mul"]  # one per operation of the training forms
    assert all(arithmetic_split(k) == "train" for k in keys), keys
    # the default examples' product is held-out arithmetic: the reason "each_operation" picks its own
    assert arithmetic_split(arithmetic_key(operator.mul, 3, 4)) == "test" and "3 * 4 = 12" in EASY_EXAMPLES[1][1]
    task = generalisation_problems(1, 0, "train")[0]
    for choice, examples in (("add_mul", EASY_EXAMPLES), ("each_operation", EACH_OPERATION_EXAMPLES)):
        env = MathToolGeneralisationEnv(worked_examples=choice)
        env.reset(task)
        for agent, reply in (("reasoner", 1), ("tool", 2)):
            messages = env.first_prompt(agent)
            assert [m["content"] for m in messages[1:-1]] == [x for e in examples for x in (e[0], e[reply])]
            assert messages[-1]["content"] == f"Problem: {task['question']}"
    with pytest.raises(ValueError, match="worked_examples must be one of"):
        MathToolGeneralisationEnv(worked_examples="three")


def test_gsm8k_and_polaris_transforms():
    row = {"question": "Natalia sold clips to 48 friends in April, and half as many in May. How many in total? ",
           "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nIn total she sold 48+24 = <<48+24=72>>72 clips."
                     "\n#### 72"}
    task = gsm8k_to_task(row)
    assert task == {"question": row["question"].strip(), "answer": "72",
                    "solution": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nIn total she sold 48+24 = "
                                "<<48+24=72>>72 clips."}
    assert gsm8k_to_task({"question": "q", "answer": "big\n#### 1,250"})["answer"] == "1250"
    with pytest.raises(ValueError, match="####"):
        gsm8k_to_task({"question": "q", "answer": "no marker"})
    assert polaris_to_task({"problem": " Find x. ", "answer": "\\frac{1}{2}", "difficulty": "3/8"}) == {
        "question": "Find x.", "answer": "\\frac{1}{2}"}
    MathToolEnv.validate_dataset_columns(list(task))
    from trl_multiagent.runtime.user_code import import_object

    for name, function in (("gsm8k_to_task", gsm8k_to_task), ("polaris_to_task", polaris_to_task)):
        # the dataset_transform that recipes written before the problems moved to math_problems name
        assert import_object(f"trl_multiagent.environments.math_tool:{name}") is function


CONFIGS = ["math_at_grpo_shared", "math_at_grpo_specialized", "gsm8k_at_grpo", "polaris_at_grpo"]


@pytest.mark.parametrize("name", CONFIGS)
def test_math_recipes_load(tmp_path, name):
    from trl_multiagent.command.cli import load_recipe
    from trl_multiagent.command.recipe import build_team, resolve_environment
    from trl_multiagent.runtime.user_code import import_object

    recipe, config = load_recipe(["--config", str(ROOT / f"recipes/configs/{name}.yaml"), "--output_dir",
                                  str(tmp_path)])
    assert type(config).__name__ == "ATGRPOConfig" and recipe.model == "smollm2-135m-instruct"
    env_cls = resolve_environment(recipe.environment)
    assert env_cls is MathToolEnv
    env = env_cls(**recipe.env_kwargs)
    specs = build_team(recipe, env.agents)
    assert len({s.policy for s in specs}) == (2 if recipe.policy_mapping == "specialized" else 1)
    if recipe.dataset_transform:
        assert callable(import_object(recipe.dataset_transform))


@pytest.mark.parametrize("name", ["gsm8k_at_grpo", "polaris_at_grpo"])
def test_hub_math_recipes_offline_are_clear(tmp_path, monkeypatch, name):
    import datasets

    from trl_multiagent.command import recipe as recipe_module
    from trl_multiagent.command.cli import load_recipe

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "no-cache", raising=False)
    recipe, config = load_recipe(["--config", str(ROOT / f"recipes/configs/{name}.yaml"),
                                                "--output_dir", str(tmp_path)])
    config_cls, trainer_cls = recipe_module._trainer_registry()[recipe.trainer]

    class NeverBuilt(trainer_cls):  # the data must fail first: no model is ever loaded by this test
        def __init__(self, *args, **kwargs):
            raise AssertionError("the trainer was reached although the dataset cannot load offline")

    monkeypatch.setattr(recipe_module, "_trainer_registry", lambda: {recipe.trainer: (config_cls, NeverBuilt)})
    with pytest.raises(recipe_module.RecipeError, match="reachable Hugging Face Hub"):
        build_trainer(recipe, config)


def test_generalisation_recipe_holds_out_both_sets_and_names_its_baselines(tmp_path):
    from trl_multiagent.command.cli import load_recipe
    from trl_multiagent.command.recipe import held_out_tasks, resolve_environment

    recipe, config = load_recipe(["--config", str(ROOT / "recipes/configs/math_generalisation_at_grpo.yaml"),
                                  "--output_dir", str(tmp_path)])
    assert resolve_environment(recipe.environment) is MathToolGeneralisationEnv
    assert recipe.eval_methods == ["team", "reasoner_alone", "tool_alone", "no_exchange"]
    assert recipe.eval_metric == "final/team_correct"
    held = list(held_out_tasks(recipe, config, recipe.eval_num_problems))
    assert [r["held_out_set"] for r in held] == ["unseen_operands"] * 80 + ["unseen_form"] * 40
    train = MathToolGeneralisationEnv.make_dataset(num_tasks=recipe.num_tasks, seed=config.seed, split="train")
    assert set(train["arithmetic"]).isdisjoint(r["arithmetic"] for r in held[:80])
    assert "compare" not in set(train["template"])
