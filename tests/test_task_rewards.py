"""The task rewards of the top-level rewards/ folder: the same numbers as the environments' defaults (the package's
compositions) and as the rewards before they moved out of the package, every shipped recipe that names one finds
it, and the folder is not installed with the package."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from trl_multiagent.environments import ENVIRONMENTS, ArxivExpansionEnv, AuxMainCodingEnv, TLDREnv
from trl_multiagent.runtime.user_code import import_object

ROOT = Path(__file__).resolve().parents[1]
tldr_reward = import_object(f"{ROOT}/rewards/writing.py:tldr_reward")
arxiv_reward = import_object(f"{ROOT}/rewards/writing.py:arxiv_reward")
cooperative_code_reward = import_object(f"{ROOT}/rewards/coding.py:cooperative_code_reward")

TEXTS = {
    "summary": "Landlord raised rent by forty percent; tenant asks whether that is legal and plans to move.",
    "elaboration": (
        "The poster explains that their landlord, without any warning, raised the monthly rent by forty percent. "
        "However, the lease says increases need sixty days of notice. Therefore the tenant wonders whether the "
        "increase is legal, and for example cites a neighbour who paid less. Finally, since savings are thin, they "
        "plan to move out next spring unless the owner agrees to negotiate a smaller raise."),
    "background": (
        "Large language models often struggle to coordinate when several of them must write one document "
        "together. Moreover, existing approaches train each model alone, so the joint text lacks coherence."),
    "method": (
        "We propose training the writers jointly with a shared reward. Specifically, each agent drafts one part, and "
        "a group-relative advantage compares joint samples. As a result, cooperation improves measurably."),
    "short": "cats dogs",
}

# (first, second) -> (total, stopped_at, structure, style, coherence). Recorded from trl_multiagent/rewards/writing.py
# before the task rewards moved to rewards/ (commit 901fe52), and derived by hand from the word counts (words 16 / 65,
# distinct non-stopwords 11 / 43 for summary / elaboration; 29 / 30 and 22 / 21, 2 shared of 41, for background /
# method) and the transition categories (7 and 3) under each task's bands.
TLDR_CASES = {
    ("summary", "elaboration"): (0.9201388888888888, None, ((5.0 - 65 / 16) / (5.0 - 3.2) + 1) / 2, 1.0, 1.0),
    ("elaboration", "summary"): (0.0, "length", 0.0, 0.0, 0.0),  # length ratio 16 / 65 < 1.1
    ("summary", "short"): (0.0, "length", 0.0, 0.0, 0.0),
    ("background", "method"): (0.0, "length", 0.0, 0.0, 0.0),  # 30 / 29 < 1.1
}
ARXIV_CASES = {
    ("background", "method"): (0.5888689406201565, None, 1.0, (2 / 41) / 0.23, 0.4 * math.log(4)),
    ("method", "background"): (0.5610911628423787, None, ((29 / 30 - 0.8) / (1.0 - 0.8) + 1) / 2, (2 / 41) / 0.23,
                               0.4 * math.log(4)),
    ("summary", "elaboration"): (0.0, "length", 0.0, 0.0, 0.0),  # 65 / 16 > 1.5
    ("background", "short"): (0.0, "length", 0.0, 0.0, 0.0),
}


@pytest.mark.parametrize(("reward", "env_cls", "cases"), [(tldr_reward, TLDREnv, TLDR_CASES),
                                                          (arxiv_reward, ArxivExpansionEnv, ARXIV_CASES)])
def test_writing_rewards_match_the_environment_default_and_the_recorded_values(reward, env_cls, cases):
    default = env_cls().reward_fn
    for (first, second), (total, stopped, structure, style, coherence) in cases.items():
        mine, theirs = reward(TEXTS[first], TEXTS[second]), default(TEXTS[first], TEXTS[second], weights=None)
        assert (mine.total, mine.stopped_at, mine.levels) == (theirs.total, theirs.stopped_at, theirs.levels)
        assert mine.total == total and mine.stopped_at == stopped, (first, second)
        hand = {"structure": structure, "style": style, "coherence": coherence}
        assert {k: mine.levels[k] for k in hand} == pytest.approx(hand), (first, second)
        if stopped is None:
            assert mine.total == pytest.approx(sum(hand.values()) / 3)
    weights = {"coherence": 0.0, "style": 0.5}
    first, second = next(iter(cases))
    assert reward(TEXTS[first], TEXTS[second], weights).total == \
        default(TEXTS[first], TEXTS[second], weights=weights).total


AUX = "def aux(xs):\n    return [x * 2 for x in xs]\n"
MAINS = {  # name -> (main, reward at pass rates 0, 0.5, 1 of 4 tests), recorded before the move and by hand
    "uses": ("def double_sum(xs):\n    doubled = aux(xs)\n    return sum(doubled)\n", (2.0, 4.0, 5.0)),
    "wrapper": ('def double_sum(xs):\n    """Sum of doubles."""\n    return aux(xs)\n', (2.0, 3.5, 4.5)),
    "ignores": ("def double_sum(xs):\n    aux(xs)\n    return sum(x * 2 for x in xs)\n", (2.0, 3.0, 4.0)),
    "alone": ("def double_sum(xs):\n    return sum(x * 2 for x in xs)\n", (2.0, 3.0, 4.0)),
}


def test_coding_reward_matches_the_environment_default_and_the_recorded_values():
    default = AuxMainCodingEnv().reward_fn
    for name, (main, totals) in MAINS.items():
        for pass_rate, total in zip((0.0, 0.5, 1.0), totals):
            kwargs = dict(aux=AUX, main=main, entry_point="double_sum", pass_rate=pass_rate, num_tests=4, imports="")
            mine, theirs = cooperative_code_reward(**kwargs), default(**kwargs)
            assert (mine.total, mine.stopped_at, mine.levels) == (theirs.total, theirs.stopped_at, theirs.levels)
            assert mine.total == total, (name, pass_rate)
            assert mine.stopped_at == ("tests" if pass_rate == 0 else None)


def shipped_recipes():
    for path in sorted((ROOT / "recipes" / "configs").glob("*.yaml")):
        values = yaml.safe_load(path.read_text())
        yield path, values


def test_every_recipe_of_a_writing_or_coding_task_names_its_reward_in_rewards():
    named = {}
    for path, values in shipped_recipes():
        env_cls = ENVIRONMENTS.get(values.get("environment"))
        spec = (values.get("env_kwargs") or {}).get("reward_fn")
        if env_cls in (TLDREnv, ArxivExpansionEnv, AuxMainCodingEnv):
            assert spec and spec.startswith("rewards/"), f"{path.name} names no task reward from rewards/"
        if spec:
            file, _, name = spec.rpartition(":")
            assert (ROOT / file).is_file() and callable(import_object(f"{ROOT / file}:{name}")), path.name
            named[path.stem] = spec
    assert named["tldr_magrpo"] == "rewards/writing.py:tldr_reward"
    assert named["arxiv_cc"] == "rewards/writing.py:arxiv_reward"
    assert named["coding"] == "rewards/coding.py:cooperative_code_reward"


def test_rewards_folder_is_not_installed():
    """A PyPI package owns the top-level name ``rewards``: the wheel holds trl_multiagent only (the packages that
    pyproject.toml's find rule selects), and rewards/ is no package (no __init__.py), loaded by path instead."""
    from setuptools import find_packages

    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = find_packages(str(ROOT), **find)
    assert "trl_multiagent" in packages and "trl_multiagent.reward_blocks" in packages
    assert not [p for p in packages if p.split(".")[0] != "trl_multiagent"], packages
    assert not (ROOT / "rewards" / "__init__.py").exists()
