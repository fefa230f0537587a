"""The command line answers ``--help`` and the recipe errors it can decide without importing torch
(trl_multiagent/command/recipe_fields.py): a snapshot written from the config classes reads back current, its answers are the
classes' answers (help text for help text, error for error), and a stale one is ignored and rewritten."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.cli_harness import ROOT
from trl_multiagent.command import cli, recipe_fields, recipe_parser
from trl_multiagent.command.recipe import coerce_value
from trl_multiagent.errors import RecipeError
from trl_multiagent.trainers import TRAINERS

PROG = "python -m trl_multiagent train"
TINY_RECIPE = "tests/configs/tiny_matrix_game.yaml"


@pytest.fixture(autouse=True)
def at_the_root(monkeypatch):
    monkeypatch.chdir(ROOT)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache folder of its own holding a snapshot written from the classes (``TRL_MULTIAGENT_CACHE`` while the
    module's tests run)."""
    folder = tmp_path_factory.mktemp("cache")
    before = os.environ.get("TRL_MULTIAGENT_CACHE")
    os.environ["TRL_MULTIAGENT_CACHE"] = str(folder)
    recipe_fields.write(cli.RecipeParser)
    yield folder
    if before is None:
        os.environ.pop("TRL_MULTIAGENT_CACHE")
    else:
        os.environ["TRL_MULTIAGENT_CACHE"] = before


@pytest.fixture(scope="module")
def snapshot(cache):
    current = recipe_fields.current()
    assert current is not None, "a snapshot just written does not read back as current"
    return current


def test_a_written_snapshot_is_what_the_classes_give_and_is_current(snapshot, cache):
    assert recipe_fields.snapshot_path().parent == cache
    fresh = json.loads(json.dumps(recipe_fields.snapshot_of_parsers(cli.RecipeParser)))
    assert fresh == snapshot


def outcome(argv, snapshot=None, yaml_text=None):
    """What parsing ``argv`` does: ``("help", text)``, ``("error", message)``, ``("undecided",)`` or ``("ok",)``."""
    import contextlib
    import io

    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            recipe_parser._parse(list(map(str, argv)), yaml_text, PROG, snapshot)
    except SystemExit as exc:
        assert exc.code == 0
        return "help", buffer.getvalue()
    except RecipeError as exc:
        return "error", str(exc)
    except recipe_fields.Undecided:
        return ("undecided",)
    return ("ok",)


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["--config", "recipes/configs/tldr_magrpo.yaml", "--help"],
    ["--config", "recipes/configs/no_such_recipe.yaml", "--help"],
    *[["--trainer", name, "--help"] for name in sorted(TRAINERS)],
    ["--config", "recipes/configs/math_easy_at_grpo.yaml", "-h"],
])
def test_help_from_the_file_is_the_help_of_the_classes(snapshot, argv):
    light, heavy = outcome(argv, snapshot), outcome(argv)
    assert light[0] == "help" and light == heavy


def write_recipe(tmp_path, text: str) -> str:
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


CASES = [
    [],
    ["--lerning_rate", "0.1"],
    ["--learning_rate", "fast"],
    ["--learning_rate", "1e-5"],
    ["--max_steps", "ten"],
    ["--bf16", "maybe"],
    ["--bf16"],
    ["--no_bf16"],
    ["--trainer", "magrp"],
    ["--trainer"],
    ["--config"],
    ["--environment", "chess"],
    ["--policy_mapping", "mixed"],
    ["--quantization", "8bit"],
    ["--eval_num_samples", "0"],
    ["--eval_stages", '["during"]'],
    ["--eval_methods", '["team", "solo"]'],
    ["--num_tasks", "0"],
    ["--num_generations", "0"],
    ["--temperature", "-0.5"],
    ["--agents", '{"name": "a"}'],
    ["--env_kwargs", "[1, 2]"],
    ["--env_kwargs", "{not json"],
    ["--generation_kwargs", "[1]"],
    ["--report_to", "none"],
    ["--lr_scheduler_type", "cosine"],
    ["--lr_scheduler_type", "not_a_schedule"],
    ["--save_strategy", "no"],
    ["--save_strategy", '{"a": 1}'],
    ["--logging_steps", "0.5"],
    ["--debug", "underflow_overflow"],
    ["--optim", "adamw_torch"],
    ["--parallelism_config", "none"],
    ["--seed", "1.5"],
    ["stray"],
    ["--trainer", "at_grpo", "--agent_order", "diagonal"],
    ["--trainer", "maporl", "--reward_mode", "best"],
    ["--trainer", "collm", "--critic", "centralized"],
]


@pytest.mark.parametrize("extra", CASES, ids=[" ".join(c) or "plain" for c in CASES])
def test_errors_from_the_file_are_the_errors_of_the_classes(snapshot, extra):
    """An error the file finds is the classes' error, word for word; where the file finds none (or cannot decide),
    the classes decide (and their answer is whatever it always was)."""
    argv = ["--config", TINY_RECIPE, "--output_dir", "/tmp/unused-output", *extra]
    light, heavy = outcome(argv, snapshot), outcome(argv)
    if light[0] == "error":
        assert heavy == light
    else:
        assert light[0] in ("ok", "undecided") and heavy[0] in ("ok", "error")


@pytest.mark.parametrize("text", [
    "trainer: magrpo\nlearning_rate: fast\n",
    "trainer: magrpo\nlerning_rate: 0.1\nlearning_rate: fast\n",
    "learning_rate: 1.0e-5\nlearning_rate: 2.0e-5\n",
    "- a\n- b\n",
    "env: [1]\n",
    "env: {A: 1}\nmax_steps: many\n",
    "command: train-verifier\n",
    "trainer: [magrpo]\n",
    "agents: {name: a}\n",
    "eval_metric: [a]\n",
    "save_strategy: bogus\nmax_steps: x\n",
    "max_steps: x\nsave_strategy: bogus\n",
    "output_dir: run\nnum_tasks: -3\n",
])
def test_recipe_file_errors_too(snapshot, tmp_path, text):
    argv = ["--config", write_recipe(tmp_path, text)]
    light, heavy = outcome(argv, snapshot), outcome(argv)
    if light[0] == "error":
        assert heavy == light
    else:
        assert light[0] in ("ok", "undecided") and heavy[0] in ("ok", "error")


def test_every_shipped_recipe_passes_the_file_and_the_classes(snapshot):
    """Every training recipe passes both; a verifier config is refused by both, in the same words."""
    for path in sorted((ROOT / "recipes" / "configs").glob("*.yaml")):
        argv = ["--config", str(path), "--output_dir", "/tmp/unused-output"]
        light, heavy = outcome(argv, snapshot), outcome(argv)
        if "command: train-verifier" in path.read_text():
            assert light[0] == "error" and light == heavy, path.name
        else:
            assert light == heavy == ("ok",), path.name


PROBES = [None, "", "none", "null", "true", "no", "0", "1", "-2", "1.5", "1e-5", "abc", "steps", "cosine", "epoch",
          "[1, 2]", '["a"]', '{"a": 1}', "{bad", 0, 3, -1, 2.5, 2.0, True, False, [], ["a"], [1], {}, {"a": 1}]


def test_every_config_field_coerces_alike(snapshot):
    """For every field of every trainer's config and a battery of values: the type kept in the file accepts what the
    class's type accepts and refuses it with the same message, or says it cannot decide."""
    decided = 0
    for trainer, (config_class, _) in sorted(TRAINERS.items()):
        recipe_parser._recipe_parser_class()(trainer)  # build the parser first, as parse_recipe does
        real = recipe_parser._hints(config_class)
        light = recipe_fields.config_hints(snapshot, trainer)
        assert set(light) <= set(real)
        for name, hint in light.items():
            for value in PROBES:
                try:
                    coerce_value(name, value, hint, "source")
                    got = ("ok",)
                except RecipeError as exc:
                    got = ("error", str(exc))
                except recipe_fields.Undecided:
                    continue
                try:
                    coerce_value(name, value, real[name], "source")
                    want = ("ok",)
                except RecipeError as exc:
                    want = ("error", str(exc))
                assert got == want, (trainer, name, value)
                decided += 1
    assert decided > 0.9 * sum(len(recipe_fields.config_hints(snapshot, t)) for t in TRAINERS) * len(PROBES)


def test_a_stale_or_missing_file_is_not_used(tmp_path, monkeypatch, snapshot):
    stale = dict(snapshot, fingerprint={**snapshot["fingerprint"], "python": "2.7"})
    (tmp_path / "stale.json").write_text(json.dumps(stale))
    monkeypatch.setattr(recipe_fields, "snapshot_path", lambda: tmp_path / "stale.json")
    assert recipe_fields.current() is None
    monkeypatch.setattr(recipe_fields, "snapshot_path", lambda: tmp_path / "missing.json")
    assert recipe_fields.current() is None
    (tmp_path / "broken.json").write_text("{")
    monkeypatch.setattr(recipe_fields, "snapshot_path", lambda: tmp_path / "broken.json")
    assert recipe_fields.current() is None


def test_a_stale_snapshot_is_rewritten_by_the_next_command(tmp_path, monkeypatch, snapshot):
    """A changed source (here: a fingerprint that no longer matches) costs one slow command, then the snapshot is
    current again: nothing to regenerate by hand."""
    stale = dict(snapshot, fingerprint={**snapshot["fingerprint"], "sources": {"cli.py": "0" * 16}})
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(stale))
    monkeypatch.setattr(recipe_fields, "snapshot_path", lambda: path)
    monkeypatch.setattr(recipe_fields, "_refreshed", False)
    assert recipe_fields.current() is None
    cli.parse_recipe(["--config", TINY_RECIPE])
    assert recipe_fields.current() == snapshot


def fresh(code: str) -> dict:
    """Run ``code`` in a new interpreter at the repository root (with the module's cache); it prints one JSON
    line."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    env.pop("TRL_MULTIAGENT_TRACEBACK", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


RUN = """
import contextlib, io, json, runpy, sys
sys.argv = ["trl_multiagent", *{args!r}]
out, err, code = io.StringIO(), io.StringIO(), None
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        runpy.run_module("trl_multiagent", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
heavy = sorted(m for m in ("torch", "transformers", "trl", "peft", "datasets") if m in sys.modules)
print(json.dumps({{"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(), "heavy": heavy}}))
"""


def test_a_fresh_interpreter_answers_help_and_recipe_errors_without_torch(snapshot):
    """``python -m trl_multiagent train --help`` and a recipe's unknown key, in new interpreters: no torch (nor
    transformers, TRL, peft, datasets) imported, and the very help and error the classes give."""
    help_run = fresh(RUN.format(args=["train", "--help"]))
    assert help_run["heavy"] == [] and help_run["code"] == 0
    assert help_run["stdout"] == outcome(["--help"])[1]
    error_run = fresh(RUN.format(args=["train", "--config", TINY_RECIPE, "--lerning_rate", "0.1"]))
    assert error_run["heavy"] == [] and error_run["code"] == 2
    assert error_run["stderr"].strip() == f"{PROG}: error: command line: unknown key 'lerning_rate'; did you mean " \
                                          "'learning_rate' or 'logging_strategy'?"
    package = fresh("import json, sys\nimport trl_multiagent, trl_multiagent.command.cli, trl_multiagent.command.recipe\n"
                    "light = 'torch' not in sys.modules\nfrom trl_multiagent import AgentSpec\n"
                    "print(json.dumps({'light': light, 'lazy': AgentSpec.__module__}))")
    assert package == {"light": True, "lazy": "trl_multiagent.team.agent_spec"}


def test_a_fault_of_the_file_leaves_the_answer_to_the_classes(snapshot, monkeypatch):
    """A snapshot that cannot be read as expected (a bug, a hand-edited file) never decides anything: the classes do."""
    broken = dict(snapshot, parsers={})
    monkeypatch.setattr(recipe_fields, "current", lambda: broken)
    monkeypatch.delitem(sys.modules, "trl_multiagent.trainers")  # as in a fresh process, where the file is read
    recipe, config, _ = cli.parse_recipe(["--config", TINY_RECIPE, "--output_dir", "/tmp/unused-output"])
    assert recipe.environment == "matrix_game" and config.num_generations == 4
