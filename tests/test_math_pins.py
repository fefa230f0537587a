"""Regression pins of the math and debate environments: generated problems (seeds, splits, levels), the prompts of
every turn, the rewards, and the answers parsed from model text and program output.

The results recorded under ``experiments/`` were produced by these environments, so they must keep producing exactly
the same problems, prompts and rewards. Unlike the rest of the suite (expected values worked out independently), the
expected values here are the code's own output, recorded in ``tests/data/math_pins.json`` before the math environment
was split into modules (issue 36, item 5): any difference is a change of behaviour. Regenerate the file only for an
intended change: ``.venv/bin/python tests/test_math_pins.py > tests/data/math_pins.json``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from pathlib import Path

from trl_multiagent.environments import ENVIRONMENTS
from trl_multiagent.environments.debate import nli_problems
from trl_multiagent.environments.math_problems import gsm8k_to_task, polaris_to_task, word_problems
from trl_multiagent.metrics.answers import (
    answers_match,
    final_answer,
    last_boxed,
    last_number,
    parse_answer,
    parse_nli_label,
    text_after_boxed,
)

PINS = Path(__file__).resolve().parent / "data" / "math_pins.json"

TEXTS = [
    "first \\boxed{1}, finally \\boxed{\\frac{7}{2}}.", "\\boxed{\\frac{1}{\\sqrt{2}}}", "so \\boxed 5.", "\\fbox{3}",
    "no final answer", "\\boxed{}", "\\boxed{3} and an unclosed \\boxed{4", "4 + 3 = 7", "4 + 3 = 7 beads.",
    "so 1,250 apples", "1,2,3", "it is 2.5.", "x is 3/4", "a loss of -3", "8 - 3 = 5 apples left",
    "The answer is \\boxed{7}.", "$\\boxed{0.5}$ and then", "\\boxed{9} and then 10", "\\boxedfoo 4", "12 / 5 m",
    "\\boxed{ 12 }\n\n", "\\boxed{\\text{entailment}}", "The premise says so: \\boxed{Contradiction.}",
]
OUTPUTS = ["step 1\n42\n\n", "  \n", "", "3.5", "a\nb  \n  c  \n", "7/2\n"]
PAIRS = [
    ("0.5", "\\frac{1}{2}", (False, False)), ("1,000", "1000", (False, False)), ("\\$1,000", "1000", (False, False)),
    ("3.5", "7/2", (True, False)), ("\\dfrac{7}{2}", "3.5", (False, True)), ("12.50", "12.5", (False, False)),
    ("The answer is 42", "42", (True, False)), ("1e+3", "1000", (True, False)), ("12.50 dollars", "12.5", (False, False)),
    ("11 years old", "11", (False, False)), ("4", "3.5", (False, False)), ("7/2", "2/7", (False, False)),
    ("x+1", "1+x", (False, False)), ("inf", "1", (True, False)), ("-3", "-3.0", (True, False)), ("", "0", (False, False)),
    ("2.5e-3", "0.0025", (True, False)), ("\\$12.50", "12.5", (False, False)), ("12/7", "1.7142857", (False, True)),
    ("1" * 300, "1" * 300, (False, False)),
]
#: Inputs a comparison outside the main thread refuses (no timeout can stop Math-Verify there).
COSTLY = [("10^{10^{10}}", "5", (False, False)), ("2^{12345}", "1", (False, False)), ("1000!", "1", (False, False))]
GSM8K = [{"question": " q ", "answer": "r\n#### 1,250"}, {"question": "q", "answer": "a #### $72."},
         {"question": "q", "answer": "x\n#### -3"}]


def _sha(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _result(result) -> dict:
    return {"team_reward": result.team_reward, "local_rewards": result.local_rewards, "done": result.done,
            "info": result.info, "next_prompts": result.next_prompts}


def _episodes() -> dict:
    """Prompts, rewards and extracted answers of scripted episodes of every math / debate environment."""
    standard = word_problems(1, 0, "test")[0]
    easy = word_problems(1, 0, "test", "easy")[0]
    nli = nli_problems(3, 0, "test")
    code = "```python\nfrom fractions import Fraction\nprint({})\n```"
    out = {}
    tool_cases = [
        ("math_tool", {}, standard),
        ("math_tool", {"max_turns": 2, "reasoner_weights": {"format": 0.5}}, standard),
        ("math_tool_easy", {}, easy),
        ("math_tool_easy", {"examples_as_turns": False}, easy),
        ("math_tool_easy", {"accept_final_number": False}, easy),
    ]
    for i, (name, kwargs, task) in enumerate(tool_cases):
        env = ENVIRONMENTS[name](**kwargs)
        steps = [env.reset(task)]
        steps.append(_result(env.step({"reasoner": "I think it is 4 + 3 = 8. \\boxed{8}",
                                       "tool": code.format("1 / 0")})))
        steps.append(_result(env.step({"reasoner": f"So the answer is {task['answer']}."})))
        if not env.turn >= env.max_turns:
            steps.append(_result(env.step({"tool": code.format(f"Fraction('{task['answer']}')")})))
        steps.append({"reasoner_answer": env.reasoner_answer, "tool_answer": env.tool_answer, "output": env.output})
        out[f"{name}/{i}"] = steps
    debate_cases = [
        ("math_debate", {}, standard, ["\\boxed{8}", f"It is {standard['answer']}", f"\\boxed{{{standard['answer']}}}"]),
        ("math_debate", {"num_agents": 3, "max_turns": 2}, standard,
         ["\\boxed{8}", f"It is {standard['answer']}", f"\\boxed{{{standard['answer']}}}"]),
        ("math_debate_easy", {"num_agents": 3}, easy, ["4 + 3 = 7", f"\\boxed{{{easy['answer']}}}.", "no idea"]),
        ("math_debate_easy", {"examples_as_turns": False}, easy, ["4 + 3 = 7", "4 - 3 = 1"]),
        ("nli_debate", {"num_agents": 3}, nli[0], ["\\boxed{entailment}", "\\boxed{\\text{Neutral}}", "unsure"]),
        ("nli_debate", {}, nli[1], ["\\boxed{contradiction}", "\\boxed{contradicts.}"]),
    ]
    for i, (name, kwargs, task, replies) in enumerate(debate_cases):
        env = ENVIRONMENTS[name](**kwargs)
        steps = [env.reset(task), env.question, env.gold]
        for turn in range(2):
            if env.outcomes and (len(env.outcomes) >= env.max_turns or steps[-1]["done"]):
                break
            shift = replies[turn:] + replies[:turn]
            steps.append(_result(env.step({a: shift[k % len(shift)] for k, a in enumerate(env.agents)})))
        steps.append([[o.answers, o.groups, o.correct] for o in env.outcomes])
        steps.append([env.is_correct(r) for r in replies])
        out[f"{name}/{i}"] = steps
    return out


def snapshot() -> dict:
    problems = {}
    for level in ("standard", "easy"):
        for split in ("train", "test"):
            for seed in (0, 1, 7):
                rows = word_problems(200, seed, split, level)
                problems[f"{level}/{split}/{seed}"] = {"first": rows[:3], "sha256": _sha(rows)}
    datasets = {f"{name}/{split}": _sha(ENVIRONMENTS[name].make_dataset(num_tasks=20, seed=3, split=split).to_list())
                for name in ("math_tool", "math_tool_easy", "math_debate", "math_debate_easy", "nli_debate")
                for split in ("train", "test")}
    threaded = {}

    def worker():  # outside the main thread the comparison has no timeout and refuses costly inputs
        threaded["match"] = [answers_match(a, b, printed) for a, b, printed in PAIRS + COSTLY]

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(120)
    return {
        "problems": problems,
        "datasets": datasets,
        "nli": nli_problems(6, 2, "train"),
        "episodes": _episodes(),
        "texts": [[final_answer(t), final_answer(t, True), last_boxed(t), text_after_boxed(t), last_number(t),
                   parse_nli_label(last_boxed(t))] for t in TEXTS],
        "printed": [final_answer(s, printed=True) for s in OUTPUTS],
        "parsed": [[str(parse_answer(a, printed[0])), str(parse_answer(b, printed[1]))] for a, b, printed in PAIRS
                   if len(a) < 200],
        "match": [answers_match(a, b, printed) for a, b, printed in PAIRS],
        "match_in_thread": threaded["match"],
        "gsm8k": [gsm8k_to_task(row) for row in GSM8K],
        "polaris": polaris_to_task({"problem": " Find x. ", "answer": " \\frac{1}{2} ", "difficulty": "3/8"}),
    }


def test_math_environments_are_unchanged():
    expected = json.loads(PINS.read_text())
    got = json.loads(json.dumps(snapshot()))  # tuples -> lists, as stored
    for key in expected:
        assert got[key] == expected[key], key
    assert set(got) == set(expected)


if __name__ == "__main__":
    json.dump(snapshot(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
