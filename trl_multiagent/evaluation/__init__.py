"""One evaluation for every recipe: a team (trained, untrained, or a baseline) on held-out tasks.

* :func:`evaluate_team` (``core``) plays every requested method on the tasks, batched: each round makes ONE
  ``AgentPool.generate_many`` call for all problems x samples x methods, and returns per-task values
  (:class:`MethodResult`), so that before/after and method-vs-method comparisons are paired by task.
* Evaluators, one per family of tasks: :class:`EpisodeEvaluator` (any turn-based environment: success, return,
  final-state metrics), :class:`CodingEvaluator` (aux + main against the four MAGRPO baselines, @k metrics),
  :class:`DebateEvaluator` (MAPoRL's majority vote per turn), :class:`PipelineEvaluator` (MHGPO's accuracy, EM, F1),
  :class:`WritingEvaluator` (two writers against the four MAGRPO baselines, the writing reward and its components).
  :func:`make_evaluator` picks one for an environment.
* :mod:`.alone`: every member alone as a baseline: an environment that scores one agent's answer (``score_alone``)
  gets ``<agent>_alone`` (and ``<agent>_alone_turns``) methods in the episodes and debate evaluations.
* :mod:`.report`: ``summary.json``'s ``evaluation`` section, ``report.md`` and ``reward_curve.png``, written in one
  place. The statistics it reports (the paired bootstrap, the @k metrics, the debate metrics) are pure functions of
  :mod:`trl_multiagent.metrics`, re-exported here.

* :mod:`.labels`: how a method is named and a mean with its interval written; :mod:`.model_card`: the card
  (``README.md``) of every saved team folder, from ``summary.json``.

May import: :mod:`trl_multiagent.team`, :mod:`trl_multiagent.environments`, :mod:`trl_multiagent.credit`,
:mod:`trl_multiagent.metrics`, :mod:`trl_multiagent.generation`, :mod:`trl_multiagent.runtime`,
:mod:`trl_multiagent.errors`; never the trainers or the command.
"""

from __future__ import annotations

from collections.abc import Callable

from trl_multiagent.evaluation.alone import ALL_ALONE, alone_methods
from trl_multiagent.evaluation.coding import BASELINES, METHODS, CodingEvaluator
from trl_multiagent.evaluation.core import (
    TEAM,
    Evaluator,
    MethodOutput,
    MethodResult,
    StageResult,
    evaluate_team,
    generate,
    run_programs,
)
from trl_multiagent.evaluation.debate import DebateEvaluator, debate_metrics, evaluate_debate
from trl_multiagent.evaluation.episodes import EpisodeEvaluator, play_episodes, success_rate
from trl_multiagent.evaluation.pipeline import PipelineEvaluator
from trl_multiagent.evaluation.progress import EvalProgress
from trl_multiagent.evaluation.report import evaluation_section, summarize, write_report, write_run_outputs
from trl_multiagent.evaluation.writing import WritingEvaluator
from trl_multiagent.metrics.at_k import KS, at_k_metrics, expected_max_at_k, pass_at_k
from trl_multiagent.metrics.stats import bootstrap_interval, paired_bootstrap
from trl_multiagent.runtime.user_code import import_object

#: ``evaluator:`` names of a recipe (``auto`` picks by environment, ``none`` evaluates nothing).
EVALUATORS: dict[str, type[Evaluator]] = {
    "episodes": EpisodeEvaluator,
    "coding": CodingEvaluator,
    "debate": DebateEvaluator,
    "pipeline": PipelineEvaluator,
    "writing": WritingEvaluator,
}


def evaluator_kind(env) -> str:
    """The evaluator ``auto`` chooses for an environment instance."""
    from trl_multiagent.environments import AuxMainCodingEnv, DebateEnv, PipelineEnvironment
    from trl_multiagent.environments.writing import ArxivExpansionEnv, TLDREnv

    if isinstance(env, PipelineEnvironment):
        return "pipeline"
    if isinstance(env, DebateEnv):
        return "debate"
    if isinstance(env, AuxMainCodingEnv):
        return "coding"
    if isinstance(env, (TLDREnv, ArxivExpansionEnv)):
        return "writing"
    return "episodes"


def make_evaluator(name: str, env_factory: Callable, num_turns: int = 1, agent_order: str = "parallel") -> Evaluator:
    """An evaluator by recipe name (``auto``, a key of :data:`EVALUATORS`, or ``"module:Class"`` of an
    :class:`Evaluator` subclass taking ``(env_factory, num_turns)``)."""
    if name == "auto":
        name = evaluator_kind(env_factory())
    if name == "episodes":
        return EpisodeEvaluator(env_factory, num_turns, agent_order)
    if name == "pipeline":
        return PipelineEvaluator(env_factory)
    if name in EVALUATORS:
        return EVALUATORS[name](env_factory, num_turns)
    cls = import_object(name, "evaluator")
    if not (isinstance(cls, type) and issubclass(cls, Evaluator)):
        raise ValueError(f"evaluator {name!r} is not an Evaluator subclass")
    return cls(env_factory, num_turns)


__all__ = [
    "ALL_ALONE", "BASELINES", "EVALUATORS", "KS", "METHODS", "TEAM", "CodingEvaluator", "DebateEvaluator", "EpisodeEvaluator",
    "EvalProgress", "Evaluator", "MethodOutput", "MethodResult", "PipelineEvaluator", "StageResult", "WritingEvaluator",
    "alone_methods", "at_k_metrics", "bootstrap_interval", "debate_metrics", "evaluate_debate", "evaluate_team", "evaluation_section",
    "evaluator_kind", "expected_max_at_k", "generate", "make_evaluator", "paired_bootstrap", "pass_at_k",
    "play_episodes", "run_programs", "success_rate", "summarize", "write_report", "write_run_outputs",
]
