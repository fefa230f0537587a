"""SIGINT and SIGTERM during training (issue 65, point 3; trl_multiagent/trainers/signals.py).

A real training process (the command line on the tiny A/B model, forked by tests/cli_harness.py with its own pid)
is sent the signal in the middle of a step: a small wrapper holds step 3 at its start until the test has sent the
signal and says go, so that the signal always lands while a step is in progress. The step is finished, a checkpoint
of it written, run_status.json says `interrupted` with the step and the command that resumes the run, the process
exits 130 (SIGINT) / 143 (SIGTERM) with one line on stderr, and running the command from run_status.json continues the
run to max_steps. A second signal stops the process at once; a signal before the first step is done saves nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.cli_harness import CommandRunner
from tests.test_cli import TINY_RECIPE
from trl_multiagent.trainers.outputs import check_checkpoint
from trl_multiagent.trainers.signals import resume_command

# Runs the command line, holding the step taken when global_step == PAUSE_AT_STEP at its start: it writes PAUSED and
# waits until RELEASE exists (the test sends its signal in between). Without PAUSE_AT_STEP it changes nothing.
SIGNAL_RUN = r"""
import os, sys, time
from pathlib import Path

from trl_multiagent.command.cli import run_recipe_script
from trl_multiagent.trainers.magrpo import MAGRPOTrainer

pause_at = int(os.environ.get("PAUSE_AT_STEP", "-1"))
original = MAGRPOTrainer.training_step


def training_step(self, *args, **kwargs):
    if self.state.global_step == pause_at:
        Path(os.environ["PAUSED"]).touch()
        deadline = time.monotonic() + 120
        while not Path(os.environ["RELEASE"]).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    return original(self, *args, **kwargs)


MAGRPOTrainer.training_step = training_step
sys.exit(run_recipe_script(None, "signal_run.py"))
"""


@pytest.fixture(scope="module")
def cli():
    runner = CommandRunner(timeout=300)
    yield runner
    runner.close()


def _wait_for(path: Path, started, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared:\n{started.err.read_text()[-3000:]}"
        time.sleep(0.05)


def _interrupt(cli, tmp_path, tiny_ab_model, out: Path, signals: list[int], pause_at: int, extra=()):
    """Start the run, send ``signals`` while step ``pause_at + 1`` is held, let it go on; the run's Result."""
    script = tmp_path / "signal_run.py"
    script.write_text(SIGNAL_RUN)
    paused, release = tmp_path / "paused", tmp_path / "release"
    args = ["--config", TINY_RECIPE, "--model", tiny_ab_model, "--output_dir", out, "--max_steps", "5",
            "--eval_stages", "[]", "--lr_scheduler_type", "constant", *extra]
    started = cli.start(args, script=str(script), env={"PAUSE_AT_STEP": str(pause_at), "PAUSED": str(paused),
                                                        "RELEASE": str(release)})
    _wait_for(paused, started)
    for i, sig in enumerate(signals):
        if i:  # the first signal's warning is out: its handler ran
            deadline = time.monotonic() + 60
            while "again stops at once" not in started.err.read_text():
                assert time.monotonic() < deadline, started.err.read_text()[-3000:]
                time.sleep(0.05)
        os.kill(started.pid, sig)
    release.touch()
    return started.wait()


def _one_line(result, prog: str = "signal_run.py") -> str:
    assert "Traceback" not in result.output, result.output[-3000:]
    assert not [line for line in result.stderr.splitlines() if "error:" in line], result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith(f"{prog}: interrupted: ")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def _steps(out: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_step_saves_that_step_and_the_run_resumes_from_it(cli, tiny_ab_model, tmp_path, sig):
    out = tmp_path / "run"
    result = _interrupt(cli, tmp_path, tiny_ab_model, out, [sig], pause_at=2)
    name = signal.Signals(sig).name
    assert result.returncode == 128 + sig, (result.returncode, result.output[-3000:])
    line = _one_line(result)
    assert line.startswith(f"signal_run.py: interrupted: {name} at step 3 of 5: stopped after the step in progress and "
                           "saved checkpoint-3; resume with: python signal_run.py --config "), line
    assert line.endswith(" --resume_from_checkpoint true"), line
    assert f"{name}: finishing step 3, then saving a checkpoint of it and stopping" in result.stderr

    status = json.loads((out / "run_status.json").read_text())
    assert status["status"] == "interrupted" and status["signal"] == name and status["step"] == 3
    assert status["checkpoint"] == str(out / "checkpoint-3") and status["message"] in line
    assert status["resume"] in line
    # the step in progress was finished and logged, and saved whole; nothing of the end of a run was written
    assert _steps(out) == [1, 2, 3]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3"]
    assert json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())["global_step"] == 3
    check_checkpoint(str(out / "checkpoint-3"), out, ["agent1", "agent2"])
    for policy in ("agent1", "agent2"):
        weights = load_file(str(out / "checkpoint-3" / "adapters" / policy / "adapter_model.safetensors"))
        assert all(torch.isfinite(t).all() for t in weights.values())
    assert not (out / "adapters").exists() and not (out / "summary.json").exists()

    # the command in run_status.json continues the run to max_steps
    command = shlex.split(status["resume"])
    assert command[:2] == ["python", "signal_run.py"] and command[-2:] == ["--resume_from_checkpoint", "true"]
    resumed = cli(command[2:], script=str(tmp_path / "signal_run.py"))
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert f"resuming from {out / 'checkpoint-3'}" in resumed.stderr
    assert _steps(out) == [1, 2, 3, 4, 5]
    assert json.loads((out / "summary.json").read_text())["global_step"] == 5
    assert json.loads((out / "run_status.json").read_text())["status"] == "finished"


def test_a_second_signal_stops_at_once(cli, tiny_ab_model, tmp_path):
    """SIGTERM, then SIGINT while the step is still held: the process ends at once (the step's work is lost, no
    checkpoint of it), with the exit code of the second signal and run_status.json saying so."""
    out = tmp_path / "run"
    result = _interrupt(cli, tmp_path, tiny_ab_model, out, [signal.SIGTERM, signal.SIGINT], pause_at=2,
                        extra=["--save_strategy", "steps", "--save_steps", "2"])
    assert result.returncode == 128 + signal.SIGINT, (result.returncode, result.output[-3000:])
    assert "Traceback" not in result.output, result.output[-3000:]
    assert "a second SIGINT stopped the run at once after step 2" in result.stderr
    status = json.loads((out / "run_status.json").read_text())
    assert status["status"] == "interrupted" and status["step"] == 2 and status["signal"] == "SIGINT"
    assert status["checkpoint"] == str(out / "checkpoint-2")  # the last complete one, from save_steps
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]


@pytest.mark.parametrize("pause_at,extra,reason", [
    (0, [], "the signal came before the first step was done"),
    (2, ["--save_on_signal", "false"], "save_on_signal is false"),
], ids=["before-the-first-step", "save_on_signal-false"])
def test_a_signal_that_saves_nothing_says_so(cli, tiny_ab_model, tmp_path, pause_at, extra, reason):
    out = tmp_path / "run"
    result = _interrupt(cli, tmp_path, tiny_ab_model, out, [signal.SIGTERM], pause_at=pause_at, extra=extra)
    assert result.returncode == 143, (result.returncode, result.output[-3000:])
    line = _one_line(result)
    assert f"SIGTERM at step {pause_at + 1} of 5: stopped after the step in progress; no checkpoint of it was saved " \
           f"({reason}); there is no checkpoint to resume from: start the run again" in line, line
    status = json.loads((out / "run_status.json").read_text())
    assert status["status"] == "interrupted" and status["checkpoint"] is None and status["resume"] is None
    assert not list(out.glob("checkpoint-*"))


def test_the_resume_command_replaces_a_resume_argument():
    class Trainer:
        launch_command = "python -m trl_multiagent train --config r.yaml --resume_from_checkpoint out/checkpoint-2 " \
                         "--max_steps 9"

    assert resume_command(Trainer()) == \
        "python -m trl_multiagent train --config r.yaml --max_steps 9 --resume_from_checkpoint true"
    Trainer.launch_command = "python recipes/magrpo.py --resume_from_checkpoint=last"
    assert resume_command(Trainer()) == "python recipes/magrpo.py --resume_from_checkpoint true"
    assert "resume_from_checkpoint=True" in resume_command(object())  # in Python, no command line
