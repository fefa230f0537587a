"""report_to: a tracking backend receives the team's metrics under per-agent names (tensorboard, read back from its
event files)."""

import json

import pytest
from datasets import Dataset

from trl_multiagent.agents import AgentSpec
from trl_multiagent.environments import MatrixGameEnv
from trl_multiagent.trainers import MultiAgentGRPOConfig, MultiAgentGRPOTrainer


def test_two_steps_with_tensorboard_write_the_logged_metrics(tiny_ab_model, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")  # installed with the dev extra; the [tracking] extra for users
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logs = tmp_path / "tb"
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(logs))  # transformers 5: else <output_dir>/runs/<date>
    args = MultiAgentGRPOConfig(output_dir=str(tmp_path / "run"), report_to=["tensorboard"], max_completion_length=1,
                                num_generations=2, generation_kwargs={"suppress_tokens": [0, 1, 2]},
                                save_strategy="no", disable_tqdm=True, max_steps=2, logging_steps=1,
                                learning_rate=1e-2, log_completions=True, num_completions_to_print=0)
    agents = [AgentSpec("agent1", model=tiny_ab_model, lora_r=4), AgentSpec("agent2", model=tiny_ab_model, lora_r=4)]
    MultiAgentGRPOTrainer(agents, MatrixGameEnv, args, Dataset.from_dict({"task_id": list(range(16))})).train()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "reward" in r]
    events = [p for p in logs.rglob("events.out.tfevents.*")]
    assert events
    acc = EventAccumulator(str(events[0].parent), size_guidance={"tensors": 0}).Reload()
    tags = set(acc.Tags()["scalars"])
    for key in ("reward", "loss", "agent/agent1/reward", "agent/agent2/reward", "policy/agent1/grad_norm"):
        assert f"train/{key}" in tags, (key, sorted(tags))
        points = acc.Scalars(f"train/{key}")
        assert [p.step for p in points] == [1, 2]
        assert [p.value for p in points] == pytest.approx([r[key] for r in records], rel=1e-6)
    # log_completions: each step's joint actions as a markdown table in the text tab, the completions file's rows
    rows = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    texts = acc.Tensors("train/completions/text_summary")
    assert [t.step for t in texts] == [1, 2]
    for t in texts:
        markdown = t.tensor_proto.string_val[0].decode()
        assert markdown.startswith("| task | agent1 | agent2 | reward |")
        mine = [r for r in rows if r["step"] == t.step]
        assert len(markdown.splitlines()) == 2 + len(mine)
        for r in mine:
            answer = " ".join(r["completions"]["agent1"].split())
            assert f"| {answer} (advantage {r['advantages']['agent1']:+.3f}) |" in markdown
