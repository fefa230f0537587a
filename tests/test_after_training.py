"""After training (issue 62): evaluate a saved team on one's own data (``python -m trl_multiagent evaluate``), ask it
one question from Python (``Team.from_pretrained(dir).play(task)``, no gold answer needed), train it more
(``resume_from_checkpoint`` exactly, ``init_adapters`` as a warm start), and the ``trl-multiagent`` console script.
The README's "After training" section runs as written on a tiny chat model standing in for the demo's; the rest are
scripted pools and files, no model."""

from __future__ import annotations

import json
import shlex
import shutil
import string
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import GenerationConfig

from tests.cli_harness import ROOT, CommandRunner
from tests.tiny import save_tiny
from trl_multiagent.command.evaluate import AdaptersOff
from trl_multiagent.environments import MathToolEnv
from trl_multiagent.errors import RecipeError
from trl_multiagent.evaluation import TEAM, EpisodeEvaluator, evaluate_team, evaluation_section, write_run_outputs
from trl_multiagent.evaluation.report import task_groups
from trl_multiagent.team.pool import Generation

GREEDY = GenerationConfig(max_new_tokens=4, do_sample=False)
README = ROOT / "README.md"
CHAT = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}")
MAIN_JOB = "recipes/configs/math_generalisation_at_grpo.yaml"


class ScriptPool:
    """``generate_many`` from ``script(agent, prompt, use_adapter)``; the adapters compute something (trained)."""

    def __init__(self, script):
        self.script, self.requests = script, []

    def adapters_are_identity(self):
        return False

    def generate_many(self, requests, generation_config, max_batch_sequences=None):
        self.requests += list(requests)
        return [[Generation([0], [1, 2], self.script(r.agent, r.prompt, r.use_adapter))] * r.num_samples
                for r in requests]


def trained_tool(agent, prompt, adapter):
    """The tool's program is right only with its (trained) adapter on; the reasoner never answers."""
    if agent == "tool":
        return "```python\nprint(3 * 12)\n```" if adapter else "```python\nprint(3 + 12)\n```"
    return "I do not know."


TASKS = [{"task_id": "pens", "question": "Ann has 3 boxes of 12 pens. How many pens?", "answer": "36",
          "form": "product"},
         {"task_id": "more", "question": "Ann has 3 boxes of 12 pens, again. How many pens?", "answer": "36",
          "form": "product_again"}]


# ------------------------------------------------------------------------------------------------ methods
def test_each_agent_alone_trained_plays_with_its_adapter_and_the_untrained_team_without():
    evaluator = EpisodeEvaluator(MathToolEnv, num_turns=2)
    assert evaluator.trained_alone == {"reasoner_alone_trained": "reasoner_alone", "tool_alone_trained": "tool_alone"}
    assert evaluator.resolve_methods([TEAM, "alone_trained"]) == [TEAM, "reasoner_alone_trained", "tool_alone_trained"]
    pool = ScriptPool(trained_tool)
    after = evaluate_team(pool, evaluator, TASKS, [TEAM, "tool_alone", "tool_alone_trained"], generation_config=GREEDY)
    assert after.methods["tool_alone_trained"].per_task("final/team_correct") == [1.0, 1.0]  # adapter on: 3 * 12
    assert after.methods["tool_alone"].per_task("final/team_correct") == [0.0, 0.0]  # the base: 3 + 12
    assert after.methods[TEAM].per_task("final/tool_correct") == [1.0, 1.0]
    # the untrained team: every request with the adapters off (the bases)
    pool.requests.clear()
    before = evaluate_team(AdaptersOff(pool), evaluator, TASKS, [TEAM], generation_config=GREEDY)
    assert pool.requests and not any(r.use_adapter for r in pool.requests)
    assert before.methods[TEAM].per_task("final/tool_correct") == [0.0, 0.0]
    # a trained agent alone needs no generation of its own: its request is the team's first turn, shared
    pool.requests.clear()
    evaluate_team(pool, evaluator, TASKS[:1], [TEAM, "tool_alone_trained"], generation_config=GREEDY)
    assert sum(r.agent == "tool" and r.use_adapter for r in pool.requests) == 2  # turn 1 (shared) and turn 2


def test_per_turn_values_and_groups_are_written_task_by_task(tmp_path):
    evaluator = EpisodeEvaluator(MathToolEnv, num_turns=2)
    pool = ScriptPool(trained_tool)
    stages = {"before": evaluate_team(AdaptersOff(pool), evaluator, TASKS, [TEAM, "tool_alone"],
                                      generation_config=GREEDY),
              "after": evaluate_team(pool, evaluator, TASKS, [TEAM, "tool_alone_trained"], generation_config=GREEDY)}
    groups = {"form": task_groups(TASKS, "form")}
    assert groups == {"form": {"product": [0], "product_again": [1]}}
    section = evaluation_section(stages, "final/team_correct", "episodes", 1, {"max_new_tokens": 4},
                                 baselines=evaluator.baselines, num_resamples=100, tasks=TASKS, groups=groups)
    assert set(section["groups"]["form"]) == {"product", "product_again"}
    assert section["groups"]["form"]["product"]["methods"]["tool_alone_trained"]["after"]["mean"] == 1.0
    write_run_outputs(tmp_path, section, {"command": "test"}, stages)
    rows = [json.loads(line) for line in (tmp_path / "eval_per_task.jsonl").read_text().splitlines()]
    team_after = [r for r in rows if r["stage"] == "after" and r["method"] == TEAM]
    # turn 1: the reasoner has no answer, so the team's is the tool's, right after training; both agents disagree,
    # so a second turn is played
    assert [r["turn1/team_correct"] for r in team_after] == [1.0, 1.0] and all("turn2/team_reward" in r
                                                                                for r in team_after)
    report = (tmp_path / "report.md").read_text()
    assert "### `form` = `product` (1 tasks)" in report and "| tool alone, trained |" in report
    with pytest.raises(ValueError, match="group_by 'level': no held-out task has a column 'level'"):
        task_groups(TASKS, "level")


# ------------------------------------------------------------------------------------------------ one question
def test_a_question_without_a_gold_answer_is_played_and_answered():
    from trl_multiagent import Team

    env = MathToolEnv()
    env.reset({"question": "3 boxes of 12 pens?"})  # no KeyError
    step = env.step({"reasoner": "\\boxed{36}", "tool": "```python\nprint(36)\n```"})
    assert step.team_reward is None and step.local_rewards is None and step.done  # they agree
    assert step.info["agreed"] == 1.0 and not any(k.endswith("_correct") for k in step.info)
    assert env.team_answer() == "36"
    team = Team(ScriptPool(trained_tool), MathToolEnv, num_turns=2)
    play = team.play({"question": "Ann has 3 boxes of 12 pens. How many pens?"})
    assert play.answer == "36" and play.rewards == [None, None] and len(play.turns) == 2  # never agreed
    messages = play.turns[0]["tool"]
    assert messages[0]["role"] == "user" and "3 boxes" in messages[0]["content"]
    assert messages[-1] == {"role": "assistant", "content": "```python\nprint(3 * 12)\n```"}
    assert play.responses[1]["reasoner"] == "I do not know."


# ------------------------------------------------------------------------------------------------ recipe checks
def recipe_of(*overrides):
    from trl_multiagent.command.cli import parse_recipe

    return parse_recipe(["--config", str(ROOT / MAIN_JOB), *overrides])


def test_eval_num_problems_zero_means_every_row_of_a_held_out_file(tmp_path):
    from trl_multiagent.command.recipe import RecipeArguments
    from trl_multiagent.command.runner import Run

    held = tmp_path / "mine.jsonl"
    held.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(37)))
    run = Run(*recipe_of("--eval_dataset_split", str(held), "--eval_num_problems", "0", "--output_dir", str(tmp_path)))
    run.prepare()
    assert len(run.tasks) == 37  # not the evaluator's default (32)
    generated = Run(*recipe_of("--eval_num_problems", "0", "--output_dir", str(tmp_path)))
    generated.prepare()
    assert len(generated.tasks) == 32  # a generated split keeps the evaluator's default
    help_text = RecipeArguments.__dataclass_fields__["eval_num_problems"].metadata["help"]
    assert "0: every row of a held-out data file" in help_text


def saved_team(folder: Path, lora_r: int = 16) -> Path:
    """A team folder as a run saves it (adapters/team.json and the adapter files), without a model."""
    (folder / "adapters" / "shared").mkdir(parents=True)
    (folder / "adapters" / "shared" / "adapter_model.safetensors").write_bytes(b"")
    agents = [{"name": n, "policy": "shared", "model": "smollm2-135m-instruct", "lora_r": lora_r, "lora_alpha": 32}
              for n in ("reasoner", "tool")]
    (folder / "adapters" / "team.json").write_text(json.dumps({"agents": agents}))
    return folder


def test_init_adapters_is_checked_before_any_model_loads(tmp_path):
    from trl_multiagent.command.runner import Run
    from trl_multiagent.trainers.outputs import OutputDirError, check_checkpoint

    team = saved_team(tmp_path / "team")
    out = ["--output_dir", str(tmp_path / "more")]
    Run(*recipe_of("--init_adapters", str(team), *out)).prepare()  # fits
    for overrides, message in (
            (["--resume_from_checkpoint", "true"], "are two ways to continue a saved team; give one"),
            (["--lora_r", "8"], "agent 'reasoner' was saved with lora_r 16, the recipe gives it 8"),
            (["--policy_mapping", "specialized"], "was saved with policy 'shared', the recipe gives it 'reasoner'")):
        with pytest.raises(RecipeError, match=message):
            Run(*recipe_of("--init_adapters", str(team), *out, *overrides)).prepare()
    with pytest.raises(RecipeError, match="holds no saved team"):
        Run(*recipe_of("--init_adapters", str(tmp_path), *out)).prepare()
    # a resume from a folder with a saved team but no training state names init_adapters as the other way
    with pytest.raises(OutputDirError, match=rf"trainer_state.json is missing.*pass --init_adapters {team} without"):
        check_checkpoint(str(team), tmp_path / "more", ["shared"])


# ------------------------------------------------------------------------------------------------ command line
def test_the_evaluate_command_refuses_with_one_line(tmp_path, capsys):
    from trl_multiagent.command.cli import main

    team = saved_team(tmp_path / "team")
    recipe, _, given = recipe_of()
    (team / "summary.json").write_text(json.dumps({"recipe": given}))
    cases = [(["--team", str(tmp_path / "none")], "does not exist"),
             (["--team", str(tmp_path)], "holds no saved team"),
             (["--team", str(team), "--methods", "team,coder_alone"], "not ['coder_alone']"),
             (["--team", str(team), "--group_by", "form"], "no held-out task has a column 'form'"),
             (["--team", str(team), "--output_dir", str(team)], "holds a training run's results")]
    for args, message in cases:
        assert main(["evaluate", *args]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("error:") == 1 and "Traceback" not in err, err
    assert main(["evaluate", "--help"]) == 0
    assert "--group_by COLUMN" in capsys.readouterr().out


def test_the_console_script_has_the_same_commands():
    script = Path(sys.executable).parent / "trl-multiagent"
    assert script.is_file(), "pip install -e . registers the trl-multiagent console script"
    top = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=300)
    assert top.returncode == 0 and top.stdout.startswith("usage: trl-multiagent <command>")
    for command in ("train", "evaluate", "train-verifier", "train-single", "push"):
        assert f"\n  {command} " in top.stdout
    evaluate = subprocess.run([str(script), "evaluate", "--help"], capture_output=True, text=True, timeout=300)
    assert evaluate.returncode == 0 and evaluate.stdout.startswith("usage: trl-multiagent evaluate")


# ------------------------------------------------------------------------------------------------ the README
def readme_section() -> str:
    return README.read_text().split("\n## After training\n", 1)[1].split("\n## ", 1)[0]


def blocks(kind: str) -> list[str]:
    return [part.split("```", 1)[0] for part in readme_section().split(f"```{kind}\n")[1:]]


def commands(block: str) -> list[list[str]]:
    return [shlex.split(line)[3:] for line in block.splitlines() if line.startswith("python -m trl_multiagent ")]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """``make demo``'s output_dir, on a tiny chat model with small sizes (the recipe's turns, steps and saves)."""
    from transformers import AutoTokenizer

    work = tmp_path_factory.mktemp("after_training")
    chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
    model = save_tiny(work / "model", chars=chars, max_positions=1024)
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = CHAT
    tok.save_pretrained(model)
    (work / "recipes" / "configs").mkdir(parents=True)
    shutil.copy(ROOT / MAIN_JOB, work / MAIN_JOB)
    tiny = ["--model", model, "--num_tasks", "8", "--episodes_per_step", "1", "--num_generations", "2",
            "--max_completion_length", "4", "--lora_r", "4", "--lora_alpha", "8", "--eval_num_problems", "4",
            "--eval_max_new_tokens", "4", "--disable_tqdm", "true"]
    cli = CommandRunner(timeout=600)
    result = cli(["train", "--config", MAIN_JOB, "--output_dir", "outputs/demo", "--overwrite_output_dir", "true",
                  *tiny], cwd=work)
    assert result.returncode == 0, result.output[-4000:]
    yield work, tiny, cli
    cli.close()


@pytest.mark.slow
def test_the_readme_after_training_runs_as_written(demo, monkeypatch):
    work, tiny, cli = demo
    demo_dir = work / "outputs" / "demo"
    assert (demo_dir / "adapters" / "team.json").is_file() and (demo_dir / "checkpoint-12" / "optimizer.pt").is_file()
    problems, evaluations, python, training = blocks("json")[0], blocks("bash")[0], blocks("python")[0], \
        blocks("bash")[1]
    (work / "my_problems.jsonl").write_text(problems)

    # evaluate on one's own file: every row, the recipe's decoding, every method, per-turn values, a table per form
    for args in commands(evaluations):
        result = cli(args, cwd=work)
        assert result.returncode == 0, result.output[-4000:]
    ev = json.loads((demo_dir / "eval-my_problems" / "summary.json").read_text())["evaluation"]
    assert ev["held_out_tasks"] == 3 and ev["decoding"] == {"max_new_tokens": 4, "do_sample": False}
    assert set(ev["methods"]) == {"team", "reasoner_alone", "tool_alone", "no_exchange", "reasoner_alone_trained",
                                  "tool_alone_trained"}
    assert set(ev["methods"]["team"]) >= {"before", "after", "gain", "gain_vs_best_baseline"}
    assert set(ev["groups"]["form"]) == {"sum", "how_many_more", "product"}
    rows = [json.loads(line) for line in (demo_dir / "eval-my_problems" / "eval_per_task.jsonl").read_text()
            .splitlines()]
    assert all("turn1/team_correct" in r for r in rows if r["method"] == "team")
    assert "`form` = `how_many_more`" in (demo_dir / "eval-my_problems" / "report.md").read_text()
    tool = json.loads((work / "outputs" / "demo-eval-tool" / "summary.json").read_text())["evaluation"]
    assert set(tool["methods"]) == {"team", "tool_alone", "tool_alone_trained"}
    assert not (demo_dir / "eval-my_problems" / "README.md").exists()  # results of an evaluation: no model card

    # hand it on: its model card (with the run's held-out results), and the push, refused offline with one line
    card = (demo_dir / "README.md").read_text()
    assert "AT-GRPO" in card and "## Held-out results" in card and "| team | " in card and \
        "--lora-modules shared=outputs/demo/adapters/shared" in card
    assert "This is the checkpoint of step 12" in (demo_dir / "checkpoint-12" / "README.md").read_text()
    (push,) = [args for args in commands(blocks("bash")[2]) if args[0] == "push"]
    result = cli(push, cwd=work)  # the harness runs with HF_HUB_OFFLINE=1
    assert result.returncode == 2 and "the Hub is offline here" in result.stderr, result.output[-3000:]

    # on the recipe's own held-out problems, the evaluate command reproduces the training run's evaluation
    again = cli(["evaluate", "--team", "outputs/demo", "--output_dir", "outputs/demo-again"], cwd=work)
    assert again.returncode == 0, again.output[-4000:]

    def team_rows(folder):
        lines = (work / "outputs" / folder / "eval_per_task.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines if json.loads(line)["method"] == "team"]
    assert team_rows("demo-again") == team_rows("demo") and len(team_rows("demo")) == 8

    # one question from Python, as written
    monkeypatch.chdir(work)
    namespace: dict = {}
    exec(compile(python, "README.md (After training)", "exec"), namespace)
    play = namespace["play"]
    assert set(play.turns[0]) == {"reasoner", "tool"} and play.turns[0]["tool"][-1]["role"] == "assistant"
    assert play.answer is None or isinstance(play.answer, str)
    assert namespace["team"].generation_config.max_new_tokens == 4  # the recipe's eval_max_new_tokens

    # train it more: exactly, then from its adapters
    resume, warm = commands(training)
    result = cli([*resume, *tiny], cwd=work)
    assert result.returncode == 0, result.output[-4000:]
    assert "resuming from outputs/demo/checkpoint-12" in result.output
    assert json.loads((demo_dir / "summary.json").read_text())["global_step"] == 14
    result = cli([*warm, *tiny], cwd=work)
    assert result.returncode == 0, result.output[-4000:]
    assert "init_adapters: a warm start from outputs/demo" in result.output and "global step starts at 0" in \
        result.output
    more = json.loads((work / "outputs" / "demo-more" / "summary.json").read_text())
    assert more["global_step"] == 2 and more["recipe"]["init_adapters"] == "outputs/demo"
    # a resume from an output_dir names the checkpoints and init_adapters
    wrong = cli(["train", "--config", MAIN_JOB, "--output_dir", "outputs/demo-other", "--resume_from_checkpoint",
                 "outputs/demo", *tiny], cwd=work)
    assert wrong.returncode == 2 and "resume from one of its checkpoints (checkpoint-12, checkpoint-14)" in \
        wrong.stderr and "--init_adapters outputs/demo" in wrong.stderr
