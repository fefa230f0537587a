"""docs/guides/new_environment.md, run as written: its files under ``my_task/`` (the environment, the recipes, the
functions of a multi-turn FunctionEnvironment, the user's own tests) are extracted from the guide into a folder of
their own, outside the repository, and used the way the guide says: the user's tests pass, the recipe plans its
evaluation on the held-out split, and the team trains and is evaluated under both launchers (``python -m
trl_multiagent train`` and ``recipes/magrpo.py``), with the file form and with the module form on PYTHONPATH."""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path

import pytest
from transformers import GenerationConfig

from tests.cli_harness import ROOT, CommandRunner
from trl_multiagent.command.cli import parse_recipe
from trl_multiagent.command.recipe import environment_factory, held_out_tasks
from trl_multiagent.command.runner import Run
from trl_multiagent.rollout import JointTreeSampler
from trl_multiagent.runtime.user_code import load_file_module
from trl_multiagent.testing import ScriptedPool

GUIDE = ROOT / "docs" / "guides" / "new_environment.md"
#: A fenced block whose first line is ``# my_task/<file>`` is that file.
BLOCK = re.compile(r"^```(?:python|yaml)\n# (my_task/[\w.]+)\n(.*?)^```$", re.S | re.M)
#: What makes a run on the tiny model (tests/tiny.py) quick; everything else is the guide's recipe.
TINY = ["--max_completion_length", "1", "--eval_max_new_tokens", "1", "--eval_num_problems", "2",
        "--num_generations", "2", "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true",
        "--logging_steps", "1"]


def guide_files() -> dict[str, str]:
    files = {name: f"# {name}\n{body}" for name, body in BLOCK.findall(GUIDE.read_text())}
    expected = {"my_task/secret_sum.py", "my_task/secret_sum.yaml", "my_task/test_secret_sum.py",
                "my_task/sum_functions.py", "my_task/sum_functions.yaml", "my_task/target_sum.py",
                "my_task/test_target_sum.py"}
    assert expected <= set(files), sorted(files)
    return files


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user's folder: ``my_task/`` with the guide's files, as the current directory."""
    for name, text in guide_files().items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    for module in ("secret_sum", "target_sum"):  # the user's tests import them from my_task/, and no other
        monkeypatch.delitem(sys.modules, module, raising=False)
    yield tmp_path
    for module in ("secret_sum", "target_sum"):
        sys.modules.pop(module, None)


@pytest.fixture(scope="module")
def cli():
    runner = CommandRunner()
    yield runner
    runner.close()


def test_the_guides_own_tests_pass(project, monkeypatch):
    """``pytest my_task/test_secret_sum.py`` and ``test_target_sum.py``, as pytest runs them (``my_task/`` on the
    path): both samplers, with the package's ScriptedPool."""
    monkeypatch.syspath_prepend(str(project / "my_task"))
    ran = []
    for name in ("test_secret_sum.py", "test_target_sum.py"):
        module = load_file_module(project / "my_task" / name)
        tests = [(k, v) for k, v in vars(module).items() if k.startswith("test_") and callable(v)]
        for test_name, test in tests:
            test()
            ran.append(test_name)
    assert "test_the_magrpo_sampler_and_its_learning_signal" in ran and "test_the_at_grpo_sampler" in ran
    assert "test_sequential_at_grpo" in ran


def test_the_recipe_plans_its_evaluation_on_the_eval_split(project, caplog):
    """The guide's recipe, found by path beside it: the episodes evaluator, headline success, 32 held-out tasks of
    ``make_dataset(split="eval")``, none of them a training task."""
    caplog.set_level(logging.INFO, logger="trl_multiagent.command.recipe")
    recipe, config, given = parse_recipe(["--config", "my_task/secret_sum.yaml", "--output_dir", str(project / "o")])
    assert recipe.environment == f"{project / 'my_task' / 'secret_sum.py'}:SecretSumEnv"
    run = Run(recipe, config, given)
    run.prepare()
    assert run.evaluator.name == "episodes" and run.evaluator.metrics_preference[0] == "success"
    assert len(run.tasks) == 32 and all(t["task_id"].startswith("eval/") for t in run.tasks)
    train = {(r["alice_secret"], r["bob_secret"]) for r in run.dataset}
    assert not train & {(t["alice_secret"], t["bob_secret"]) for t in run.tasks}
    assert "split='eval'" in caplog.text


def test_the_multi_turn_function_environment(project):
    """The FunctionEnvironment example: three turns at most (transition_fn, max_turns), ended early once both
    answers are right (done_fn); success in info; its data files plan an evaluation too."""
    secret_sum = load_file_module(project / "my_task" / "secret_sum.py")
    secret_sum.SecretSumEnv.make_dataset(20, split="train").to_json("my_task/sums_train.jsonl")
    secret_sum.SecretSumEnv.make_dataset(4, split="eval").to_json("my_task/sums_held_out.jsonl")
    recipe, config, given = parse_recipe(["--config", "my_task/sum_functions.yaml", "--output_dir",
                                          str(project / "o")])
    _, factory, probe = environment_factory(recipe)
    assert probe.max_turns == 3

    def script(wrong_turns):
        def answer(agent, prompt, k):
            mine = int(re.search(r"secret number is (\d+)", prompt).group(1))
            said = re.search(r'partner said: "My number is (\d+)', prompt)
            if said is None:
                return f"My number is {mine}."
            turn = 2 if "was checked" in prompt else 1
            return str(mine + int(said.group(1)) + (1 if turn in wrong_turns else 0))
        return answer

    task = {"task_id": "t", "alice_secret": 12, "bob_secret": 30}
    solved_at_once = JointTreeSampler(num_samples=1, num_turns=3).rollout(
        ScriptedPool(["alice", "bob"], script(wrong_turns=())), factory, [task], GenerationConfig())
    assert [(j.turn, j.reward, j.done) for j in solved_at_once.joint_actions] == [(0, 0.0, False), (1, 1.0, True)]
    assert solved_at_once.joint_actions[-1].info == {"answers_right": 1.0, "success": 1.0}
    second_try = JointTreeSampler(num_samples=1, num_turns=3).rollout(
        ScriptedPool(["alice", "bob"], script(wrong_turns=(1,))), factory, [task], GenerationConfig())
    assert [(j.turn, j.reward, j.done) for j in second_try.joint_actions] == \
        [(0, 0.0, False), (1, 0.0, False), (2, 1.0, True)]
    run = Run(recipe, config, given)
    run.prepare()
    assert run.evaluator.name == "episodes" and len(run.tasks) == 4 and len(run.dataset) == 20


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_both_launchers_train_and_evaluate_the_users_environment(cli, project, tiny_ab_model):
    """From the user's folder: the file form under ``python -m trl_multiagent train``; the module form under
    ``recipes/magrpo.py``, refused without PYTHONPATH (the error says how to make the module importable and names
    the environment's class, not a reward function) and trained with it."""
    out = project / "run-module-command"
    result = cli(["train", "--config", "my_task/secret_sum.yaml", "--model", tiny_ab_model, "--max_steps", "2",
                  "--output_dir", out, *TINY], cwd=project)
    assert result.returncode == 0, result.output[-4000:]
    ev = _summary(out)["evaluation"]
    assert ev["evaluator"] == "episodes" and ev["metric"] == "success" and ev["held_out_tasks"] == 2
    texts = [json.loads(line) for line in (out / "eval_texts_after.jsonl").read_text().splitlines()]
    assert {(t["agent"], t["turn"]) for t in texts} == {(a, t) for a in ("alice", "bob") for t in (0, 1)}
    # the tiny model writes A and B: no reward ever differs, and the trainer says so
    assert "no learning signal: 2 rollouts in a row (steps 1-2)" in result.stderr

    script = str(ROOT / "recipes" / "magrpo.py")
    module_form = ["--config", "my_task/secret_sum.yaml", "--environment", "secret_sum:SecretSumEnv",
                   "--model", tiny_ab_model, "--max_steps", "1", *TINY]
    refused = cli([*module_form, "--output_dir", project / "refused"], script=script, cwd=project)
    assert refused.returncode == 2 and "Traceback" not in refused.output, refused.output[-4000:]
    error = refused.stderr.strip().splitlines()[-1]
    assert "error: Cannot import environment 'secret_sum:SecretSumEnv'" in error
    assert "PYTHONPATH" in error and "secret_sum.py:SecretSumEnv" in error and "reward" not in error
    assert not (project / "refused").exists()

    out = project / "run-script"
    result = cli([*module_form, "--output_dir", out], script=script, cwd=project,
                 env={"PYTHONPATH": "my_task"})
    assert result.returncode == 0, result.output[-4000:]
    summary = _summary(out)
    assert summary["global_step"] == 1 and summary["recipe"]["environment"] == "secret_sum:SecretSumEnv"
    assert (out / "eval_texts_before.jsonl").is_file() and (out / "eval_texts_after.jsonl").is_file()


def test_fewer_held_out_tasks_than_asked_are_said(project, caplog):
    """The guide's two examples of held-out splits short of eval_num_problems: SecretSumEnv's 521 pairs (the
    evaluation takes them all: truncated) and TargetSumEnv's 50 odd targets drawn with replacement (repeated)."""
    caplog.set_level(logging.INFO, logger="trl_multiagent.command.recipe")
    recipe, config, _ = parse_recipe(["--config", "my_task/secret_sum.yaml", "--eval_num_problems", "1000"])
    tasks = held_out_tasks(recipe, config, 1000)
    assert len(tasks) == 521
    assert "1000 held-out tasks were asked for (eval_num_problems, or the evaluator's default when it is 0), but " \
           "the generated split 'eval' of SecretSumEnv has only 521: the evaluation uses those 521 (truncated, " \
           "nothing repeated)" in caplog.text
    caplog.clear()
    recipe, config, _ = parse_recipe(["--environment", "my_task/target_sum.py:TargetSumEnv"])
    tasks = held_out_tasks(recipe, config, 64)
    assert len(tasks) == 64 and len(set(tasks["target"])) == 38
    assert "the generated split 'eval' of TargetSumEnv has only 38 distinct tasks among the 64 held-out tasks " \
           "evaluated (rows equal but for their id): the repeats are evaluated as they are" in caplog.text
    caplog.clear()
    recipe, config, _ = parse_recipe(["--config", "my_task/secret_sum.yaml"])
    assert len(held_out_tasks(recipe, config, 32)) == 32  # enough distinct tasks: nothing to say
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
