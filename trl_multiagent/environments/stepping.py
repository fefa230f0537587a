"""Stepping environments from a thread pool: the one helper the samplers and the evaluators share.

An environment whose ``step`` waits on subprocesses (sandboxed tests, tools) sets ``concurrent_steps = True``; its
steps then run from a thread pool with one worker per CPU core, every other environment's in order in the calling
thread. Results always come back in the order of the jobs; the first exception in that order is raised once every
started call has ended (``ThreadPoolExecutor.map`` inside its ``with``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .base import Environment, StepResult

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


def step_all(envs: Sequence[Environment], actions: Sequence[Mapping[str, str]]) -> list[StepResult]:
    """Step every environment with its joint action (:func:`map_steps`; concurrent when the environments set
    ``concurrent_steps``)."""
    pairs = list(zip(envs, actions))
    return map_steps(lambda pair: pair[0].step(pair[1]), pairs, envs[0] if envs else None)
