"""Evaluation of debating teams (MAPoRL Sec. 4.1, 4.3, Remark 2): per-turn majority vote, transitions, agents alone.

* **majority accuracy per turn**: the majority vote over the agents' answers at that turn, a tie scored by the
  expected accuracy of a uniform pick among the tied answers (Sec. 4.1); the last turn's value is the team's final
  accuracy. A debate that stopped early (all agents agreed) keeps its agreed answers for the later turns.
* **transitions per turn**: the fractions of answers going right -> right, right -> wrong, wrong -> right and
  wrong -> wrong from turn t to t+1, and the Table 3-4 triples with the other agents' majority at t (Sec. 4.3).
* **each agent alone**: every agent's accuracy at turn 1, where it answers the question alone (Remark 2), and its
  accuracy at every later turn.

All come from :class:`~trl_multiagent.rollout.debate.DebateSampler` debates on held-out tasks and the pure functions
of :mod:`trl_multiagent.credit.maporl`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from transformers import GenerationConfig

from .agents import AgentPool
from .credit.maporl import fill_after_early_stop, majority_vote_accuracy, transition_fractions
from .environments.debate import DebateEnv
from .rollout.debate import Debate, DebateSampler


def debate_metrics(debates: Sequence[Debate], num_turns: int) -> dict[str, Any]:
    """Per-turn majority accuracy, transitions, per-agent accuracy and agreement of finished debates."""
    if not debates or not all(d.outcomes for d in debates):
        raise ValueError("debate_metrics needs debates played in a DebateEnv (their answers and correctness)")
    agents = debates[0].agents
    n = len(agents)
    correct = [fill_after_early_stop([[o.correct[i] for o in d.outcomes] for i in range(n)], num_turns)
               for d in debates]
    groups = [fill_after_early_stop([[o.groups[i] for o in d.outcomes] for i in range(n)], num_turns)
              for d in debates]
    majority = [[majority_vote_accuracy([g[i][t] for i in range(n)], [c[i][t] for i in range(n)])
                 for t in range(num_turns)] for c, g in zip(correct, groups)]
    out: dict[str, Any] = {
        "num_debates": len(debates),
        "majority_accuracy": [_mean(m[t] for m in majority) for t in range(num_turns)],
        "agent_accuracy": {a: [_mean(float(c[i][t]) for c in correct) for t in range(num_turns)]
                           for i, a in enumerate(agents)},
        "transitions": transition_fractions(correct, groups),
        "turns_played": _mean(d.turns_played for d in debates),
        "agreed": _mean(float(g[0][-1] is not None and len({row[-1] for row in g}) == 1) for g in groups),
        "answered": [_mean(float(g[i][t] is not None) for g in groups for i in range(n)) for t in range(num_turns)],
    }
    out["final_majority_accuracy"] = out["majority_accuracy"][-1]
    out["agent_alone_accuracy"] = {a: acc[0] for a, acc in out["agent_accuracy"].items()}
    return out


def evaluate_debate(pool: AgentPool, env_factory: Callable[[], DebateEnv], tasks: Sequence[Mapping[str, Any]],
                    num_turns: int, max_new_tokens: int, temperature: float = 0.7, top_p: float = 1.0,
                    num_debates: int = 1) -> dict[str, Any]:
    """Debate every task ``num_debates`` times with the team's current adapters (sampling at ``temperature``, as the
    paper evaluates) and return :func:`debate_metrics` plus the wall time."""
    if not isinstance(env_factory(), DebateEnv):
        raise ValueError("evaluate_debate needs a DebateEnv factory (MathDebateEnv, NLIDebateEnv, ...)")
    start = time.perf_counter()
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                              temperature=temperature if temperature > 0 else None, top_p=top_p)
    debates = DebateSampler(num_turns=num_turns, num_debates=num_debates).run(pool, env_factory, tasks, config)
    metrics = debate_metrics(debates, num_turns)
    metrics["num_tasks"] = len(tasks)
    metrics["wall_time_s"] = time.perf_counter() - start
    return metrics


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else math.nan
