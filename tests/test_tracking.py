"""report_to: a tracking backend receives the team's metrics under per-agent names and the completions table, read
back with the backend's own reader (tensorboard: its event files; trackio: its database; wandb: an offline run's
transaction log)."""

import json

import pytest
from datasets import Dataset

from trl_multiagent.environments import MatrixGameEnv
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer


def test_two_steps_with_tensorboard_write_the_logged_metrics(tiny_ab_model, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")  # installed with the dev extra; the [tracking] extra for users
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logs = tmp_path / "tb"
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(logs))  # transformers 5: else <output_dir>/runs/<date>
    args = MAGRPOConfig(output_dir=str(tmp_path / "run"), report_to=["tensorboard"], max_completion_length=1,
                                num_generations=2, generation_kwargs={"suppress_tokens": [0, 1, 2]},
                                save_strategy="no", disable_tqdm=True, max_steps=2, logging_steps=1,
                                learning_rate=1e-2, log_completions=True, num_completions_to_print=0)
    agents = [AgentSpec("agent1", model=tiny_ab_model, lora_r=4), AgentSpec("agent2", model=tiny_ab_model, lora_r=4)]
    MAGRPOTrainer(agents, MatrixGameEnv, args, Dataset.from_dict({"task_id": list(range(16))})).train()
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
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.environments import MatrixGameEnv
from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer

model, out = sys.argv[1], sys.argv[2]
args = MAGRPOConfig(output_dir=out, report_to=["trackio"], project="team-test", run_name="two-steps",
                            max_completion_length=1, num_generations=2, generation_kwargs={"suppress_tokens": [0, 1, 2]},
                            save_strategy="no", disable_tqdm=True, max_steps=2, logging_steps=1, learning_rate=1e-2,
                            log_completions=True, num_completions_to_print=0)
agents = [AgentSpec("agent1", model=model, lora_r=4), AgentSpec("agent2", model=model, lora_r=4)]
MAGRPOTrainer(agents, MatrixGameEnv, args, Dataset.from_dict({"task_id": list(range(16))})).train()
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
    """log_to_trackers alone, with a stand-in wandb module: what it sends (a Table built from the same DataFrame, with
    the step), and nothing when wandb has no run. The real wandb: the offline run test below."""
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


TINY_RECIPE = "tests/configs/tiny_matrix_game.yaml"


def wandb_inspect_json() -> list[str] | None:
    """The command that prints an offline run's records as JSON lines with wandb's own reader (``wandb leet inspect
    --json``: wandb-core reads the .wandb transaction log; the Python reader of older versions,
    ``wandb.sdk.internal.datastore``, is not in wandb 0.31), or None when the installed wandb has no such command."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "wandb", "leet", "inspect"]
    shown = subprocess.run(command + ["--help"], capture_output=True, text=True, timeout=60)
    return command + ["--json"] if shown.returncode == 0 and "--json" in shown.stdout else None


def test_two_steps_with_wandb_offline_log_every_metric_and_the_completions_table(tiny_ab_model, tmp_path):
    """The CLI on the tiny matrix game with report_to wandb (offline: no network, no account) and log_completions:
    read back from the run's .wandb file, every value of metrics.jsonl is in the run's history at its
    train/global_step (transformers' end-of-training totals in its summary), and each step's completions table holds
    exactly that step's rows of completions.jsonl."""
    pytest.importorskip("wandb", reason="wandb is in the [tracking] extra (make install installs it)")
    import os
    import subprocess
    import sys

    from tests.cli_harness import ROOT

    inspect = wandb_inspect_json()
    if inspect is None:
        pytest.skip("this wandb has no `wandb leet inspect --json` to read an offline run back")
    wandb_env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_CODE": "true",
                 "WANDB_PROJECT": "team-test", "WANDB_DIR": str(tmp_path / "wandb_dir")}
    for name in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        wandb_env[name] = str(tmp_path / name.lower())  # nothing written to ~/.cache or ~/.config
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(wandb_env, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p))
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "trl_multiagent", "train", "--config", TINY_RECIPE,
                           "--model", tiny_ab_model, "--output_dir", str(run), "--max_steps", "2",
                           "--report_to", "wandb", "--log_completions", "true", "--num_completions_to_print", "0"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (tmp_path / "wandb_dir" / "wandb").glob("offline-run-*")
    (log,) = run_dir.glob("*.wandb")
    read = subprocess.run(inspect + [str(log)], env=env, capture_output=True, text=True, timeout=120)
    assert read.returncode == 0, read.stderr[-3000:]
    records = [json.loads(line) for line in read.stdout.splitlines() if line.strip()]
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    summary: dict = {}
    for r in records:
        if r["type"] == "summary":
            summary.update(r["summary"].get("update", {}))

    # every metric of every logged step, under train/<key> in a history row of that train/global_step
    logged: dict[tuple[int, str], object] = {}
    for item in history:
        for key, value in item.items():
            if key.startswith("train/") and key != "train/global_step":
                logged[(int(item["train/global_step"]), key[len("train/"):])] = value
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "reward" in m] == [1, 2]
    totals = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss"}
    per_agent = set()
    for m in metrics:
        for key, value in m.items():
            if key == "step":
                continue
            if key in totals:  # transformers' WandbCallback puts the end-of-training totals in the run summary
                assert summary[key] == value, key
            else:
                assert logged.get((m["step"], key)) == value, (m["step"], key, logged.get((m["step"], key)), value)
                per_agent.update({key} if key.startswith(("agent/", "policy/")) else set())
    assert {"agent/agent1/reward", "agent/agent2/reward", "policy/agent1/grad_norm",
            "policy/agent2/grad_norm"} <= per_agent

    # the completions table of each step: the file the history row points to, row for row completions.jsonl
    rows = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    tables = {int(item["train/global_step"]): item for item in history if item.get("completions._type") == "table-file"}
    assert sorted(tables) == [1, 2]
    for step, item in tables.items():
        table = json.loads((run_dir / "files" / item["completions.path"]).read_text())
        mine = [r for r in rows if r["step"] == step]
        components = list(mine[0]["components"])
        assert table["columns"] == ["step", "episode", "turn", "task", "completion/agent1", "advantage/agent1",
                                    "completion/agent2", "advantage/agent2", "reward", *components]
        assert item["completions.nrows"] == len(mine) == len(table["data"])
        for got, want in zip(table["data"], mine):
            assert got == [want["step"], want["episode"], want["turn"], want["task"],
                           want["completions"]["agent1"], want["advantages"]["agent1"],
                           want["completions"]["agent2"], want["advantages"]["agent2"], want["reward"],
                           *(want["components"][c] for c in components)]


# ------------------------------------------------------------------------------------------------ wandb's login
def no_wandb_login(monkeypatch, home):
    """An environment where wandb has no login: no WANDB_* variables, HOME (its netrc and settings) a new folder."""
    import os

    for name in [n for n in os.environ if n.startswith("WANDB_")] + ["NETRC"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(home)  # no ./wandb/settings of the repository's


def test_wandb_login_is_found_where_wandb_looks_for_it(monkeypatch, tmp_path):
    from trl_multiagent.trainers.tracking_login import wandb_login_problem

    no_wandb_login(monkeypatch, tmp_path)
    problem = wandb_login_problem()
    assert problem and "wandb login" in problem and "WANDB_API_KEY" in problem and "WANDB_MODE=offline" in problem
    assert "\n" not in problem
    for name, value in (("WANDB_MODE", "offline"), ("WANDB_MODE", "disabled"), ("WANDB_API_KEY", "k" * 40)):
        monkeypatch.setenv(name, value)
        assert wandb_login_problem() is None, name
        monkeypatch.delenv(name)
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    assert wandb_login_problem() is None  # `wandb login` writes this
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert "no entry for wandb.example.org" in wandb_login_problem()  # a login for another server is none here
    monkeypatch.delenv("WANDB_BASE_URL")
    (tmp_path / ".netrc").unlink()
    (tmp_path / ".config" / "wandb").mkdir(parents=True)
    (tmp_path / ".config" / "wandb" / "settings").write_text("[default]\nmode = offline\n")
    assert wandb_login_problem() is None  # `wandb offline`
    monkeypatch.setenv("WANDB_MODE", "online")
    assert "WANDB_MODE is 'online'" in wandb_login_problem()


def test_wandb_without_a_login_is_one_line_before_any_model_loads(tiny_ab_model, tmp_path):
    """The command line with report_to wandb in an environment without a wandb login (no key, HOME a new folder):
    one line that says both ways on, exit code 2, before any model loads and before the output_dir is made."""
    pytest.importorskip("wandb", reason="wandb is in the [tracking] extra (make install installs it)")
    import os
    import subprocess
    import sys

    from tests.cli_harness import ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "NETRC"}
    env.update(HOME=str(tmp_path), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               WANDB_DIR=str(tmp_path), PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p))
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "trl_multiagent", "train", "--config", TINY_RECIPE,
                           "--model", tiny_ab_model, "--output_dir", str(run), "--report_to", "wandb"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Loading base" not in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "error:" in line]
    assert line.startswith(f"python -m trl_multiagent train: error: {TINY_RECIPE}: report_to names wandb, but wandb "
                           "is not logged in here")
    assert "log in with `wandb login` (or set WANDB_API_KEY), or set WANDB_MODE=offline" in line
    assert not run.exists()
