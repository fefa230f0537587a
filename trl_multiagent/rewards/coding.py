"""The level-based joint reward of cooperative coding (aux + main), MAGRPO Appendix C and CoLLM Appendix F.2.

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

from collections.abc import Mapping
from dataclasses import dataclass, field

from trl_multiagent.environments.coding import CodeAnalysis, analyze  # noqa: F401  (re-exported)

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


def cooperative_code_reward(aux: str, main: str, entry_point: str, pass_rate: float, num_tests: int,
                            imports: str = "", weights: Mapping[str, float] | None = None) -> RewardBreakdown:
    """Level-based joint reward of an aux/main pair (MAGRPO App. C "Coding Collaboration"; CoLLM App. F.2).

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
