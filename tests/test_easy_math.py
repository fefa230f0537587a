"""The easy arithmetic tasks of issue 18 (one operation, numbers up to 10, a worked format example, a final number
accepted without a box): answer extraction, data, and both environments (AT-GRPO's reasoner / tool loop and
MAPoRL's debate)."""

import json
import re
from pathlib import Path

import pytest

from trl_multiagent.answers import final_answer, last_number
from trl_multiagent.environments import ENVIRONMENTS
from trl_multiagent.environments.debate import MathDebateEasyEnv, MathDebateEnv
from trl_multiagent.environments.math_tool import (
    EASY_TEMPLATES,
    MathToolEasyEnv,
    MathToolEnv,
    question_split,
    word_problems,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, number", [
    ("5 + 2 = 7.", "7"), ("so 1,250 apples", "1250"), ("1,2,3", "3"), ("it is 2.5.", "2.5"), ("x is 3/4", "3/4"),
    ("a loss of -3", "-3"), ("no digits here", None), ("8 - 3 = 5 apples left", "5"),
])
def test_last_number(text, number):
    assert last_number(text) == number


def test_final_answer_prefers_the_box_and_falls_back_only_when_asked():
    assert final_answer("\\boxed{9} and then 10", accept_last_number=True) == "9"
    assert final_answer("4 + 3 = 7", accept_last_number=True) == "7"
    assert final_answer("4 + 3 = 7") is None
    assert final_answer("no number", accept_last_number=True) is None


def _easy_answer(template: str, p: dict) -> int:
    return {"gain": p["a"] + p["b"], "together": p["a"] + p["b"], "loss": p["a"] - p["b"],
            "groups": p["a"] * p["b"]}[template]


def test_easy_word_problems_are_correct_small_and_disjoint():
    rows = word_problems(300, seed=2, split="train", level="easy")
    assert {r["template"] for r in rows} == set(EASY_TEMPLATES)
    assert len({r["question"] for r in rows}) == 300
    for r in rows:
        p = json.loads(r["params"])
        assert int(r["answer"]) == _easy_answer(r["template"], p) > 0, r
        assert all(2 <= v <= 10 for v in p.values())
        numbers = re.findall(r"\d+", r["question"])
        assert sorted(numbers) == sorted(str(v) for v in p.values()), r["question"]  # the operands, nothing else
    train = {r["question"] for seed in (0, 1) for r in word_problems(300, seed, "train", "easy")}
    test = {r["question"] for seed in (0, 1) for r in word_problems(200, seed, "test", "easy")}
    assert train.isdisjoint(test) and all(question_split(q) == "test" for q in test)
    assert word_problems(5, 0, "test", "easy") == word_problems(5, 0, "test", "easy")
    assert word_problems(5, 0, "train")[0]["task_id"].startswith("word/")  # the standard level is unchanged
    with pytest.raises(ValueError, match="level"):
        word_problems(1, 0, "train", level="hard")


def test_environments_are_registered_and_generate_their_level():
    assert ENVIRONMENTS["math_tool_easy"] is MathToolEasyEnv and ENVIRONMENTS["math_debate_easy"] is MathDebateEasyEnv
    for cls in (MathToolEasyEnv, MathDebateEasyEnv):
        data = cls.make_dataset(num_tasks=6, seed=0, split="test")
        assert data["question"] == [r["question"] for r in word_problems(6, 0, "test", "easy")]
    assert MathToolEnv.make_dataset(num_tasks=2, seed=0)["task_id"][0].startswith("word/")


TASK = {"question": "Ava has 4 beads. Ben gives Ava 3 more. How many beads does Ava have now?", "answer": "7"}
CODE = "```python\nprint(4 + 3)\n```"


def test_math_tool_easy_reads_a_final_number_but_pays_format_only_for_a_box():
    env = MathToolEasyEnv(max_turns=2)
    prompts = env.reset(TASK)
    assert "\\boxed{7}" in prompts["reasoner"] and "print(5 + 2)" in prompts["tool"] and TASK["question"] in \
        prompts["tool"]
    result = env.step({"reasoner": "4 + 3 = 7 beads.", "tool": CODE})
    assert result.done and result.team_reward == 1.0  # both say 7: agreement ends the episode
    assert result.local_rewards == {"reasoner": pytest.approx(0.8), "tool": pytest.approx(1.0)}  # no box: no format
    assert result.info["reasoner_format"] == 0.0 and result.info["reasoner_correct"] == 1.0

    env.reset(TASK)
    result = env.step({"reasoner": "4 + 3 = 7. The answer is \\boxed{7}.", "tool": CODE})
    assert result.local_rewards["reasoner"] == pytest.approx(1.0) and result.info["reasoner_format"] == 1.0

    env.reset(TASK)
    result = env.step({"reasoner": "4 + 3 = 8", "tool": CODE})  # a wrong final number: disagreement, turn 2
    assert not result.done and result.team_reward == 0.0 and result.local_rewards["reasoner"] == 0.0
    assert "says 8" in result.next_prompts["tool"]

    strict = MathToolEasyEnv(max_turns=2, accept_final_number=False)  # the paper's box-only reading
    strict.reset(TASK)
    result = strict.step({"reasoner": "4 + 3 = 7 beads.", "tool": CODE})
    assert result.info["reasoner_correct"] == 0.0 and result.team_reward == 1.0  # the team falls back on the tool
    with pytest.raises(ValueError, match="accept_final_number"):
        MathToolEasyEnv(accept_final_number="yes")


def test_math_tool_standard_level_still_needs_a_box():
    env = MathToolEnv(max_turns=1)
    env.reset(TASK)
    assert env.step({"reasoner": "4 + 3 = 7", "tool": CODE}).info["reasoner_correct"] == 0.0


def test_math_debate_easy_reads_final_numbers():
    env = MathDebateEasyEnv(num_agents=3, max_turns=2)
    prompts = env.reset(TASK)
    assert "\\boxed{7}" in prompts["agent1"] and TASK["question"] in prompts["agent1"]
    result = env.step({"agent1": "4 + 3 = 7", "agent2": "The answer is \\boxed{7}.", "agent3": "4 - 3 = 1"})
    assert result.local_rewards == {"agent1": 1.0, "agent2": 1.0, "agent3": 0.0}
    assert result.team_reward == 1.0 and not result.done  # majority right, no agreement
    assert env.outcomes[0].answers == ["7", "7", "1"] and env.outcomes[0].groups == [0, 0, 2]
    standard = MathDebateEnv(num_agents=2, max_turns=1)
    standard.reset(TASK)
    assert standard.step({"agent1": "4 + 3 = 7", "agent2": "\\boxed{7}"}).local_rewards == {"agent1": 0.0,
                                                                                         "agent2": 1.0}
    assert MathDebateEasyEnv(accept_final_number=False).extract_answer("4 + 3 = 7") is None


@pytest.mark.parametrize("name, env_cls", [("math_easy_at_grpo", MathToolEasyEnv),
                                           ("math_easy_at_grpo_specialized", MathToolEasyEnv),
                                           ("math_easy_debate", MathDebateEasyEnv)])
def test_easy_recipes_load(tmp_path, name, env_cls):
    from trl_multiagent.cli import load_recipe
    from trl_multiagent.recipe import build_team, resolve_environment

    recipe, config = load_recipe(["--config", str(ROOT / f"recipes/configs/{name}.yaml"), "--output_dir",
                                  str(tmp_path)])
    assert resolve_environment(recipe.environment) is env_cls and recipe.dataset == "generated"
    build_team(recipe, env_cls(**recipe.env_kwargs).agents)
