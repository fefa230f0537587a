"""Calling environments: the one way the samplers and the evaluators reset and step them.

:func:`reset_env` and :func:`step_env` call the environment (user code: its methods, the reward functions and tools
they call) and turn any exception into one :class:`~trl_multiagent.errors.UserCodeError` that names the task, the
turn, each acting agent with the start of its text, and the user's own frame. A step whose team or local reward is
not a finite number is such an error too (:func:`check_finite_rewards`).

An environment whose ``step`` waits on subprocesses (sandboxed tests, tools) sets ``concurrent_steps = True``; its
steps then run from a thread pool with one worker per CPU core, every other environment's in order in the calling
thread. Results always come back in the order of the jobs; the first exception in that order is raised once every
started call has ended (``ThreadPoolExecutor.map`` inside its ``with``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from trl_multiagent.environments.base import Environment, StepResult
from trl_multiagent.errors import UserCodeError, user_code_error
from trl_multiagent.generation.requests import Prompt

T = TypeVar("T")


def thread_map(fn: Callable[[T], Any], jobs: Iterable[T]) -> list:
    """``[fn(job) for job in jobs]`` from a thread pool with one worker per CPU core (in job order)."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as executor:
        return list(executor.map(fn, jobs))


def map_steps(fn: Callable[[T], Any], jobs: Sequence[T], env: Environment | None) -> list:
    """``fn`` over ``jobs``, each one step of an environment like ``env``: from a thread pool (:func:`thread_map`)
    when there are several jobs and ``env`` sets ``concurrent_steps``; otherwise one after another, in this thread."""
    if len(jobs) > 1 and getattr(env, "concurrent_steps", False):
        return thread_map(fn, jobs)
    return [fn(job) for job in jobs]


def reset_env(env: Environment, task: Mapping[str, Any]) -> dict[str, Prompt]:
    """``env.reset(task)``; an exception becomes a :class:`~trl_multiagent.errors.UserCodeError` naming the task."""
    try:
        return env.reset(task)
    except UserCodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - user code may raise anything; reported with where it happened
        raise user_code_error(exc, f"{type(env).__name__}.reset", task=task) from exc


def step_env(env: Environment, joint_action: Mapping[str, str], task: Mapping[str, Any] | None = None,
             turn: int | None = None) -> StepResult:
    """``env.step(joint_action)``; an exception becomes a :class:`~trl_multiagent.errors.UserCodeError` naming the
    task, the turn and each acting agent with the start of its text."""
    try:
        result = env.step(joint_action)
        check_finite_rewards(result)
    except UserCodeError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise user_code_error(exc, f"{type(env).__name__}.step", task=task, turn=turn,
                              joint_action=joint_action) from exc
    return result


def check_finite_rewards(result: StepResult) -> None:
    """A ``ValueError`` when a step's team reward or a local reward is not a finite number: a NaN that reached the
    advantages would reach every adapter (an environment that means "no reward" says so itself, e.g. with 0)."""
    rewards = {"team reward": result.team_reward, **{f"local reward of {a!r}": r
                                                     for a, r in (result.local_rewards or {}).items()}}
    for what, value in rewards.items():
        try:
            finite = math.isfinite(value)
        except TypeError:
            raise ValueError(f"step returned a {what} of {value!r}, not a number") from None
        if not finite:
            raise ValueError(f"step returned a non-finite {what} ({value}); a NaN or infinite reward would reach the "
                             "adapters")


def step_all(envs: Sequence[Environment], actions: Sequence[Mapping[str, str]],
             tasks: Sequence[Mapping[str, Any] | None] | None = None,
             turns: Sequence[int | None] | None = None) -> list[StepResult]:
    """:func:`step_env` on every environment with its joint action (and, for error messages, its task and turn);
    concurrent when the environments set ``concurrent_steps`` (:func:`map_steps`)."""
    tasks = list(tasks) if tasks is not None else [None] * len(envs)
    turns = list(turns) if turns is not None else [None] * len(envs)
    jobs = list(zip(envs, actions, tasks, turns))
    return map_steps(lambda job: step_env(*job), jobs, envs[0] if envs else None)
