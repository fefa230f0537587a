"""``python -m trl_multiagent train-verifier``: MAPoRL's learned verifier from sampled solutions to a saved, evaluated
verifier (App. E). The metrics by hand; every config mistake as one error line before any model loads; the command end
to end on a tiny model (collect -> balance -> train -> save -> evaluate -> summary.json); the debate trainer loading
what it saved; the two recipes."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
import torch
import yaml
from datasets import Dataset

from trl_multiagent.command.cli import main, parse_recipe
from trl_multiagent.command.train_verifier import VerifierRun, parse_config
from trl_multiagent.environments.debate import DebateEnv
from trl_multiagent.metrics.classification import (
    accuracy_at_threshold,
    average_ranks,
    question_bootstrap,
    roc_auc,
)
from trl_multiagent.metrics.stats import resample_indices
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers import MAPoRLConfig, MAPoRLTrainer
from trl_multiagent.verifier.learned import num_training_steps

from .numerics import assert_same_computation
from .tiny import model_terms

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------------- the metrics
def test_accuracy_at_threshold_by_hand():
    # predictions (s >= 0.5): right, wrong, wrong (0.5 counts as 'correct'), right
    assert accuracy_at_threshold([0.9, 0.4, 0.5, 0.2], [True, True, False, False]) == 0.5
    # at 0.3 the 0.4 counts as 'correct' too: right, right, wrong, right
    assert accuracy_at_threshold([0.9, 0.4, 0.5, 0.2], [True, True, False, False], threshold=0.3) == 0.75
    assert accuracy_at_threshold([0.9, 0.4, 0.5, 0.2], [True, True, False, False], threshold=0.45) == 0.5
    assert accuracy_at_threshold([0.9, 0.4, 0.5, 0.2], [True, False, True, False]) == 1.0
    with pytest.raises(ValueError, match="2 scores but 1 labels"):
        accuracy_at_threshold([0.1, 0.2], [True])


def test_average_ranks_share_ties():
    assert average_ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
    assert average_ranks([0.5, 0.5, 0.5]) == [2.0, 2.0, 2.0]


def test_auc_by_hand():
    # correct 0.8, 0.4 against incorrect 0.4, 0.1: pairs 1, 1, 1/2 (the tie), 1 -> 3.5 / 4
    assert roc_auc([0.8, 0.4, 0.4, 0.1], [True, True, False, False]) == 0.875
    assert roc_auc([0.3, 0.3, 0.3, 0.3], [True, False, True, False]) == 0.5  # one score for all: chance
    assert roc_auc([0.9, 0.8, 0.2, 0.1], [True, True, False, False]) == 1.0
    assert roc_auc([0.1, 0.2, 0.8, 0.9], [True, True, False, False]) == 0.0
    # a 0/1 scorer: correct (1, 1, 0), incorrect (1, 0, 0, 0): TPR 2/3, FPR 1/4 -> (1 + 2/3 - 1/4) / 2 = 17/24
    scores = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    labels = [True, True, True, False, False, False, False]
    assert roc_auc(scores, labels) == pytest.approx(17 / 24, abs=1e-15)
    # the same by the pair count: each correct 1 beats three incorrect 0s and ties the incorrect 1 (3.5 each);
    # the correct 0 ties three incorrect 0s (1.5): 8.5 of 12 pairs
    assert roc_auc(scores, labels) == pytest.approx(8.5 / 12, abs=1e-15)
    with pytest.raises(ValueError, match="correct and incorrect"):
        roc_auc([0.2, 0.3], [True, True])
    with pytest.raises(ValueError, match="NaN"):
        roc_auc([math.nan, 0.3], [True, False])


def test_question_bootstrap_resamples_questions():
    # question A: both solutions judged right; question B: both judged wrong -> accuracy 0.5 on all four
    scores = [[0.9, 0.1], [0.1, 0.9]]
    labels = [[True, False], [True, False]]
    out = question_bootstrap(accuracy_at_threshold, scores, labels, num_resamples=2000, seed=3)
    assert out["mean"] == 0.5 and out["num_questions"] == 2 and out["num_solutions"] == 4
    # a resample is AA (1.0), AB / BA (0.5) or BB (0.0), each of AA and BB with probability 1/4: the 95% interval
    # reaches both ends
    assert out["ci95"] == [0.0, 1.0]
    assert out["resamples_used"] == 2000
    # one question: every resample is that question, so the interval is the point
    one = question_bootstrap(roc_auc, [[0.8, 0.4, 0.4, 0.1]], [[True, True, False, False]], num_resamples=500)
    assert one["mean"] == 0.875 and one["ci95"] == [0.875, 0.875]
    # question A holds only correct solutions, B only incorrect ones: the AUC exists only on resamples with both
    both = question_bootstrap(roc_auc, [[0.9], [0.2]], [[True], [False]], num_resamples=1000, seed=5)
    rows = resample_indices(2, 1000, 5)
    assert both["resamples_used"] == sum(len(set(row.tolist())) == 2 for row in rows)
    assert both["mean"] == 1.0 and both["ci95"] == [1.0, 1.0]


# --------------------------------------------------------------------------------------------------- a tiny task
class LetterDebate(DebateEnv):
    """A debate the tiny A/B model can answer: the answer is the first A or B of a response, the gold answer is A,
    so about half of its samples are right. Generated questions per split, disjoint by name."""

    required_columns = ("question", "answer")
    prompt_template = "q: {question}"

    @classmethod
    def make_dataset(cls, num_tasks: int | None = 8, seed: int = 0, split: str = "train"):
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        n = num_tasks or 8
        return Dataset.from_list([{"task_id": f"{split}/{seed}/{i}", "question": f"{split} question {i}",
                                   "answer": "A"} for i in range(n)])

    def extract_answer(self, response: str) -> str | None:
        found = re.search("[AB]", response)
        return found.group(0) if found else None


ENV = "tests.test_verifier_training:LetterDebate"


def _recipe(tmp_path: Path, model: str, **overrides) -> Path:
    values = {"environment": ENV, "model": model, "num_questions": 4, "num_samples": 6, "temperature": 1.0,
              "max_new_tokens": 4, "per_class": 2, "eval_num_questions": 3, "eval_per_class": 2, "lora_r": 4,
              "lora_alpha": 8, "epochs": 2, "learning_rate": 1.0e-2, "batch_size": 4, "score_batch_size": 5,
              "eval_bootstrap_resamples": 200, "model_dtype": "float64", "num_threads": 1,
              "output_dir": str(tmp_path / "verifier"), "seed": 0, **overrides}
    path = tmp_path / "verifier.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model load fails the test: the checks must all run before one."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the checks finished")

    monkeypatch.setattr("trl_multiagent.team.pool.load_base_model", refuse)


def _one_error(capsys, code: int, *needles: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert code == 2, err[-3000:]
    assert "Traceback" not in err
    assert len(lines) == 1, err[-3000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# --------------------------------------------------------------------------------------------------- config errors
@pytest.mark.parametrize("args,needles", [
    (["--learning_rate", "fast"], ["command line", "'learning_rate' expects a number, got 'fast'"]),
    (["--learning_rate", "-0.0001"], ["learning_rate must be a number > 0"]),
    (["--learning_rate", "nan"], ["learning_rate must be a number > 0"]),
    (["--epochs", "2.5"], ["'epochs' expects an integer"]),
    (["--epochs", "0"], ["epochs must be an integer >= 1, got 0"]),
    (["--num_samples", "0"], ["num_samples must be an integer >= 1"]),
    (["--per_class", "-2"], ["per_class must be an integer >= 1"]),
    (["--temperature", "0"], ["temperature must be a number > 0"]),
    (["--top_p", "1.5"], ["top_p must be a number in (0, 1]"]),
    (["--latter_fraction", "0"], ["latter_fraction must be a number in (0, 1]"]),
    (["--eval_threshold", "2"], ["eval_threshold must be a number in [0, 1]"]),
    (["--eval_bootstrap_resamples", "10"], ["eval_bootstrap_resamples"]),
    (["--quantization", "3bit"], ["quantization must be one of"]),
    (["--model_dtype", "int8"], ["model_dtype must be one of"]),
    (["--fill_missing", "maybe"], ["'fill_missing' expects true/false"]),
    (["--epoch", "3"], ["command line: unknown key 'epoch'", "did you mean 'epochs'"]),
    (["positional"], ["unexpected argument 'positional'"]),
    (["--environment", "matrix_game"], ["is not a debate environment"]),
    (["--environment", "chess"], ["Unknown environment 'chess'"]),
    (["--env_kwargs", '{"num_agents": 1}'], ["num_agents"]),
    (["--agent", "judge"], ["agent 'judge' is not a role", "agent1"]),
    (["--eval_split", "validation"], ["eval_split 'validation'", "generated"]),
])
def test_config_errors_are_one_line_before_any_model_loads(args, needles, tiny_ab_model, tmp_path, capsys,
                                                             no_model_loads):
    recipe = _recipe(tmp_path, tiny_ab_model)
    code = main(["train-verifier", "--config", str(recipe), *args])
    _one_error(capsys, code, *needles)
    assert not (tmp_path / "verifier").exists()


def test_errors_in_the_file_name_the_file(tiny_ab_model, tmp_path, capsys, no_model_loads):
    recipe = _recipe(tmp_path, tiny_ab_model, per_clas=3)
    _one_error(capsys, main(["train-verifier", "--config", str(recipe)]), str(recipe), "unknown key 'per_clas'",
               "did you mean 'per_class'")
    recipe = _recipe(tmp_path, tiny_ab_model, batch_size=0)
    _one_error(capsys, main(["train-verifier", "--config", str(recipe)]), str(recipe), "batch_size")
    _one_error(capsys, main(["train-verifier", "--config", str(tmp_path / "none.yaml")]), "none.yaml",
               "does not exist")
    _one_error(capsys, main(["train-verifier"]), "no recipe given")


def test_data_files_need_a_held_out_file(tiny_ab_model, tmp_path, capsys, no_model_loads):
    rows = tmp_path / "questions.jsonl"
    rows.write_text("".join(json.dumps({"question": f"q{i}", "answer": "A"}) + "\n" for i in range(6)))
    recipe = _recipe(tmp_path, tiny_ab_model, dataset=str(rows))
    _one_error(capsys, main(["train-verifier", "--config", str(recipe)]), "needs eval_split")
    _one_error(capsys, main(["train-verifier", "--config", str(recipe), "--eval_split", "test"]),
               "eval_split must be another data file")
    _one_error(capsys, main(["train-verifier", "--config", str(recipe), "--eval_split", str(rows)]),
               "held-out question(s) are also training questions")
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps({"question": f"h{i}", "answer": "A"}) + "\n" for i in range(2)))
    _one_error(capsys, main(["train-verifier", "--config", str(recipe), "--eval_split", str(held),
                             "--num_questions", "7"]), "has 6 rows in its training split")
    _one_error(capsys, main(["train-verifier", "--config", str(recipe), "--eval_split", str(held)]),
               "the held-out split has 2 questions, eval_num_questions asks for 3")


def test_a_model_that_is_not_here(tiny_ab_model, tmp_path, capsys, no_model_loads):
    recipe = _recipe(tmp_path, tiny_ab_model)
    _one_error(capsys, main(["train-verifier", "--config", str(recipe), "--model", str(tmp_path / "no-model")]),
               "no-model")
    _one_error(capsys, main(["train-verifier", "--config", str(recipe), "--verifier_model",
                             str(tmp_path / "no-verifier-model")]), "no-verifier-model")


def test_fill_missing_needs_numeric_answers(tmp_path, capsys, no_model_loads, tiny_ab_model):
    recipe = _recipe(tmp_path, tiny_ab_model, environment="nli_debate", fill_missing=True)
    _one_error(capsys, main(["train-verifier", "--config", str(recipe)]), "fill_missing needs numeric gold answers",
               "entailment")


def test_output_dir_rules(tiny_ab_model, tmp_path, capsys, no_model_loads):
    recipe = _recipe(tmp_path, tiny_ab_model)
    existing = tmp_path / "earlier"
    existing.mkdir()
    (existing / "summary.json").write_text("keep me")
    _one_error(capsys, main(["train-verifier", "--config", str(recipe), "--output_dir", str(existing)]),
               "already exists and is not empty", "summary.json", "--overwrite true")
    assert (existing / "summary.json").read_text() == "keep me"
    a_file = tmp_path / "results.txt"
    a_file.write_text("keep me too")
    _one_error(capsys, main(["train-verifier", "--config", str(recipe), "--output_dir", str(a_file)]),
               "existing file")
    _one_error(capsys, main(["train-verifier", "--config", str(recipe), "--output_dir", str(a_file / "sub")]),
               "cannot be created", "results.txt")
    assert a_file.read_text() == "keep me too"


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may write anywhere")
def test_an_unwritable_output_dir(tiny_ab_model, tmp_path, capsys, no_model_loads):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        recipe = _recipe(tmp_path, tiny_ab_model)
        _one_error(capsys, main(["train-verifier", "--config", str(recipe), "--output_dir", str(locked / "out")]),
                   "cannot be written")
    finally:
        locked.chmod(0o700)


def test_a_valid_recipe_passes_every_check_without_a_model(tiny_ab_model, tmp_path, no_model_loads):
    config, given = parse_config(["--config", str(_recipe(tmp_path, tiny_ab_model)), "--epochs", "3"])
    assert config.epochs == 3 and given["epochs"] == 3 and config.learning_rate == 1e-2
    run = VerifierRun(config, given)
    run.prepare()
    assert run.agent == "agent1"
    assert [t["task_id"] for t in run.train_tasks] == [f"train/0/{i}" for i in range(4)]
    assert [t["task_id"] for t in run.held_out_tasks] == [f"test/0/{i}" for i in range(3)]


# --------------------------------------------------------------------------------------------------- end to end
def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_command_end_to_end_and_the_debate_trainer_loads_the_verifier(tiny_ab_model, tmp_path, capsys):
    recipe = _recipe(tmp_path, tiny_ab_model)
    out = tmp_path / "verifier"
    assert main(["train-verifier", "--config", str(recipe)]) == 0, capsys.readouterr().err[-3000:]
    for name in ("summary.json", "report.md", "solutions.jsonl", "held_out_scores.jsonl", "verifier.json",
                 "adapters/team.json", "adapters/verifier/adapter_model.safetensors",
                 "adapters/verifier_head/value_head.safetensors"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["command"] == f"python -m trl_multiagent train-verifier --config {recipe}"

    # collect: every question answered num_samples times, labelled by the gold check (the first A or B is 'A')
    solutions = _jsonl(out / "solutions.jsonl")
    train = [r for r in solutions if r["split"] == "train"]
    held = [r for r in solutions if r["split"] == "held_out"]
    assert len(train) == 4 * 6 and len(held) == 3 * 6
    for r in solutions:
        first = re.search("[AB]", r["solution"])
        assert r["answered"] == bool(first) and r["correct"] == bool(first and first.group(0) == "A")
    assert {r["question"] for r in train}.isdisjoint({r["question"] for r in held})  # questions never trained on

    # balance: per question at most per_class of each class, as many correct as incorrect, answered ones only
    data = summary["data"]
    assert data["train"]["sampled"] == 24 and data["held_out"]["sampled"] == 18
    assert data["train"]["balanced"] == 2 * data["train"]["balanced_correct"] > 0
    assert data["train"]["filled_in"] == 0
    scored = _jsonl(out / "held_out_scores.jsonl")
    assert len(scored) == data["held_out"]["balanced"] == 2 * data["held_out"]["balanced_correct"]
    kept_held = {(r["question"], r["solution"]) for r in held if r["answered"]}
    for question in {r["question"] for r in scored}:
        rows = [r for r in scored if r["question"] == question]
        assert sum(r["correct"] for r in rows) == len(rows) / 2 <= 2
        assert all((r["question"], r["solution"]) in kept_held for r in rows)

    # train: one loss per optimizer step
    steps = num_training_steps(data["train"]["balanced"], 4, 2)
    assert summary["training"]["steps"] == steps == len(summary["training"]["loss_per_step"])

    # evaluate: the rule verifier is the gold check (scores 1 / 0 = the labels); the summary's numbers are the
    # metrics of the per-solution scores it wrote
    assert [r["rule"] for r in scored] == [float(r["correct"]) for r in scored]
    held_out = summary["held_out"]
    assert held_out["rule"]["accuracy"]["mean"] == 1.0 and held_out["rule"]["auc"]["mean"] == 1.0
    labels = [r["correct"] for r in scored]
    learned = [r["learned"] for r in scored]
    assert all(0.0 <= s <= 1.0 for s in learned)
    assert held_out["learned"]["accuracy"]["mean"] == accuracy_at_threshold(learned, labels, 0.5)
    assert held_out["learned"]["auc"]["mean"] == roc_auc(learned, labels)
    assert held_out["learned"]["accuracy"]["num_questions"] == data["held_out"]["balanced_questions"]
    report = (out / "report.md").read_text()
    assert f"{held_out['learned']['auc']['mean']:.3f}" in report and "rule (gold-answer check" in report

    # the debate trainer loads what was saved and scores answers with it (another batching of the same model:
    # equal up to rounding, tests/numerics.py)
    args = MAPoRLConfig(output_dir=str(tmp_path / "debate"), verifier=str(out), num_turns=1,
                           reward_mode="immediate", episodes_per_step=2, max_completion_length=4,
                           per_device_train_batch_size=4, critic_lora_r=4, report_to=[], save_strategy="no",
                           disable_tqdm=True, model_dtype="float64", penalize_no_boxed=False, penalize_no_eos=False,
                           min_response_tokens=0, penalize_repetition=False, penalize_post_boxed=False)
    agents = [AgentSpec(a, model=tiny_ab_model, lora_r=4, lora_alpha=8) for a in ("agent1", "agent2")]
    trainer = MAPoRLTrainer(agents, LetterDebate, args, LetterDebate.make_dataset(2))
    assert trainer.sampler.scorer == trainer.verifier_model.score
    again = trainer.verifier_model.score([r["question"] for r in scored], [r["solution"] for r in scored])
    tokens = sum(len(trainer.verifier_model.encode(r["question"], r["solution"])[0]) for r in scored)
    assert_same_computation(torch.tensor(again), torch.tensor(learned), terms=model_terms(tokens),
                            what="held-out scores of the reloaded verifier")

    # the results are never overwritten silently; with --overwrite the earlier run's files are replaced
    before = (out / "summary.json").read_bytes()
    _one_error(capsys, main(["train-verifier", "--config", str(recipe)]), "already exists and is not empty")
    assert (out / "summary.json").read_bytes() == before
    assert main(["train-verifier", "--config", str(recipe), "--overwrite", "--epochs", "1"]) == 0
    rerun = json.loads((out / "summary.json").read_text())
    assert rerun["training"]["epochs"] == 1 and rerun["given"]["overwrite"] is True


def test_no_balanced_data_is_one_clear_error_after_sampling(tiny_ab_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(LetterDebate, "gold_answer", lambda self, task: "C")  # nothing the model writes is right
    recipe = _recipe(tmp_path, tiny_ab_model)
    assert main(["train-verifier", "--config", str(recipe)]) == 1
    err = capsys.readouterr().err
    assert "no training question has both a correct and an incorrect solution" in err and "fill_missing" in err
    assert not (tmp_path / "verifier" / "summary.json").exists()


# --------------------------------------------------------------------------------------------------- the recipes
def test_the_recipes(tmp_path, no_model_loads):
    config, _ = parse_config(["--config", str(ROOT / "recipes/configs/verifier_math_easy.yaml"),
                              "--output_dir", str(tmp_path / "verifier")])
    run = VerifierRun(config)
    run.prepare()  # environment, questions, held-out split, model: all here, nothing loaded
    assert config.output_dir == str(tmp_path / "verifier")
    recipe, _ = parse_config(["--config", str(ROOT / "recipes/configs/verifier_math_easy.yaml")])
    # the debate recipe is the easy debate recipe scored by the verifier the first recipe saves
    _, debate, given = parse_recipe(["--config", str(ROOT / "recipes/configs/math_easy_debate_learned_verifier.yaml")])
    _, plain, plain_given = parse_recipe(["--config", str(ROOT / "recipes/configs/math_easy_debate.yaml")])
    assert debate.verifier == recipe.output_dir == "outputs/verifier_math_easy"
    assert {k: v for k, v in given.items() if k not in ("verifier", "output_dir")} == \
        {k: v for k, v in plain_given.items() if k not in ("verifier", "output_dir")}
    assert given["env_kwargs"] == recipe.env_kwargs and debate.max_completion_length == recipe.max_new_tokens
    assert debate.temperature == recipe.temperature and given["model"] == recipe.model
