"""Building blocks of the level-based joint reward of cooperative coding (aux + main), MAGRPO Appendix C and CoLLM
Appendix F.2: the static facts of an aux/main pair (:func:`analyze`), the level weights (:data:`WEIGHTS`) and the
levels' composition (:func:`level_reward`).

The task reward that recipes name is ``rewards/coding.py:cooperative_code_reward`` at the repository's top level; it
is :func:`level_reward`, which is also the default of :class:`~trl_multiagent.environments.coding.AuxMainCodingEnv`
(so an installed package without the repository scores the same). The environment runs the unit tests in the
sandbox (:func:`trl_multiagent.sandbox.run_tests`) and passes their pass rate in.

Levels are checked in order; a level is scored only when the earlier ones hold, and a failing gate ends the
evaluation ("termination" in the papers):

=============  =====================================================================  =====  ====================
level          what is checked                                                        max    gate (stops here)
=============  =====================================================================  =====  ====================
structure      the main agent defines the entry point with a ``return`` (0.5);         1.0    no entry point
               the auxiliary agent defines ``aux`` with a ``return`` (0.5)
syntax         the concatenated program (task imports + aux + main) parses (``ast``)   1.0    a syntax error
tests          fraction of unit tests passed, times 2                                 2.0    no test passes
cooperation    +0.5 when main calls ``aux``; +0.5 more when main does more than wrap   1.0    -
               it; -1.0 when main calls ``aux`` but discards its return value
=============  =====================================================================  =====  ====================

The maximum joint reward is 5.0. The papers give the levels but not their weights; these weights are this
project's choice, kept in :data:`WEIGHTS` so that a recipe can change them.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass, field

WEIGHTS: dict[str, float] = {
    "main_defined": 0.5,
    "aux_defined": 0.5,
    "syntax": 1.0,
    "tests": 2.0,
    "calls_aux": 0.5,
    "beyond_wrapper": 0.5,
    "discards_aux": -1.0,
}
MAX_REWARD = 5.0


@dataclass
class RewardBreakdown:
    """The joint reward and its levels; ``stopped_at`` names the gate that ended the evaluation, if any."""

    total: float
    levels: dict[str, float] = field(default_factory=dict)
    stopped_at: str | None = None


@dataclass
class CodeAnalysis:
    """Static facts about an aux/main pair (no code is run)."""

    main_defined: bool
    aux_defined: bool
    syntax_ok: bool
    syntax_error: str = ""
    calls_aux: bool = False
    wrapper_only: bool = False
    discards_aux: bool = False


def _find_function(tree: ast.AST, name: str) -> ast.FunctionDef | None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def _has_return(fn: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(fn))


def _parse(code: str) -> ast.Module | None:  # noqa: D401
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        return None


def _is_aux_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "aux"


def _body_without_docstring(fn: ast.FunctionDef) -> list[ast.stmt]:
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body


def analyze(aux: str, main: str, entry_point: str, imports: str = "") -> CodeAnalysis:
    """Structure, syntax and cooperation facts of an aux/main pair.

    ``wrapper_only``: the entry point's body (docstring aside) is a single ``return aux(...)``.
    ``discards_aux``: main calls ``aux`` only as bare statements, so its return value is never used.
    """
    main_tree, aux_tree = _parse(main), _parse(aux)
    main_fn = _find_function(main_tree, entry_point) if main_tree else None
    aux_fn = _find_function(aux_tree, "aux") if aux_tree else None
    combined = "\n\n".join(part for part in (imports, aux, main) if part)
    syntax_error = ""
    try:
        ast.parse(combined)
        syntax_ok = True
    except SyntaxError as exc:
        syntax_ok, syntax_error = False, f"{exc.msg} (line {exc.lineno})"
    result = CodeAnalysis(main_defined=main_fn is not None and _has_return(main_fn),
                          aux_defined=aux_fn is not None and _has_return(aux_fn),
                          syntax_ok=syntax_ok, syntax_error=syntax_error)
    if main_fn is None:
        return result
    calls = [n for n in ast.walk(main_fn) if _is_aux_call(n)]
    result.calls_aux = bool(calls)
    if calls:
        bare = {id(stmt.value) for stmt in ast.walk(main_fn) if isinstance(stmt, ast.Expr) and _is_aux_call(stmt.value)}
        result.discards_aux = all(id(c) in bare for c in calls)
        body = _body_without_docstring(main_fn)
        result.wrapper_only = len(body) == 1 and isinstance(body[0], ast.Return) and _is_aux_call(body[0].value)
    return result


def level_reward(aux: str, main: str, entry_point: str, pass_rate: float, num_tests: int,
                 imports: str = "", weights: Mapping[str, float] | None = None) -> RewardBreakdown:
    """Level-based joint reward of an aux/main pair (MAGRPO App. C "Coding Collaboration"; CoLLM App. F.2): the
    levels of the module docstring in order, each gate ending the evaluation.

    Args:
        aux, main: the two agents' code.
        entry_point: the function the main agent must define.
        pass_rate: fraction of unit tests passed by the concatenated program (from the sandbox).
        num_tests: number of unit tests (0 means the tests could not run).
        imports: the task's import lines, put before the agents' code.
        weights: overrides of :data:`WEIGHTS`.
    """
    w = {**WEIGHTS, **(weights or {})}
    facts = analyze(aux, main, entry_point, imports)
    levels = {"structure": 0.0, "syntax": 0.0, "tests": 0.0, "cooperation": 0.0}

    if not facts.main_defined:
        return RewardBreakdown(0.0, levels, stopped_at="structure")
    levels["structure"] = w["main_defined"] + (w["aux_defined"] if facts.aux_defined else 0.0)

    if not facts.syntax_ok:
        return RewardBreakdown(sum(levels.values()), levels, stopped_at="syntax")
    levels["syntax"] = w["syntax"]

    if num_tests <= 0 or pass_rate <= 0.0:
        return RewardBreakdown(sum(levels.values()), levels, stopped_at="tests")
    levels["tests"] = w["tests"] * float(pass_rate)

    if facts.calls_aux:
        coop = w["calls_aux"]
        if not facts.wrapper_only:
            coop += w["beyond_wrapper"]
        if facts.discards_aux:
            coop += w["discards_aux"]
        levels["cooperation"] = coop
    return RewardBreakdown(sum(levels.values()), levels)
