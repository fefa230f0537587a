"""Each trainer has one name (docs/architecture.md, "One name per trainer"); its earlier names still run, each with a
warning that names the new one, so that recorded commands and saved teams keep working."""

from __future__ import annotations

import logging

import pytest

from trl_multiagent.command.recipe_parser import _current_trainer_name
from trl_multiagent.command.trl_names import RENAMED_TRAINERS


def test_an_earlier_trainer_name_becomes_the_current_one_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        argv, values = _current_trainer_name(["--trainer", "debate_ppo", "--seed", "1"], {"trainer": "actor_critic"},
                                             "recipe.yaml")
    assert argv == ["--trainer", "maporl", "--seed", "1"] and values == {"trainer": "collm"}
    assert [r.getMessage() for r in caplog.records] == [
        "command line: trainer 'debate_ppo' is now named 'maporl'; the recipe runs under the new name",
        "recipe.yaml: trainer 'actor_critic' is now named 'collm'; the recipe runs under the new name"]
    argv, values = _current_trainer_name(["--trainer=actor_critic"], {}, "recipe.yaml")
    assert argv == ["--trainer=collm"] and values == {}
    assert _current_trainer_name(["--trainer", "magrpo"], {"trainer": "magrpo"}, "r") == (["--trainer", "magrpo"],
                                                                                          {"trainer": "magrpo"})


def test_every_earlier_name_points_at_a_registered_trainer_and_class():
    from trl_multiagent import trainers

    assert set(RENAMED_TRAINERS.values()) <= set(trainers.TRAINERS)
    for old, new in trainers.RENAMED_CLASSES.items():
        with pytest.warns(DeprecationWarning, match=f"{old} is now named {new}"):
            assert getattr(trainers, old) is getattr(trainers, new)
    with pytest.warns(DeprecationWarning):
        import trl_multiagent

        assert trl_multiagent.DebatePPOConfig is trainers.MAPoRLConfig


def test_each_trainer_class_knows_its_one_name():
    from trl_multiagent.trainers import TRAINERS

    assert {name: cls._trainer_name for name, (_, cls) in TRAINERS.items()} == {name: name for name in TRAINERS}
    assert {cls.__name__ for _, cls in TRAINERS.values()} == {"MAGRPOTrainer", "ATGRPOTrainer", "MHGPOTrainer",
                                                                "CoLLMTrainer", "MAPoRLTrainer"}
