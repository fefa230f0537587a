"""Evaluation of debating teams (MAPoRL Sec. 4.1, 4.3, Remark 2): per-turn majority vote, transitions, agents alone.

* **majority accuracy per turn**: the majority vote over the agents' answers at that turn, a tie scored by the
  expected accuracy of a uniform pick among the tied answers (Sec. 4.1); the last turn's value is the team's final
  accuracy (the headline metric, ``majority_accuracy``). The evaluation's debates stop early when all agents agree
  (the environment's ``early_stop``, on by default; MAPoRL's training never stops early, as the authors train): a
  debate that stopped early keeps its agreed answers for the later turns, and ``turns_played`` reports how many were
  played.
* **transitions per turn**: the fractions of answers going right -> right, right -> wrong, wrong -> right and
  wrong -> wrong from turn t to t+1, and the Table 3-4 triples with the other agents' majority at t (Sec. 4.3).
* **each agent alone**: every agent's accuracy at turn 1, where it answers the question alone (Remark 2), and its
  accuracy at every later turn.
* **baselines** ``<agent>_alone`` (:mod:`.alone`): each agent's untrained base answering alone, its one answer
  scored by :meth:`~trl_multiagent.environments.debate.DebateEnv.score_alone` (``majority_accuracy``: its
  correctness), so that the best baseline includes the best single debater.

The debates are played by :func:`~trl_multiagent.evaluation.episodes.play_episodes` (every live debate of every
task in one generation call per turn), with sampling at the training temperature as the paper evaluates; the pure
functions are those of :mod:`trl_multiagent.credit.maporl`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trl_multiagent.credit.maporl import fill_after_early_stop
from trl_multiagent.environments.debate import DebateEnv, TurnOutcome
from trl_multiagent.evaluation.alone import alone_methods
from trl_multiagent.evaluation.core import TEAM, Evaluator, MethodOutput, Program
from trl_multiagent.evaluation.episodes import by_task, episode_texts, play_alone, play_episodes
from trl_multiagent.metrics.debate import majority_vote_accuracy, transition_fractions
from trl_multiagent.metrics.stats import mean


@dataclass
class DebateView:
    """What the debate metrics read of a played debate (a rollout's ``Debate`` has the same attributes)."""

    agents: list[str]
    outcomes: list[TurnOutcome]
    turns_played: int


def _filled(debate, num_turns: int) -> tuple[list[list[bool]], list[list]]:
    n = len(debate.agents)
    correct = fill_after_early_stop([[o.correct[i] for o in debate.outcomes] for i in range(n)], num_turns)
    groups = fill_after_early_stop([[o.groups[i] for o in debate.outcomes] for i in range(n)], num_turns)
    return correct, groups


def majority_per_turn(debate, num_turns: int) -> list[float]:
    """The majority-vote accuracy of one debate at every turn (early-stopped debates filled)."""
    correct, groups = _filled(debate, num_turns)
    n = len(debate.agents)
    return [majority_vote_accuracy([groups[i][t] for i in range(n)], [correct[i][t] for i in range(n)])
            for t in range(num_turns)]


def debate_metrics(debates: Sequence, num_turns: int) -> dict[str, Any]:
    """Per-turn majority accuracy, transitions, per-agent accuracy and agreement of finished debates."""
    if not debates or not all(d.outcomes for d in debates):
        raise ValueError("debate_metrics needs debates played in a DebateEnv (their answers and correctness)")
    agents = debates[0].agents
    n = len(agents)
    filled = [_filled(d, num_turns) for d in debates]
    correct = [c for c, _ in filled]
    groups = [g for _, g in filled]
    majority = [majority_per_turn(d, num_turns) for d in debates]
    out: dict[str, Any] = {
        "num_debates": len(debates),
        "majority_accuracy": [mean([m[t] for m in majority]) for t in range(num_turns)],
        "agent_accuracy": {a: [mean([float(c[i][t]) for c in correct]) for t in range(num_turns)]
                           for i, a in enumerate(agents)},
        "transitions": transition_fractions(correct, groups),
        "turns_played": mean([d.turns_played for d in debates]),
        "agreed": mean([float(g[0][-1] is not None and len({row[-1] for row in g}) == 1) for g in groups]),
        "answered": [mean([float(g[i][t] is not None) for g in groups for i in range(n)]) for t in range(num_turns)],
    }
    out["final_majority_accuracy"] = out["majority_accuracy"][-1]
    out["agent_alone_accuracy"] = {a: acc[0] for a, acc in out["agent_accuracy"].items()}
    return out


class DebateEvaluator(Evaluator):
    """MAPoRL's evaluation of a debating team (see the module docstring).

    Per task and debate: ``majority_accuracy`` (final turn), ``turn<t>/majority_accuracy``, ``agent/<a>/alone``
    (the agent's correctness at turn 1) and ``agreed``; the details hold :func:`debate_metrics` of all debates.
    """

    name = "debate"
    metrics_preference = ("majority_accuracy",)
    sampled = True

    def __init__(self, env_factory: Callable[[], DebateEnv], num_turns: int):
        probe = env_factory()
        if not isinstance(probe, DebateEnv):
            raise ValueError(f"the debate evaluation needs a DebateEnv (MathDebateEnv, NLIDebateEnv, ...), got "
                             f"{type(probe).__name__}")
        if num_turns < 1:
            raise ValueError(f"num_turns must be at least 1, got {num_turns}")
        self.env_factory, self.num_turns, self.num_agents = env_factory, num_turns, len(probe.agents)
        self.alone = alone_methods(probe, 1)
        self.baselines = tuple(self.alone)

    def expected_sequences(self, method: str, num_tasks: int, num_samples: int) -> int:
        if method in self.alone:
            return num_tasks * num_samples
        return num_tasks * num_samples * self.num_agents * self.num_turns

    def program(self, method: str, tasks: Sequence[Mapping[str, Any]], num_samples: int) -> Program:
        if method in self.alone:  # one debater's base, its one answer
            episodes = yield from play_alone(self.env_factory, self.alone[method][0], tasks, num_samples)
            records = [[{"majority_accuracy": float(ep.steps[0].info.get("majority_accuracy",
                                                                         ep.steps[0].team_reward)),
                         "answered": float(ep.steps[0].info.get("answered", 0.0))} for ep in eps]
                       for eps in by_task(episodes, len(tasks))]
            return MethodOutput(records, {}, episode_texts(episodes))
        if method != TEAM:
            raise ValueError(f"the debate evaluation has no method {method!r}")
        episodes = yield from play_episodes(self.env_factory, tasks, num_samples, self.num_turns)
        views = {id(ep): DebateView(list(ep.env.agents), list(ep.env.outcomes), ep.turns_played) for ep in episodes}
        records = []
        for eps in by_task(episodes, len(tasks)):
            recs = []
            for ep in eps:
                view = views[id(ep)]
                per_turn = majority_per_turn(view, self.num_turns)
                correct, groups = _filled(view, self.num_turns)
                record = {"majority_accuracy": per_turn[-1],
                          "agreed": float(groups[0][-1] is not None and len({g[-1] for g in groups}) == 1)}
                record.update({f"turn{t + 1}/majority_accuracy": v for t, v in enumerate(per_turn)})
                record.update({f"agent/{a}/alone": float(correct[i][0]) for i, a in enumerate(view.agents)})
                recs.append(record)
            records.append(recs)
        return MethodOutput(records, debate_metrics([views[id(ep)] for ep in episodes], self.num_turns),
                            episode_texts(episodes))


def evaluate_debate(pool, env_factory: Callable[[], DebateEnv], tasks: Sequence[Mapping[str, Any]],
                    num_turns: int, max_new_tokens: int, temperature: float = 0.7, top_p: float = 1.0,
                    num_debates: int = 1) -> dict[str, Any]:
    """Debate every task ``num_debates`` times with the team's current adapters (sampling at ``temperature``, as the
    paper evaluates) and return :func:`debate_metrics` plus the number of tasks and the wall time."""
    from transformers import GenerationConfig

    from trl_multiagent.evaluation.core import evaluate_team

    start = time.perf_counter()
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                              temperature=temperature if temperature > 0 else None, top_p=top_p)
    result = evaluate_team(pool, DebateEvaluator(env_factory, num_turns), tasks, num_samples=num_debates,
                           generation_config=config)
    metrics = dict(result.methods[TEAM].details)
    metrics["num_tasks"] = len(tasks)
    metrics["wall_time_s"] = time.perf_counter() - start
    return metrics
