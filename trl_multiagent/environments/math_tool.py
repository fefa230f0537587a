"""A reasoner and a Python tool agent solve a math problem until their answers agree: the math MAS of AT-GRPO
(Sec. 5.1 "Math", Appendix B.1 rewards, C.2 prompts).

Roles: the **reasoner** solves the problem in words and ends with ``\\boxed{answer}``; the **tool** agent writes a
Python program whose printed output (its last non-empty line) is its answer; the program runs in the sandbox
(:func:`trl_multiagent.sandbox.run_python`). Turn 1 shows both agents only the problem (C.2 "Phase 1"); later prompts
show each agent its previous output and answer, the other agent's latest output and answer, and that they disagree
(C.2 "Phase 2": feedback from the mismatch between the boxed answer and the printed output).

Answers are read and compared by :mod:`trl_multiagent.metrics.answers`: the reasoner's with
:func:`~trl_multiagent.metrics.answers.final_answer` (its last ``\\boxed{}``), the tool agent's with
``final_answer(stdout, printed=True)`` (its last printed line), and each against the gold answer and the other with
:func:`~trl_multiagent.metrics.answers.answers_match` (Math-Verify, B.1: ``0.5`` equals ``\\frac{1}{2}``, ``1,000`` equals
``1000``; bounded in time when the environment is stepped from a thread pool).

Termination (the analysis of Sec. 5: "MAS interaction terminates when the two agents align"): the episode ends as
soon as both agents have an answer and the two answers are equal, or when the turn budget ``max_turns`` is spent (a
turn is over once every agent has acted in it).

Rewards of one step (AT-GRPO Eq. 3 mixes them as ``alpha * team + local``):

* **team** = 1 when the team's answer equals the gold answer, else 0 (B.1: "sparse pass ... via numerical
  equality"). The team's answer is the agreed answer when the agents agree, otherwise the reasoner's boxed answer
  (the tool's answer while the reasoner has none; ``final_answer="tool"`` swaps the two): the answer the team would submit if the episode stopped now, so
  that at the last step it is the final answer.
* **reasoner local** = masked convex combination (B.1) ``sum_k w_k s_k / sum_k w_k`` of ``s_format`` = 1 when the
  reply has a ``\\boxed{}`` answer (w = 0.2) and ``s_correct`` = 1 when that answer equals the gold one (w = 0.8).
* **tool local** = the same over ``s_executes`` = 1 when the program exits normally and prints an answer (w = 0.2)
  and ``s_correct`` = 1 when the printed answer equals the gold one (w = 0.8).

Teamwork measures in every step's ``info`` (read at the episode's last step in the held-out evaluation,
``final/<name>``): ``agreed``; ``<agent>_corrected`` (the agent's first answer was wrong, its latest is right: the
other's answer corrected it) and ``<agent>_misled`` (first right, latest wrong). The held-out evaluation's baselines
are one turn of the untrained bases: each agent alone (:meth:`MathToolEnv.score_alone`: ``reasoner_alone``, once
called ``single``, the reasoner's boxed answer; ``tool_alone``, the tool's program run in the sandbox and its printed
answer; each scored as the team's answer is) and ``no_exchange`` (``episode_baselines``: both agents answer once,
without seeing each other's answer, the team's answer by the rule above).

A task without a gold ``answer`` can be played (asking a trained team a new question, :class:`~trl_multiagent.command.saved_team.Team`):
the exchange and the termination are as above, the steps carry no rewards (``team_reward`` and the local rewards
``None``, ``info`` without the ``*_correct``, ``*_corrected`` and ``*_misled`` values), and :meth:`team_answer`
gives the answer the team submits. Training and the held-out evaluation need the ``answer`` column (checked before
any model loads).

The paper's coefficients were lost in our copy of the text; these weights are this project's choice and can be
changed with ``reasoner_weights`` / ``tool_weights``. Partial actions (``{"reasoner": ...}`` or ``{"tool": ...}``,
sequential AT-GRPO) and joint actions are both accepted; the local rewards returned are the acting agents'.

The prompt texts are in :mod:`~trl_multiagent.environments.math_prompts` and the problems in
:mod:`~trl_multiagent.environments.math_problems`: :meth:`MathToolEnv.make_dataset` generates arithmetic word
problems (:func:`~trl_multiagent.environments.math_problems.word_problems`: disjoint train and test splits), and
recipes map GSM8K and Polaris-Dataset-53K rows with ``dataset_transform:
trl_multiagent.environments.math_problems:gsm8k_to_task`` (or ``polaris_to_task``).
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Mapping
from typing import Any

from trl_multiagent.environments.base import (
    Environment,
    StepResult,
    chat_with_examples,
    merge_weights,
    revise_last_message,
)
from trl_multiagent.environments.checks import need_bool, need_int, need_tasks, need_weights, sandbox_settings
from trl_multiagent.environments.coder_tester import masked_convex_combination
from trl_multiagent.environments.coding import extract_code
from trl_multiagent.environments.math_problems import (
    HELD_OUT_SETS,
    TRAINING_SPLITS,
    generalisation_problems,
    gsm8k_to_task,
    polaris_to_task,
    word_problems,
)
from trl_multiagent.environments.math_prompts import (
    EACH_OPERATION_EXAMPLES,
    EASY_EXAMPLES,
    EASY_REASONER_PROMPT,
    EASY_REASONER_SYSTEM,
    EASY_TOOL_PROMPT,
    EASY_TOOL_SYSTEM,
    REASONER_PROMPT,
    REASONER_REVISION,
    TOOL_PROMPT,
    TOOL_REVISION,
)
from trl_multiagent.generation.requests import Prompt
from trl_multiagent.metrics.answers import answers_match, final_answer, last_boxed
from trl_multiagent.sandbox import SandboxConfig, run_python

#: Default weights of the reasoner's local reward components (see the module docstring).
REASONER_WEIGHTS: dict[str, float] = {"format": 0.2, "correct": 0.8}
#: Default weights of the tool agent's local reward components (see the module docstring).
TOOL_WEIGHTS: dict[str, float] = {"executes": 0.2, "correct": 0.8}

# ``trl_multiagent.environments.math_tool:gsm8k_to_task`` (and ``:polaris_to_task``), the ``dataset_transform`` of
# recipes written before the problems moved to ``math_problems``, still resolves.
__all__ = ["REASONER_WEIGHTS", "TOOL_WEIGHTS", "MathToolEnv", "MathToolEasyEnv", "MathToolGeneralisationEnv",
           "gsm8k_to_task", "polaris_to_task"]


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
        final_answer: whose answer the team submits while the two disagree: ``"reasoner"`` (default; AT-GRPO's
            text leaves it open) or ``"tool"`` (the program's printed answer, the reasoner's while the program has
            none). A team whose final word is its weaker member's throws the stronger member's answer away.
    """

    agents = ("reasoner", "tool")
    #: The inference-time baseline of the held-out evaluation besides each agent alone (:meth:`score_alone`): one
    #: turn of the untrained bases, both agents answering once without an exchange (the team's answer by the rule
    #: above).
    episode_baselines = {"no_exchange": ("reasoner", "tool")}
    #: ``single``, the name of the reasoner-alone baseline before every agent had one, still names it.
    method_aliases = {"single": "reasoner_alone"}
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
                 max_feedback_chars: int = 1500, accept_final_number: bool | None = None,
                 final_answer: str = "reasoner"):
        self.max_turns = need_int("max_turns", max_turns, minimum=1)
        self.accept_final_number = self.accepts_final_number if accept_final_number is None else \
            need_bool("accept_final_number", accept_final_number)
        self.sandbox = sandbox_settings(sandbox, {"timeout_s": 10})
        self.reasoner_weights = merge_weights(need_weights("reasoner_weights", reasoner_weights), REASONER_WEIGHTS,
                                              "reasoner_weights")
        self.tool_weights = merge_weights(need_weights("tool_weights", tool_weights), TOOL_WEIGHTS, "tool_weights")
        self.max_answer_chars = need_int("max_answer_chars", max_answer_chars, minimum=1)
        self.max_feedback_chars = need_int("max_feedback_chars", max_feedback_chars, minimum=1)
        if final_answer not in self.agents:
            raise ValueError(f"final_answer must be one of {list(self.agents)}, got {final_answer!r}")
        self.final_answer = final_answer
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
        self.first_correct: dict[str, bool] = {}  # each agent's first answer right? (the teamwork measures)

    @classmethod
    def make_dataset(cls, num_tasks: int | None = 256, seed: int = 0, split: str = "train"):
        """Generated arithmetic word problems of the class's ``level`` (:func:`word_problems`) as a ``Dataset``."""
        from datasets import Dataset

        need_tasks(num_tasks)

        return Dataset.from_list(word_problems(num_tasks or 256, seed, split, cls.level))

    # ------------------------------------------------------------------------------------------- protocol
    def reset(self, task: Mapping[str, Any]) -> dict[str, Prompt]:
        gold = task.get("answer")  # None: a question to answer, not to score (the module docstring)
        self.question, self.gold = str(task["question"]), None if gold is None else str(gold).strip()
        self.turn, self.acted = 0, set()
        self.solution = self.reasoner_answer = self.code = self.tool_answer = None
        self.output, self.tool_ran, self.reasoner_boxed = "", False, False
        self.first_correct = {}
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
        first, second = (reasoner_correct, tool_correct) if self.final_answer == "reasoner" else \
            (tool_correct, reasoner_correct)
        has_first = (self.reasoner_answer if self.final_answer == "reasoner" else self.tool_answer) is not None
        team_correct = first if has_first else second

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
        info.update(self._teamwork({"reasoner": reasoner_correct, "tool": tool_correct}, acting))

        self.acted |= set(acting)
        if self.acted == set(self.agents):
            self.turn, self.acted = self.turn + 1, set()
        done = agreed or self.turn >= self.max_turns
        next_prompts = None if done else {a: self._prompt(a) for a in self.agents}
        if self.gold is None:  # nothing to score against: no rewards, no correctness
            info = {k: v for k, v in info.items() if not k.endswith(("_correct", "_corrected", "_misled"))}
            return StepResult(team_reward=None, next_prompts=next_prompts, done=done, local_rewards=None, info=info)
        return StepResult(team_reward=float(team_correct), next_prompts=next_prompts, done=done,
                          local_rewards=local, info=info)

    def team_answer(self) -> str | None:
        """The answer the team submits now: the agreed one when the agents agree, else the ``final_answer`` agent's
        (the other's while it has none); ``None`` before any answer."""
        first, second = (self.reasoner_answer, self.tool_answer) if self.final_answer == "reasoner" else \
            (self.tool_answer, self.reasoner_answer)
        return first if first is not None else second

    def score_alone(self, agent: str, response: str, task: Mapping[str, Any]) -> StepResult:
        """``agent``'s first-turn ``response`` on ``task`` as the team's answer (the held-out evaluation's
        ``<agent>_alone`` baselines): the reasoner's boxed answer, or the tool's program run in the sandbox and its
        last printed line; the other agent has not answered, so by the team's rule the answer is this agent's and
        ``team_correct`` (the team reward) is its correctness. The step's ``info`` is the team's, one turn in."""
        if agent not in self.agents:
            raise ValueError(f"{type(self).__name__} has the agents {list(self.agents)}, not {agent!r}")
        self.reset(task)
        return self.step({agent: response})

    def clone(self) -> MathToolEnv:
        return copy.deepcopy(self)

    # ------------------------------------------------------------------------------------------- internals
    def _teamwork(self, correct: Mapping[str, bool], acting) -> dict[str, float]:
        """What the exchange changed, for every agent: ``<agent>_corrected`` = 1 when its first answer was wrong and
        its latest one is right (it revised after seeing the other's), ``<agent>_misled`` = 1 when its first answer
        was right and its latest one is wrong. Read at the episode's last step (``final/...`` in the evaluation)."""
        for agent in acting:
            self.first_correct.setdefault(agent, bool(correct[agent]))
        out = {}
        for agent in self.agents:
            first = self.first_correct.get(agent)
            out[f"{agent}_corrected"] = float(first is False and bool(correct[agent]))
            out[f"{agent}_misled"] = float(first is True and not correct[agent])
        return out

    def _run_tool(self, response: str) -> None:
        self.code = extract_code(response)
        self.tool_answer, self.tool_ran = None, False
        try:
            ast.parse(self.code)
        except (SyntaxError, ValueError) as exc:
            self.output = f"(not run) {type(exc).__name__}: {exc}"
            return
        result = run_python(self.code, self.sandbox)
        answer = final_answer(result.stdout, printed=True)
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
        return chat_with_examples(system, [(example[0], example[reply]) for example in self.examples],
                                  f"Problem: {self.question}")

    @property
    def examples(self) -> tuple:
        """The worked examples shown as earlier chat turns: ``(request, reasoner reply, tool reply)``."""
        return EASY_EXAMPLES


class MathToolGeneralisationEnv(MathToolEasyEnv):
    """:class:`MathToolEasyEnv` whose held-out problems test generalisation
    (:func:`~trl_multiagent.environments.math_problems.generalisation_problems`): no held-out problem shares its
    operation and operands with a training problem (set ``unseen_operands``), and a second set asks a question form
    no training problem uses (set ``unseen_form``). The held-out split (``"test"``) holds both, each row naming its
    set in ``held_out_set``, and the run's summary reports them separately as well as together.

    Args:
        worked_examples: ``"add_mul"`` (default): :data:`EASY_EXAMPLES`, an addition and a product, as in
            ``math_tool_easy``; ``"each_operation"``: :data:`EACH_OPERATION_EXAMPLES`, one example per operation of
            the training forms, each on training arithmetic (``"add_mul"``'s product 3 * 4 is held-out arithmetic).
        **kwargs: the arguments of :class:`MathToolEasyEnv`.
    """

    #: ``worked_examples`` -> the examples it shows.
    WORKED_EXAMPLES = {"add_mul": EASY_EXAMPLES, "each_operation": EACH_OPERATION_EXAMPLES}

    def __init__(self, *args: Any, worked_examples: str = "add_mul", **kwargs: Any):
        super().__init__(*args, **kwargs)
        if worked_examples not in self.WORKED_EXAMPLES:
            raise ValueError(f"worked_examples must be one of {sorted(self.WORKED_EXAMPLES)}, got {worked_examples!r}")
        self.worked_examples = worked_examples

    @property
    def examples(self) -> tuple:
        return self.WORKED_EXAMPLES[self.worked_examples]

    @classmethod
    def make_dataset(cls, num_tasks: int | None = 256, seed: int = 0, split: str = "train"):
        """``split``: one of the training splits (``"train"``, ``"train_balanced"``: each operation equally often,
        ``"validation"``: for choosing a configuration), ``"test"`` (both held-out sets) or one of them
        (``"unseen_operands"``, ``"unseen_form"``); see
        :func:`~trl_multiagent.environments.math_problems.generalisation_problems`. A recipe picks the training
        split with ``dataset_split`` and the evaluated split with ``eval_dataset_split``."""
        from datasets import Dataset

        need_tasks(num_tasks)
        if split not in (*TRAINING_SPLITS, "test", *HELD_OUT_SETS):
            raise ValueError(f"split must be one of {(*TRAINING_SPLITS, 'test', *HELD_OUT_SETS)}, got {split!r}")
        return Dataset.from_list(generalisation_problems(num_tasks or 256, seed, split))
