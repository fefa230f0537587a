"""Moved to :mod:`trl_multiagent.evaluation.debate`; this name stays importable for existing code."""

from .evaluation.debate import DebateEvaluator, debate_metrics, evaluate_debate

__all__ = ["DebateEvaluator", "debate_metrics", "evaluate_debate"]
