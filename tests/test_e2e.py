"""End-to-end: the matrix-game recipe through `accelerate launch`, on the embedded SmolLM2-135M-Instruct with QLoRA.

One process on the CPU, two agents (two QLoRA adapters on ONE shared 4-bit base), two optimizer steps. The run is
kept small (K=4 samples per agent, completions of at most 2 tokens). SmolLM2 rarely answers a bare "A" or "B" in so
few tokens, and a team whose answers are all invalid gets the same reward everywhere: zero advantages, zero
gradients and LoRA B matrices that never leave zero. A strong `sequence_bias` towards the tokens "A" and "B" makes
every answer valid while leaving the choice between them to sampling, so the joint rewards (10/7/0) differ within a
group and training moves the adapters.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import get_peft_model_state_dict
from safetensors.torch import load_file

from trl_multiagent.models.loading import DEFAULT_MODEL, ModelNotFoundError, load_tokenizer, resolve_model

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ("agent1", "agent2")
STEPS = 2


def _subprocess_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture(scope="module")
def embedded_model() -> str:
    try:
        return resolve_model(DEFAULT_MODEL)  # converts the GGUF once if this machine has not done it yet
    except ModelNotFoundError as exc:
        pytest.skip(f"embedded model not available: {exc}")


@pytest.fixture(scope="module")
def e2e_run(embedded_model, tmp_path_factory):
    """Launch the recipe once; the tests below read what it wrote."""
    pytest.importorskip("bitsandbytes")
    tok = load_tokenizer(embedded_model)
    a_id, b_id = tok.convert_tokens_to_ids("A"), tok.convert_tokens_to_ids("B")
    assert None not in (a_id, b_id) and tok.unk_token_id not in (a_id, b_id), (a_id, b_id)
    # After the chat prompt the 4-bit model's logit of "A" exceeds that of "B" by ~1.9 (~2.9 unquantized): with equal
    # biases it answers A ~87% of the time, and a group of four (A, A) joint actions (equal rewards, zero advantages)
    # is likely. The 2 extra units for "B" bring P(A) near 1/2 (near 0.7 even unquantized).
    generation_kwargs = {"sequence_bias": [[[a_id], 100.0], [[b_id], 102.0]]}
    out = tmp_path_factory.mktemp("e2e") / "run"
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--num_processes", "1", "--num_machines", "1", "--cpu", "--mixed_precision", "no", "--dynamo_backend", "no",
        # One thread: with two OpenMP threads on a 2-core machine, any other busy process slows this run down 5-6x
        # (measured on a shared 2-core machine: 29 s with one thread, 160-180 s with two).
        "--num_cpu_threads_per_process", "1",
        "recipes/magrpo.py", "--config", "recipes/configs/matrix_game.yaml",
        "--quantization", "4bit", "--max_steps", str(STEPS), "--output_dir", str(out),
        "--num_generations", "4", "--episodes_per_step", "1", "--max_completion_length", "2",
        "--per_device_train_batch_size", "4", "--generation_kwargs", json.dumps(generation_kwargs),
        "--disable_tqdm", "true", "--save_strategy", "no", "--seed", "0",
    ]
    # in its own session: on timeout the whole group goes (accelerate launch runs the recipe in a child process)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"the recipe did not finish in 420 s\n{stdout[-3000:]}\n{stderr[-6000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), out


@pytest.mark.slow
def test_recipe_runs_and_writes_metrics(e2e_run):
    proc, out = e2e_run
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    step_records = [r for r in records if "loss" in r]  # the last line is the end-of-training summary
    assert [r["step"] for r in step_records] == list(range(1, STEPS + 1))  # logging_steps 1: one line per step
    for record in step_records:
        for key in ("reward", "loss", *(f"agent/{a}/reward" for a in AGENTS)):
            assert isinstance(record.get(key), (int, float)), (key, record)
        assert record["env/valid"] == 1.0, record  # the bias makes every answer A or B

    summary = json.loads((out / "summary.json").read_text())
    assert summary["global_step"] == STEPS
    assert summary["algorithm"] == "MAGRPO"
    assert {s["quantization"] for s in summary["agents"].values()} == {"4bit"}
    for agent in AGENTS:
        assert (out / "adapters" / agent / "adapter_model.safetensors").is_file()
        assert (out / "adapters" / agent / "adapter_config.json").is_file()


@pytest.mark.slow
def test_saved_adapters_reload_and_moved(e2e_run):
    proc, out = e2e_run
    assert proc.returncode == 0, proc.stderr[-6000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert any(r.get("frac_reward_zero_std", 1.0) < 1.0 for r in records if "loss" in r), (
        "no group had different rewards, so no gradient could move the adapters", records)

    from trl_multiagent.team.pool import AgentPool

    pool = AgentPool.from_pretrained(out)
    assert sorted(pool.policies) == list(AGENTS)
    assert len(pool.bases) == 1  # both adapters on one shared base
    assert {q for _, q in pool.base_sources.values()} == {"4bit"}
    moved = []
    for policy in AGENTS:
        saved = load_file(str(out / "adapters" / policy / "adapter_model.safetensors"))
        loaded = get_peft_model_state_dict(pool.base_of(policy), adapter_name=policy)
        assert saved.keys() == loaded.keys()
        assert saved, policy
        for key, tensor in saved.items():
            assert torch.equal(loaded[key].detach().cpu(), tensor), key
        moved += [key for key, tensor in saved.items() if "lora_B" in key and tensor.abs().max() > 0]
    # LoRA B starts at zero; a non-zero B means an optimizer step with a real gradient went through.
    assert moved, "every LoRA B matrix is still zero after training"
