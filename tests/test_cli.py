"""The command line, as a user meets it: every bad input ends in ONE clear error line that names the field or the
file, exit code 2, no traceback, before any model loads, and nothing already saved is touched; --help lists every
field. Each case is a separate process (forked from a warm one, tests/cli_harness.py); a few run as plain fresh
interpreters too."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_harness import ROOT, CommandRunner

TINY_RECIPE = "tests/configs/tiny_matrix_game.yaml"


@pytest.fixture(scope="module")
def cli():
    runner = CommandRunner()
    yield runner
    runner.close()


@pytest.fixture
def base(tiny_ab_model, tmp_path):
    """A valid recipe on the tiny model; each case changes one thing."""
    return ["train", "--config", TINY_RECIPE, "--model", tiny_ab_model, "--output_dir", str(tmp_path / "run")]


def assert_clean_error(result, *needles: str) -> str:
    assert result.returncode == 2, (result.returncode, result.output[-3000:])
    assert "Traceback" not in result.output, result.output[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]


# ------------------------------------------------------------------------------------------------ values
@pytest.mark.parametrize("args,needles", [
    (["--num_generations", "0"], ["num_generations", "got 0"]),
    (["--num_generations", "1"], ["num_generations", "got 1"]),
    (["--num_tasks", "0"], ["num_tasks", "got 0"]),
    (["--temperature", "-0.5"], ["temperature", "-0.5"]),
    (["--per_device_train_batch_size", "0"], ["per_device_train_batch_size"]),
    (["--learning_rate", "fast"], ["command line", "'learning_rate' expects a number, got 'fast'"]),
    (["--max_steps", "ten"], ["'max_steps' expects an integer"]),
    (["--bf16", "maybe"], ["'bf16' expects true/false"]),
    (["--lerning_rate", "0.1"], ["unknown key 'lerning_rate'", "did you mean 'learning_rate'"]),
    (["--trainer", "magrp"], ["unknown trainer 'magrp'", "did you mean 'magrpo'"]),
    (["--environment", "chess"], ["Unknown environment 'chess'"]),
    (["--policy_mapping", "mixed"], ["policy_mapping", "'mixed'"]),
    (["--eval_num_samples", "0"], ["eval_num_samples"]),
    (["--eval_num_problems", "-1"], ["eval_num_problems"]),
    (["--eval_max_new_tokens", "0"], ["eval_max_new_tokens"]),
    (["--eval_stages", "during"], ["eval_stages"]),
    (["--eval_methods", "teem"], ["eval_methods", "did you mean 'team'"]),
    (["--eval_temperature", "-1"], ["eval_temperature"]),
    (["--eval_bootstrap_resamples", "5"], ["eval_bootstrap_resamples"]),
    (["--evaluator", "vibes"], ["evaluator"]),
    (["--lora_r", "0"], ["lora_r"]),
    (["--agents", '[{"name": "agent1", "lora_r": "big"}, {"name": "agent2"}]'], ["agents[0]", "'lora_r'"]),
    (["--agents", '[{"name": "agent1", "lr": 1}, {"name": "agent2"}]'], ["agents[0]: unknown key 'lr'"]),
    (["--agents", '[{"name": "agent1"}, {"name": "bob"}]'], ["do not match the environment's roles"]),
    (["--env_kwargs", "[1, 2]"], ["'env_kwargs' expects a mapping"]),
    (["--env_kwargs", "{not json"], ["'env_kwargs' expects JSON"]),
    (["--env_kwargs", '{"colour": "red"}'], ["env_kwargs do not fit MatrixGameEnv"]),
    (["--env_kwargs", '{"local_payoff": "greedy"}'], ["env_kwargs of MatrixGameEnv", "local_payoff"]),
    (["--max_completion_length", "100000"], ["max_completion_length=100000", "context"]),
    (["positional"], ["unexpected argument 'positional'"]),
])
def test_bad_values_end_in_one_clean_error(cli, base, args, needles):
    assert_clean_error(cli(base + args), *needles)


@pytest.mark.parametrize("backend", ["wandb", "tensorboard", "mlflow"])  # mlflow: not in the extras, so it runs
def test_a_tracking_backend_that_is_not_installed_is_one_error_naming_the_extra(cli, base, backend):
    import importlib.util

    if importlib.util.find_spec(backend) is not None:
        pytest.skip(f"{backend} is installed here")
    assert_clean_error(cli(base + ["--report_to", backend]), "report_to", backend, "trl-multiagent[tracking]")


@pytest.mark.parametrize("env_kwargs,needle", [
    ({"max_turns": 0}, "max_turns"),
    ({"max_turns": "three"}, "max_turns"),
    ({"sandbox": {"timeout_s": -1}}, "timeout_s"),
])
def test_environment_arguments_out_of_range(cli, base, env_kwargs, needle):
    agents = json.dumps([{"name": "aux"}, {"name": "main"}])
    result = cli(base + ["--environment", "humaneval_aux_main", "--agents", agents,
                         "--env_kwargs", json.dumps(env_kwargs)])
    assert_clean_error(result, "AuxMainCodingEnv", needle)


def test_values_in_the_recipe_file_name_the_file(cli, base, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("trainer: magrpo\nenvironment: matrix_game\nlearning_rate: fast\n")
    line = assert_clean_error(cli(["train", "--config", recipe]), str(recipe), "'learning_rate' expects a number")
    assert "command line" not in line
    recipe.write_text("num_generations: 0\n")
    assert_clean_error(cli(["train", "--config", recipe]), str(recipe), "num_generations")
    recipe.write_text("lerning_rate: 0.1\n")
    assert_clean_error(cli(["train", "--config", recipe]), str(recipe), "did you mean 'learning_rate'")
    recipe.write_text("env: [1, 2]\nlearning_rate: 0.1\n")
    assert_clean_error(cli(["train", "--config", recipe]), "'env' must be a mapping")


# ------------------------------------------------------------------------------------------------ recipe files
def test_recipe_files(cli, tmp_path):
    missing = tmp_path / "missing.yaml"
    assert_clean_error(cli(["train", "--config", missing]), str(missing), "does not exist")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("model: caf\xe9\n".encode("latin-1"))
    assert_clean_error(cli(["train", "--config", latin]), str(latin), "not UTF-8")
    listing = tmp_path / "list.yaml"
    listing.write_text("- learning_rate: 0.1\n- max_steps: 2\n")
    assert_clean_error(cli(["train", "--config", listing]), str(listing), "YAML mapping")
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here\n")
    assert_clean_error(cli(["train", "--config", empty]), str(empty), "empty")
    broken = tmp_path / "broken.yaml"
    broken.write_text("learning_rate: 0.1\nagents: [{name: a}\n")
    assert_clean_error(cli(["train", "--config", broken]), str(broken), "not valid YAML", "line")
    assert_clean_error(cli(["train", "--config", tmp_path]), "is not a file")
    assert_clean_error(cli(["train", "--config"]), "--config needs the path")


# ------------------------------------------------------------------------------------------------ data files
DEBATE = ["--environment", "math_debate", "--trainer", "magrpo"]


@pytest.mark.parametrize("name,content,needles", [
    ("empty.jsonl", "", ["is empty"]),
    ("blank.jsonl", "\n  \n", ["is empty"]),
    ("bad.jsonl", '{"question": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": \n', ["line 2", "not valid JSON"]),
    ("rows.jsonl", '["1+1?", "2"]\n', ["line 1", "one JSON object per line"]),
    ("header.csv", "question,answer\n", ["only a header", "question, answer"]),
    ("ragged.csv", "question,answer\n1+1?,2\n2+2?,4,extra\n", ["line 3", "3 fields", "header has 2"]),
    ("types.jsonl", '{"question": "1+1?", "answer": "2"}\n{"question": 7, "answer": "4"}\n',
     ["line 2", "'question'", "a number", "line 1 holds a string"]),
    ("scalar.json", '"1+1?"', ["JSON array"]),
    ("ragged.json", '{"question": ["1+1?", "2+2?"], "answer": ["2"]}', ["lengths [1, 2]"]),
    ("none.json", "[]", ["no rows"]),
    ("columns.jsonl", '{"q": "1+1?", "a": "2"}\n', ["lacks the column(s)", "question"]),
    ("bad.parquet", "not parquet", ["not a readable Parquet file"]),
])
def test_dataset_files(cli, base, tmp_path, name, content, needles):
    path = tmp_path / name
    path.write_text(content)
    result = cli(base + DEBATE + ["--dataset", path, "--eval_dataset_split", "generated"])
    assert_clean_error(result, *needles)


def test_dataset_values_of_the_wrong_type_for_the_environment(cli, base, tmp_path):
    path = tmp_path / "grids.jsonl"
    path.write_text('{"task_id": "a", "grid": 5, "start": [0, 0], "goal": [1, 1]}\n')
    result = cli(base + ["--environment", "plan_path", "--agents", '[{"name": "tool"}, {"name": "plan"}]',
                         "--dataset", path, "--eval_dataset_split", "generated"])
    assert_clean_error(result, "row 0", "PlanPathEnv")


def test_missing_dataset_file(cli, base, tmp_path):
    assert_clean_error(cli(base + ["--dataset", tmp_path / "nope.jsonl"]), "nope.jsonl", "does not exist")


# ------------------------------------------------------------------------------------------------ output_dir
def _finished_run(path: Path, status: str = "finished", pid: int | None = None) -> dict[str, bytes]:
    path.mkdir(parents=True)
    (path / "run_status.json").write_text(json.dumps({"status": status, "pid": pid or 1, "host": socket.gethostname(),
                                                      "time": "2025-01-01T00:00:00"}))
    (path / "summary.json").write_text(json.dumps({"global_step": 6}))
    (path / "adapters").mkdir()
    (path / "adapters" / "weights.bin").write_bytes(b"trained")
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def _unchanged(path: Path, before: dict[str, bytes]) -> None:
    after = {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert after == before


def test_output_dir_that_is_a_file(cli, tiny_ab_model, tmp_path):
    target = tmp_path / "results.txt"
    target.write_text("keep me")
    result = cli(["train", "--config", TINY_RECIPE, "--model", tiny_ab_model, "--output_dir", target])
    assert_clean_error(result, "output_dir", "existing file")
    assert target.read_text() == "keep me"


def test_output_dir_with_a_finished_run_is_refused_and_names_the_ways_on(cli, tiny_ab_model, tmp_path):
    out = tmp_path / "done"
    before = _finished_run(out)
    (out / "checkpoint-6").mkdir()  # resuming is offered only where there is a checkpoint (tests/test_run_failures.py)
    result = cli(["train", "--config", TINY_RECIPE, "--model", tiny_ab_model, "--output_dir", out])
    assert_clean_error(result, "finished run", "--resume_from_checkpoint", "checkpoint-6", "--output_dir",
                       "--overwrite_output_dir true")
    _unchanged(out, before)


def test_output_dir_with_a_running_run_is_refused_even_with_overwrite(cli, tiny_ab_model, tmp_path):
    out = tmp_path / "busy"
    before = _finished_run(out, status="running", pid=os.getpid())  # this test process: alive
    result = cli(["train", "--config", TINY_RECIPE, "--model", tiny_ab_model, "--output_dir", out,
                  "--overwrite_output_dir", "true"])
    assert_clean_error(result, "still running")
    _unchanged(out, before)


def test_resume_checkpoint_missing_or_corrupt(cli, tiny_ab_model, tmp_path):
    out = tmp_path / "run"
    common = ["train", "--config", TINY_RECIPE, "--model", tiny_ab_model, "--output_dir", out]
    assert_clean_error(cli(common + ["--resume_from_checkpoint", tmp_path / "checkpoint-9"]), "checkpoint-9",
                       "does not exist")
    assert_clean_error(cli(common + ["--resume_from_checkpoint", "true"]), "no checkpoint")
    broken = out / "checkpoint-2"
    broken.mkdir(parents=True)
    (broken / "trainer_state.json").write_text("{not json")
    before = {p.name: p.read_bytes() for p in broken.iterdir()}
    assert_clean_error(cli(common + ["--resume_from_checkpoint", broken]), "corrupt", "trainer_state.json")
    assert {p.name: p.read_bytes() for p in broken.iterdir()} == before


def test_a_model_that_is_not_here_is_one_error(cli, tmp_path):
    result = cli(["train", "--config", TINY_RECIPE, "--model", tmp_path / "no-such-model",
                  "--output_dir", tmp_path / "run"])
    assert_clean_error(result, "no-such-model")
    assert not (tmp_path / "run" / "summary.json").exists()


# ------------------------------------------------------------------------------------------------ usage and help
def test_no_arguments_prints_usage_and_fails(cli):
    for args, script in (([], None), (["train"], None), ([], "recipes/magrpo.py")):
        result = cli(args, script=script)
        assert result.returncode == 2 and "Traceback" not in result.output
        assert "usage:" in result.stderr and "error:" in result.stderr
    assert_clean_error(cli(["trian"]), "unknown command 'trian'", "did you mean 'train'")


def test_help_lists_every_field_with_its_help(cli):
    from trl_multiagent.command.recipe import RecipeArguments, _fields
    from trl_multiagent.trainers import TRAINERS

    result = cli(["train", "--help"])
    assert result.returncode == 0, result.output[-2000:]
    fields = set(_fields(RecipeArguments)) | set(_fields(TRAINERS["magrpo"][0]))
    missing = [f for f in fields if f"--{f} " not in result.stdout and f"--{f}," not in result.stdout]
    assert not missing, missing
    assert "K: samples per agent and branch point." in result.stdout  # a trainer field's help text
    assert "--overwrite_output_dir true" in result.stdout  # the overwrite rule
    debate = cli(["train", "--trainer", "maporl", "--help"])
    assert debate.returncode == 0 and "--reward_mode" in debate.stdout and "--reward_mode" not in result.stdout
    with_recipe = cli(["train", "--config", "recipes/configs/tldr_magrpo.yaml", "--help"])
    assert "(default: outputs/tldr_magrpo)" in with_recipe.stdout  # the recipe's values are the defaults shown
    assert cli(["--help"]).returncode == 0


def test_recipe_scripts_insist_on_their_trainer(cli, base):
    assert_clean_error(cli(base[1:], script="recipes/mhgpo.py"), "recipes/mhgpo.py runs trainer 'mhgpo'")
    assert_clean_error(cli(base[1:], script="recipes/coding.py"), "environment 'humaneval_aux_main'")


@pytest.mark.parametrize("cmd", [
    [sys.executable, "-m", "trl_multiagent"],
    [sys.executable, "recipes/at_grpo.py", "--config", TINY_RECIPE, "--num_generations", "0"],
])
def test_fresh_interpreters(cmd):
    """The real entry points, without the forking harness."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("TRL_MULTIAGENT_TRACEBACK", None)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "error:" in proc.stderr
    assert time.perf_counter() - start < 180


# ------------------------------------------------------------------------------------------------ a whole run
def test_train_evaluates_before_and_after_and_writes_the_results(cli, tiny_ab_model, tmp_path):
    """The runner end to end on the tiny model: held-out evaluation before and after (one generation call per
    round), training, summary.json with paired intervals, report.md, the curve; the finished run is then protected
    and replaced only with --overwrite_output_dir true."""
    out = tmp_path / "run"
    args = ["train", "--config", TINY_RECIPE, "--model", tiny_ab_model, "--environment", "collaboration_game",
            "--max_steps", "2", "--max_completion_length", "1", "--eval_num_problems", "6", "--eval_temperature", "1",
            "--eval_num_samples", "2", "--eval_max_new_tokens", "1", "--output_dir", out]
    result = cli(args)
    assert result.returncode == 0, result.output[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["global_step"] == 2 and summary["algorithm"] == "MAGRPO"  # the trainer's summary
    assert summary["command"].startswith("python -m trl_multiagent train --config")
    assert summary["recipe"]["environment"] == "collaboration_game" and summary["generated_samples"]["rollouts"] == 2
    generated = summary["generated_samples"]  # max_completion_length 1: every completion is one token
    assert generated["total"] > 0 and generated["completion_tokens"] == generated["total"]
    ev = summary["evaluation"]
    assert ev["evaluator"] == "episodes" and ev["metric"] == "return" and ev["held_out_tasks"] == 6
    assert all(t.startswith("game/test/") for t in ev["task_ids"])  # the environment's held-out split
    assert ev["stages"]["before"]["generate_calls"] == 1 and ev["num_samples"] == 2
    team = ev["methods"]["team"]
    for key in ("before", "after", "gain"):
        assert set(team[key]) == {"mean", "ci95"} and len(team[key]["ci95"]) == 2
    assert (out / "report.md").read_text().count("| team |") >= 2 and (out / "reward_curve.png").is_file()
    assert json.loads((out / "run_status.json").read_text())["status"] == "finished"
    # what the team wrote on the held-out tasks, per stage: one row per response, its step's reward alongside
    per_task = [json.loads(line) for line in (out / "eval_per_task.jsonl").read_text().splitlines()]
    for stage in ("before", "after"):
        texts = [json.loads(line) for line in (out / f"eval_texts_{stage}.jsonl").read_text().splitlines()]
        assert texts and all({"method", "task_id", "sample", "turn", "agent", "text", "reward"} <= set(t)
                              and isinstance(t["text"], str) for t in texts)
        assert {t["task_id"] for t in texts} == set(ev["task_ids"]) and {t["sample"] for t in texts} == {0, 1}
        assert {t["agent"] for t in texts} == {"agent1", "agent2"} and {t["method"] for t in texts} == {"team"}
        for row in (r for r in per_task if r["stage"] == stage and r["method"] == "team"):
            mine = [t for t in texts if t["task_id"] == row["task_id"] and t["agent"] == "agent1"]
            returns = [sum(t["reward"] for t in mine if t["sample"] == s) for s in (0, 1)]
            assert abs(sum(returns) / 2 - row["return"]) < 1e-9  # the texts' rewards make the evaluated return

    kept = (out / "summary.json").read_bytes()
    assert_clean_error(cli(args), "finished run", "--overwrite_output_dir true")
    assert (out / "summary.json").read_bytes() == kept
    again = cli(args + ["--overwrite_output_dir", "true", "--max_steps", "1", "--eval_stages", "after"])
    assert again.returncode == 0, again.output[-4000:]
    replaced = json.loads((out / "summary.json").read_text())
    assert replaced["global_step"] == 1 and set(replaced["evaluation"]["stages"]) == {"after"}
    # no text of the replaced run passes for this one's
    assert (out / "eval_texts_after.jsonl").is_file() and not (out / "eval_texts_before.jsonl").exists()


def test_max_steps_zero_evaluates_the_untrained_team_only(cli, tiny_ab_model, tmp_path):
    out = tmp_path / "eval-only"
    result = cli(["train", "--config", TINY_RECIPE, "--model", tiny_ab_model, "--environment", "collaboration_game",
                  "--max_steps", "0", "--max_completion_length", "1", "--eval_num_problems", "3",
                  "--eval_max_new_tokens", "1", "--output_dir", out])
    assert result.returncode == 0, result.output[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert "global_step" not in summary and set(summary["evaluation"]["stages"]) == {"before"}
    assert summary["evaluation"]["decoding"]["do_sample"] is False and summary["evaluation"]["num_samples"] == 1


def test_baselines_can_take_fewer_samples_than_the_team(cli, tiny_ab_model, tmp_path):
    out, recipe = tmp_path / "fewer", tmp_path / "tldr.yaml"
    recipe.write_text((ROOT / TINY_RECIPE).read_text().replace("{name: agent1}", "{name: summary}")
                      .replace("{name: agent2}", "{name: elaboration}"))
    result = cli(["train", "--config", recipe, "--model", tiny_ab_model, "--environment", "tldr",
                  "--max_steps", "0", "--eval_num_problems", "2", "--eval_temperature", "1", "--eval_num_samples", "3",
                  "--eval_baseline_num_samples", "1", "--eval_team_before_is_naive", "true",
                  "--eval_max_new_tokens", "2", "--output_dir", out])
    assert result.returncode == 0, result.output[-4000:]
    ev = json.loads((out / "summary.json").read_text())["evaluation"]
    # the naive baseline stands for the untrained team, so it keeps the team's samples; the others take one
    assert ev["num_samples_per_method"] == {"team": 3, "single": 1, "naive": 3, "sequential": 1, "discussion": 1}
    # generated: single 1 x 2 tasks, naive 3 x 2 agents x 2 tasks, sequential's second writer 1 x 2 (its first
    # writer's part is naive's first draft), discussion's revisions 1 x 2 agents x 2 (its drafts are naive's)
    assert ev["stages"]["before"]["generated_sequences"] == 2 + 12 + 2 + 4
    assert "samples per task: " in (out / "report.md").read_text()


def test_other_files_and_import_paths(cli, base, tmp_path):
    rows = tmp_path / "train.jsonl"
    rows.write_text('{"question": "1+1?", "answer": "2"}\n')
    assert_clean_error(cli(base + DEBATE + ["--dataset", rows, "--eval_dataset_split", tmp_path / "held.jsonl"]),
                       "held.jsonl", "does not exist")
    assert_clean_error(cli(base + DEBATE + ["--dataset", rows, "--eval_dataset_split", "generated",
                                            "--dataset_transform", "no_such_module:fix"]), "dataset_transform",
                       "no_such_module")
    agents = json.dumps([{"name": "aux"}, {"name": "main"}])
    assert_clean_error(cli(base + ["--environment", "humaneval_aux_main", "--agents", agents,
                                   "--env_kwargs", '{"reward_fn": "rewards.nothing:here"}']), "reward_fn")
    assert_clean_error(cli(base + ["--evaluator", "no_such_module:Judge", "--environment", "plan_path",
                                   "--agents", '[{"name": "tool"}, {"name": "plan"}]']), "evaluator", "Judge")
