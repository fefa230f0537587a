"""The level-based coding reward (rewards/coding.py over trl_multiagent/reward_blocks/coding.py) on hand-written
aux/main pairs, every level."""

from pathlib import Path

import pytest

from trl_multiagent.reward_blocks.coding import MAX_REWARD, analyze
from trl_multiagent.runtime.user_code import import_object

cooperative_code_reward = import_object(f"{Path(__file__).resolve().parents[1]}/rewards/coding.py:cooperative_code_reward")

AUX = "def aux(xs):\n    return [x * 2 for x in xs]\n"
MAIN_USES = "def double_sum(xs):\n    doubled = aux(xs)\n    return sum(doubled)\n"
MAIN_WRAPPER = "def double_sum(xs):\n    \"\"\"Sum of doubles.\"\"\"\n    return aux(xs)\n"
MAIN_IGNORES = "def double_sum(xs):\n    aux(xs)\n    return sum(x * 2 for x in xs)\n"
MAIN_ALONE = "def double_sum(xs):\n    return sum(x * 2 for x in xs)\n"


def reward(aux, main, pass_rate=1.0, num_tests=4):
    return cooperative_code_reward(aux, main, "double_sum", pass_rate=pass_rate, num_tests=num_tests)


def test_missing_main_stops_at_structure():
    r = reward(AUX, "def something_else(xs):\n    return 1\n")
    assert r.total == 0.0 and r.stopped_at == "structure"
    r = reward(AUX, "def double_sum(xs):\n    pass\n")  # defined without a return statement
    assert r.total == 0.0 and r.stopped_at == "structure"


def test_syntax_error_stops_after_structure():
    r = reward(AUX, "def double_sum(xs):\n    return aux(xs\n")
    assert r.stopped_at == "structure"  # the main code does not even parse: no entry point found
    r = reward("def aux(xs):\n    return xs +\n", MAIN_USES)
    assert r.stopped_at == "syntax"
    assert r.levels == {"structure": 0.5, "syntax": 0.0, "tests": 0.0, "cooperation": 0.0}
    assert r.total == 0.5


def test_no_test_passed_stops_at_tests():
    r = reward(AUX, MAIN_USES, pass_rate=0.0)
    assert r.stopped_at == "tests" and r.total == 1.0 + 1.0
    assert r.levels["cooperation"] == 0.0  # later levels only when earlier ones hold


def test_partial_tests_and_full_cooperation():
    r = reward(AUX, MAIN_USES, pass_rate=0.75)
    assert r.stopped_at is None
    assert r.levels == {"structure": 1.0, "syntax": 1.0, "tests": 1.5, "cooperation": 1.0}
    assert r.total == pytest.approx(4.5)
    assert reward(AUX, MAIN_USES).total == MAX_REWARD


def test_wrapper_only_gets_base_bonus_only():
    r = reward(AUX, MAIN_WRAPPER)
    assert analyze(AUX, MAIN_WRAPPER, "double_sum").wrapper_only
    assert r.levels["cooperation"] == 0.5


def test_ignored_return_is_penalised():
    facts = analyze(AUX, MAIN_IGNORES, "double_sum")
    assert facts.calls_aux and facts.discards_aux and not facts.wrapper_only
    assert reward(AUX, MAIN_IGNORES).levels["cooperation"] == pytest.approx(0.5 + 0.5 - 1.0)


def test_no_aux_call_and_missing_aux():
    r = reward(AUX, MAIN_ALONE)
    assert r.levels["cooperation"] == 0.0
    r = reward("", MAIN_ALONE)
    assert r.levels["structure"] == 0.5 and r.total == pytest.approx(0.5 + 1.0 + 2.0)


def test_weights_override():
    r = cooperative_code_reward(AUX, MAIN_USES, "double_sum", 1.0, 4, weights={"tests": 10.0})
    assert r.levels["tests"] == 10.0
