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


def test_td_errors_normalised_per_turn_as_the_released_code():
    # issue 61: CoMLRL normalises the TD errors of every per-turn buffer: delta [0.7, 0.8, 1.0] has mean 2.5 / 3 =
    # 0.8333 and population std sqrt((0.1333^2 + 0.0333^2 + 0.1667^2) / 3) = sqrt(0.04667 / 3) = 0.12472, so
    # [-0.1333, -0.0333, 0.1667] / 0.12472 = [-1.069, -0.267, 1.336]: two positive TD errors turn negative.
    from trl_multiagent.credit import normalize_per_turn

    mean = (0.7 + 0.8 + 1.0) / 3
    std = (((0.7 - mean) ** 2 + (0.8 - mean) ** 2 + (1.0 - mean) ** 2) / 3) ** 0.5
    expected = [(d - mean) / std for d in (0.7, 0.8, 1.0)]
    assert expected == pytest.approx([-1.069, -0.267, 1.336], abs=1e-3)
    assert normalize_per_turn([0.7, 0.8, 1.0], [0, 0, 0]).tolist() == pytest.approx(expected)
    # turns apart: a turn of one transition keeps its TD error; the order of the transitions is kept
    got = normalize_per_turn([0.7, 5.0, 0.8, 1.0], [1, 0, 1, 1]).tolist()
    assert got == pytest.approx([expected[0], 5.0, expected[1], expected[2]])
    # equal TD errors: centred to 0 (the std floor 1e-6 keeps the division finite)
    assert normalize_per_turn([0.3, 0.3], [0, 0]).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="TD errors but"):
        normalize_per_turn([0.1, 0.2], [0])


def test_td_error_normalization_is_an_option_off_by_default(tmp_path):
    from trl_multiagent.trainers import CoLLMConfig

    assert CoLLMConfig(output_dir=str(tmp_path)).td_error_normalization is False  # Eq. 2 / Eq. 4
    assert CoLLMConfig(output_dir=str(tmp_path), td_error_normalization=True).td_error_normalization
