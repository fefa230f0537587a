"""The reasoner / Python-tool team with the problem split between them, so that neither can answer alone: the
reasoner reads the question with its two numbers hidden (written ``A`` and ``B``) and plans the calculation; the tool
agent sees only the numbers and the reasoner's plan, and computes (issue 60, item 4: "a task where the two roles
need each other").

Why it exists. On the main job's task (:class:`~trl_multiagent.environments.math_tool.MathToolGeneralisationEnv`)
each agent sees the whole problem, and the trained team was never better than its best member trained alone
(``experiments/training/math_teamwork/``): either agent can solve a one-operation problem on its own. Here the
information is split as in a plan agent / tool agent team (AT-GRPO's Plan-Path and Sudoku, Sec. 5.1, where a plan
agent decides and a tool agent executes): the problem's *meaning* is the reasoner's alone, its *numbers* the tool's
alone. A member alone can therefore answer only by guessing (the reasoner a number it never saw, the tool an
operation it never read); the question the task asks is whether training makes the hand-over work, and whether
the pair then beats a single agent that sees the whole problem (the main job's single-agent records, the same
held-out problems).

The problems are :class:`MathToolGeneralisationEnv`'s (the same generated splits and held-out sets, the same task ids
for a seed), each with exactly two numbers; the first number of the question is ``A``, the second ``B``
(:func:`split_question`).

Protocol (one turn, ``agent_order: sequential``, the recipe
``recipes/configs/math_split_at_grpo.yaml``): the reasoner answers first with its plan as a boxed calculation in
``A`` and ``B`` (``\\boxed{A - B}``); the tool agent's prompt then shows the numbers and that reply, and its
program's printed line is the team's answer (``final_answer="tool"``: while the program prints nothing, the
reasoner's boxed text, which cannot be right unless it guessed a number). With ``agent_order: parallel`` or at the
first turn of a tool acting alone, the tool's prompt says there is no plan yet. Later turns (``max_turns`` > 1) use
the revision prompts of :class:`MathToolEnv`.

Rewards (AT-GRPO Eq. 3, ``alpha * team + local``): **team** = 1 when the team's answer equals the gold one. The
**tool's local** reward is :class:`MathToolEnv`'s (the program runs and prints, 0.2; its answer is right, 0.8). The
**reasoner's local** reward judges the plan: boxed (0.2) and right, i.e. its calculation evaluated at the hidden
numbers equals the gold answer (0.8; :func:`evaluate_plan`); the environment computes this for the reward only and
never submits it as the team's answer, so the reasoner cannot score as the team without the tool. ``info`` adds
``plan_correct`` and ``tool_followed_plan`` (the tool's printed answer equals the plan's value): a right answer with
a right plan followed is the division of labour the task asks for.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from trl_multiagent.environments.base import StepResult, chat_with_examples, revise_last_message
from trl_multiagent.environments.coder_tester import masked_convex_combination
from trl_multiagent.environments.math_problems import format_answer
from trl_multiagent.environments.math_prompts import (
    REASONER_REVISION,
    SPLIT_EXAMPLES,
    SPLIT_REASONER_SYSTEM,
    SPLIT_TOOL_REQUEST,
    SPLIT_TOOL_SYSTEM,
    TOOL_REVISION,
)
from trl_multiagent.environments.math_tool import MathToolGeneralisationEnv
from trl_multiagent.generation.requests import Prompt
from trl_multiagent.metrics.answers import last_boxed

__all__ = ["MathToolSplitEnv", "evaluate_plan", "split_question"]

_NUMBER = re.compile(r"\d+")
#: The names of the hidden numbers, in the order they appear in the question.
HIDDEN_NAMES = ("A", "B")


def split_question(question: str) -> tuple[str, dict[str, int]]:
    """The reasoner's view of ``question`` (its two numbers replaced by ``A`` and ``B`` in order of appearance) and
    the tool's (``{"A": first, "B": second}``). A question without exactly two numbers is an error."""
    numbers = _NUMBER.findall(question)
    if len(numbers) != len(HIDDEN_NAMES):
        raise ValueError(f"math_tool_split needs questions with exactly two numbers, got {len(numbers)} in "
                         f"{question!r}")
    names = iter(HIDDEN_NAMES)
    return _NUMBER.sub(lambda _: next(names), question), dict(zip(HIDDEN_NAMES, map(int, numbers)))


#: ``x`` between two operands (``A x B``) read as a product.
_TIMES = re.compile(r"(?<=[\sAB\d)])x(?=[\sAB\d(])")
_OPERATIONS = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y, ast.Mult: lambda x, y: x * y,
               ast.Div: lambda x, y: x / y}


def evaluate_plan(plan: str | None, numbers: Mapping[str, int]) -> str | None:
    """The value of a boxed plan, a calculation in the hidden numbers (``A - B``, ``(A + B) * 2``; ``×``, ``\\times``
    and ``\\cdot`` read as ``*``), at ``numbers``, as an exact answer text (:func:`format_answer`); ``None`` for
    anything else: a plain number counts as no plan (the reasoner never saw the numbers), as does a name other
    than ``A`` and ``B``, any other operation, a division by zero, or more than 200 characters."""
    if not plan or len(plan) > 200:
        return None
    text = _TIMES.sub("*", plan.replace("\\times", "*").replace("\\cdot", "*").replace("×", "*"))
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    names_used: set[str] = set()

    def value(node) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATIONS:
            return _OPERATIONS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        if isinstance(node, ast.Name) and node.id in numbers:
            names_used.add(node.id)
            return Fraction(numbers[node.id])
        raise ValueError("not a calculation in the hidden numbers")

    try:
        result = value(tree)
    except (ValueError, ZeroDivisionError):
        return None
    return format_answer(result) if names_used else None


class MathToolSplitEnv(MathToolGeneralisationEnv):
    """The reasoner plans with the question's numbers hidden; the tool computes with the numbers and the plan
    (see the module docstring).

    Args:
        final_answer: whose answer the team submits (default ``"tool"``: the program's printed line; the
            reasoner's boxed plan is not a number).
        worked_examples: ``"each_operation"`` (the only one): :data:`SPLIT_EXAMPLES`, an addition, a subtraction and
            a product on training arithmetic.
        **kwargs: the other arguments of :class:`MathToolGeneralisationEnv` (``max_turns``, ``sandbox``, weights).
    """

    WORKED_EXAMPLES = {"each_operation": SPLIT_EXAMPLES}
    #: No ``no_exchange`` baseline: in one turn with the reasoner first, the only exchange is the hand-over of the
    #: plan, and the tool answering without it is ``tool_alone``.
    episode_baselines: dict = {}
    #: One turn: the reasoner plans, then the tool computes (``agent_order: sequential``).
    max_turns = 1

    def __init__(self, *args: Any, final_answer: str = "tool", worked_examples: str = "each_operation",
                 **kwargs: Any):
        kwargs.setdefault("max_turns", type(self).max_turns)
        super().__init__(*args, final_answer=final_answer, worked_examples=worked_examples, **kwargs)
        self.hidden_question, self.numbers = "", {}

    def reset(self, task: Mapping[str, Any]) -> dict[str, Prompt]:
        self.hidden_question, self.numbers = split_question(str(task["question"]))
        return super().reset(task)

    def first_prompt(self, agent: str) -> Prompt:
        if agent == "reasoner":
            return chat_with_examples(SPLIT_REASONER_SYSTEM, [(ex[0], ex[1]) for ex in self.examples],
                                      f"Problem: {self.hidden_question}")
        return self._tool_request(None)

    def _tool_request(self, plan: str | None) -> Prompt:
        """The tool agent's prompt: the numbers and the reasoner's plan (``None``: not given yet)."""
        return chat_with_examples(SPLIT_TOOL_SYSTEM, [(ex[2], ex[3]) for ex in self.examples],
                                  SPLIT_TOOL_REQUEST.format(**self.numbers, plan=plan or "(none yet)"))

    def step(self, joint_action: Mapping[str, str]) -> StepResult:
        result = super().step(joint_action)
        plan_value = evaluate_plan(last_boxed(self.solution or ""), self.numbers)
        plan_correct = self._match(plan_value, self.gold, (False, False))
        followed = self._match(self.tool_answer, plan_value, (True, False))
        result.info.update(plan_correct=float(plan_correct), tool_followed_plan=float(followed))
        if result.local_rewards is not None and "reasoner" in result.local_rewards:
            result.local_rewards["reasoner"] = masked_convex_combination(
                {"format": float(self.reasoner_boxed), "correct": float(plan_correct)}, self.reasoner_weights)
        return result

    def _prompt(self, agent: str) -> Prompt:
        cut = self.max_feedback_chars
        solution = None if self.solution is None else self.solution[-cut:]
        if agent == "tool":
            request = self._tool_request(solution)
            if self.code is None:
                return request
            return revise_last_message(request, lambda first: TOOL_REVISION.format(
                first_prompt=first, code=self.code[-cut:], output=self.output[-cut:],
                answer=self.tool_answer or "(none)", solution=solution or "(no solution yet)",
                other_answer=self.reasoner_answer or "(none)", mismatch=self._mismatch()))
        if self.solution is None:
            return self.first_prompts["reasoner"]
        return revise_last_message(self.first_prompts["reasoner"], lambda first: REASONER_REVISION.format(
            first_prompt=first, solution=solution, answer=self.reasoner_answer or "(none)",
            code=(self.code or "# (no program yet)")[-cut:], output=self.output[-cut:] or "(no output yet)",
            other_answer=self.tool_answer or "(none)", mismatch=self._mismatch()))
