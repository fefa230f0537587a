"""``"path/to/file.py:name"`` wherever ``"module:name"`` is taken: loading by path, once per process, clear errors,
and a recipe file's relative paths looked up from the current directory, the recipe's folder, then its repository
root (trl_multiagent/utils.py: import_object, anchor_file_specs)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from trl_multiagent.command.cli import parse_recipe
from trl_multiagent.command.recipe import environment_factory, resolve_environment
from trl_multiagent.command.recipe_files import read_recipe_file
from trl_multiagent.environments import FunctionEnvironment
from trl_multiagent.errors import RecipeError
from trl_multiagent.runtime.user_code import anchor_file_specs, import_object, load_file_module

ROOT = Path(__file__).resolve().parents[1]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_relative_absolute_and_module_forms(tmp_path, monkeypatch):
    write(tmp_path / "mine" / "score.py", """
        CALLS = []
        def reward(text):
            return float(len(text))
    """)
    monkeypatch.chdir(tmp_path)
    relative = import_object("mine/score.py:reward", "reward_fn")
    assert relative("abc") == 3.0
    assert import_object(f"{tmp_path}/mine/score.py:reward") is relative  # one file, one module
    assert import_object(relative) is relative  # a callable passes through
    assert import_object("trl_multiagent.runtime.user_code:import_object") is import_object


def test_a_file_loads_once_per_process(tmp_path):
    counter = tmp_path / "count.txt"
    write(tmp_path / "once.py", f"""
        from pathlib import Path
        p = Path({str(counter)!r})
        p.write_text(str(int(p.read_text() or 0) + 1) if p.exists() else "1")
        def f():
            return 1
        def g():
            return 2
    """)
    module = load_file_module(tmp_path / "once.py")
    assert import_object(f"{tmp_path}/once.py:f")() == 1 and import_object(f"{tmp_path}/once.py:g")() == 2
    assert load_file_module(tmp_path / "once.py") is module and counter.read_text() == "1"
    assert module.__name__.startswith("_trl_multiagent_file_once_")
    write(tmp_path / "other" / "once.py", "def f():\n    return 3\n")  # same file name elsewhere: its own module
    assert import_object(f"{tmp_path}/other/once.py:f")() == 3 and import_object(f"{tmp_path}/once.py:f")() == 1


def test_clear_errors(tmp_path):
    with pytest.raises(ImportError, match=r"reward_fn 'nowhere/r\.py:f'.*no file nowhere/r\.py"):
        import_object("nowhere/r.py:f", "reward_fn")
    write(tmp_path / "names.py", "def tldr(): ...\ndef arxiv(): ...\n_hidden = 1\n")
    with pytest.raises(ImportError, match=r"defines no 'tldr_reward' \(it defines: arxiv, tldr\)"):
        import_object(f"{tmp_path}/names.py:tldr_reward", "reward_fn")
    write(tmp_path / "broken.py", "import os\n\nVALUE = undefined_name + 1\n")
    with pytest.raises(ImportError, match=r"fails to import \(broken\.py, line 3: NameError: name 'undefined_name' "
                                          r"is not defined\)"):
        import_object(f"{tmp_path}/broken.py:VALUE", "reward_fn")
    write(tmp_path / "syntax.py", "def f(:\n    pass\n")
    with pytest.raises(ImportError, match=r"syntax\.py, line 1: SyntaxError"):
        import_object(f"{tmp_path}/syntax.py:f")
    write(tmp_path / "needs.py", "import no_such_package_here\n")
    with pytest.raises(ImportError, match="ModuleNotFoundError: No module named 'no_such_package_here'"):
        import_object(f"{tmp_path}/needs.py:f")
    for bad in ("no_colon_here", "rewards/writing.py", "rewards/writing.py:"):
        with pytest.raises(ValueError, match="must look like"):
            import_object(bad)
    with pytest.raises(ValueError, match="or a callable"):
        import_object(3)


def test_recipe_values_found_from_the_recipe_folder_then_the_repository_root(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    write(repo / "pyproject.toml", "")
    write(repo / "rewards" / "task.py", "def reward(**kw):\n    return 1.0\n")
    write(repo / "recipes" / "configs" / "local.py", "def reward(**kw):\n    return 2.0\n")
    recipe = repo / "recipes" / "configs" / "r.yaml"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    values = {"env_kwargs": {"reward_fn": "rewards/task.py:reward", "local": "local.py:reward",
                             "many": ["rewards/task.py:reward", {"deep": "local.py:reward"}], "n": 3},
              "dataset_transform": "trl_multiagent.environments.coding:mbpp_to_humaneval", "model": "x"}
    anchored = anchor_file_specs(values, recipe)
    kwargs = anchored["env_kwargs"]
    assert kwargs["reward_fn"] == f"{repo / 'rewards' / 'task.py'}:reward"  # the repository root
    assert kwargs["local"] == f"{repo / 'recipes' / 'configs' / 'local.py'}:reward"  # the recipe's folder
    assert kwargs["many"] == [kwargs["reward_fn"], {"deep": kwargs["local"]}] and kwargs["n"] == 3
    assert anchored["dataset_transform"] == values["dataset_transform"] and anchored["model"] == "x"
    assert import_object(kwargs["reward_fn"])() == 1.0
    # the current directory comes first: a file found there keeps its relative path
    write(elsewhere / "rewards" / "task.py", "def reward(**kw):\n    return 3.0\n")
    assert anchor_file_specs(values, recipe)["env_kwargs"]["reward_fn"] == "rewards/task.py:reward"
    with pytest.raises(FileNotFoundError, match=r"no file rewards/missing\.py in .*elsewhere.*configs.*repo"):
        anchor_file_specs({"env_kwargs": {"reward_fn": "rewards/missing.py:f"}}, recipe)
    write(recipe, "environment: tldr\nenv_kwargs:\n  reward_fn: rewards/missing.py:f\n")
    with pytest.raises(RecipeError, match=r"r\.yaml: 'rewards/missing\.py:f': no file"):
        read_recipe_file(recipe)


def test_a_shipped_recipe_runs_from_another_folder(tmp_path, monkeypatch):
    """recipes/configs/tldr_cc.yaml names rewards/writing.py:tldr_reward; started elsewhere, the name is found at
    the repository root, and the environment scores with it."""
    monkeypatch.chdir(tmp_path)
    recipe, _, given = parse_recipe(["--config", str(ROOT / "recipes" / "configs" / "tldr_cc.yaml"),
                                     "--output_dir", str(tmp_path / "out")])
    assert recipe.env_kwargs["reward_fn"] == f"{ROOT / 'rewards' / 'writing.py'}:tldr_reward"
    _, _, probe = environment_factory(recipe)
    assert probe.reward_fn is import_object(f"{ROOT}/rewards/writing.py:tldr_reward")
    # a value given on the command line is taken as it is: relative to the current directory
    with pytest.raises(RecipeError, match="no file rewards/writing.py"):
        recipe, _, _ = parse_recipe(["--config", str(ROOT / "recipes" / "configs" / "tldr_cc.yaml"),
                                     "--env_kwargs", '{"reward_fn": "rewards/writing.py:tldr_reward"}'])
        environment_factory(recipe)


def test_environment_and_function_environment_from_files(tmp_path, monkeypatch):
    write(tmp_path / "task.py", """
        from trl_multiagent.environments import FunctionEnvironment

        def prompt(task):
            return f"Say {task['word']}"

        def said_it(completions, word):
            return float(all(word in c for c in completions.values()))

        def short(completions):
            return float(len(completions["a"]) < 10)

        class Echo(FunctionEnvironment):
            def __init__(self, **kw):
                super().__init__(agents=("a", "b"), prompt_fns={"a": prompt, "b": "task.py:prompt"},
                                 reward_fns="task.py:said_it", local_reward_fns={"a": "task.py:short"}, **kw)
    """)
    monkeypatch.chdir(tmp_path)
    env = FunctionEnvironment(agents=("a", "b"), prompt_fns={"a": "task.py:prompt", "b": "task.py:prompt"},
                              reward_fns=["task.py:said_it", "task.py:short"], reward_weights=[1.0, 0.5])
    assert env.reset({"word": "hi"}) == {"a": "Say hi", "b": "Say hi"}
    result = env.step({"a": "hi", "b": "hi there"})
    assert result.team_reward == 1.5 and result.info == {"said_it": 1.0, "short": 1.0}
    recipe, _, _ = parse_recipe(["--environment", "task.py:Echo", "--output_dir", str(tmp_path / "out")])
    _, _, probe = environment_factory(recipe)
    probe.reset({"word": "yo"})
    assert probe.step({"a": "yo", "b": "no"}).local_rewards == {"a": 1.0}


def test_a_module_that_does_not_import_says_how_to_make_it_importable(tmp_path, monkeypatch):
    """'module:Class' whose module is not on sys.path: the error names PYTHONPATH and the file form, with the
    field's own kind of example (an environment class for environment, not a reward function)."""
    write(tmp_path / "envs" / "secret_sum.py", "class SecretSumEnv:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    for name in ("secret_sum", "here"):  # imported below: absent now, and as they were after the test
        monkeypatch.setitem(sys.modules, name, None)
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError) as info:
        import_object("secret_sum:SecretSumEnv", "environment")
    message = str(info.value)
    assert message.startswith("Cannot import environment 'secret_sum:SecretSumEnv': no module named 'secret_sum' on "
                              "the Python path")
    assert "PYTHONPATH" in message and "environment: 'path/to/secret_sum.py:SecretSumEnv'" in message
    assert "reward" not in message
    with pytest.raises(RecipeError, match=r"no module named 'secret_sum'.*PYTHONPATH"):
        resolve_environment("secret_sum:SecretSumEnv")
    # beside the current directory: the error names the very file
    write(tmp_path / "here.py", "class HereEnv:\n    pass\n")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    with pytest.raises(ImportError, match=r"environment: 'here\.py:HereEnv' \(that file is in the current "
                                          r"directory\)"):
        import_object("here:HereEnv", "environment")
    # on PYTHONPATH (sys.path), the same spec imports
    monkeypatch.syspath_prepend(str(tmp_path / "envs"))
    assert import_object("secret_sum:SecretSumEnv", "environment").__name__ == "SecretSumEnv"
    assert resolve_environment("secret_sum:SecretSumEnv").__name__ == "SecretSumEnv"


def test_a_module_that_fails_or_lacks_the_name(tmp_path, monkeypatch):
    write(tmp_path / "mods" / "needs_more.py", "import no_such_package_here\n")
    write(tmp_path / "mods" / "broken_env.py", "X = 1\nY = undefined_name\n")
    write(tmp_path / "mods" / "pkg" / "__init__.py", "")
    write(tmp_path / "mods" / "some_env.py", "class MyEnv:\n    pass\ndef helper():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    with pytest.raises(ImportError, match=r"module 'needs_more' fails to import \(needs_more\.py, line 1\): "
                                          r"ModuleNotFoundError: No module named 'no_such_package_here'"):
        import_object("needs_more:Env", "environment")
    with pytest.raises(ImportError, match=r"module 'broken_env' fails to import \(broken_env\.py, line 2\): "
                                          r"NameError"):
        import_object("broken_env:Env", "environment")
    with pytest.raises(ImportError, match=r"package 'pkg' \(.*pkg\) has no module 'missing'"):
        import_object("pkg.missing:Env", "environment")
    with pytest.raises(ImportError, match=r"module 'some_env' \(.*some_env\.py\) defines no 'MyEnvv' \(it defines: "
                                          r"MyEnv, helper\)"):
        import_object("some_env:MyEnvv", "environment")
    with pytest.raises(ValueError, match=r"must look like .*\(e\.g\. 'my_package\.my_env:MyEnv' or "
                                         r"'envs/my_env\.py:MyEnv'\)"):
        import_object("some_env.MyEnv", "environment")
