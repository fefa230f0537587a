"""Sharded and multi-process training on the CPU: FSDP2 over gloo, groups kept whole, checkpoints, and the accelerate
config files shipped in recipes/accelerate_configs/ (docs/guides/distributed.md says what ran where).

The two-process runs use ``recipes/magrpo.py`` on the tiny A/B model (two agents, two adapters on one base) through a
small wrapper (``SHARD_WRAPPER``) that changes nothing in the training and:

* makes sampling depend only on the request (each request's draws seeded by its agent and prompt), so that one
  process with a global batch of 2 tasks and two processes with 1 task each sample the SAME completions: their
  advantages, losses and adapter updates must then be equal (up to float summation order);
* records every rank's samples (agent, tokens, reward, advantage) after each rollout and the whole adapter tensors
  after each step (gathered from the shards under FSDP);
* with ``FORCE_CPU_FSDP=1``: lets accelerate build its FSDP2 path on the CPU. accelerate itself enables FSDP only
  on accelerators (on CPU it falls back to DDP, which the trainer refuses: ``check_parallelism``), so the wrapper
  switches accelerate's state from MULTI_CPU to FSDP with the plugin built from the shipped ``fsdp.yaml``;
  everything from ``fully_shard`` on (sharding, the rollout's gathering, clipping, saving, resuming) is the real code.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.numerics import assert_same_computation
from tests.test_distributed import _fail_message, _run, _step_records
from tests.tiny import model_terms

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "recipes" / "accelerate_configs"
CONFIG = "tests/configs/tiny_matrix_game.yaml"

SHARD_WRAPPER = r"""
import json, os, sys, zlib
import torch
import torch.distributed as dist
from transformers import TrainerCallback
from trl_multiagent.team.pool import AgentPool
from trl_multiagent.trainers import sharding
from trl_multiagent.trainers.magrpo import MAGRPOTrainer

TAG = os.environ["RECORD_TAG"]

if os.environ.get("FORCE_CPU_FSDP") == "1":
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    sharding.accelerator_available = lambda: True
    original_state_init = AcceleratorState.__init__

    def state_init(self, *args, fsdp_plugin=None, **kwargs):  # every (re)initialisation of the shared state
        original_state_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if self.distributed_type == DistributedType.MULTI_CPU:
            plugin = fsdp_plugin or getattr(self, "fsdp_plugin", None) or FullyShardedDataParallelPlugin()
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = plugin

    AcceleratorState.__init__ = state_init

original_generate = AgentPool.generate_many


def generate_many(self, requests, generation_config, *args, **kwargs):
    out = []
    for req in requests:  # each request's draws depend on the request only, not on the batch around it
        torch.manual_seed(zlib.crc32(repr((req.agent, req.prompt)).encode()))
        out += original_generate(self, [req], generation_config, *args, **kwargs)
    return out


AgentPool.generate_many = generate_many


def rank():
    return dist.get_rank() if dist.is_initialized() else 0


def gather_object(obj):
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


original_rollout = MAGRPOTrainer.rollout


def rollout(self, tasks):
    experience = original_rollout(self, tasks)
    rows = [[s.agent, s.generation.prompt_ids, s.generation.completion_ids, s.reward, s.advantage]
            for s in experience.samples]
    everything = gather_object(rows)
    if rank() == 0:
        with open(os.path.join(self.args.output_dir, f"{TAG}-samples.jsonl"), "a") as fh:
            fh.write(json.dumps({"step": self.state.global_step + 1, "ranks": everything}) + "\n")
    return experience


MAGRPOTrainer.rollout = rollout


class Record(TrainerCallback):
    def __init__(self, trainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        self.save(args, f"{TAG}-begin.pt")

    def on_step_end(self, args, state, control, **kwargs):
        self.save(args, f"{TAG}-step{state.global_step}.pt")

    def save(self, args, name):
        t = self.trainer
        adapters = {}
        for policy in t.pool.policies:
            for n, p in t.pool.base_of(policy).named_parameters():
                if f".{policy}." in n and "lora_" in n:
                    adapters[n] = sharding._full(p.detach()).clone()
        info = {"wrapped": type(t.model_wrapped).__name__, "world": t.accelerator.num_processes,
                "fsdp": sharding.is_fsdp(t.accelerator),
                "sharded": any(type(p).__name__ == "DTensor" for p in t.pool.parameters())}
        if rank() == 0:
            torch.save({"adapters": adapters, "info": info}, os.path.join(args.output_dir, name))


original_init = MAGRPOTrainer.__init__


def init(self, *args, **kwargs):
    original_init(self, *args, **kwargs)
    self.add_callback(Record(self))


MAGRPOTrainer.__init__ = init
sys.path.insert(0, "recipes")
import magrpo
sys.exit(magrpo.main(sys.argv[1:]))
"""


def fsdp_env(config: Path) -> dict[str, str]:
    """The environment ``accelerate launch --config_file <config>`` gives its processes (accelerate's own function)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(config), "--num_processes", "2", "x.py"])
    args, _, _ = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args)
    return {k: v for k, v in env.items() if k.startswith(("ACCELERATE_", "FSDP_"))}


def _launch(wrapper: Path, args: list[str], tag: str, processes: int, extra_env: dict[str, str] | None = None):
    env = {"RECORD_TAG": tag, **(extra_env or {})}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    cmd = [*(launcher if processes > 1 else [sys.executable]), str(wrapper), *args]
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # _run copies os.environ
    try:
        return _run(cmd, timeout=300)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _samples(out: Path, tag: str) -> dict[int, list]:
    """Every sample of each step, all ranks together, as a sorted list (the union does not depend on the split)."""
    by_step = {}
    for line in (out / f"{tag}-samples.jsonl").read_text().splitlines():
        entry = json.loads(line)
        by_step[entry["step"]] = sorted((json.dumps(r[:3]), r[3], r[4]) for rows in entry["ranks"] for r in rows)
    return by_step


def _adapters(out: Path, tag: str, step: int | None) -> dict:
    """The adapters (and run info) after ``step``; ``None``: before training."""
    return torch.load(out / (f"{tag}-begin.pt" if step is None else f"{tag}-step{step}.pt"), weights_only=False)


# ---------------------------------------------------------------------------------------------------- configs
@pytest.mark.parametrize("name,kind", [("ddp", "MULTI_GPU"), ("fsdp", "FSDP"), ("zero2", "DEEPSPEED"),
                                       ("zero3", "DEEPSPEED")])
def test_shipped_accelerate_configs_load(name, kind):
    """Each shipped config is a valid accelerate config of its kind (accelerate's own loader)."""
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(CONFIGS / f"{name}.yaml"))
    assert config.distributed_type == kind
    raw = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    if name == "fsdp":
        assert raw["fsdp_config"]["fsdp_version"] == 2
        assert raw["fsdp_config"]["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    if name.startswith("zero"):
        assert raw["deepspeed_config"]["zero_stage"] == int(name[-1])


@pytest.mark.parametrize("name,reason", [("zero2", "DeepSpeed"), ("zero3", "DeepSpeed"), ("fsdp", "without a GPU")])
def test_configs_refused_before_any_model_loads(name, reason, monkeypatch, tmp_path):
    """The environment `accelerate launch` sets from the shipped config reaches the config's checks: DeepSpeed is
    refused with its reason, and FSDP on this CPU-only machine (accelerate would silently run DDP)."""
    from trl_multiagent.trainers.magrpo import MAGRPOConfig

    if name == "fsdp" and torch.accelerator.is_available():
        pytest.skip("this machine has an accelerator: FSDP is allowed here")
    for key in [k for k in os.environ if k.startswith(("ACCELERATE_", "FSDP_"))]:
        monkeypatch.delenv(key)
    if name == "fsdp":
        env = fsdp_env(CONFIGS / "fsdp.yaml")
        assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    else:
        env = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": name[-1]}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=reason):
        MAGRPOConfig(output_dir=str(tmp_path), report_to="none")


def test_fsdp1_refused(monkeypatch, tmp_path):
    from trl_multiagent.trainers import sharding
    from trl_multiagent.trainers.magrpo import MAGRPOConfig

    monkeypatch.setattr(sharding, "accelerator_available", lambda: True)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(ValueError, match="FSDP version 1"):
        MAGRPOConfig(output_dir=str(tmp_path), report_to="none")


def test_shared_prompt_prefixes_are_refused_under_fsdp_and_off_by_default_there(monkeypatch, tmp_path):
    from trl_multiagent.trainers import sharding
    from trl_multiagent.trainers.magrpo import MAGRPOConfig

    monkeypatch.setattr(sharding, "accelerator_available", lambda: True)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    with pytest.raises(ValueError, match="share_prompt_prefixes: true cannot run under FSDP"):
        MAGRPOConfig(output_dir=str(tmp_path), report_to="none", share_prompt_prefixes=True)
    assert MAGRPOConfig(output_dir=str(tmp_path), report_to="none").share_prompt_prefixes is None

@pytest.mark.parametrize("module,config", [("collm", "CoLLMConfig"), ("maporl", "MAPoRLConfig")])
def test_trainers_with_critics_refuse_fsdp(module, config, monkeypatch, tmp_path):
    import importlib

    from trl_multiagent.trainers import sharding

    cls = getattr(importlib.import_module(f"trl_multiagent.trainers.{module}"), config)
    monkeypatch.setattr(sharding, "accelerator_available", lambda: True)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    with pytest.raises(ValueError, match="does not run under FSDP: its critics"):
        cls(output_dir=str(tmp_path), report_to="none")
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    cls(output_dir=str(tmp_path), report_to="none")  # the same config without FSDP is fine


# ---------------------------------------------------------------------------------------------------- runs
@pytest.mark.slow
def test_fsdp_two_processes_match_one_process_and_resume(tiny_ab_model, tmp_path):
    """Two processes under FSDP2 (gloo), 1 task each, against one process with both tasks (the same global batch):
    the same samples, the same advantages (every group scored against its whole group), the same loss, the same
    adapters after every step. Then a resume from the FSDP run's checkpoint reproduces its last step."""
    wrapper = tmp_path / "shard_wrapper.py"
    wrapper.write_text(SHARD_WRAPPER)
    steps = 2
    # max_grad_norm small enough to clip: the per-agent norm must be the norm of all shards; float64 weights: the two
    # runs sum in another order (reduce-scatter across ranks), compared with a tolerance from the summed terms
    common = ["--config", CONFIG, "--model", tiny_ab_model, "--max_steps", str(steps), "--seed", "0",
              "--max_grad_norm", "0.05", "--model_dtype", "float64"]
    env = {"FORCE_CPU_FSDP": "1", **fsdp_env(CONFIGS / "fsdp.yaml")}
    fsdp_out, single_out = tmp_path / "fsdp", tmp_path / "single"

    proc = _launch(wrapper, [*common, "--episodes_per_step", "1", "--output_dir", str(fsdp_out),
                             "--save_strategy", "steps", "--save_steps", "1"], "fsdp", 2, env)
    assert proc.returncode == 0, _fail_message(proc)
    # the single process runs one pass per row, as FSDP does (share_prompt_prefixes is off under FSDP), so that the
    # two runs compute the same numbers in the same order
    proc = _launch(wrapper, [*common, "--episodes_per_step", "2", "--output_dir", str(single_out),
                             "--share_prompt_prefixes", "false"], "single", 1)
    assert proc.returncode == 0, _fail_message(proc)

    fsdp_samples, single_samples = _samples(fsdp_out, "fsdp"), _samples(single_out, "single")
    # the longest sums behind a step's loss and gradients: every token of the step's samples (tests/numerics.py)
    terms = model_terms(max(sum(len(p) + len(c) for p, c in (json.loads(r[0])[1:] for r in rows))
                            for rows in single_samples.values()))
    assert sorted(fsdp_samples) == sorted(single_samples) == list(range(1, steps + 1))
    for step in fsdp_samples:
        f, s = fsdp_samples[step], single_samples[step]
        assert [r[0] for r in f] == [r[0] for r in s], f"step {step}: the sampled completions differ"
        assert [r[1] for r in f] == pytest.approx([r[1] for r in s])
        assert [r[2] for r in f] == pytest.approx([r[2] for r in s], abs=1e-6), f"step {step}: advantages differ"
        assert any(abs(r[2]) > 0 for r in f)  # real advantages, so the updates below are real

    for f, s in zip(_step_records(fsdp_out), _step_records(single_out)):
        assert_same_computation(torch.tensor(f["loss"]), torch.tensor(s["loss"]), terms=terms, what="loss")
        assert max(v for k, v in f.items() if k.endswith("grad_norm")) > 0.05  # the clipping did act

    for step in range(1, steps + 1):
        f, s = _adapters(fsdp_out, "fsdp", step), _adapters(single_out, "single", step)
        assert f["info"] == {"wrapped": "FSDPAgentPool", "world": 2, "fsdp": True, "sharded": True}, f["info"]
        assert s["info"]["world"] == 1 and not s["info"]["fsdp"]
        assert f["adapters"].keys() == s["adapters"].keys() and len(f["adapters"]) > 0
        # what training changed (the same initial adapters in both runs): the updates must agree
        start = _adapters(single_out, "single", None)["adapters"]
        assert all(torch.equal(v, start[n]) for n, v in _adapters(fsdp_out, "fsdp", None)["adapters"].items())
        names = sorted(s["adapters"])
        assert_same_computation([f["adapters"][n] - start[n] for n in names],
                                [s["adapters"][n] - start[n] for n in names], terms=terms,
                                what=f"adapter updates after step {step}")
    moved = [n for n, v in _adapters(single_out, "single", steps)["adapters"].items() if "lora_B" in n and v.abs().max() > 0]
    assert moved  # lora_B starts at zero: the adapters did move

    # the final adapters written by the FSDP run (gathered from the shards) are the trained ones
    from safetensors.torch import load_file
    for policy in ("agent1", "agent2"):
        saved = load_file(fsdp_out / "adapters" / policy / "adapter_model.safetensors")
        trained = {n: v for n, v in _adapters(fsdp_out, "fsdp", steps)["adapters"].items() if f".{policy}." in n}
        assert len(saved) == len(trained) > 0
        for key, value in saved.items():
            match = [v for n, v in trained.items() if n.replace(f".{policy}.", ".") == key]
            assert len(match) == 1, key
            torch.testing.assert_close(value, match[0])

    # resume the FSDP run from its first checkpoint: step 2 again, from the restored adapters and optimizer
    checkpoint = fsdp_out / "checkpoint-1"
    assert (checkpoint / "adapters" / "agent1" / "adapter_model.safetensors").is_file()
    proc = _launch(wrapper, [*common, "--episodes_per_step", "1", "--output_dir", str(fsdp_out),
                             "--resume_from_checkpoint", str(checkpoint)], "resumed", 2, env)
    assert proc.returncode == 0, _fail_message(proc)
    resumed = _adapters(fsdp_out, "resumed", steps)
    assert resumed["info"]["fsdp"]
    last, before = _adapters(fsdp_out, "fsdp", steps)["adapters"], _adapters(fsdp_out, "fsdp", steps - 1)["adapters"]
    assert resumed["adapters"].keys() == last.keys()
    assert_same_computation([resumed["adapters"][n] - before[n] for n in sorted(last)],
                            [last[n] - before[n] for n in sorted(last)], terms=terms,
                            what="the resumed step's adapter update")
