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


TRACKIO_RUN = r"""
import json, sys
from datasets import Dataset
from trl_multiagent.agents import AgentSpec
from trl_multiagent.environments import MatrixGameEnv
from trl_multiagent.trainers import MultiAgentGRPOConfig, MultiAgentGRPOTrainer

model, out = sys.argv[1], sys.argv[2]
args = MultiAgentGRPOConfig(output_dir=out, report_to=["trackio"], project="team-test", run_name="two-steps",
                            max_completion_length=1, num_generations=2, generation_kwargs={"suppress_tokens": [0, 1, 2]},
                            save_strategy="no", disable_tqdm=True, max_steps=2, logging_steps=1, learning_rate=1e-2,
                            log_completions=True, num_completions_to_print=0)
agents = [AgentSpec("agent1", model=model, lora_r=4), AgentSpec("agent2", model=model, lora_r=4)]
MultiAgentGRPOTrainer(agents, MatrixGameEnv, args, Dataset.from_dict({"task_id": list(range(16))})).train()
from trackio.sqlite_storage import SQLiteStorage
print("LOGS=" + json.dumps(SQLiteStorage.get_logs("team-test", "two-steps"), default=str))
"""


def test_two_steps_with_trackio_offline_write_metrics_and_completions(tiny_ab_model, tmp_path):
    """trackio (local, no Space): the logged scalars and the completions table, read back from its database. In a
    fresh process, since trackio fixes its storage folder (TRACKIO_DIR) when it is first imported."""
    pytest.importorskip("trackio")  # installed with the dev extra; the [tracking] extra for users
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}
    done = subprocess.run([sys.executable, "-c", TRACKIO_RUN, tiny_ab_model, str(tmp_path / "run")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    logs = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("LOGS="))[5:])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "reward" in r]
    by_step: dict[int, dict] = {}  # trackio counts log calls; transformers' callback logs train/global_step
    for entry in logs:
        by_step.setdefault(int(entry["train/global_step"]), {}).update(entry)
    assert sorted(by_step) == [1, 2]
    for record in records:
        logged = by_step[record["step"]]
        for key in ("reward", "loss", "agent/agent1/reward", "agent/agent2/reward"):
            assert logged[f"train/{key}"] == pytest.approx(record[key], rel=1e-6), key
    rows = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    for step in (1, 2):
        table = by_step[step]["completions"]
        assert table["_type"] == "trackio.table"
        logged_rows = table["_value"]
        mine = [r for r in rows if r["step"] == step]
        assert len(logged_rows) == len(mine)
        for got, want in zip(logged_rows, mine):
            assert got["completion/agent1"] == want["completions"]["agent1"]
            assert got["advantage/agent2"] == pytest.approx(want["advantages"]["agent2"])
            assert got["reward"] == pytest.approx(want["reward"])


def test_wandb_gets_the_completions_table_of_its_run(monkeypatch):
    """wandb is not installed in the test environment: a stand-in module records what log_to_trackers sends (a
    Table built from the same DataFrame, with the step), and nothing is sent when wandb has no run."""
    import sys
    import types

    from trl_multiagent.trainers.completions import completions_frame, log_to_trackers

    logged = []
    fake = types.SimpleNamespace(run=None, log=logged.append, Table=lambda dataframe: ("table", dataframe))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    rows = [{"step": 3, "episode": 0, "turn": 0, "task": "t", "completions": {"a": "x"}, "advantages": {"a": 0.5},
             "reward": 1.0, "components": {"score": 1.0}},
            {"step": 3, "episode": 1, "turn": 0, "task": "u", "completions": {"a": "y", "b": "z"},
             "advantages": {"a": -0.5, "b": 0.25}, "reward": 0.0, "components": {}}]
    assert log_to_trackers(rows, ["a", "b"], 3, ["wandb"]) == [] and logged == []  # no run started
    fake.run = object()
    assert log_to_trackers(rows, ["a", "b"], 3, ["wandb"]) == ["wandb"]
    (entry,) = logged
    assert entry["train/global_step"] == 3 and entry["completions"][0] == "table"
    frame = entry["completions"][1]
    assert list(frame.columns) == ["step", "episode", "turn", "task", "completion/a", "advantage/a", "completion/b",
                                   "advantage/b", "reward", "score"]
    assert frame["completion/b"].tolist() == ["", "z"] and frame["advantage/a"].tolist() == [0.5, -0.5]
    assert frame.equals(completions_frame(rows, ["a", "b"]))
