"""The easy arithmetic tasks of issue 18 (one operation, numbers up to 10, a worked format example, a final number
accepted without a box): answer extraction, data, and both environments (AT-GRPO's reasoner / tool loop and
MAPoRL's debate)."""

import json
import re
from pathlib import Path

import pytest

from trl_multiagent.credit.maporl import PenaltySettings, answer_penalties
from trl_multiagent.environments import ENVIRONMENTS
from trl_multiagent.environments.base import chat_with_examples, revise_last_message
from trl_multiagent.environments.debate import MathDebateEasyEnv, MathDebateEnv
from trl_multiagent.environments.math_problems import EASY_TEMPLATES, THINGS, question_split, word_problems
from trl_multiagent.environments.math_prompts import (
    EASY_DEBATE_EXAMPLES,
    EASY_EXAMPLES,
    EASY_MATH_PROMPT,
    EASY_MATH_SYSTEM,
    EASY_REASONER_PROMPT,
    EASY_REASONER_SYSTEM,
    EASY_TOOL_PROMPT,
    EASY_TOOL_SYSTEM,
)
from trl_multiagent.environments.math_tool import MathToolEasyEnv, MathToolEnv
from trl_multiagent.metrics.answers import final_answer, last_number, text_after_boxed

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
    env.reset(TASK)
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
    assert "says 8" in result.next_prompts["tool"][-1]["content"]

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
    env.reset(TASK)
    result = env.step({"agent1": "4 + 3 = 7", "agent2": "The answer is \\boxed{7}.", "agent3": "4 - 3 = 1"})
    assert result.local_rewards == {"agent1": 1.0, "agent2": 1.0, "agent3": 0.0}
    assert result.team_reward == 1.0 and not result.done  # majority right, no agreement
    assert env.outcomes[0].answers == ["7", "7", "1"] and env.outcomes[0].groups == [0, 0, 2]
    standard = MathDebateEnv(num_agents=2, max_turns=1)
    standard.reset(TASK)
    assert standard.step({"agent1": "4 + 3 = 7", "agent2": "\\boxed{7}"}).local_rewards == {"agent1": 0.0,
                                                                                         "agent2": 1.0}
    assert MathDebateEasyEnv(accept_final_number=False).extract_answer("4 + 3 = 7") is None


def test_chat_with_examples_and_revise_last_message():
    messages = chat_with_examples("rules", [("q1", "a1"), ("q2", "a2")], "q3")
    assert messages == [{"role": "system", "content": "rules"}, {"role": "user", "content": "q1"},
                        {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"},
                        {"role": "assistant", "content": "a2"}, {"role": "user", "content": "q3"}]
    revised = revise_last_message(messages, lambda text: text + " again")
    assert revised[:-1] == messages[:-1] and revised[-1] == {"role": "user", "content": "q3 again"}
    assert messages[-1]["content"] == "q3"  # the input is not changed
    assert revise_last_message("plain", str.upper) == "PLAIN"


def _example_answers_are_right():
    """Every worked example's replies compute its question's answer (recomputed from the question's numbers)."""
    for request, reasoning, program in EASY_EXAMPLES:
        a, b = (int(n) for n in re.findall(r"\d+", request))
        expected = a + b if "more" in request else a * b
        assert final_answer(reasoning) == str(expected)
        assert program == f"```python\nprint({a} {'+' if 'more' in request else '*'} {b})\n```"
        assert not any(thing in request for thing in THINGS)  # no example can be a generated task


def test_math_tool_easy_shows_worked_examples_as_chat_turns():
    _example_answers_are_right()
    env = MathToolEasyEnv(max_turns=2)
    prompts = env.reset(TASK)
    for agent, reply, system in (("reasoner", 1, EASY_REASONER_SYSTEM), ("tool", 2, EASY_TOOL_SYSTEM)):
        assert prompts[agent] == chat_with_examples(system, [(e[0], e[reply]) for e in EASY_EXAMPLES],
                                                    f"Problem: {TASK['question']}")
    result = env.step({"reasoner": "4 + 3 = 8", "tool": CODE})  # disagreement: turn 2 revises the last message
    for agent in ("reasoner", "tool"):
        turn2 = result.next_prompts[agent]
        assert turn2[:-1] == prompts[agent][:-1]  # the system message and the examples stay
        assert turn2[-1]["role"] == "user" and turn2[-1]["content"].startswith(f"Problem: {TASK['question']}")
        assert "says 8" in turn2[-1]["content"] and "print(4 + 3)" in turn2[-1]["content"]

    inline = MathToolEasyEnv(max_turns=2, examples_as_turns=False)  # the prompts of the first runs
    prompts = inline.reset(TASK)
    assert prompts == {"reasoner": EASY_REASONER_PROMPT.format(question=TASK["question"]),
                       "tool": EASY_TOOL_PROMPT.format(question=TASK["question"])}
    assert isinstance(inline.step({"reasoner": "4 + 3 = 8", "tool": CODE}).next_prompts["tool"], str)
    with pytest.raises(ValueError, match="examples_as_turns"):
        MathToolEasyEnv(examples_as_turns="no")


def test_math_debate_easy_shows_worked_examples_as_chat_turns():
    env = MathDebateEasyEnv(num_agents=2, max_turns=2)
    prompts = env.reset(TASK)
    opening = chat_with_examples(EASY_MATH_SYSTEM, EASY_DEBATE_EXAMPLES, f"Problem: {TASK['question']}")
    for (request, reply), (shown_request, reasoner_reply, _) in zip(EASY_DEBATE_EXAMPLES, EASY_EXAMPLES):
        assert (request, reply + ".") == (shown_request, reasoner_reply)
        # App. G: nothing may follow the box, so a debater copying an example is not penalised
        assert text_after_boxed(reply) == "" and not any(
            answer_penalties(reply, reply.split(), False, PenaltySettings(min_tokens=8)).values())
    assert prompts == {"agent1": opening, "agent2": opening}
    assert env.question == f"Problem: {TASK['question']}"  # what a learned verifier reads
    result = env.step({"agent1": "4 + 3 = 7", "agent2": "4 - 3 = 1"})
    turn2 = result.next_prompts["agent1"]
    assert turn2[:-1] == opening[:-1] and turn2[-1]["content"].startswith(opening[-1]["content"])
    assert "Your previous answer:\n4 + 3 = 7" in turn2[-1]["content"]
    assert "Answer of agent2:\n4 - 3 = 1" in turn2[-1]["content"]
    assert "Answer of agent1:\n4 + 3 = 7" in result.next_prompts["agent2"][-1]["content"]
    inline = MathDebateEasyEnv(examples_as_turns=False)
    assert inline.reset(TASK)["agent1"] == EASY_MATH_PROMPT.format(question=TASK["question"])


@pytest.mark.parametrize("name, env_cls", [("math_easy_at_grpo", MathToolEasyEnv),
                                           ("math_easy_at_grpo_specialized", MathToolEasyEnv),
                                           ("math_easy_debate", MathDebateEasyEnv),
                                           ("math_easy_cc", MathToolEasyEnv), ("math_easy_dc", MathToolEasyEnv),
                                           ("math_easy_magrpo", MathToolEasyEnv)])
def test_easy_recipes_load(tmp_path, name, env_cls):
    from trl_multiagent.command.cli import load_recipe
    from trl_multiagent.command.recipe import build_team, resolve_environment

    recipe, config = load_recipe(["--config", str(ROOT / f"recipes/configs/{name}.yaml"), "--output_dir",
                                  str(tmp_path)])
    assert resolve_environment(recipe.environment) is env_cls and recipe.dataset == "generated"
    build_team(recipe, env_cls(**recipe.env_kwargs).agents)


def test_collm_and_magrpo_easy_recipes_share_one_budget_and_protocol(tmp_path):
    """CoLLM-CC, CoLLM-DC and MAGRPO are compared on the same task: the same environment settings, model, sampling,
    number of training episodes (CoLLM: one per problem; MAGRPO: K joint actions per problem) and held-out protocol."""
    from trl_multiagent.command.cli import load_recipe

    loaded = {name: load_recipe(["--config", str(ROOT / f"recipes/configs/math_easy_{name}.yaml"), "--output_dir",
                                 str(tmp_path / name)])[:2] for name in ("cc", "dc", "magrpo")}
    assert loaded["cc"][1].critic == "centralized" and loaded["dc"][1].critic == "decentralized"
    # Both critics' m_t (App. E: CC and DC) show the largest reward of a turn; the math environment has no reward_max.
    assert not hasattr(MathToolEasyEnv(), "reward_max")
    assert loaded["cc"][1].reward_max == loaded["dc"][1].reward_max == 1.0
    assert loaded["cc"][1].critic_global_info and loaded["dc"][1].critic_global_info
    episodes = {name: config.max_steps * config.episodes_per_step * (config.num_generations or 1)
                for name, (_, config) in loaded.items()}
    assert episodes == {"cc": 192, "dc": 192, "magrpo": 192}
    for name, (recipe, config) in loaded.items():
        assert (recipe.environment, recipe.env_kwargs, recipe.model, recipe.eval_num_problems, recipe.eval_metric) \
            == ("math_tool_easy", {"max_turns": 1, "max_feedback_chars": 300}, "smollm2-135m-instruct", 80,
                "final/team_correct"), name
        assert (config.num_turns, config.temperature, config.top_p, config.max_completion_length,
                config.learning_rate) == (1, 0.7, 1.0, 40, 3e-4), name
