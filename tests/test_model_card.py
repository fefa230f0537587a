"""A trained team leaves the trainer as a TRL user expects (issue 62, item 4): every saved team folder (the run's
output_dir and each checkpoint-N) has a README.md model card, each adapter folder loads with plain
``peft.PeftModel.from_pretrained`` and computes what the team's agent computes, and ``push`` sends the folder with its
card to the Hub (here a local stand-in of ``HfApi``), or refuses with one line, before any upload, when offline.
The vLLM side (a saved adapter folder as a ``LoRARequest``) is in tests/test_vllm.py (``make test-vllm``)."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import shutil
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import GenerationConfig

from trl_multiagent.environments import MathToolEnv, MatrixGameEnv
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer

GREEDY = GenerationConfig(max_new_tokens=4, do_sample=False)


@pytest.fixture(scope="module")
def trained(tiny_ab_model, tmp_path_factory):
    """Two steps of a two-agent team (two policies, LoRA ranks 4 and 8), a checkpoint at each step."""
    out = tmp_path_factory.mktemp("card") / "run"
    args = MAGRPOConfig(output_dir=str(out), report_to=[], max_completion_length=1, num_generations=4,
                                generation_kwargs={"suppress_tokens": [0, 1, 2]}, save_strategy="steps",
                                save_steps=1, disable_tqdm=True, learning_rate=1e-2, max_steps=2)
    agents = [AgentSpec("agent1", model=tiny_ab_model, lora_r=4),
              AgentSpec("agent2", model=tiny_ab_model, lora_r=8, lora_alpha=16)]
    trainer = MAGRPOTrainer(agents, MatrixGameEnv, args, Dataset.from_dict({"task_id": list(range(16))}))
    trainer.train()
    return trainer, out


# ------------------------------------------------------------------------------------------------ PEFT
@pytest.mark.parametrize("folder", ["", "checkpoint-2"])
def test_each_adapter_folder_loads_with_plain_peft_and_computes_the_agents_logits(trained, tiny_ab_model, folder):
    from peft import PeftModel, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    trainer, out = trained
    pool = trainer.pool
    for agent in ("agent1", "agent2"):
        policy = pool.policy_of(agent)
        base = AutoModelForCausalLM.from_pretrained(tiny_ab_model)  # a fresh base, as a user loads it
        model = PeftModel.from_pretrained(base, str(out / folder / "adapters" / policy)).eval()
        loaded = get_peft_model_state_dict(model)
        trained_state = get_peft_model_state_dict(pool.bases[pool.policies[policy].base_key], adapter_name=policy)
        assert sorted(loaded) == sorted(trained_state)
        for key, value in trained_state.items():
            assert torch.equal(loaded[key], value.detach().cpu()), key
        assert any("lora_B" in k and v.abs().sum() > 0 for k, v in loaded.items()), "training changed the adapter"
        assert model.peft_config["default"].r == (4 if agent == "agent1" else 8)
        ids = torch.tensor([pool.encode_prompt(agent, "ABBA")])
        with torch.no_grad():
            torch.testing.assert_close(model(input_ids=ids).logits, pool(policy, input_ids=ids).logits)


# ------------------------------------------------------------------------------------------------ the card
def test_every_saved_team_folder_has_a_model_card(trained, tiny_ab_model):
    _, out = trained
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: peft\n")  # a local base is no Hub id: no base_model entry
    for tag in ("- trl\n", "- trl-multiagent\n", "- magrpo\n", "- lora\n"):
        assert tag in card.split("---")[1]
    assert f"`{tiny_ab_model}`" in card and "| agent2 | `adapters/agent2` |" in card and "| 8 / 16 |" in card
    assert ("Algorithm: MAGRPO (trainer `magrpo`, MAGRPOTrainer); paper: [LLM Collaboration With "
            "Multi-Agent Reinforcement Learning](https://arxiv.org/abs/2508.04652)") in card
    assert "- Steps: 2\n" in card and "@article{liu2025llmcollaboration" in card
    # the trainer config: the fields set away from their defaults, and only those
    config = card.split("### Trainer config")[1].split("\n## ")[0]
    assert "defaults of MAGRPOConfig" in config
    for row in ("| learning_rate | `0.01` |", "| max_steps | `2` |", "| save_steps | `1` |",
                '| generation_kwargs | `{"suppress_tokens": [0, 1, 2]}` |'):
        assert row in config, row
    assert "| beta |" not in config and "output_dir" not in config and "accelerator_config" not in config
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trainer_config"]["learning_rate"] == 0.01 and "beta" not in summary["trainer_config"]
    assert "This run did not evaluate the team on held-out tasks" in card
    versions = card.split("## Library versions")[1].split("\n## ")[0]
    assert "| trl-multiagent | trl | transformers | peft | torch |" in versions
    assert f"| {metadata.version('trl')} | {metadata.version('transformers')} | {metadata.version('peft')} |" in \
        versions
    # the commands: evaluate (a team trained from Python names its recipe), continue, push, PEFT, vLLM
    assert f"python -m trl_multiagent evaluate --team {out} --eval_dataset_split my_tasks.jsonl --config" in card
    assert f"--init_adapters {out} --output_dir {out}-more" in card
    assert f"python -m trl_multiagent push --team {out} --repo_id <user>/<name>" in card
    assert f'PeftModel.from_pretrained(base, "{out}/adapters/agent1")' in card
    assert (f"vllm serve {tiny_ab_model} --enable-lora --max-lora-rank 8 --lora-modules "
            f"agent1={out}/adapters/agent1 agent2={out}/adapters/agent2") in card
    # each checkpoint: its own card, its step, its own folder in the commands
    for step in (1, 2):
        checkpoint = (out / f"checkpoint-{step}" / "README.md").read_text()
        assert f"# run/checkpoint-{step}\n" in checkpoint and f"This is the checkpoint of step {step} of the run" in \
            checkpoint and f"- Steps: {step} (of the run's 2)" in checkpoint
        assert f"--resume_from_checkpoint {out}/checkpoint-{step}" in checkpoint
        assert f"agent1={out}/checkpoint-{step}/adapters/agent1" in checkpoint


class ScriptPool:
    """``generate_many`` from a fixed script: the tool is right only with its (trained) adapter on."""

    def adapters_are_identity(self):
        return False

    def generate_many(self, requests, generation_config, max_batch_sequences=None):
        from trl_multiagent.team.pool import Generation

        def text(r):
            if r.agent == "tool":
                return "```python\nprint(3 * 12)\n```" if r.use_adapter else "```python\nprint(3 + 12)\n```"
            return "I do not know."
        return [[Generation([0], [1, 2], text(r))] * r.num_samples for r in requests]


def test_the_card_shows_the_held_out_results_once_the_run_has_them(trained, tmp_path):
    """The runner adds the held-out results to summary.json (write_run_outputs): the card is rewritten with them;
    a folder without a saved team (the evaluate command's results) gets no card."""
    from trl_multiagent.command.evaluate import AdaptersOff
    from trl_multiagent.evaluation import TEAM, EpisodeEvaluator, evaluate_team, evaluation_section, write_run_outputs

    _, out = trained
    folder = tmp_path / "run"
    shutil.copytree(out, folder)
    tasks = [{"task_id": str(i), "question": f"{i}: 3 boxes of 12 pens?", "answer": "36"} for i in range(4)]
    evaluator = EpisodeEvaluator(MathToolEnv, num_turns=1)
    pool = ScriptPool()
    stages = {"before": evaluate_team(AdaptersOff(pool), evaluator, tasks, [TEAM, "tool_alone", "reasoner_alone"],
                                      generation_config=GREEDY),
              "after": evaluate_team(pool, evaluator, tasks, [TEAM], generation_config=GREEDY)}
    section = evaluation_section(stages, "final/team_correct", "episodes", 1, {"max_new_tokens": 4,
                                                                               "do_sample": False},
                                 baselines=evaluator.baselines, num_resamples=200)
    recipe = {"trainer": "magrpo", "environment": "matrix_game", "learning_rate": 0.01}
    command = f"python -m trl_multiagent train --config my_recipe.yaml --output_dir {folder}"
    write_run_outputs(folder, section, {"command": command, "recipe": recipe}, stages)
    card = (folder / "README.md").read_text()
    results = card.split("## Held-out results")[1].split("\n## ")[0]
    assert "`final/team_correct` on 4 held-out tasks (episodes evaluation; decoding: max_new_tokens 4, do_sample " \
           "False)" in results
    # the team before and after with their intervals, the best baseline (the first of equals), the gain over it
    assert "| team | 0.000 [0.000, 0.000] | 1.000 [1.000, 1.000] | +1.000 [1.000, 1.000] |" in results
    assert "| reasoner alone (the best baseline) | 0.000 [0.000, 0.000] | - | - |" in results
    assert "The trained team against the best baseline (reasoner alone, before training): +1.000 [1.000, 1.000]." \
        in results
    assert "```yaml\ntrainer: magrpo\nenvironment: matrix_game\nlearning_rate: 0.01\n```" in card
    assert f"python -m trl_multiagent evaluate --team {folder} --eval_dataset_split my_tasks.jsonl\n" in card
    assert f"train --config my_recipe.yaml --init_adapters {folder}" in card
    assert f'Team.from_pretrained("{folder}")' in card
    # a checkpoint was not evaluated: its card says so rather than showing the final team's numbers
    assert "This checkpoint was not evaluated on its own" in (folder / "checkpoint-1" / "README.md").read_text()
    elsewhere = tmp_path / "eval-mine"
    write_run_outputs(elsewhere, section, {"command": "evaluate"}, stages)
    assert (elsewhere / "summary.json").is_file() and not (elsewhere / "README.md").exists()


# ------------------------------------------------------------------------------------------------ push
class StandIn:
    """``HfApi.create_repo`` / ``upload_folder`` recording their calls; the upload copies what it would send (the
    folder's files that its allow / ignore patterns select) into ``hub``."""

    def __init__(self, hub: Path, unreachable: Exception | None = None, upload_fails: Exception | None = None):
        self.hub, self.unreachable, self.upload_fails, self.calls = hub, unreachable, upload_fails, []

    def install(self, monkeypatch):
        from huggingface_hub import HfApi

        stand_in = self

        def create_repo(api, repo_id, **kwargs):
            stand_in.calls.append(("create_repo", repo_id, kwargs))
            if stand_in.unreachable is not None:
                raise stand_in.unreachable
            return f"https://huggingface.co/{repo_id}"

        def upload_folder(api, **kwargs):
            from huggingface_hub.utils import filter_repo_objects

            stand_in.calls.append(("upload_folder", kwargs["repo_id"], kwargs))
            if stand_in.upload_fails is not None:
                raise stand_in.upload_fails
            root = Path(kwargs["folder_path"])
            files = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
            for name in filter_repo_objects(files, allow_patterns=kwargs.get("allow_patterns"),
                                            ignore_patterns=kwargs.get("ignore_patterns")):
                (stand_in.hub / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(root / name, stand_in.hub / name)
            return None

        monkeypatch.setattr(HfApi, "create_repo", create_repo)
        monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
        return self


def online(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def test_push_sends_the_team_folder_with_its_card(trained, tiny_ab_model, tmp_path, monkeypatch, capsys):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trl_multiagent.command.cli import main

    _, out = trained
    online(monkeypatch)
    hub = StandIn(tmp_path / "hub").install(monkeypatch)
    assert main(["push", "--team", str(out), "--repo_id", "me/matrix-team", "--private"]) == 0
    (create, upload) = hub.calls
    assert create == ("create_repo", "me/matrix-team", {"private": True, "exist_ok": True, "repo_type": "model"})
    assert upload[1] == "me/matrix-team" and upload[2]["folder_path"] == str(out)
    sent = sorted(str(p.relative_to(hub.hub)) for p in hub.hub.rglob("*") if p.is_file())
    assert sent == ["README.md", "adapters/agent1/adapter_config.json", "adapters/agent1/adapter_model.safetensors",
                    "adapters/agent2/adapter_config.json", "adapters/agent2/adapter_model.safetensors",
                    "adapters/team.json", "metrics.jsonl", "summary.json"]  # no checkpoints, status or pickles
    assert (hub.hub / "README.md").read_text() == (out / "README.md").read_text()
    # what a user downloads loads with PEFT
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_ab_model), str(hub.hub / "adapters/agent2"))
    # a checkpoint folder sends its own card and adapters, not its optimizer
    shutil.rmtree(hub.hub)
    assert main(["push", "--team", str(out / "checkpoint-1"), "--repo_id", "me/matrix-team-step1"]) == 0
    sent = sorted(str(p.relative_to(hub.hub)) for p in hub.hub.rglob("*") if p.is_file())
    assert "README.md" in sent and "adapters/agent1/adapter_model.safetensors" in sent
    assert not any(name.endswith((".pt", ".pth", ".bin")) or name == "trainer_state.json" for name in sent)
    assert "This is the checkpoint of step 1" in (hub.hub / "README.md").read_text()


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_push_offline_is_refused_with_one_line_before_any_upload(trained, tmp_path, monkeypatch, capsys):
    from trl_multiagent.command.cli import main

    _, out = trained
    hub = StandIn(tmp_path / "hub").install(monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    capsys.readouterr()
    assert main(["push", "--team", str(out), "--repo_id", "me/matrix-team"]) == 2
    (line,) = error_lines(capsys)
    assert line.startswith("python -m trl_multiagent push: error: the Hub is offline here (HF_HUB_OFFLINE is set): "
                           "nothing was uploaded; unset HF_HUB_OFFLINE") and "hf auth login" in line
    assert hub.calls == []


def test_push_without_a_network_is_refused_with_one_line_before_any_upload(trained, tmp_path, monkeypatch, capsys):
    import httpx

    from trl_multiagent.command.cli import main

    _, out = trained
    online(monkeypatch)
    hub = StandIn(tmp_path / "hub", unreachable=httpx.ConnectError("[Errno -3] Temporary failure in name "
                                                                   "resolution")).install(monkeypatch)
    capsys.readouterr()
    assert main(["push", "--team", str(out), "--repo_id", "me/matrix-team"]) == 2
    (line,) = error_lines(capsys)
    assert "error: cannot reach the Hub (ConnectError: [Errno -3] Temporary failure in name resolution): nothing " \
           "was uploaded" in line
    assert [c[0] for c in hub.calls] == ["create_repo"]  # the repository first: nothing was sent
    assert not (tmp_path / "hub").exists()
    # not a saved team: one line too
    assert main(["push", "--team", str(tmp_path), "--repo_id", "me/matrix-team"]) == 2
    (line,) = error_lines(capsys)
    assert "holds no saved team" in line
    # an upload that starts and fails: one line, exit code 1
    StandIn(tmp_path / "hub", upload_fails=RuntimeError("500 Server Error")).install(monkeypatch)
    assert main(["push", "--team", str(out), "--repo_id", "me/matrix-team"]) == 1
    (line,) = error_lines(capsys)
    assert f"error: the upload of {out} to me/matrix-team failed (RuntimeError: 500 Server Error)" in line
