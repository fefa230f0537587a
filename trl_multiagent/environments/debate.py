"""Collaborative debate (Du et al. 2024) as MAPoRL trains it: n agents answer, then read each other and revise.

Paper: MAPoRL (Park et al., arXiv 2502.18439), Sec. 3.1 (the debate), Sec. 4.1 (datasets, majority vote), App. G.4-G.5
(prompts; their text was lost in our copy, the prompts below are this project's).

Turn 1: each agent sees only the question and answers alone. Turn t > 1: each agent sees the question, its own
previous answer and every other agent's previous answer, and writes an updated answer. Answers end with
``\\boxed{...}``. A step returns:

* ``local_rewards``: the rule verifier's score of every agent's answer, 1.0 when it matches the gold answer else 0.0
  (a learned verifier, :mod:`trl_multiagent.verifier.learned`, replaces these scores in the trainer);
* ``team_reward``: the accuracy of the majority vote over this turn's answers, ties scored by the expected accuracy
  of a uniform pick among the tied answers (Sec. 4.1, :func:`~trl_multiagent.metrics.debate.majority_vote_accuracy`);
* ``done``: after ``max_turns`` turns, or as soon as every agent gives the same answer (early stop, ``early_stop``;
  the held-out evaluation stops so, MAPoRL's training sampler switches it off: the authors train every debate to its
  last turn, ``MAPoRLConfig.train_early_stop``);
* ``info``: ``majority_accuracy``, ``agreed``, ``answered`` (fraction of agents with a boxed answer), ``accuracy``.

Alone (the held-out evaluation's ``<agent>_alone`` baselines, :meth:`DebateEnv.score_alone`): one agent's first
answer, scored as a debate's answer is (a majority vote over one answer is that answer's correctness).

:attr:`DebateEnv.outcomes` keeps, per turn played, every agent's extracted answer, its answer-group key (agents with
equal answers share a key) and its correctness; the debate sampler reads them for the incentives and the evaluation.

Tasks:

* :class:`MathDebateEnv`: arithmetic word problems with numeric answers. ``make_dataset`` reuses the generator of
  :mod:`trl_multiagent.environments.math_problems` (train and test splits disjoint by construction), and the prompts
  are in :mod:`trl_multiagent.environments.math_prompts`; answers are read with
  :func:`~trl_multiagent.metrics.answers.final_answer` and compared with Math-Verify
  (:func:`~trl_multiagent.metrics.answers.answers_match`). GSM8K rows map with
  :func:`~trl_multiagent.environments.math_problems.gsm8k_to_task`.
* :class:`NLIDebateEnv`: natural language inference (entailment / neutral / contradiction). ``make_dataset``
  generates premises from templated facts (places, counts, orderings, jobs, universal statements) with a hypothesis
  of each label; ANLI rows map with :func:`anli_to_task`. The label of an answer is read by
  :func:`~trl_multiagent.metrics.answers.parse_nli_label`.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trl_multiagent.environments.base import Environment, StepResult, chat_with_examples, revise_last_message
from trl_multiagent.environments.checks import need_bool, need_int, need_tasks
from trl_multiagent.environments.math_problems import NAMES, word_problems
from trl_multiagent.environments.math_prompts import (
    EASY_DEBATE_EXAMPLES,
    EASY_MATH_PROMPT,
    EASY_MATH_SYSTEM,
    MATH_PROMPT,
)
from trl_multiagent.generation.requests import Prompt
from trl_multiagent.metrics.answers import NLI_LABELS, answers_match, final_answer, last_boxed, parse_nli_label
from trl_multiagent.metrics.debate import majority_vote_accuracy

NLI_PROMPT = (
    "Read the premise and the hypothesis. Decide whether the premise entails the hypothesis (entailment), "
    "contradicts it (contradiction), or neither (neutral). Reason step by step, then give your final answer as "
    "\\boxed{{entailment}}, \\boxed{{neutral}} or \\boxed{{contradiction}}.\n\nPremise: {premise}\nHypothesis: "
    "{hypothesis}"
)

REVISION = """{first_prompt}

This is a debate between {num_agents} agents. The answers from the previous round were:

{answers}

Use these answers as additional information: check each one critically, keep what is right and fix what is wrong.
Then write your own updated solution step by step and end with the final answer in \\boxed{{}}."""


@dataclass
class TurnOutcome:
    """One turn of a debate: every agent's extracted answer, answer-group key and correctness (agent order)."""

    answers: list[str | None]
    groups: list[int | None]
    correct: list[bool]


class DebateEnv(Environment):
    """Base of the debate tasks: n agents, ``max_turns`` turns, early stop on agreement (see the module docstring).

    Subclasses set ``prompt_template`` (formatted with the task's ``required_columns``) and may override the answer
    extraction (:meth:`extract_answer`), the equality of two answers (:meth:`same_answer`) and the gold answer of a
    task (:meth:`gold_answer`).

    Args:
        num_agents: n, the debaters (named ``agent1`` ... ``agentN``).
        max_turns: T, the turn budget.
        early_stop: end the debate as soon as all agents give the same answer (the evaluation's debates; MAPoRL's
            training plays every turn whatever this says, unless ``MAPoRLConfig.train_early_stop``).
        max_feedback_chars: longest previous answer shown in a later turn's prompt (the tail is kept).
    """

    max_turns = 3
    required_columns: tuple[str, ...] = ()
    prompt_template: str | None = None

    def __init__(self, num_agents: int = 2, max_turns: int = 3, early_stop: bool = True,
                 max_feedback_chars: int = 1200):
        if self.prompt_template is None:
            raise TypeError(f"{type(self).__name__} has no prompt_template; use a task environment such as "
                            "MathDebateEnv or NLIDebateEnv, or subclass DebateEnv with one")
        if isinstance(num_agents, int) and not isinstance(num_agents, bool) and num_agents < 2:
            raise ValueError(f"a debate needs at least two agents, got num_agents={num_agents}")
        need_int("num_agents", num_agents, minimum=2)
        self.agents = tuple(f"agent{i + 1}" for i in range(num_agents))
        self.max_turns = need_int("max_turns", max_turns, minimum=1)
        self.early_stop = need_bool("early_stop", early_stop)
        self.max_feedback_chars = need_int("max_feedback_chars", max_feedback_chars, minimum=50)
        self.task: dict[str, Any] = {}
        self.gold = ""
        self.first: str = ""
        self.responses: list[dict[str, str]] = []
        self.outcomes: list[TurnOutcome] = []
        self._same: dict[tuple[str, str], bool] = {}

    # ------------------------------------------------------------------------------------------- task hooks
    def first_prompt(self, task: Mapping[str, Any]) -> str:
        return self.prompt_template.format(**{c: str(task[c]).strip() for c in self.required_columns})

    def opening(self) -> Prompt:
        """Every agent's first-turn prompt on the current task (a later turn revises its last message); by default
        the text of :meth:`first_prompt`."""
        return self.first

    def gold_answer(self, task: Mapping[str, Any]) -> str:
        return str(task["answer"]).strip()

    def extract_answer(self, response: str) -> str | None:
        return last_boxed(response)

    def same_answer(self, a: str, b: str) -> bool:
        return a.strip() == b.strip()

    def is_correct(self, response: str) -> bool:
        """Whether a response's extracted answer equals the current task's gold answer."""
        answer = self.extract_answer(response)
        return answer is not None and self._equal(answer, self.gold)

    @property
    def question(self) -> str:
        """The question as text (what a learned verifier reads before a solution)."""
        return self.first

    # ------------------------------------------------------------------------------------------- protocol
    def reset(self, task: Mapping[str, Any]) -> dict[str, Prompt]:
        self.task = dict(task)
        self.gold = self.gold_answer(self.task)
        self.first = self.first_prompt(self.task)
        self.responses, self.outcomes = [], []
        return dict.fromkeys(self.agents, self.opening())

    def step(self, joint_action: Mapping[str, str]) -> StepResult:
        if set(joint_action) != set(self.agents):
            raise ValueError(f"{type(self).__name__}.step needs one response per agent {list(self.agents)}, got "
                             f"{sorted(joint_action)}")
        if len(self.outcomes) >= self.max_turns:
            raise ValueError(f"the debate is over: {self.max_turns} turns were played")
        responses = {a: joint_action[a] for a in self.agents}
        answers = [self.extract_answer(responses[a]) for a in self.agents]
        groups = self._group(answers)
        correct = [a is not None and self._equal(a, self.gold) for a in answers]
        self.responses.append(responses)
        self.outcomes.append(TurnOutcome(answers, groups, correct))
        majority = majority_vote_accuracy(groups, correct)
        agreed = groups[0] is not None and len(set(groups)) == 1
        done = len(self.outcomes) >= self.max_turns or (self.early_stop and agreed)
        info = {"majority_accuracy": majority, "agreed": float(agreed), "accuracy": sum(correct) / len(correct),
                "answered": sum(a is not None for a in answers) / len(answers)}
        return StepResult(team_reward=majority, next_prompts=None if done else self._revision_prompts(), done=done,
                          local_rewards={a: float(c) for a, c in zip(self.agents, correct)}, info=info)

    def score_alone(self, agent: str, response: str, task: Mapping[str, Any]) -> StepResult:
        """``agent``'s first-turn ``response`` on ``task`` alone: the majority vote over its one answer, i.e. its
        correctness (``majority_accuracy``, the team reward), and whether it gave an answer (``answered``)."""
        if agent not in self.agents:
            raise ValueError(f"{type(self).__name__} has the agents {list(self.agents)}, not {agent!r}")
        self.reset(task)
        correct = float(self.is_correct(response))
        info = {"majority_accuracy": correct, "accuracy": correct,
                "answered": float(self.extract_answer(response) is not None)}
        return StepResult(team_reward=correct, done=True, local_rewards={agent: correct}, info=info)

    # ------------------------------------------------------------------------------------------- internals
    def _equal(self, a: str, b: str) -> bool:
        key = (a, b)
        if key not in self._same:
            self._same[key] = self._same[(b, a)] = self.same_answer(a, b)
        return self._same[key]

    def _group(self, answers: list[str | None]) -> list[int | None]:
        """Answer-group keys: agents whose answers are equal get the index of the first such answer."""
        groups: list[int | None] = []
        for i, answer in enumerate(answers):
            if answer is None:
                groups.append(None)
                continue
            groups.append(next((j for j in range(i) if answers[j] is not None and self._equal(answers[j], answer)),
                               i))
        return groups

    def _cut(self, text: str) -> str:
        limit = self.max_feedback_chars
        return text if len(text) <= limit else "...(truncated) " + text[-(limit - 16):]

    def _revision_prompts(self) -> dict[str, Prompt]:
        last = self.responses[-1]
        opening = self.opening()
        prompts = {}
        for agent in self.agents:
            parts = [f"Your previous answer:\n{self._cut(last[agent].strip())}"]
            parts += [f"Answer of {other}:\n{self._cut(last[other].strip())}" for other in self.agents if other != agent]
            prompts[agent] = revise_last_message(opening, lambda first, parts=parts: REVISION.format(
                first_prompt=first, num_agents=len(self.agents), answers="\n\n".join(parts)))
        return prompts


class MathDebateEnv(DebateEnv):
    """Debate on math problems with numeric answers (GSM8K, or generated arithmetic word problems offline).

    Columns: ``question``, ``answer`` (the gold answer). Answers are the last ``\\boxed{}`` of a response and are
    compared with Math-Verify (``0.5`` equals ``\\frac{1}{2}``, ``1,000`` equals ``1000``).
    """

    required_columns = ("question", "answer")
    prompt_template = MATH_PROMPT
    #: The :func:`~trl_multiagent.environments.math_problems.word_problems` level of :meth:`make_dataset`.
    level = "standard"
    #: Whether an answer without a box answers with its last number (``accept_final_number=None``).
    accepts_final_number = False

    def __init__(self, num_agents: int = 2, max_turns: int = 3, early_stop: bool = True,
                 max_feedback_chars: int = 1200, accept_final_number: bool | None = None):
        super().__init__(num_agents, max_turns, early_stop, max_feedback_chars)
        self.accept_final_number = self.accepts_final_number if accept_final_number is None else \
            need_bool("accept_final_number", accept_final_number)

    @classmethod
    def make_dataset(cls, num_tasks: int | None = 256, seed: int = 0, split: str = "train"):
        """Generated arithmetic word problems of the class's ``level``
        (:func:`~trl_multiagent.environments.math_problems.word_problems`)."""
        from datasets import Dataset

        need_tasks(num_tasks)

        return Dataset.from_list(word_problems(num_tasks or 256, seed, split, cls.level))

    def extract_answer(self, response: str) -> str | None:
        return final_answer(response, self.accept_final_number)

    def same_answer(self, a: str, b: str) -> bool:
        return answers_match(a, b)


class MathDebateEasyEnv(MathDebateEnv):
    """:class:`MathDebateEnv` on one-operation problems with small numbers (``word_problems(level="easy")``), with
    worked examples in the first prompt, and an answer without a box answering with its last number (issue 18: the
    closest task to MAPoRL's math debate on which the embedded 135M model can make progress).

    Args:
        examples_as_turns: show the worked examples (:data:`EASY_DEBATE_EXAMPLES`) as earlier chat turns under a
            system message of instructions, the task as ``Problem: {question}`` (default); ``False``: one format
            example inside a single user message (:data:`EASY_MATH_PROMPT`, the prompt of the first issue-18 runs).
        **kwargs: the arguments of :class:`MathDebateEnv`.
    """

    prompt_template = EASY_MATH_PROMPT
    level = "easy"
    accepts_final_number = True

    def __init__(self, *args: Any, examples_as_turns: bool = True, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.examples_as_turns = need_bool("examples_as_turns", examples_as_turns)

    def first_prompt(self, task: Mapping[str, Any]) -> str:
        if not self.examples_as_turns:
            return super().first_prompt(task)
        return f"Problem: {str(task['question']).strip()}"

    def opening(self) -> Prompt:
        if not self.examples_as_turns:
            return self.first
        return chat_with_examples(EASY_MATH_SYSTEM, EASY_DEBATE_EXAMPLES, self.first)


class NLIDebateEnv(DebateEnv):
    """Debate on natural language inference: columns ``premise``, ``hypothesis``, ``answer`` (one of
    :data:`~trl_multiagent.metrics.answers.NLI_LABELS`). The answer is the label in the last ``\\boxed{}`` (see
    :func:`~trl_multiagent.metrics.answers.parse_nli_label`)."""

    required_columns = ("premise", "hypothesis", "answer")
    prompt_template = NLI_PROMPT

    @classmethod
    def make_dataset(cls, num_tasks: int | None = 256, seed: int = 0, split: str = "train"):
        """Generated NLI problems from templated facts (:func:`nli_problems`)."""
        from datasets import Dataset

        need_tasks(num_tasks)

        return Dataset.from_list(nli_problems(num_tasks or 256, seed, split))

    def gold_answer(self, task: Mapping[str, Any]) -> str:
        gold = parse_nli_label(str(task["answer"]))
        if gold is None:
            raise ValueError(f"NLI answer must be one of {NLI_LABELS}, got {task['answer']!r}")
        return gold

    def extract_answer(self, response: str) -> str | None:
        return parse_nli_label(last_boxed(response))


# --------------------------------------------------------------------------------------------------- NLI data
CITIES = ("Lisbon", "Oslo", "Nairobi", "Lima", "Hanoi", "Quebec", "Tbilisi", "Perth", "Accra", "Bergen")
JOBS = (("baker", "bakery"), ("nurse", "hospital"), ("teacher", "school"), ("pilot", "airline"),
        ("librarian", "library"), ("chef", "restaurant"), ("mechanic", "garage"))
COUNTABLES = ("apples", "books", "stamps", "marbles", "tickets", "shells", "coins")
EVENTS = (("arrived at the party", "arrived"), ("finished the race", "finished"), ("woke up", "woke up"),
          ("left the office", "left"))
COLORS = ("red", "blue", "green", "yellow", "white", "black")
CONTAINERS = (("box", "ball"), ("drawer", "sock"), ("basket", "pear"), ("jar", "marble"))


def _nli_places(rng: random.Random, label: str):
    a, b = rng.sample(NAMES, 2)
    c1, c2, c3 = rng.sample(CITIES, 3)
    premise = f"{a} lives in {c1}. {b} lives in {c2}."
    hypothesis = {"entailment": rng.choice([f"{a} lives in {c1}.", f"{a} and {b} live in different cities."]),
                  "contradiction": rng.choice([f"{a} lives in {c3}.", f"{a} and {b} live in the same city."]),
                  "neutral": rng.choice([f"{a} was born in {c3}.", f"{b} has visited {c1}."])}[label]
    return premise, hypothesis


def _nli_counts(rng: random.Random, label: str):
    a, b = rng.sample(NAMES, 2)
    x, y = rng.sample(range(2, 20), 2)
    things, other = rng.sample(COUNTABLES, 2)
    more, fewer = (a, b) if x > y else (b, a)
    premise = f"{a} has {x} {things}. {b} has {y} {things}."
    hypothesis = {"entailment": rng.choice([f"{more} has more {things} than {fewer}.",
                                            f"{fewer} has fewer {things} than {more}.",
                                            f"Together they have {x + y} {things}."]),
                  "contradiction": rng.choice([f"{fewer} has more {things} than {more}.",
                                               f"Together they have {x + y + rng.randint(1, 5)} {things}."]),
                  "neutral": rng.choice([f"{more} has more {other} than {fewer}.",
                                         f"{a} bought the {things} last week."])}[label]
    return premise, hypothesis


def _nli_order(rng: random.Random, label: str):
    a, b, c, d = rng.sample(NAMES, 4)
    event, short = rng.choice(EVENTS)
    premise = f"{a} {event} before {b}. {b} {short} before {c}."
    hypothesis = {"entailment": f"{a} {short} before {c}.",
                  "contradiction": f"{c} {short} before {a}.",
                  "neutral": rng.choice([f"{a} {short} before {d}.", f"{d} {short} after {c}."])}[label]
    return premise, hypothesis


def _nli_jobs(rng: random.Random, label: str):
    a = rng.choice(NAMES)
    (job, place), (other_job, _) = rng.sample(JOBS, 2)
    premise = f"{a} works as a {job} at the local {place}."
    hypothesis = {"entailment": rng.choice([f"{a} has a job.", f"{a} works at a {place}."]),
                  "contradiction": rng.choice([f"{a} has never had a job.", f"{a} does not work at the {place}."]),
                  "neutral": rng.choice([f"{a} enjoys working as a {job}.", f"{a} used to be a {other_job}."])}[label]
    return premise, hypothesis


def _nli_universal(rng: random.Random, label: str):
    a = rng.choice(NAMES)
    container, item = rng.choice(CONTAINERS)
    color, other = rng.sample(COLORS, 2)
    premise = f"Every {item} in the {container} is {color}. {a} took a {item} out of the {container}."
    hypothesis = {"entailment": f"{a} took a {color} {item}.",
                  "contradiction": f"{a} took a {other} {item} out of the {container}.",
                  "neutral": rng.choice([f"{a} took two {item}s.", f"{a} likes {color} {item}s."])}[label]
    return premise, hypothesis


#: NLI templates: name -> ``fn(rng, label) -> (premise, hypothesis)``.
NLI_TEMPLATES: dict[str, Callable[[random.Random, str], tuple[str, str]]] = {
    "places": _nli_places, "counts": _nli_counts, "order": _nli_order, "jobs": _nli_jobs,
    "universal": _nli_universal,
}


def _nli_split(premise: str, hypothesis: str, test_fraction: int = 5) -> str:
    digest = hashlib.sha256(f"{premise}\n{hypothesis}".encode()).hexdigest()
    return "test" if int(digest, 16) % test_fraction == 0 else "train"


def nli_problems(num_tasks: int, seed: int = 0, split: str = "train") -> list[dict[str, str]]:
    """``num_tasks`` distinct generated NLI problems of ``split`` with labels cycling through :data:`NLI_LABELS`.

    Each split draws from its own seed stream and keeps only the pairs whose hash falls in that split, so train and
    test never share a (premise, hypothesis) pair. Rows: ``task_id``, ``premise``, ``hypothesis``, ``answer``,
    ``template``.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rng = random.Random(f"nli-problems/{split}/{seed}")
    names = sorted(NLI_TEMPLATES)
    rows: list[dict[str, str]] = []
    seen: set[tuple[str, str]] = set()
    attempts = 0
    while len(rows) < num_tasks:
        attempts += 1
        if attempts > 200 * num_tasks + 1000:
            raise RuntimeError(f"could only generate {len(rows)} distinct {split} NLI problems of {num_tasks}")
        label = NLI_LABELS[len(rows) % len(NLI_LABELS)]
        template = rng.choice(names)
        premise, hypothesis = NLI_TEMPLATES[template](rng, label)
        if (premise, hypothesis) in seen or _nli_split(premise, hypothesis) != split:
            continue
        seen.add((premise, hypothesis))
        rows.append({"task_id": f"nli/{split}/{seed}/{len(rows)}", "premise": premise, "hypothesis": hypothesis,
                     "answer": label, "template": template})
    return rows


def anli_to_task(row: Mapping[str, Any]) -> dict[str, str]:
    """An ANLI row (``facebook/anli``: ``premise``, ``hypothesis``, ``label`` 0/1/2 = entailment/neutral/
    contradiction) -> this environment's columns."""
    label = int(row["label"])
    if label not in (0, 1, 2):
        raise ValueError(f"ANLI label must be 0, 1 or 2, got {row['label']!r}")
    return {"premise": str(row["premise"]).strip(), "hypothesis": str(row["hypothesis"]).strip(),
            "answer": NLI_LABELS[label]}
