"""A run that ends on an error leaves a clear trail (issue 39, points 3 and 4).

- The last inputs that got past the checks (a negative ``max_steps``, an empty ``output_dir``, an ``output_dir`` where
  no directory can be made) end in one error line naming the field, before any model loads.
- An exception raised by user code (here a reward function that reads an integer from a reply with none) is ONE
  error that names the environment method, the task id, the turn, the agent with the start of its text and the
  user's own frame (file, line, function, source); the run's ``run_status.json`` says ``failed`` with that error.
- A status that says ``running`` for a process that is gone is recognised as stale: the refusal says so, its advice
  matches what the folder holds (resume only when there is a checkpoint), and a run allowed in replaces it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_harness import CommandRunner
from tests.test_cli import TINY_RECIPE, assert_clean_error
from trl_multiagent.environments import FunctionEnvironment
from trl_multiagent.environments.stepping import reset_env, step_all, step_env
from trl_multiagent.errors import UserCodeError
from trl_multiagent.trainers.outputs import check_output_dir, marked_running, read_run_status, run_is_stale


@pytest.fixture(scope="module")
def cli():
    runner = CommandRunner()
    yield runner
    runner.close()


@pytest.fixture
def base(tiny_ab_model, tmp_path):
    return ["train", "--config", TINY_RECIPE, "--model", tiny_ab_model, "--output_dir", str(tmp_path / "run")]


# ------------------------------------------------------------------------------------------------ bad inputs
@pytest.mark.parametrize("args,needles", [
    (["--max_steps", "-5"], ["max_steps", "-5", "-1 (no step limit"]),
    (["--max_steps", "-1", "--num_train_epochs", "0"], ["num_train_epochs", "got 0"]),
    (["--output_dir", ""], ["output_dir", "empty"]),
    (["--output_dir", "/proc/trl-multiagent-no-such/run"], ["output_dir", "/proc/trl-multiagent-no-such/run",
                                                             "cannot be made"]),
    (["--save_steps", "-3"], ["save_steps", "-3"]),
    (["--save_total_limit", "0"], ["save_total_limit", "got 0"]),
    (["--warmup_steps", "-2"], ["warmup_steps", "-2"]),
    (["--max_nonfinite_updates_in_a_row", "-1"], ["max_nonfinite_updates_in_a_row", "-1", "integer >= 0"]),
])
def test_last_bad_inputs_fail_before_the_model_loads(cli, base, args, needles):
    assert_clean_error(cli(base + args), *needles)


def test_an_output_dir_under_a_file_names_output_dir(cli, base, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("keep me")
    assert_clean_error(cli(base + ["--output_dir", blocker / "run"]), "output_dir", "cannot be made")
    assert blocker.read_text() == "keep me"


def test_the_writability_probe_leaves_nothing_behind(tmp_path):
    target = tmp_path / "a" / "b" / "c"
    check_output_dir(target, None, False)
    assert not (tmp_path / "a").exists()  # made to prove it can be, and removed again


# ------------------------------------------------------------------------------------------------ user code
READS_AN_INTEGER = '''
def prompt(task):
    return "Answer with a number: " + task["question"]


def reward(completions, task):
    reply = completions["solo"]
    return float(int(reply))  # the user's bug: a reply with no integer
'''


def _broken_env(tmp_path: Path) -> FunctionEnvironment:
    (tmp_path / "user_task.py").write_text(READS_AN_INTEGER)
    return FunctionEnvironment(["solo"], {"solo": str(tmp_path / "user_task.py") + ":prompt"},
                               str(tmp_path / "user_task.py") + ":reward", required_columns=["question"])


def test_a_raising_reward_names_task_turn_agent_text_and_the_users_frame(tmp_path):
    env = _broken_env(tmp_path)
    task = {"id": "q-17", "question": "2 + 2?"}
    reset_env(env, task)
    with pytest.raises(UserCodeError) as info:
        step_env(env, {"solo": "four, I think"}, task, turn=0)
    message = str(info.value)
    for needle in ("FunctionEnvironment.step raised ValueError", "invalid literal for int()", "task id='q-17'",
                   "turn 0", "agent 'solo' wrote 'four, I think'", "user_task.py:8 in reward",
                   "return float(int(reply))"):
        assert needle in message, (needle, message)
    assert "\n" not in message
    assert isinstance(info.value.__cause__, ValueError)  # the original, for a traceback on request


def test_a_raising_reset_and_a_threaded_step_are_reported_the_same_way(tmp_path):
    env = _broken_env(tmp_path)
    with pytest.raises(UserCodeError, match=r"FunctionEnvironment.reset raised KeyError: 'question' \(task "
                                            r"id='no-question'\)"):
        reset_env(env, {"id": "no-question"})

    class Threaded(FunctionEnvironment):
        concurrent_steps = True

    envs = [Threaded(["solo"], {"solo": lambda t: "?"}, str(tmp_path / "user_task.py") + ":reward")
            for _ in range(3)]
    tasks = [{"id": f"t{i}"} for i in range(3)]
    for env, task in zip(envs, tasks):
        reset_env(env, task)
    with pytest.raises(UserCodeError, match=r"task id='t1', turn 2, agent 'solo' wrote 'B'"):
        step_all(envs, [{"solo": "3"}, {"solo": "B"}, {"solo": "4"}], tasks, [2, 2, 2])


def test_the_status_of_a_run_that_raises_is_failed_with_the_error(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with marked_running(tmp_path / "run"):
            assert read_run_status(tmp_path / "run")["status"] == "running"
            raise RuntimeError("boom")
    status = read_run_status(tmp_path / "run")
    assert status["status"] == "failed" and status["error"] == "boom"


USER_CODE_RECIPE = """\
trainer: magrpo
environment: trl_multiagent.environments:FunctionEnvironment
env_kwargs:
  agents: [solo]
  prompt_fns: {{solo: {task_file}:prompt}}
  reward_fns: {task_file}:reward
  required_columns: [question]
agents:
  - {{name: solo}}
dataset: {data}
eval_stages: []
lora_r: 4
lora_alpha: 8
num_generations: 2
max_completion_length: 2
generation_kwargs: {{suppress_tokens: [0, 1, 2]}}
temperature: 1.0
per_device_train_batch_size: 2
max_steps: 2
logging_steps: 1
save_strategy: "no"
report_to: none
disable_tqdm: true
"""


def test_a_run_whose_reward_raises_ends_in_one_error_and_a_failed_status(cli, tiny_ab_model, tmp_path):
    (tmp_path / "user_task.py").write_text(READS_AN_INTEGER)
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps({"id": f"sum-{i}", "question": f"{i} + 1?"}) + "\n" for i in range(4)))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(USER_CODE_RECIPE.format(task_file=tmp_path / "user_task.py", data=data))
    out = tmp_path / "run"
    result = cli(["train", "--config", recipe, "--model", tiny_ab_model, "--output_dir", out])
    assert result.returncode == 1, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr[-3000:]
    for needle in ("FunctionEnvironment.step raised ValueError", "task id='sum-", "turn 0", "agent 'solo' wrote",
                   "user_task.py:8 in reward"):
        assert needle in errors[0], (needle, errors[0])
    status = json.loads((out / "run_status.json").read_text())
    assert status["status"] == "failed" and "invalid literal for int()" in status["error"]
    # the failed run is not mistaken for a live one, and the refusal says what the folder holds
    again = cli(["train", "--config", recipe, "--model", tiny_ab_model, "--output_dir", out])
    assert_clean_error(again, "a run that failed", "invalid literal", "no checkpoint-* to resume from",
                       "--overwrite_output_dir true")


# ------------------------------------------------------------------------------------------------ stale status
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _stale_run(path: Path, checkpoint: bool) -> None:
    path.mkdir(parents=True)
    (path / "run_status.json").write_text(json.dumps({"status": "running", "pid": _dead_pid(),
                                                      "host": socket.gethostname(), "time": "2026-01-01T00:00:00"}))
    (path / "metrics.jsonl").write_text("{}\n")
    if checkpoint:
        (path / "checkpoint-4").mkdir()


def test_a_stale_status_is_reported_as_such_with_advice_that_matches_the_folder(cli, base, tmp_path):
    bare = tmp_path / "crashed"
    _stale_run(bare, checkpoint=False)
    assert run_is_stale(read_run_status(bare))
    line = assert_clean_error(cli(base + ["--output_dir", bare]), "did not finish", "is gone",
                              "no checkpoint-* to resume from", "--overwrite_output_dir true")
    assert "--resume_from_checkpoint" not in line
    with_checkpoint = tmp_path / "crashed-late"
    _stale_run(with_checkpoint, checkpoint=True)
    assert_clean_error(cli(base + ["--output_dir", with_checkpoint]), "did not finish", "--resume_from_checkpoint",
                       "checkpoint-4")


def test_a_run_allowed_into_a_stale_folder_replaces_its_status(cli, base, tmp_path):
    out = tmp_path / "crashed"
    _stale_run(out, checkpoint=False)
    result = cli(base + ["--output_dir", out, "--overwrite_output_dir", "true", "--max_steps", "1",
                         "--eval_stages", "[]"])
    assert result.returncode == 0, result.output[-3000:]
    assert "did not finish" in result.stderr  # reported as stale, then replaced
    assert json.loads((out / "run_status.json").read_text())["status"] == "finished"
