"""Faults a long run meets (issue 65): non-finite updates and non-finite adapters.

- An optimizer update whose loss or gradient norm is NaN or infinite is skipped: the adapters and the optimizer's
  state stay as they were, a warning counts the skipped updates, the training logs carry ``skipped_updates``; one
  more than ``max_nonfinite_updates_in_a_row`` in a row ends the run with ONE error line (exit code 1) and a
  ``failed`` run status (trl_multiagent/trainers/update_guard.py).
- A save never writes a non-finite adapter: every tensor is checked before anything is written, and the files of the
  previous save stay byte for byte as they were (trl_multiagent/team/adapter_files.py).

NaN enters through the advantages (the credit stage's output, patched after the trainer's own), which makes the
policy loss and its gradient NaN exactly as a NaN reward would, without depending on how environments treat a NaN
reward.
"""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file
from transformers import TrainerCallback

from tests.cli_harness import CommandRunner
from tests.test_cli import TINY_RECIPE
from trl_multiagent.environments import MatrixGameEnv
from trl_multiagent.errors import NonFiniteAdapterError, NonFiniteUpdateError
from trl_multiagent.team.critics import CriticSpec
from trl_multiagent.team.pool import AgentPool, AgentSpec
from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.trainers.update_guard import NonFiniteUpdateGuard, describe_problem

NAN = float("nan")


def _trainer(model_dir, tmp_path, **kw) -> MAGRPOTrainer:
    """The matrix game on the tiny A/B model, two agents (tests/test_trainer.py's set-up)."""
    settings = dict(output_dir=str(tmp_path), report_to=[], max_completion_length=1, num_generations=4,
                    generation_kwargs={"suppress_tokens": [0, 1, 2]}, save_strategy="no", disable_tqdm=True,
                    learning_rate=1e-2, logging_steps=1)
    args = MAGRPOConfig(**{**settings, **kw})
    agents = [AgentSpec("agent1", model=model_dir, lora_r=4), AgentSpec("agent2", model=model_dir, lora_r=4)]
    return MAGRPOTrainer(agents, MatrixGameEnv, args, Dataset.from_dict({"task_id": list(range(16))}))


def _lora(pool) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in pool.named_parameters() if "lora_" in n}


class _Snapshots(TrainerCallback):
    """The LoRA weights after every optimizer step, by step."""

    def __init__(self, pool):
        self.pool, self.by_step = pool, {0: _lora(pool)}

    def on_step_end(self, args, state, control, **kwargs):
        self.by_step[state.global_step] = _lora(self.pool)


def _nan_advantages(trainer, steps, policies=None) -> None:
    """Make the advantages of the rollouts of ``steps`` (of ``policies``, default all) NaN, after the credit."""
    credit = trainer.assign_credit

    def assign_credit(experience):
        credit(experience)
        if trainer.state.global_step + 1 in steps:
            for sample in experience.samples:
                if policies is None or sample.policy in policies:
                    sample.advantage = NAN

    trainer.assign_credit = assign_credit


# ------------------------------------------------------------------------------------------------ the counts
def test_the_guard_counts_in_a_row_and_stops_one_past_the_limit():
    guard = NonFiniteUpdateGuard(limit=2)
    assert guard.observe(1, None) is None
    assert guard.observe(2, "non-finite loss (nan)") == ("step 2: non-finite loss (nan): update skipped (1 skipped so "
                                                         "far, 1 in a row; max_nonfinite_updates_in_a_row=2)")
    assert guard.observe(3, None) is None and guard.in_a_row == 0 and guard.skipped == 1  # a good update resets
    assert "(2 skipped so far, 1 in a row;" in guard.observe(4, "x")
    assert "(3 skipped so far, 2 in a row;" in guard.observe(5, "x")
    with pytest.raises(NonFiniteUpdateError, match=r"^step 6: x; 3 optimizer updates in a row \(steps 4-6\) had a "
                                                    r"non-finite loss or gradient norm, more than "
                                                    r"max_nonfinite_updates_in_a_row=2, so the run stops \(3 skipped "
                                                    r"before this one; the adapters are those of step 3"):
        guard.observe(6, "x")
    with pytest.raises(NonFiniteUpdateError, match="step 1: x; 1 optimizer updates in a row .*the initial ones"):
        NonFiniteUpdateGuard(limit=0).observe(1, "x")  # 0: the first one ends the run


def test_the_problem_names_what_was_not_finite_for_which_policy():
    assert describe_problem({"a": 1.0, "b": 2.0}, 3.0, {("policy", "a"): 0.5}, 0.5) is None
    assert describe_problem({"shared": NAN}, NAN, {("policy", "shared"): NAN}, NAN) == \
        "non-finite loss (nan) for policy 'shared'"  # its NaN gradient is said once, with the loss
    assert describe_problem({"a": 1.0, "b": math.inf}, math.inf, {("policy", "a"): NAN, ("policy", "b"): math.inf,
                                                                  ("critic", "c1"): NAN, ("critic", "c2"): NAN}, NAN) \
        == ("non-finite loss (inf) for policy 'b', non-finite gradient norm (nan) for policy 'a', non-finite gradient "
            "norm (nan) for critics 'c1', 'c2'")
    # a critic's value loss is in the total only; a norm without per-group norms (max_grad_norm 0) is the total's
    assert describe_problem({"a": 1.0}, NAN, {}, 2.0) == "non-finite loss (nan)"
    assert describe_problem({"a": 1.0}, 1.0, {}, math.inf) == "non-finite gradient norm (inf)"


# ------------------------------------------------------------------------------------------------ in a run
def test_a_nan_loss_skips_that_update_and_leaves_the_adapters_as_they_were(tiny_ab_model, tmp_path, caplog):
    """Step 2's loss is NaN for agent1 only: the whole update of step 2 is skipped (neither adapter moves, the
    optimizer's step count does not advance), steps 1 and 3 update as usual."""
    caplog.set_level(logging.WARNING, logger="trl_multiagent.trainers")
    trainer = _trainer(tiny_ab_model, tmp_path, max_steps=3)
    _nan_advantages(trainer, steps={2}, policies={"agent1"})
    snapshots = _Snapshots(trainer.pool)
    trainer.add_callback(snapshots)
    trainer.train()
    w = snapshots.by_step
    changed = lambda a, b: [n for n in a if not torch.equal(a[n], b[n])]  # noqa: E731
    assert changed(w[0], w[1]) and changed(w[2], w[3])  # steps 1 and 3 train both agents
    assert {n.split(".")[-2] for n in changed(w[0], w[1])} == {"agent1", "agent2"}
    assert not changed(w[1], w[2])  # step 2: nothing moved, agent2 (whose loss was finite) neither
    state = trainer.optimizer.state
    assert {int(state[p]["step"]) for p in trainer.pool.policy_parameters("agent2")} == {2}  # 3 steps, 1 skipped

    warnings = [r.getMessage() for r in caplog.records if "update skipped" in r.getMessage()]
    assert warnings == ["step 2: non-finite loss (nan) for policy 'agent1': update skipped (1 skipped so far, 1 in a "
                        "row; max_nonfinite_updates_in_a_row=3)"]
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = {x["step"]: x for x in lines if "loss" in x}
    assert "skipped_updates" not in steps[1]  # a run without a skipped update logs no such key
    assert steps[2]["skipped_updates"] == 1 and steps[3]["skipped_updates"] == 1
    assert steps[2]["grad_norm"] is None and steps[3]["grad_norm"] > 0  # NaN is written as null
    assert json.loads((tmp_path / "run_status.json").read_text())["status"] == "finished"


def test_the_optimizer_step_is_watched_through_torch_hooks_and_a_skipped_one_is_not_timed(tiny_ab_model, tmp_path):
    """The trainer times its optimizer steps (time/optimizer, logged with the next step) through torch's public step
    hooks, its optimizer's step left as it is (nothing replaced on the instance); the skipped update of step 2 runs
    no time. The trainer counts its rollouts' samples itself (generated_samples, what summary.json records)."""
    trainer = _trainer(tiny_ab_model, tmp_path, max_steps=3)
    _nan_advantages(trainer, steps={2})
    trainer.train()
    assert "step" not in vars(trainer.optimizer.optimizer)  # the trainer's own optimizer, in accelerate's wrapper
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = {x["step"]: x for x in lines if "loss" in x}
    assert "time/optimizer" in steps[2] and "time/optimizer" not in steps[3]  # step 2's update was skipped
    assert steps[3]["skipped_updates"] == 1
    generated = trainer.generated_samples
    assert len(generated.per_rollout) == 3 and all(n > 0 for n in generated.per_rollout)
    assert generated.completion_tokens == sum(generated.per_rollout)  # max_completion_length 1: one token each


def test_a_non_finite_adapter_at_a_checkpoint_ends_the_run_with_nothing_written(tiny_ab_model, tmp_path):
    """After step 2's update an adapter weight is infinite (as an overflowing optimizer step would leave it): the
    checkpoint of step 2 writes no adapter, the run fails with the error naming the policy and the tensor, and
    checkpoint-1 is as it was."""
    trainer = _trainer(tiny_ab_model, tmp_path, max_steps=3, save_strategy="steps", save_steps=1)

    class Overflow(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                with torch.no_grad():
                    next(p for n, p in trainer.pool.named_parameters() if "lora_B" in n and ".agent2" in n)[0, 0] = \
                        math.inf

    trainer.add_callback(Overflow())
    first = {}

    class Keep(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == 1:
                first.update({p.name: p.read_bytes() for p in (tmp_path / "checkpoint-1" / "adapters").rglob("*")
                              if p.is_file()})

    trainer.add_callback(Keep())
    with pytest.raises(NonFiniteAdapterError) as info:
        trainer.train()
    message = str(info.value)
    for needle in ("policy 'agent2'", "lora_B", "has 1 non-finite values (inf)", "nothing was written",
                   "checkpoint-2"):
        assert needle in message, (needle, message)
    assert not (tmp_path / "checkpoint-2" / "adapters").exists()
    assert not (tmp_path / "checkpoint-2" / "trainer_state.json").exists()  # incomplete: never resumed from
    assert {p.name: p.read_bytes() for p in (tmp_path / "checkpoint-1" / "adapters").rglob("*") if p.is_file()} \
        == first
    status = json.loads((tmp_path / "run_status.json").read_text())
    assert status["status"] == "failed" and "policy 'agent2'" in status["error"]


# ------------------------------------------------------------------------------------------------ saving
def test_a_non_finite_adapter_is_not_saved_and_the_previous_files_stay(tiny_ab_model, tmp_path):
    pool = AgentPool([AgentSpec("agent1", model=tiny_ab_model, lora_r=4)],
                     critics=[CriticSpec("judge", agent="agent1", lora_r=4)])
    pool.save_adapters(tmp_path)
    root = tmp_path / "adapters"
    before = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert "agent1/adapter_model.safetensors" in before and "judge/value_head.safetensors" in before
    name, weight = next((n, p) for n, p in pool.named_parameters() if "lora_B" in n and ".agent1" in n)
    with torch.no_grad():
        weight[0, 0] = NAN
        weight[1, 0] = NAN
        for p in pool.value_heads["judge"].parameters():
            p.fill_(math.inf)
    with pytest.raises(NonFiniteAdapterError) as info:
        pool.save_adapters(tmp_path)
    message = str(info.value)
    key = next(k for k in load_file(str(root / "agent1" / "adapter_model.safetensors")) if "lora_B" in k
               and k.split(".lora_B")[0] in name)
    assert message.startswith(f"policy 'agent1': tensor {key!r} (adapter_model.safetensors) has 2 non-finite values "
                              f"(nan) of {weight.numel()} (and ")
    assert "critic 'judge'" in message and "nothing was written" in message and "\n" not in message
    after = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert after == before  # byte for byte, team.json included
    # a new place gets nothing at all
    with pytest.raises(NonFiniteAdapterError):
        pool.save_adapters(tmp_path / "checkpoint-9")
    assert not (tmp_path / "checkpoint-9").exists()


# ------------------------------------------------------------------------------------------------ command line
NAN_RUN = """
import sys

from trl_multiagent.command.cli import run_recipe_script
from trl_multiagent.trainers.magrpo import MAGRPOTrainer

credit = MAGRPOTrainer.assign_credit


def assign_credit(self, experience):  # every advantage NaN from step {first} on
    credit(self, experience)
    if self.state.global_step + 1 >= {first}:
        for sample in experience.samples:
            sample.advantage = float("nan")


MAGRPOTrainer.assign_credit = assign_credit
sys.exit(run_recipe_script(None, "nan_run.py"))
"""


@pytest.fixture(scope="module")
def cli():
    runner = CommandRunner()
    yield runner
    runner.close()


def test_non_finite_updates_in_a_row_end_the_run_with_one_error(cli, tiny_ab_model, tmp_path):
    """From step 2 on every loss is NaN; with max_nonfinite_updates_in_a_row 2, steps 2 and 3 are skipped and step 4
    ends the run: one error line, exit code 1, a failed status, no final adapters; the checkpoints of the skipped
    steps hold step 1's adapters."""
    script = tmp_path / "nan_run.py"
    script.write_text(NAN_RUN.replace("{first}", "2"))
    out = tmp_path / "run"
    result = cli(["--config", TINY_RECIPE, "--model", tiny_ab_model, "--output_dir", out, "--max_steps", "6",
                  "--max_nonfinite_updates_in_a_row", "2", "--save_strategy", "steps", "--save_steps", "1",
                  "--eval_stages", "[]"], script=str(script))
    assert result.returncode == 1, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr[-3000:]
    for needle in ("nan_run.py: error: step 4: non-finite loss (nan) for policies 'agent1', 'agent2'",
                   "3 optimizer updates in a row (steps 2-4)", "max_nonfinite_updates_in_a_row=2",
                   "the adapters are those of step 1"):
        assert needle in errors[0], (needle, errors[0])
    for needle in ("step 2: non-finite loss (nan) for policies 'agent1', 'agent2': update skipped (1 skipped so far, "
                   "1 in a row", "step 3: non-finite loss (nan) for policies 'agent1', 'agent2': update skipped (2 "
                   "skipped so far, 2 in a row"):
        assert needle in result.stderr, needle
    status = json.loads((out / "run_status.json").read_text())
    assert status["status"] == "failed" and "max_nonfinite_updates_in_a_row=2" in status["error"]
    assert not (out / "adapters").exists() and not (out / "summary.json").exists()
    for policy in ("agent1", "agent2"):
        one, three = (load_file(str(out / f"checkpoint-{s}" / "adapters" / policy / "adapter_model.safetensors"))
                      for s in (1, 3))
        assert all(torch.equal(one[k], three[k]) for k in one)
