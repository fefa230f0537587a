"""Two processes on the CPU: the recipe under `torchrun --nproc_per_node 2` (DDP over gloo) on the tiny A/B model.

(`accelerate launch --cpu` starts several CPU processes only through mpirun; torchrun needs nothing extra. On a
machine without an accelerator the config switches `use_cpu` on by itself, without which accelerate would see two
independent single-process runs.)

The recipe's `main` runs through a small wrapper that adds checks and changes nothing in the training:
* around `average_gradients_across_processes` (the trainer computes gradients inside `accelerator.no_sync` and
  averages them itself): the local gradients of the two ranks, and the averaged ones;
* after every optimizer step: every adapter tensor of both ranks, and the completions each rank sampled.
Rank 0 writes what it saw to `<output_dir>/sync.jsonl`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.numerics import check_deviation

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "tests/configs/tiny_matrix_game.yaml"
STEPS = 2
NUM_TASKS = 32  # tests/configs/tiny_matrix_game.yaml

SYNC_WRAPPER = r"""
import json, os, sys
import torch
import torch.distributed as dist
from transformers import TrainerCallback
from trl_multiagent.trainers.magrpo import MAGRPOTrainer


def flat(tensors):
    return torch.cat([t.detach().reshape(-1).float() for t in tensors])


def all_gather(x):
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x)
    return out


def record(trainer, entry):
    if dist.get_rank() == 0:
        with open(os.path.join(trainer.args.output_dir, "sync.jsonl"), "a") as fh:
            fh.write(json.dumps(entry) + "\n")


def params(trainer):
    return [p for pol in trainer.pool.policies for p in trainer.pool.policy_parameters(pol)]


original_average = MAGRPOTrainer.average_gradients_across_processes


def average(self):
    ps = params(self)
    local = all_gather(flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in ps]))
    original_average(self)
    averaged = all_gather(flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in ps]))
    expected = torch.stack(local).mean(0)
    record(self, {"kind": "grads", "step": self.state.global_step + 1,
                  "local_grads_differ": not torch.equal(local[0], local[1]),
                  "averaged_equal_across_ranks": all(torch.equal(averaged[0], a) for a in averaged),
                  "mean_deviation": ((averaged[0] - expected).norm() / expected.norm().clamp(min=1e-30)).item(),
                  "grad_abs_max": averaged[0].abs().max().item()})


MAGRPOTrainer.average_gradients_across_processes = average


class SyncCheck(TrainerCallback):
    def __init__(self, trainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):  # after the optimizer step
        t = self.trainer
        gathered = all_gather(flat(params(t)))
        samples = [s.generation.completion_ids for s in t._buffered_inputs.samples]
        all_samples = [None] * dist.get_world_size()
        dist.all_gather_object(all_samples, samples)
        lora_b = [p for pol in t.pool.policies for n, p in t.pool.base_of(pol).named_parameters()
                  if "lora_B" in n and f".{pol}." in n]
        record(t, {"kind": "params", "step": state.global_step, "world_size": dist.get_world_size(),
                   "num_processes": t.accelerator.num_processes, "wrapped": type(t.model_wrapped).__name__,
                   "params_equal": all(torch.equal(gathered[0], g) for g in gathered),
                   "max_abs_diff": max((g - gathered[0]).abs().max().item() for g in gathered),
                   "rollouts_differ": any(s != all_samples[0] for s in all_samples),
                   "lora_b_abs_max": max(p.detach().abs().max().item() for p in lora_b)})


original_init = MAGRPOTrainer.__init__


def init(self, *args, **kwargs):
    original_init(self, *args, **kwargs)
    self.add_callback(SyncCheck(self))


MAGRPOTrainer.__init__ = init
sys.path.insert(0, "recipes")
import magrpo
sys.exit(magrpo.main(sys.argv[1:]))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "ACCELERATE_USE_CPU"):
        env.pop(var, None)
    return env


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own session; on timeout kill the whole group (torchrun's workers too), then fail."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{cmd[1:4]} hung: no result in {timeout} s\n{out[-3000:]}\n{err[-8000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _step_records(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, filter(str.strip, lines)) if "loss" in r]


def _fail_message(proc) -> str:
    """The exit code, every error line of any rank (a rank that fails makes the others fail as well, and their
    tracebacks can fill the tail: the CLI's one-line errors and each rank's exception lines come first), then the
    tails of stdout and stderr."""
    errors = [line for line in (proc.stdout + proc.stderr).splitlines()
              if re.search(r": error: |^(\[rank\d+\]: )?\w+(Error|Exception)\b", line)]
    return (f"exit code {proc.returncode}\nerror lines:\n" + "\n".join(errors[-20:]) +
            f"\n--- stdout (tail)\n{proc.stdout[-3000:]}\n--- stderr (tail)\n{proc.stderr[-8000:]}")


@pytest.mark.slow
def test_two_process_run_keeps_replicas_in_sync(tiny_ab_model, tmp_path):
    common = ["--config", CONFIG, "--model", tiny_ab_model, "--max_steps", str(STEPS), "--seed", "0"]
    wrapper = tmp_path / "sync_wrapper.py"
    wrapper.write_text(SYNC_WRAPPER)
    dist_out, single_out = tmp_path / "distributed", tmp_path / "single"

    # --standalone: a free rendezvous port on localhost (no clash with other runs on the default 29500)
    proc = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                 str(wrapper), *common, "--output_dir", str(dist_out)], timeout=300)
    assert proc.returncode == 0, _fail_message(proc)

    single = _run([sys.executable, "recipes/magrpo.py", *common, "--output_dir", str(single_out)], timeout=300)
    assert single.returncode == 0, _fail_message(single)

    # metrics.jsonl: one line per step, written once (rank 0), with the same keys as a single-process run
    dist_records, single_records = _step_records(dist_out), _step_records(single_out)
    assert [r["step"] for r in dist_records] == list(range(1, STEPS + 1))
    assert [r["step"] for r in single_records] == list(range(1, STEPS + 1))
    for d, s in zip(dist_records, single_records):
        assert set(d) == set(s), set(d) ^ set(s)
        # two processes each take episodes_per_step tasks per step: the epoch advances twice as fast
        assert d["epoch"] == pytest.approx(2 * s["epoch"]) == pytest.approx(2 * d["step"] / NUM_TASKS)
    assert json.loads((dist_out / "summary.json").read_text())["global_step"] == STEPS

    entries = [json.loads(line) for line in (dist_out / "sync.jsonl").read_text().splitlines()]
    grads = [e for e in entries if e["kind"] == "grads"]
    steps = [e for e in entries if e["kind"] == "params"]
    assert [e["step"] for e in grads] == [e["step"] for e in steps] == list(range(1, STEPS + 1))
    for e in steps:
        assert e["world_size"] == e["num_processes"] == 2, e
        assert e["wrapped"] == "DistributedDataParallel", e
        assert e["params_equal"], e  # both replicas hold bitwise-identical adapters after every step
    for e in grads:
        # the all-reduce sums 2 terms per element, in another order than torch.mean (tests/numerics.py)
        assert e["averaged_equal_across_ranks"], e
        check_deviation(e["mean_deviation"], terms=2, what="all-reduced gradients vs their mean")
    # The check has teeth: the ranks sampled different completions (seeded per process) and computed different
    # local gradients, so without the averaging the replicas would have drifted apart; and the adapters moved.
    assert any(e["rollouts_differ"] for e in steps), steps
    assert any(e["local_grads_differ"] and e["grad_abs_max"] > 0 for e in grads), grads
    assert steps[-1]["lora_b_abs_max"] > 0, steps
