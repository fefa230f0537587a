"""Hand-computed checks of the credit-assignment math (trl_multiagent/credit/: group.py, magrpo.py, at_grpo.py)."""

import math
import statistics

import pytest
import torch

from trl_multiagent.credit import (
    STD_EPS,
    cross_sample_credit,
    discounted_returns,
    group_relative_advantages,
    grouped_advantages,
    joint_action_indices,
    num_tree_generations,
    tree_returns,
)


def test_group_relative_advantages_matches_eq1_by_hand():
    # returns 10, 7, 0: mean 17/3, unbiased std sqrt(79/3)
    std = math.sqrt(((10 - 17 / 3) ** 2 + (7 - 17 / 3) ** 2 + (0 - 17 / 3) ** 2) / 2)
    assert std == pytest.approx(5.131601439446884)
    expected = [(10 - 17 / 3) / (std + STD_EPS), (7 - 17 / 3) / (std + STD_EPS), (0 - 17 / 3) / (std + STD_EPS)]
    got = group_relative_advantages([10.0, 7.0, 0.0]).tolist()
    assert got == pytest.approx(expected, abs=1e-9)
    assert got == pytest.approx([0.84442, 0.25982, -1.10425], abs=1e-4)


def test_scale_none_only_centres_and_singleton_is_zero():
    assert group_relative_advantages([1.0, 3.0], scale="none").tolist() == [-1.0, 1.0]
    assert group_relative_advantages([5.0]).tolist() == [0.0]
    with pytest.raises(ValueError):
        group_relative_advantages([1.0, 2.0], scale="bogus")


def test_grouped_advantages_never_mix_groups_and_count_zero_std():
    returns = [1.0, 3.0, 5.0, 5.0, 2.0, 4.0]
    keys = ["a", "a", "b", "b", "c", "c"]
    adv, stats = grouped_advantages(returns, keys)
    d = 1 / (statistics.stdev([1.0, 3.0]) + STD_EPS)
    assert adv == pytest.approx([-d, d, 0.0, 0.0, -d, d])
    assert stats == {"num_groups": 3.0, "frac_zero_std_groups": pytest.approx(1 / 3)}


def test_joint_action_indices():
    assert joint_action_indices(2, 3, "aligned") == [(0, 0), (1, 1), (2, 2)]
    assert joint_action_indices(2, 2, "cross") == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert len(joint_action_indices(3, 2, "cross")) == 8


def test_cross_credit_on_matrix_game_by_hand():
    # agent1 samples (A, B), agent2 samples (A, B); cross joint actions AA, AB, BA, BB -> 10, 7, 7, 0
    idx = joint_action_indices(2, 2, "cross")
    adv = group_relative_advantages([10.0, 7.0, 7.0, 0.0]).tolist()
    s = math.sqrt((16 + 1 + 1 + 36) / 3) + STD_EPS  # mean 6
    assert adv == pytest.approx([4 / s, 1 / s, 1 / s, -6 / s])
    # sample A of agent 1 is in AA and AB: (4/s + 1/s) / 2; sample B in BA and BB: (1/s - 6/s) / 2
    assert cross_sample_credit(adv, idx, agent=0, num_samples=2) == pytest.approx([2.5 / s, -2.5 / s])
    assert cross_sample_credit(adv, idx, agent=1, num_samples=2) == pytest.approx([2.5 / s, -2.5 / s])


def test_tree_returns_two_turns_with_discount():
    # root joint actions 0 (r=1) and 1 (r=0); children of 0: 2 (r=2), 3 (r=4); of 1: 4 (r=0), 5 (r=1)
    rewards = [1.0, 0.0, 2.0, 4.0, 0.0, 1.0]
    children = [[2, 3], [4, 5], [], [], [], []]
    got = tree_returns(rewards, children, gamma=0.5)
    assert got == pytest.approx([1 + 0.5 * 3.0, 0 + 0.5 * 0.5, 2.0, 4.0, 0.0, 1.0])
    assert tree_returns(rewards, children, gamma=1.0)[:2] == pytest.approx([4.0, 0.5])


def test_discounted_returns_linear():
    assert discounted_returns([1.0, 0.0, 2.0], 0.5) == pytest.approx([1 + 0.25 * 2, 0.5 * 2, 2.0])


def test_generation_count_formula():
    assert num_tree_generations(2, 2, 3) == 2 * 2 * (2**3 - 1) // (2 - 1) == 28
    assert num_tree_generations(2, 4, 1) == 8
    assert num_tree_generations(3, 3, 2) == 3 * 3 * 4  # n*K*(1 + K)


def test_advantage_dtype_is_float64_tensor():
    assert group_relative_advantages([1.0, 2.0]).dtype == torch.float64


def test_released_code_advantage_modes_by_hand():
    # issue 61: CoMLRL's MAGRPO (the authors' released trainer) defaults to advantage_mode="mean": R - mean, no
    # std. Returns [0, 0, 0, 1]: mean 0.25 -> 0.75 for the rewarded joint action; Eq. 1 divides by the unbiased
    # std sqrt((3 * 0.25^2 + 0.75^2) / 3) = 0.5 (+ 1e-4): 0.75 / 0.5001 = 1.4997.
    from trl_multiagent.credit.magrpo import grouped_released_code_advantages, released_code_advantages

    returns = [0.0, 0.0, 0.0, 1.0]
    assert released_code_advantages(returns, "mean") == pytest.approx([-0.25, -0.25, -0.25, 0.75])
    eq1 = group_relative_advantages(returns).tolist()
    assert eq1[3] == pytest.approx(0.75 / (0.5 + STD_EPS)) and eq1[3] == pytest.approx(1.4997, abs=1e-4)
    assert released_code_advantages(returns, "raw") == returns
    assert released_code_advantages(returns, "max") == pytest.approx([-1.0, -1.0, -1.0, 0.0])
    # rloo: (4 R - 1) / 3, the return minus the mean of the other three
    assert released_code_advantages(returns, "rloo") == pytest.approx([-1 / 3, -1 / 3, -1 / 3, 1.0])
    assert released_code_advantages([2.0], "rloo") == [0.0]
    with pytest.raises(ValueError, match="Unknown released-code advantage mode"):
        released_code_advantages(returns, "std")
    # per node: two nodes never mix
    adv, stats = grouped_released_code_advantages([0.0, 1.0, 5.0, 5.0], [7, 7, 8, 8], "mean")
    assert adv == pytest.approx([-0.5, 0.5, 0.0, 0.0]) and stats == {"num_groups": 2.0, "frac_zero_std_groups": 0.5}


def test_magrpo_advantage_mode_option(tmp_path):
    from trl_multiagent.trainers import MAGRPOConfig

    assert MAGRPOConfig(output_dir=str(tmp_path)).advantage_mode == "eq1"  # the paper's Eq. 1
    assert MAGRPOConfig(output_dir=str(tmp_path), advantage_mode="mean").advantage_mode == "mean"
    with pytest.raises(ValueError, match="advantage_mode must be one of"):
        MAGRPOConfig(output_dir=str(tmp_path), advantage_mode="std")
    with pytest.raises(ValueError, match="scale_rewards applies to advantage_mode='eq1'"):
        MAGRPOConfig(output_dir=str(tmp_path), advantage_mode="mean", scale_rewards="batch")
