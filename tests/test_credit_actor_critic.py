"""CoLLM-CC / CoLLM-DC credit (Eq. 2-5) against hand-computed values on a 3-turn episode."""

import pytest

from trl_multiagent.credit import episode_td, td_errors, td_targets

# One 3-turn episode: rewards r_t, critic values V(h_t), discount 0.9.
REWARDS = [1.0, 0.0, 2.0]
VALUES = [0.5, 1.5, 1.0]
GAMMA = 0.9


def test_td_targets_and_advantages_full_episode():
    # y_0 = 1 + 0.9 * 1.5 = 2.35    delta_0 = 2.35 - 0.5 = 1.85
    # y_1 = 0 + 0.9 * 1.0 = 0.90    delta_1 = 0.90 - 1.5 = -0.60
    # y_2 = 2 (last turn: no bootstrap)     delta_2 = 2 - 1 = 1.00
    targets, deltas = episode_td(REWARDS, VALUES, GAMMA)
    assert targets.tolist() == pytest.approx([2.35, 0.9, 2.0])
    assert deltas.tolist() == pytest.approx([1.85, -0.6, 1.0])


def test_td_targets_and_advantages_with_early_stop():
    # The environment ends the episode after turn 1: turn 1 is terminal, so its target is r_1 alone, although a
    # critic would give the (never reached) history h_2 the value 1.0.
    # y_0 = 1 + 0.9 * 1.5 = 2.35, delta_0 = 1.85;  y_1 = 0, delta_1 = 0 - 1.5 = -1.5
    targets, deltas = episode_td(REWARDS[:2], VALUES[:2], GAMMA)
    assert targets.tolist() == pytest.approx([2.35, 0.0])
    assert deltas.tolist() == pytest.approx([1.85, -1.5])
    # The batched form, as the trainer calls it on a minibatch: the successor value of a terminal transition is
    # ignored whatever it holds.
    batched = td_errors(rewards=[0.0, 1.0], values=[1.5, 0.5], next_values=[99.0, 1.5], dones=[True, False],
                        gamma=GAMMA)
    assert batched.tolist() == pytest.approx([-1.5, 1.85])
    assert td_targets([0.0], [99.0], [True], GAMMA).tolist() == [0.0]


def test_gamma_one_and_zero():
    # gamma = 1 (the papers' setting): y_0 = 1 + 1.5, y_1 = 0 + 1.0, y_2 = 2
    assert episode_td(REWARDS, VALUES, 1.0)[0].tolist() == pytest.approx([2.5, 1.0, 2.0])
    # gamma = 0: the target is the reward alone
    assert episode_td(REWARDS, VALUES, 0.0)[0].tolist() == pytest.approx(REWARDS)


def test_shape_errors():
    with pytest.raises(ValueError, match="same shape"):
        td_targets([1.0, 2.0], [0.0], [False, True], 1.0)
    with pytest.raises(ValueError, match="at least one turn"):
        episode_td([], [], 1.0)
