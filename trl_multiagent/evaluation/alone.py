"""Every agent alone: the untrained base of one agent answering a held-out task by itself, as a baseline of every
environment that can score one agent's answer (issue 60).

A team is worth training only if it beats what each of its members does alone. The math team's tool agent, for
instance, is right more often alone than the reasoner is; a comparison that never plays it alone can call a team
"better than the best baseline" while it is worse than its own tool. So an environment says how to score one agent
alone, and the evaluations (:class:`~trl_multiagent.evaluation.episodes.EpisodeEvaluator`,
:class:`~trl_multiagent.evaluation.debate.DebateEvaluator`) derive one baseline per agent from it.

**The protocol** (duck-typed: nothing to inherit; an environment without it simply has no ``<agent>_alone``):

* ``score_alone(agent, response, task) -> StepResult | float``: reset the environment to ``task`` and score
  ``response``, written by ``agent`` alone, exactly as the team's answer would be scored, i.e. as if it were the
  team's answer. A :class:`~trl_multiagent.environments.base.StepResult` gives the team reward and the ``info``
  values of a one-step team episode (so the baseline has the team's metrics, ``final/<key>`` included); a number is
  the team reward alone.
* ``alone_agents`` (optional): the agents ``score_alone`` accepts; default every agent of the environment.
* ``alone_multi_turn`` (optional): the agents that can also play a whole episode alone, because the environment
  accepts their partial actions and advances its turn on them (a game's plan agent re-planning from the state its
  own last answer left). Each gets a second method, ``<agent>_alone_turns``, when the evaluation has more than one
  turn.

**The methods**, baselines like the others (the bases with the adapters off, before training only):

* ``<agent>_alone``: one turn; the agent's first prompt of the team's episode (its own role's prompt, from
  ``reset``), one response per sample, scored by ``score_alone``. Its request is the team's first-turn request with
  the adapters off, so before training (adapters that compute nothing) it shares the team's draws and costs no
  generation (:func:`~trl_multiagent.evaluation.core.run_programs`);
* ``<agent>_alone_turns``: the evaluation's turn budget with only that agent acting
  (:func:`~trl_multiagent.evaluation.episodes.play_episodes` with ``acting=(agent,)``).

In a recipe, ``eval_methods`` may name each method, or :data:`ALL_ALONE` (``alone``) for all of them (the default
list has it, so every environment that scores its agents alone gets them without asking).

**Trained, alone**: every alone method has a twin with the agent's adapter on, ``<agent>_alone_trained`` (and
``<agent>_alone_turns_trained``): the agent as the team's training left it, answering by itself
(:func:`adapters_on`; ``python -m trl_multiagent evaluate`` plays them on a saved team, after training, next to the
untrained ones). Did training make each member better on its own, or only the exchange?
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from numbers import Real
from typing import Any

from trl_multiagent.environments.base import Environment, StepResult
from trl_multiagent.errors import UserCodeError, user_code_error

#: ``eval_methods`` entry that stands for every ``<agent>_alone`` (and ``<agent>_alone_turns``) method.
ALL_ALONE = "alone"
#: ``methods`` entry that stands for every trained twin (``<agent>_alone_trained``, ...).
ALL_ALONE_TRAINED = "alone_trained"
ALONE_SUFFIX = "_alone"
TURNS_SUFFIX = "_alone_turns"
TRAINED_SUFFIX = "_trained"


def trained_method(method: str) -> str:
    """The trained twin of an alone method: ``tool_alone`` -> ``tool_alone_trained``."""
    return f"{method}{TRAINED_SUFFIX}"


def adapters_on(program: Generator) -> Generator:
    """``program`` (an evaluation program, see :mod:`.core`) with every generation request's adapter on: a baseline
    of the bases (``use_adapter=False``) played by the trained policies instead, everything else unchanged."""
    from dataclasses import replace

    try:
        requests = program.send(None)
        while True:
            generations = yield [replace(r, use_adapter=True) for r in requests]
            requests = program.send(generations)
    except StopIteration as stop:
        return stop.value


def alone_method(agent: str, multi_turn: bool = False) -> str:
    """The method name of ``agent`` alone: ``<agent>_alone`` (one turn) or ``<agent>_alone_turns``."""
    return f"{agent}{TURNS_SUFFIX if multi_turn else ALONE_SUFFIX}"


def alone_agents(env: Environment) -> tuple[str, ...]:
    """The agents ``env`` can score alone (see the module docstring); empty without ``score_alone``."""
    if not callable(getattr(env, "score_alone", None)):
        return ()
    agents = tuple(env.agents)
    named = getattr(env, "alone_agents", None)
    chosen = agents if named is None else tuple(named)
    unknown = [a for a in chosen if a not in agents]
    if unknown:
        raise ValueError(f"{type(env).__name__}.alone_agents names {unknown}, not agents of {list(agents)}")
    return chosen


def alone_methods(env: Environment, num_turns: int = 1) -> dict[str, tuple[str, int]]:
    """Every alone method of ``env`` in an evaluation of ``num_turns`` turns: name -> (agent, turns)."""
    methods = {alone_method(a): (a, 1) for a in alone_agents(env)}
    multi = tuple(getattr(env, "alone_multi_turn", None) or ())
    unknown = [a for a in multi if a not in env.agents]
    if unknown:
        raise ValueError(f"{type(env).__name__}.alone_multi_turn names {unknown}, not agents of {list(env.agents)}")
    if multi and not getattr(env, "supports_partial_actions", False):
        raise ValueError(f"{type(env).__name__}.alone_multi_turn needs supports_partial_actions (one agent acting "
                         "alone is a partial joint action)")
    if num_turns > 1:
        methods.update({alone_method(a, True): (a, num_turns) for a in multi})
    return methods


def as_step_result(value: Any, env: Environment) -> StepResult:
    """What ``score_alone`` returned, as a one-step result (a number is the team reward)."""
    if isinstance(value, StepResult):
        return value
    if isinstance(value, Real) and not isinstance(value, bool):
        return StepResult(team_reward=float(value), done=True)
    raise TypeError(f"{type(env).__name__}.score_alone must return a StepResult or a number, got "
                    f"{type(value).__name__}")


def score_alone(env: Environment, agent: str, response: str, task: Mapping[str, Any]) -> StepResult:
    """``env.score_alone(agent, response, task)`` as a :class:`StepResult`; an exception of the environment's code
    becomes one :class:`~trl_multiagent.errors.UserCodeError` naming the task and the agent's text."""
    try:
        value = env.score_alone(agent, response, task)
    except UserCodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - user code may raise anything; reported with where it happened
        raise user_code_error(exc, f"{type(env).__name__}.score_alone", task=task,
                              joint_action={agent: response}) from exc
    return as_step_result(value, env)

