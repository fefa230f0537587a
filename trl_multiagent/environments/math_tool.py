"""A reasoner and a Python tool agent solve a math problem until their answers agree: the math MAS of AT-GRPO
(Sec. 5.1 "Math", Appendix B.1 rewards, C.2 prompts).

Roles: the **reasoner** solves the problem in words and ends with ``\\boxed{answer}``; the **tool** agent writes a
Python program whose printed output (its last non-empty line) is its answer; the program runs in the sandbox
(:func:`trl_multiagent.sandbox.run_python`). Turn 1 shows both agents only the problem (C.2 "Phase 1"); later prompts
show each agent its previous output and answer, the other agent's latest output and answer, and that they disagree
(C.2 "Phase 2": feedback from the mismatch between the boxed answer and the printed output).

Answers are compared with the ``math-verify`` package (B.1: Math-Verify parses and normalises, then a numeric
comparison with tolerance; ``verify``'s default rounds floats to 6 digits), so ``0.5`` equals ``\\frac{1}{2}`` and
``1,000`` equals ``1000``. See :func:`answers_match` for how the checker stays bounded in time.

Termination (the analysis of Sec. 5: "MAS interaction terminates when the two agents align"): the episode ends as
soon as both agents have an answer and the two answers are equal, or when the turn budget ``max_turns`` is spent (a
turn is over once every agent has acted in it).

Rewards of one step (AT-GRPO Eq. 3 mixes them as ``alpha * team + local``):

* **team** = 1 when the team's answer equals the gold answer, else 0 (B.1: "sparse pass ... via numerical
  equality"). The team's answer is the agreed answer when the agents agree, otherwise the reasoner's boxed answer
  (the tool's answer while the reasoner has none): the answer the team would submit if the episode stopped now, so
  that at the last step it is the final answer.
* **reasoner local** = masked convex combination (B.1) ``sum_k w_k s_k / sum_k w_k`` of ``s_format`` = 1 when the
  reply has a ``\\boxed{}`` answer (w = 0.2) and ``s_correct`` = 1 when that answer equals the gold one (w = 0.8).
* **tool local** = the same over ``s_executes`` = 1 when the program exits normally and prints an answer (w = 0.2)
  and ``s_correct`` = 1 when the printed answer equals the gold one (w = 0.8).

The paper's coefficients were lost in our copy of the text; these weights are this project's choice and can be
changed with ``reasoner_weights`` / ``tool_weights``. Partial actions (``{"reasoner": ...}`` or ``{"tool": ...}``,
sequential AT-GRPO) and joint actions are both accepted; the local rewards returned are the acting agents'.

Data:

* :meth:`MathToolEnv.make_dataset` generates arithmetic word problems (shopping totals, work rates, speeds, ages,
  ratio sharing, successive spending, a multi-step orchard problem) with exact integer or fraction answers. Train
  and test problems come from separate seed streams, and a problem's split is also fixed by a hash of its text, so
  the two splits can never share a problem whatever the seeds.
* :func:`gsm8k_to_task` and :func:`polaris_to_task` map rows of GSM8K (``openai/gsm8k``, config ``main``) and of
  Polaris-Dataset-53K to this environment's columns (``question``, ``answer``); recipes name them in
  ``dataset_transform``.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import logging
import operator
import random
import re
import threading
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from ..answers import final_answer, last_boxed
from ..generation.requests import Prompt
from ..sandbox import SandboxConfig, run_python
from .base import Environment, StepResult, chat_with_examples, merge_weights, revise_last_message
from .checks import need_bool, need_int, need_tasks, need_weights, sandbox_settings
from .coder_tester import masked_convex_combination
from .coding import extract_code

logger = logging.getLogger(__name__)

#: Default weights of the reasoner's local reward components (see the module docstring).
REASONER_WEIGHTS: dict[str, float] = {"format": 0.2, "correct": 0.8}
#: Default weights of the tool agent's local reward components (see the module docstring).
TOOL_WEIGHTS: dict[str, float] = {"executes": 0.2, "correct": 0.8}

REASONER_PROMPT = (
    "You are the reasoning agent in a team of two: you solve math problems by step-by-step reasoning, while a tool "
    "agent solves the same problem with Python code. Solve the problem below step by step, then give the final "
    "answer as \\boxed{{answer}} (a number or an expression).\n\nProblem: {question}"
)

TOOL_PROMPT = (
    "You are the Python tool agent in a team of two: you solve math problems by writing code, while a reasoning "
    "agent solves the same problem step by step in words. Write a short Python program that computes the answer to "
    "the problem below and prints ONLY the final answer as its last line (for example `print(answer)`). Use exact "
    "arithmetic (integers or fractions.Fraction) where you can. Reply with the program in a single ```python code "
    "block.\n\nProblem: {question}"
)

#: The easy level's prompts show the expected format with a worked example (issue 18: a 135M model rarely boxes).
EASY_ANSWER_FORMAT = (
    "Write the calculation with the numbers from the problem, then the final answer as \\boxed{{answer}}. Format "
    "example: if a problem asks for 2 more than 5, write: 5 + 2 = 7. The answer is \\boxed{{7}}.\n\nProblem: "
    "{question}"
)

EASY_REASONER_PROMPT = (
    "You are the reasoning agent in a team of two: you solve math problems in words, while a tool agent solves the "
    "same problem with Python code. " + EASY_ANSWER_FORMAT
)

EASY_TOOL_PROMPT = (
    "You are the Python tool agent in a team of two: you solve math problems with Python code, while a reasoning "
    "agent solves the same problem in words. Reply with a short Python program in a single ```python code block "
    "that prints only the answer. Format example: if a problem asks for 2 more than 5, reply:\n```python\n"
    "print(5 + 2)\n```\n\nProblem: {question}"
)

#: Worked examples of the easy level, shown as earlier chat turns (``examples_as_turns``): the request, the
#: reasoner's reply and the tool agent's reply. Their objects (pens, cups) are not among the generator's, so no
#: example is a training or test task.
EASY_EXAMPLES = (
    ("Problem: Sam has 5 pens. Ava gives Sam 2 more. How many pens does Sam have now?",
     "5 + 2 = 7. The answer is \\boxed{7}.", "```python\nprint(5 + 2)\n```"),
    ("Problem: Ben has 3 bags with 4 cups in each bag. How many cups does Ben have in all?",
     "3 * 4 = 12. The answer is \\boxed{12}.", "```python\nprint(3 * 4)\n```"),
)

#: The instructions (system message) of the easy level's chat prompts; the task follows as ``Problem: {question}``.
EASY_ANSWER_RULE = "Write the calculation with the numbers from the problem, then the final answer as \\boxed{answer}."
EASY_REASONER_SYSTEM = (
    "You are the reasoning agent in a team of two: you solve math problems in words, while a tool agent solves the "
    "same problem with Python code. " + EASY_ANSWER_RULE
)
EASY_TOOL_SYSTEM = (
    "You are the Python tool agent in a team of two: you solve math problems with Python code, while a reasoning "
    "agent solves the same problem in words. Reply with a one-line Python program in a ```python code block that "
    "prints the answer."
)

REASONER_REVISION = """{first_prompt}

Your previous solution:
{solution}

Your previous answer: {answer}

The tool agent's program:
```python
{code}
```
Its output: {output}
Its answer: {other_answer}

{mismatch}
Decide which answer is wrong, then solve the problem again and end with \\boxed{{answer}}."""

TOOL_REVISION = """{first_prompt}

Your previous program:
```python
{code}
```
Its output: {output}
Your previous answer: {answer}

The reasoning agent's solution:
{solution}

Its answer: {other_answer}

{mismatch}
Decide which answer is wrong, then reply with a corrected program in a single ```python code block that \
prints only the final answer."""


# --------------------------------------------------------------------------------------------------- answers
def printed_answer(stdout: str) -> str | None:
    """The last non-empty line of a program's output, or ``None``."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    return lines[-1] if lines else None


_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_WITH_UNIT = re.compile(r"((?:\\?\$)?\s*[-+]?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?)\s+[A-Za-z]{2,}[A-Za-z .]*")
_EXPONENT = re.compile(r"(?:\^|\*\*)\s*[{(]?\s*(\d+)")
_TOWER = re.compile(r"(?:\^|\*\*)\s*[{(]?[^+\-=,;]*?(?:\^|\*\*)")


def _costly(text: str, max_chars: int) -> bool:
    """Inputs that could keep sympy busy for a long time (used where no timeout can interrupt it)."""
    if len(text) > max_chars or _TOWER.search(text) or re.search(r"\d{3,}\s*!|factorial", text):
        return True
    return any(len(m.group(1)) > 4 for m in _EXPONENT.finditer(text))


def _math_verify():
    try:
        import math_verify
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise ImportError("MathToolEnv checks answers with the package 'math-verify' (pip install math-verify)") \
            from exc
    return math_verify


def parse_answer(text: str, printed: bool = False, max_chars: int = 200) -> list:
    """Parse an answer with Math-Verify; ``[]`` when nothing parses (or the input is too costly to parse).

    ``printed``: the text is a program's printed line (read as a plain expression first, LaTeX second); otherwise
    it is a boxed or gold answer (LaTeX first). Plain words after a number (units: ``12.50 dollars``) are dropped,
    and a float literal with an exponent (``1e+300``) is expanded first.
    """
    mv = _math_verify()
    text = text.strip()
    with_unit = _WITH_UNIT.fullmatch(text)
    if with_unit:  # "12.50 dollars", "11 years old": LaTeX would read the words as a product of symbols
        text = with_unit.group(1)
    if _NUMBER.fullmatch(text) and "e" in text.lower():
        try:
            text = format(Decimal(text), "f")
        except InvalidOperation:
            pass
    in_main = threading.current_thread() is threading.main_thread()
    if not in_main and _costly(text, max_chars):
        return []
    timeout = 5 if in_main else None  # math-verify's timeout uses signal.alarm: main thread only
    latex = [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()]
    expr = [mv.ExprExtractionConfig(), mv.LatexExtractionConfig()]
    attempts = [(text, expr), (f"${text}$", latex)] if printed else [(f"${text}$", latex), (text, expr)]
    for candidate, config in attempts:
        try:
            parsed = mv.parse(candidate, extraction_config=config, parsing_timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - math-verify raises many kinds on odd input
            logger.debug("math-verify could not parse %r: %s", candidate, exc)
            parsed = []
        if parsed:
            return parsed
    return []


def answers_match(a: str | None, b: str | None, printed: tuple[bool, bool] = (False, False),
                  max_chars: int = 200) -> bool:
    """Whether two answers are mathematically equal (Math-Verify, either direction).

    In the main thread Math-Verify's own timeouts bound the work. Elsewhere (environments stepped from a thread
    pool) they cannot run, so inputs that could be slow to evaluate (longer than ``max_chars``, towers of powers,
    exponents of five or more digits, large factorials) count as unequal instead. Answers longer than
    ``max_chars`` never match.
    """
    if a is None or b is None or len(a) > max_chars or len(b) > max_chars:
        return False
    if a.strip() == b.strip():
        return True
    pa, pb = parse_answer(a, printed[0], max_chars), parse_answer(b, printed[1], max_chars)
    if not pa or not pb:
        return False
    mv = _math_verify()
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    for gold, pred in ((pa, pb), (pb, pa)):
        try:
            if mv.verify(gold, pred, timeout_seconds=timeout):
                return True
        except Exception as exc:  # noqa: BLE001
            logger.debug("math-verify could not compare %r and %r: %s", a, b, exc)
    return False


# --------------------------------------------------------------------------------------------------- dataset rows
def gsm8k_to_task(row: Mapping[str, Any]) -> dict[str, str]:
    """A GSM8K row (``question``, ``answer`` = rationale + ``#### final``) -> ``question``, ``answer`` (the final
    number, thousands separators removed) and ``solution`` (the rationale)."""
    solution, sep, final = str(row["answer"]).rpartition("####")
    if not sep:
        raise ValueError(f"GSM8K answer without '####': {row['answer']!r}")
    final = final.strip().replace(",", "").lstrip("$").rstrip(".")
    return {"question": str(row["question"]).strip(), "answer": final, "solution": solution.strip()}


def polaris_to_task(row: Mapping[str, Any]) -> dict[str, str]:
    """A Polaris-Dataset-53K row (``problem``, ``answer``, ``difficulty``) -> ``question``, ``answer``."""
    return {"question": str(row["problem"]).strip(), "answer": str(row["answer"]).strip()}


# --------------------------------------------------------------------------------------------------- word problems
NAMES = ("Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Isla", "Jamal", "Keiko", "Liam", "Maya",
         "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sam", "Tariq")
ITEMS = ("notebooks", "pens", "mugs", "candles", "scarves", "puzzles", "plants", "sketchbooks", "lamps", "kites")
WORKERS = (("Pipe A", "pipe B", "fill the tank"), ("Ana", "her brother", "paint the fence"),
           ("The old printer", "the new printer", "print the batch of flyers"),
           ("One pump", "a second pump", "empty the pond"), ("Tom", "his sister", "rake the garden"))
THINGS = ("marbles", "stickers", "cards", "coins", "stamps", "shells", "beads")
SPENDING = (("books", "lunch"), ("a jacket", "a movie ticket"), ("groceries", "bus fares"), ("a gift", "snacks"))
FRUITS = ("apple", "pear", "peach", "plum", "orange")


def _money(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"


def format_answer(value: Fraction) -> str:
    """An exact answer as text: ``12``, ``12.5`` (finite decimals) or ``12/7``."""
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    d = value.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    if d == 1:
        return format(Decimal(value.numerator) / Decimal(value.denominator), "f")
    return f"{value.numerator}/{value.denominator}"


def _shopping(rng: random.Random):
    while True:
        n1, n2 = rng.randint(2, 9), rng.randint(2, 6)
        p1, p2 = 25 * rng.randint(2, 60), 25 * rng.randint(2, 40)
        item1, item2 = rng.sample(ITEMS, 2)
        total = n1 * p1 + n2 * p2
        bills = [b for b in (10, 20, 50, 100, 200) if 100 * b >= total]
        if bills:
            break
    name, bill = rng.choice(NAMES), bills[0]
    q = (f"{name} buys {n1} {item1} that cost {_money(p1)} each and {n2} {item2} that cost {_money(p2)} each. "
         f"{name} pays with a ${bill} bill. How much change, in dollars, does {name} get back?")
    return q, Fraction(100 * bill - total, 100), {"n1": n1, "price1_cents": p1, "n2": n2, "price2_cents": p2,
                                                   "bill": bill}


def _work_rate(rng: random.Random):
    a, b = rng.sample(range(2, 16), 2)
    first, second, job = rng.choice(WORKERS)
    q = (f"{first} can {job} in {a} hours, and {second} can {job} in {b} hours. Working together at these rates, "
         f"how many hours do they need to {job}?")
    return q, Fraction(a * b, a + b), {"a": a, "b": b}


def _speed(rng: random.Random):
    v1, v2 = rng.sample(range(6, 31), 2)
    t1, t2 = 5 * rng.randint(2, 24), 5 * rng.randint(2, 24)
    name = rng.choice(NAMES)
    q = (f"{name} cycles at {v1} km/h for {t1} minutes, then at {v2} km/h for {t2} minutes. "
         f"How many kilometres does {name} ride in total?")
    return q, Fraction(v1 * t1 + v2 * t2, 60), {"v1": v1, "t1": t1, "v2": v2, "t2": t2}


def _ages(rng: random.Random):
    while True:
        child_age, m = rng.randint(2, 15), rng.choice((2, 3))
        k = rng.randint(m + 1, m + 4)
        years = Fraction((k - m) * child_age, m - 1)
        if years.denominator == 1 and 1 <= years <= 40 and 20 <= k * child_age <= 80:
            break
    parent, child = rng.sample(NAMES, 2)
    q = (f"{parent} is {k} times as old as {child}. In {years} years, {parent} will be {m} times as old as "
         f"{child}. How old is {child} now?")
    return q, Fraction(child_age), {"k": k, "m": m, "years": int(years)}


def _ratio(rng: random.Random):
    p, q_ = rng.sample(range(1, 10), 2)
    unit = rng.randint(2, 30)
    first, second = rng.sample(NAMES, 2)
    things = rng.choice(THINGS)
    total = (p + q_) * unit
    q = f"{first} and {second} share {total} {things} in the ratio {p}:{q_}. How many {things} does {second} get?"
    return q, Fraction(q_ * unit), {"total": total, "p": p, "q": q_}


def _spending(rng: random.Random):
    d1, d2 = rng.randint(2, 6), rng.randint(2, 6)
    total = d1 * d2 * rng.randint(1, 20)
    name = rng.choice(NAMES)
    first, second = rng.choice(SPENDING)
    q = (f"{name} has ${total}. {name} spends 1/{d1} of it on {first}, then 1/{d2} of what is left on {second}. "
         f"How many dollars does {name} have left?")
    return q, Fraction(total) * (1 - Fraction(1, d1)) * (1 - Fraction(1, d2)), {"total": total, "d1": d1, "d2": d2}


def _orchard(rng: random.Random):
    while True:
        rows, per_row, per_tree = rng.randint(2, 12), rng.randint(3, 15), rng.randint(10, 60)
        bag = rng.choice((4, 5, 6, 8, 10, 12))
        if rows * per_row * per_tree % bag == 0:
            break
    price = 25 * rng.randint(4, 24)
    fruit = rng.choice(FRUITS)
    q = (f"An orchard has {rows} rows of {per_row} {fruit} trees. Each tree gives {per_tree} {fruit}s. All the "
         f"{fruit}s are packed into bags of {bag}, and each bag sells for {_money(price)}. How much money, in "
         f"dollars, do all the bags bring in?")
    return q, Fraction(rows * per_row * per_tree // bag * price, 100), {
        "rows": rows, "per_row": per_row, "per_tree": per_tree, "bag": bag, "price_cents": price}


#: The word-problem templates: name -> ``fn(rng) -> (question, exact answer, parameters)``.
TEMPLATES: dict[str, Callable[[random.Random], tuple[str, Fraction, dict]]] = {
    "shopping": _shopping, "work_rate": _work_rate, "speed": _speed, "ages": _ages, "ratio": _ratio,
    "spending": _spending, "orchard": _orchard,
}


# One-operation problems with small numbers (level "easy"): what a 135M model can sometimes solve (issue 18).
#: name -> (question, operation); the operands ``a``, ``b`` are drawn by :func:`_one_operation`.
EASY_FORMS: dict[str, tuple[str, Callable[[int, int], int]]] = {
    "gain": ("{name} has {a} {things}. {other} gives {name} {b} more. How many {things} does {name} have now?",
             operator.add),
    "loss": ("{name} has {a} {things} and gives {b} of them to {other}. How many {things} does {name} have left?",
             operator.sub),
    "together": ("{name} has {a} {things} and {other} has {b} {things}. How many {things} do they have together?",
                 operator.add),
    "groups": ("{name} has {a} bags with {b} {things} in each bag. How many {things} does {name} have in all?",
               operator.mul),
}


def _one_operation(kind: str) -> Callable[[random.Random], tuple[str, Fraction, dict]]:
    """The template of ``EASY_FORMS[kind]``: operands 2-10 (a product's first factor 2-5; a difference's first
    operand the larger of two distinct ones), so every answer is a positive integer of at most 50."""
    question, operation = EASY_FORMS[kind]

    def make(rng: random.Random):
        if operation is operator.sub:
            a, b = sorted(rng.sample(range(2, 11), 2), reverse=True)
        elif operation is operator.mul:
            a, b = rng.randint(2, 5), rng.randint(2, 10)
        else:
            a, b = rng.randint(2, 10), rng.randint(2, 10)
        name, other = rng.sample(NAMES, 2) if "{other}" in question else (rng.choice(NAMES), "")
        text = question.format(name=name, other=other, a=a, b=b, things=rng.choice(THINGS))
        return text, Fraction(operation(a, b)), {"a": a, "b": b}

    return make


#: One-operation templates (level ``"easy"``): addition, subtraction and small products, operands at most 10.
EASY_TEMPLATES: dict[str, Callable[[random.Random], tuple[str, Fraction, dict]]] = {
    kind: _one_operation(kind) for kind in EASY_FORMS}

#: Problem levels of :func:`word_problems`: level -> its templates.
LEVELS = {"standard": TEMPLATES, "easy": EASY_TEMPLATES}


def question_split(question: str, test_fraction: int = 5) -> str:
    """The split a generated question belongs to: ``"test"`` for one hash bucket in ``test_fraction``."""
    bucket = int(hashlib.sha256(question.encode()).hexdigest(), 16) % test_fraction
    return "test" if bucket == 0 else "train"


def word_problems(num_tasks: int, seed: int = 0, split: str = "train", level: str = "standard") -> list[dict[str, str]]:
    """``num_tasks`` distinct generated word problems of ``split`` (``"train"`` or ``"test"``) and ``level``
    (:data:`LEVELS`: ``"standard"``, multi-step; ``"easy"``, one operation on numbers up to 10).

    Each split draws from its own seed stream (``random.Random("math-word-problems/<split>/<seed>")``, the level
    appended for ``"easy"``) and keeps only the problems whose :func:`question_split` is that split, so the splits
    are disjoint for every pair of seeds. Rows: ``task_id``, ``question``, ``answer`` (:func:`format_answer`),
    ``template``, ``params`` (JSON).
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {sorted(LEVELS)}, got {level!r}")
    templates = LEVELS[level]
    rng = random.Random(f"math-word-problems/{split}/{seed}" + ("" if level == "standard" else f"/{level}"))
    names = sorted(templates)
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    attempts = 0
    while len(rows) < num_tasks:
        attempts += 1
        if attempts > 100 * num_tasks + 1000:
            raise RuntimeError(f"could only generate {len(rows)} distinct {split} problems of {num_tasks}")
        template = rng.choice(names)
        question, answer, params = templates[template](rng)
        if question in seen or question_split(question) != split:
            continue
        seen.add(question)
        prefix = "word" if level == "standard" else f"word-{level}"
        rows.append({"task_id": f"{prefix}/{split}/{seed}/{len(rows)}", "question": question,
                     "answer": format_answer(answer), "template": template, "params": json.dumps(params)})
    return rows


# --------------------------------------------------------------------------------------------------- environment
class _SharedCache(dict):
    """Answer comparisons, shared by an environment and its clones (facts about strings, not episode state)."""

    def __deepcopy__(self, memo):
        return self


class MathToolEnv(Environment):
    """The reasoner / Python-tool loop of AT-GRPO's math workflow (see the module docstring).

    Args:
        max_turns: the turn budget (default 3).
        sandbox: limits of the tool agent's runs (a :class:`SandboxConfig` or its fields; default ``timeout_s=10``).
        reasoner_weights: weights of the reasoner's local reward (:data:`REASONER_WEIGHTS` keys).
        tool_weights: weights of the tool agent's local reward (:data:`TOOL_WEIGHTS` keys).
        max_answer_chars: longest answer compared (longer ones count as wrong outside the main thread).
        max_feedback_chars: longest solution, program or output shown in a next-turn prompt.
    """

    agents = ("reasoner", "tool")
    max_turns = 3
    required_columns = ("question", "answer")
    concurrent_steps = True
    supports_partial_actions = True
    #: The :func:`word_problems` level of :meth:`make_dataset`, and the first-turn prompts.
    level = "standard"
    reasoner_prompt = REASONER_PROMPT
    tool_prompt = TOOL_PROMPT
    #: Whether a reasoner reply without a box answers with its last number (``accept_final_number=None``).
    accepts_final_number = False

    def __init__(self, max_turns: int = 3, sandbox: SandboxConfig | Mapping | None = None,
                 reasoner_weights: Mapping[str, float] | None = None,
                 tool_weights: Mapping[str, float] | None = None, max_answer_chars: int = 200,
                 max_feedback_chars: int = 1500, accept_final_number: bool | None = None):
        self.max_turns = need_int("max_turns", max_turns, minimum=1)
        self.accept_final_number = self.accepts_final_number if accept_final_number is None else \
            need_bool("accept_final_number", accept_final_number)
        self.sandbox = sandbox_settings(sandbox, {"timeout_s": 10})
        self.reasoner_weights = merge_weights(need_weights("reasoner_weights", reasoner_weights), REASONER_WEIGHTS,
                                              "reasoner_weights")
        self.tool_weights = merge_weights(need_weights("tool_weights", tool_weights), TOOL_WEIGHTS, "tool_weights")
        self.max_answer_chars = need_int("max_answer_chars", max_answer_chars, minimum=1)
        self.max_feedback_chars = need_int("max_feedback_chars", max_feedback_chars, minimum=1)
        self._matches = _SharedCache()
        self.question, self.gold = "", ""
        self.first_prompts: dict[str, Prompt] = {}
        self.turn, self.acted = 0, set()
        self.solution: str | None = None
        self.reasoner_answer: str | None = None
        self.code: str | None = None
        self.output = ""
        self.tool_answer: str | None = None
        self.tool_ran = False
        self.reasoner_boxed = False

    @classmethod
    def make_dataset(cls, num_tasks: int | None = 256, seed: int = 0, split: str = "train"):
        """Generated arithmetic word problems of the class's ``level`` (:func:`word_problems`) as a ``Dataset``."""
        from datasets import Dataset

        need_tasks(num_tasks)

        return Dataset.from_list(word_problems(num_tasks or 256, seed, split, cls.level))

    # ------------------------------------------------------------------------------------------- protocol
    def reset(self, task: Mapping[str, Any]) -> dict[str, Prompt]:
        self.question, self.gold = str(task["question"]), str(task["answer"]).strip()
        self.turn, self.acted = 0, set()
        self.solution = self.reasoner_answer = self.code = self.tool_answer = None
        self.output, self.tool_ran, self.reasoner_boxed = "", False, False
        self.first_prompts = {agent: self.first_prompt(agent) for agent in self.agents}
        return dict(self.first_prompts)

    def first_prompt(self, agent: str) -> Prompt:
        """``agent``'s first-turn prompt on the current question (a later turn revises its last message)."""
        template = self.reasoner_prompt if agent == "reasoner" else self.tool_prompt
        return template.format(question=self.question)

    def step(self, joint_action: Mapping[str, str]) -> StepResult:
        acting = self.acting_agents(joint_action, self.acted, self.turn)
        if "reasoner" in joint_action:
            self.solution = joint_action["reasoner"]
            self.reasoner_answer = final_answer(self.solution, self.accept_final_number)
            self.reasoner_boxed = last_boxed(self.solution) is not None
        if "tool" in joint_action:
            self._run_tool(joint_action["tool"])

        reasoner_correct = self._match(self.reasoner_answer, self.gold, (False, False))
        tool_correct = self._match(self.tool_answer, self.gold, (True, False))
        agreed = self._match(self.reasoner_answer, self.tool_answer, (False, True))
        team_correct = reasoner_correct if self.reasoner_answer is not None else tool_correct

        local: dict[str, float] = {}
        if "reasoner" in acting:
            local["reasoner"] = masked_convex_combination(
                {"format": float(self.reasoner_boxed), "correct": float(reasoner_correct)},
                self.reasoner_weights)
        if "tool" in acting:
            local["tool"] = masked_convex_combination(
                {"executes": float(self.tool_ran), "correct": float(tool_correct)}, self.tool_weights)
        info = {"team_correct": float(team_correct), "reasoner_correct": float(reasoner_correct),
                "tool_correct": float(tool_correct), "agreed": float(agreed),
                "reasoner_format": float(self.reasoner_boxed), "tool_executes": float(self.tool_ran)}

        self.acted |= set(acting)
        if self.acted == set(self.agents):
            self.turn, self.acted = self.turn + 1, set()
        done = agreed or self.turn >= self.max_turns
        next_prompts = None if done else {a: self._prompt(a) for a in self.agents}
        return StepResult(team_reward=float(team_correct), next_prompts=next_prompts, done=done,
                          local_rewards=local, info=info)

    def clone(self) -> MathToolEnv:
        return copy.deepcopy(self)

    # ------------------------------------------------------------------------------------------- internals
    def _run_tool(self, response: str) -> None:
        self.code = extract_code(response)
        self.tool_answer, self.tool_ran = None, False
        try:
            ast.parse(self.code)
        except (SyntaxError, ValueError) as exc:
            self.output = f"(not run) {type(exc).__name__}: {exc}"
            return
        result = run_python(self.code, self.sandbox)
        answer = printed_answer(result.stdout)
        if result.passed and answer is not None and len(answer) <= self.max_answer_chars:
            self.tool_answer, self.tool_ran = answer, True
            self.output = result.stdout.strip()
        elif result.passed:
            self.output = "(the program printed nothing)" if answer is None else \
                f"(the last printed line is longer than {self.max_answer_chars} characters)"
        else:
            error = result.message or result.reason or result.status
            tail = result.stderr.strip().splitlines()[-1:] if result.stderr.strip() else []
            self.output = f"(the program failed: {tail[0] if tail else error})"

    def _match(self, a: str | None, b: str | None, printed: tuple[bool, bool]) -> bool:
        if a is None or b is None:
            return False
        key = (a, b, printed)
        if key not in self._matches:
            self._matches[key] = answers_match(a, b, printed, self.max_answer_chars)
        return self._matches[key]

    def _mismatch(self) -> str:
        notes = []
        if self.solution is not None and self.reasoner_answer is None:
            notes.append("The reasoning agent's reply has no final answer.")
        if self.code is not None and self.tool_answer is None:
            notes.append("The tool agent's program did not print a usable answer.")
        if self.solution is None or self.code is None:
            notes.append("The other agent has not answered yet.")
        if self.reasoner_answer is not None and self.tool_answer is not None:
            notes.append(f"The two answers do not agree: the reasoning agent says {self.reasoner_answer}, the tool "
                         f"agent's program prints {self.tool_answer}.")
        return " ".join(notes)

    def _prompt(self, agent: str) -> Prompt:
        def cut(text: str | None, empty: str) -> str:
            if not text:
                return empty
            limit = self.max_feedback_chars
            return text if len(text) <= limit else "...(truncated) " + text[-(limit - 16):]

        solution = cut(self.solution, "(no solution yet)")
        code = cut(self.code, "# (no program yet)")
        output = cut(self.output, "(no output yet)")
        if agent == "reasoner":
            if self.solution is None:
                return self.first_prompts["reasoner"]
            return revise_last_message(self.first_prompts["reasoner"], lambda first: REASONER_REVISION.format(
                first_prompt=first, solution=solution, answer=self.reasoner_answer or "(none)", code=code,
                output=output, other_answer=self.tool_answer or "(none)", mismatch=self._mismatch()))
        if self.code is None:
            return self.first_prompts["tool"]
        return revise_last_message(self.first_prompts["tool"], lambda first: TOOL_REVISION.format(
            first_prompt=first, code=code, output=output, answer=self.tool_answer or "(none)", solution=solution,
            other_answer=self.reasoner_answer or "(none)", mismatch=self._mismatch()))


class MathToolEasyEnv(MathToolEnv):
    """:class:`MathToolEnv` on one-operation problems with small numbers (``word_problems(level="easy")``), with
    worked examples in both first prompts, and a reasoner reply without a box answering with its last number
    (issue 18: the closest task to AT-GRPO's math on which the embedded 135M model can make progress). The reasoner's
    format reward still asks for the box.

    Args:
        examples_as_turns: show the :data:`EASY_EXAMPLES` as earlier chat turns under a system message of
            instructions (default); ``False``: one format example inside a single user message
            (:data:`EASY_REASONER_PROMPT`, :data:`EASY_TOOL_PROMPT`; the prompts of the first issue-18 runs).
        **kwargs: the arguments of :class:`MathToolEnv`.
    """

    level = "easy"
    reasoner_prompt = EASY_REASONER_PROMPT
    tool_prompt = EASY_TOOL_PROMPT
    accepts_final_number = True

    def __init__(self, *args: Any, examples_as_turns: bool = True, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.examples_as_turns = need_bool("examples_as_turns", examples_as_turns)

    def first_prompt(self, agent: str) -> Prompt:
        if not self.examples_as_turns:
            return super().first_prompt(agent)
        system, reply = (EASY_REASONER_SYSTEM, 1) if agent == "reasoner" else (EASY_TOOL_SYSTEM, 2)
        return chat_with_examples(system, [(example[0], example[reply]) for example in EASY_EXAMPLES],
                                  f"Problem: {self.question}")
