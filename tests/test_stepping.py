"""Stepping environments from a thread pool (trl_multiagent/environments/stepping.py): the one helper of the MAGRPO
and CoLLM samplers and of the episode and coding evaluators. Results in job order; threads only where the
environment sets concurrent_steps (and, for thread_map, always); exceptions reach the caller."""

import threading
import time

import pytest

from trl_multiagent.environments.base import Environment, StepResult
from trl_multiagent.environments.stepping import map_steps, step_all, thread_map


class Recorder(Environment):
    """Records the thread of every step; waits ``delay[action]`` seconds, so later jobs may finish first."""

    agents = ("a",)
    max_turns = 1

    def __init__(self, concurrent, delays=None, fail_on=()):
        self.concurrent_steps = concurrent
        self.delays, self.fail_on, self.threads = delays or {}, set(fail_on), []

    def reset(self, task):
        return {"a": "go"}

    def step(self, joint_action):
        action = joint_action["a"]
        self.threads.append(threading.current_thread())
        time.sleep(self.delays.get(action, 0.0))
        if action in self.fail_on:
            raise RuntimeError(f"step {action} failed")
        return StepResult(team_reward=float(action), done=True)


def test_concurrent_environments_step_in_threads_and_keep_the_order():
    envs = [Recorder(True, delays={"0": 0.2}) for _ in range(3)]
    results = step_all(envs, [{"a": str(i)} for i in range(3)])
    assert [r.team_reward for r in results] == [0.0, 1.0, 2.0]  # job order, though job 0 finished last
    assert all(env.threads[0] is not threading.main_thread() for env in envs)


def test_other_environments_step_in_order_in_the_calling_thread():
    envs = [Recorder(False) for _ in range(3)]
    assert [r.team_reward for r in step_all(envs, [{"a": str(i)} for i in range(3)])] == [0.0, 1.0, 2.0]
    assert all(env.threads == [threading.current_thread()] for env in envs)
    one = Recorder(True)  # a single job runs in the calling thread even where steps may run concurrently
    assert step_all([one], [{"a": "5"}])[0].team_reward == 5.0 and one.threads == [threading.current_thread()]
    assert step_all([], []) == []


def test_map_steps_decides_by_the_environment_and_the_number_of_jobs():
    calls = []

    def job(x):
        calls.append((x, threading.current_thread()))
        return 10 * x

    assert map_steps(job, [1, 2], Recorder(False)) == [10, 20]
    assert [t for _, t in calls] == [threading.current_thread()] * 2
    calls.clear()
    assert map_steps(job, [1, 2], Recorder(True)) == [10, 20]
    assert all(t is not threading.main_thread() for _, t in calls)


@pytest.mark.parametrize("concurrent", [True, False])
def test_a_failing_step_raises_the_first_error_in_job_order(concurrent):
    envs = [Recorder(concurrent, fail_on={"1", "2"}) for _ in range(3)]
    with pytest.raises(RuntimeError, match="step 1 failed"):
        step_all(envs, [{"a": str(i)} for i in range(3)])
    if not concurrent:  # in order: the step after the failing one never runs
        assert envs[2].threads == []


def test_thread_map_always_uses_the_pool_and_keeps_the_order():
    threads = []

    def job(x):
        threads.append(threading.current_thread())
        time.sleep(0.1 if x == 0 else 0.0)
        return x * x

    assert thread_map(job, [0, 1, 2]) == [0, 1, 4]
    assert thread_map(job, [3]) == [9]  # one job too: the caller's choice (the sandboxed scoring of the evaluators)
    assert all(t is not threading.main_thread() for t in threads)
