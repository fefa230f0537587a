"""Crash and resume: a recipe run killed with SIGKILL and resumed from its last checkpoint ends exactly where an
uninterrupted run of the same seed ends; so does a run that stopped at a smaller max_steps and is continued with
`--resume_from_checkpoint true` (or `last`), which means the last complete checkpoint of output_dir.

Runs are subprocesses of `recipes/magrpo.py` on the tiny A/B model (tests/configs/tiny_matrix_game.yaml). The run to
be killed goes through a small wrapper that blocks (sleeps) at the start of step 6, i.e. after checkpoint-4 was
written and step 5 was logged but before checkpoint-6: the SIGKILL then always lands mid-run at the same point, and
metrics.jsonl holds a line (step 5) past the checkpoint that the resumed run must drop. The wrapper changes nothing
else (a sleep consumes no random numbers).

Result: the resumed run is BITWISE equal to the uninterrupted one (adapters of the final save and of checkpoint-6, and
every logged metric but the timings). What makes that hold: transformers restores the optimizer, the scheduler and
the RNG states (after fast-forwarding the dataloader, so that the RepeatSampler order is unchanged), and the trainer
seeds before creating the LoRA adapters (otherwise two runs of one seed start from different lora_A matrices).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.cli_harness import CommandRunner
from tests.test_cli import assert_clean_error
from trl_multiagent.trainers.outputs import OutputDirError, resolve_checkpoint

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "tests/configs/tiny_matrix_game.yaml"
AGENTS = ("agent1", "agent2")
TIMING_KEYS = {"step_time", "rollout_time", "train_runtime", "train_samples_per_second", "train_steps_per_second",
               "rollout_tokens_per_s"}


def _untimed(record: dict) -> dict:
    """A log record without wall-clock quantities (they differ between any two runs)."""
    return {k: v for k, v in record.items() if k not in TIMING_KEYS and not k.startswith("time/")}

# Runs recipes/magrpo.py's main, blocking at the start of the training step taken when global_step == BLOCK_AT.
BLOCKING_WRAPPER = r"""
import os, sys, time
from trl_multiagent.trainers.magrpo import MAGRPOTrainer

block_at = int(os.environ["BLOCK_AT_STEP"])
original = MAGRPOTrainer.training_step

def training_step(self, *args, **kwargs):
    if self.state.global_step == block_at:
        time.sleep(3600)  # the test kills the process here
    return original(self, *args, **kwargs)

MAGRPOTrainer.training_step = training_step
sys.path.insert(0, "recipes")
import magrpo
sys.exit(magrpo.main(sys.argv[1:]))
"""


def _env(**extra) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _recipe(args: list[str], timeout: float = 300) -> None:
    """Run recipes/magrpo.py to completion (in its own session, killed as a group if it hangs)."""
    proc = subprocess.Popen([sys.executable, "recipes/magrpo.py", *args], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        pytest.fail(f"recipe run did not finish in {timeout} s\n{stderr[-6000:]}")
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{stderr[-6000:]}"


def _records(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _step_records(out: Path) -> list[dict]:
    return [r for r in _records(out) if "loss" in r]  # without the end-of-training summary line


def _assert_same_adapters(a: Path, b: Path) -> None:
    for policy in AGENTS:
        ta = load_file(str(a / "adapters" / policy / "adapter_model.safetensors"))
        tb = load_file(str(b / "adapters" / policy / "adapter_model.safetensors"))
        assert ta.keys() == tb.keys()
        for key in ta:
            diff = (ta[key] - tb[key]).abs().max().item()
            assert torch.equal(ta[key], tb[key]), f"{policy} {key}: max |diff| = {diff}"


@pytest.mark.slow
def test_sigkill_and_resume_matches_uninterrupted_run(tiny_ab_model, tmp_path):
    common = ["--config", CONFIG, "--model", tiny_ab_model, "--max_steps", "6", "--save_strategy", "steps",
              "--save_steps", "2", "--seed", "0"]
    reference, crashed = tmp_path / "reference", tmp_path / "crashed"
    _recipe([*common, "--output_dir", str(reference)])

    # The run that crashes: blocks at the start of step 6, after checkpoint-4 and the metrics line of step 5.
    log = (tmp_path / "crashed.log").open("w")
    proc = subprocess.Popen([sys.executable, "-c", BLOCKING_WRAPPER, *common, "--output_dir", str(crashed)],
                            cwd=ROOT, env=_env(BLOCK_AT_STEP="5"), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not any(r.get("step") == 5 for r in _step_records(crashed)):
            assert proc.poll() is None, f"the run ended early ({proc.returncode}):\n" + (tmp_path / "crashed.log").read_text()[-6000:]
            assert time.monotonic() < deadline, "step 5 was never logged"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the crash: no clean-up, no final save
        proc.wait()
        log.close()
    assert proc.returncode == -signal.SIGKILL
    assert (crashed / "checkpoint-4" / "trainer_state.json").is_file()
    assert not (crashed / "checkpoint-6").exists() and not (crashed / "summary.json").exists()
    assert [r["step"] for r in _step_records(crashed)] == [1, 2, 3, 4, 5]

    _recipe([*common, "--output_dir", str(crashed), "--resume_from_checkpoint", str(crashed / "checkpoint-4")])

    # metrics.jsonl: the pre-crash line of step 5 was dropped on resume, every step appears once
    resumed = _step_records(crashed)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    summaries = [r for r in _records(crashed) if "train_runtime" in r]
    assert [r["step"] for r in summaries] == [6]  # the killed run never wrote one
    assert json.loads((crashed / "summary.json").read_text())["global_step"] == 6

    # the resumed trajectory is the uninterrupted one, bit for bit: every metric but the timings ...
    expected = _step_records(reference)
    assert len(expected) == len(resumed)
    for want, got in zip(expected, resumed):
        want, got = _untimed(want), _untimed(got)
        assert got == want, f"step {want['step']}"
    assert any(r["grad_norm"] > 0 for r in expected[4:])  # the resumed steps did update the adapters
    # ... and the adapters: the final save and checkpoint-6
    _assert_same_adapters(reference, crashed)
    _assert_same_adapters(reference / "checkpoint-6", crashed / "checkpoint-6")


@pytest.mark.slow
def test_resume_mid_rollout_reuse_keeps_the_cycle(tiny_ab_model, tmp_path):
    """num_iterations=2: each rollout feeds two optimizer steps (steps 1-2, 3-4, 5-6). The rollout buffer is not
    checkpointed, so a run resumed from checkpoint-3 (mid-cycle) must roll out again at step 4 (on the same tasks:
    the RepeatSampler hands each chunk out twice), and then keep the cycle: a fresh rollout at step 5, reused at 6.
    Steps that reuse a rollout log no rollout statistics (no "reward" key)."""
    out = tmp_path / "run"
    common = ["--config", CONFIG, "--model", tiny_ab_model, "--max_steps", "6", "--num_iterations", "2",
              "--save_strategy", "steps", "--save_steps", "3", "--seed", "0", "--output_dir", str(out)]
    _recipe(common)
    assert [("reward" in r) for r in _step_records(out)] == [True, False, True, False, True, False]

    _recipe([*common, "--resume_from_checkpoint", str(out / "checkpoint-3")])
    records = _step_records(out)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    # steps 1-3 are the first run's lines (kept); 4 re-rolls (lost buffer); 5 and 6 are in phase again
    assert [("reward" in r) for r in records] == [True, False, True, True, True, False]


# ------------------------------------------------------------------------------------------------ true / last
def _checkpoint(out: Path, step: int, complete: bool = True) -> Path:
    path = out / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if complete:
        (path / "trainer_state.json").write_text("{}")  # written last by a checkpoint's save
    return path


def test_true_and_last_mean_the_last_complete_checkpoint(tmp_path, caplog):
    out = tmp_path / "run"
    _checkpoint(out, 2)
    ten = _checkpoint(out, 10)  # by step, not by name: checkpoint-10 comes after checkpoint-9
    _checkpoint(out, 9)
    (out / "checkpoint-notes").mkdir()
    for value in ("true", "True", "TRUE", "last", "Last", " true ", True):
        assert resolve_checkpoint(value, out) == str(ten), value
    for value in (None, False, ""):
        assert resolve_checkpoint(value, out) is None
    assert resolve_checkpoint(str(out / "checkpoint-9"), out) == str(out / "checkpoint-9")  # a path stays as given
    # a later checkpoint whose save was cut short (no trainer_state.json) is passed over, with a warning
    _checkpoint(out, 12, complete=False)
    caplog.set_level(logging.WARNING, logger="trl_multiagent.trainers.outputs")
    assert resolve_checkpoint("last", out) == str(ten)
    assert "passing over checkpoint-12 (no trainer_state.json: the save was cut short); resuming from checkpoint-10" \
        in caplog.text


def test_true_without_a_checkpoint_names_the_ways_on(tmp_path):
    with pytest.raises(OutputDirError, match=r"output_dir .*missing' does not exist, so there is no checkpoint"):
        resolve_checkpoint("true", tmp_path / "missing")
    finished = tmp_path / "finished"
    finished.mkdir()
    (finished / "summary.json").write_text("{}")
    (finished / "run_status.json").write_text(json.dumps({"status": "finished"}))
    with pytest.raises(OutputDirError) as info:
        resolve_checkpoint("last", finished)
    assert str(info.value) == (
        f"resume_from_checkpoint=last (the last checkpoint of output_dir): no checkpoint-* folder in {str(finished)!r}."
        " It holds a finished run (run_status.json, summary.json), which cannot be continued without a checkpoint (a "
        "run writes them with save_strategy 'steps' and save_steps). Choose another --output_dir for a new run, or "
        "pass --overwrite_output_dir true (without --resume_from_checkpoint) to train again in this one.")
    _checkpoint(finished, 4, complete=False)
    with pytest.raises(OutputDirError, match=r"no complete checkpoint in .* \(no trainer_state.json in checkpoint-4: "
                                             r"the saves were cut short\)"):
        resolve_checkpoint("true", finished)


@pytest.fixture(scope="module")
def cli():
    runner = CommandRunner(timeout=300)
    yield runner
    runner.close()


def test_resume_last_without_a_checkpoint_is_one_error_before_any_model_loads(cli, tmp_path):
    out = tmp_path / "done"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    # a model that does not exist: the resume error comes first, so no model was looked for
    result = cli(["train", "--config", CONFIG, "--model", "tiny-model-that-does-not-exist", "--output_dir", out,
                  "--resume_from_checkpoint", "last"])
    assert_clean_error(result, "resume_from_checkpoint=last", "no checkpoint-* folder", "--output_dir",
                       "--overwrite_output_dir true")


@pytest.mark.slow
def test_resume_true_or_last_continues_a_stopped_run_to_more_steps(cli, tiny_ab_model, tmp_path):
    """A run stopped at max_steps 4 (checkpoints 2 and 4, final adapters, status finished), continued with
    --resume_from_checkpoint true (and, in a copy, last) to max_steps 6, ends with the adapters of an uninterrupted
    6-step run, bit for bit (a constant learning rate: a schedule over max_steps would differ between 4 and 6)."""
    common = ["train", "--config", CONFIG, "--model", tiny_ab_model, "--save_strategy", "steps", "--save_steps", "2",
              "--seed", "0", "--lr_scheduler_type", "constant", "--eval_stages", "[]"]

    def run(*args):
        result = cli([*common, *args])
        assert result.returncode == 0, result.output[-6000:]
        return result

    reference, stopped = tmp_path / "reference", tmp_path / "stopped"
    run("--max_steps", "6", "--output_dir", reference)
    run("--max_steps", "4", "--output_dir", stopped)
    assert json.loads((stopped / "run_status.json").read_text())["status"] == "finished"
    assert sorted(p.name for p in stopped.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    for value in ("true", "last"):
        out = tmp_path / value
        shutil.copytree(stopped, out)
        result = run("--max_steps", "6", "--output_dir", out, "--resume_from_checkpoint", value)
        assert f"resuming from {out / 'checkpoint-4'}" in result.stderr
        assert [r["step"] for r in _step_records(out)] == [1, 2, 3, 4, 5, 6]
        assert json.loads((out / "summary.json").read_text())["global_step"] == 6
        for want, got in zip(_step_records(reference), _step_records(out)):
            assert _untimed(got) == _untimed(want), f"step {want['step']}"
        _assert_same_adapters(reference, out)
        _assert_same_adapters(reference / "checkpoint-6", out / "checkpoint-6")
