"""The warning when no rollout has a non-zero advantage (trl_multiagent/trainers/learning_signal.py): when it comes,
how often it repeats, what it counts, and which trainers it watches."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from trl_multiagent.rollout import Experience, Sample
from trl_multiagent.trainers.learning_signal import (
    REPEAT_EVERY,
    WARN_AFTER,
    LearningSignalMonitor,
    has_nonzero_advantage,
    note_learning_signal,
)


def rollout(*advantages: float) -> Experience:
    samples = [Sample(agent="a", policy="a", episode=0, turn=0, node=0, generation=None, joint_ids=[], advantage=x)
               for x in advantages]
    return Experience(samples, [], {}, ["a"])


def fake_trainer(main: bool = True, **attrs):
    accelerator = SimpleNamespace(num_processes=1, is_main_process=main)
    return SimpleNamespace(accelerator=accelerator, state=SimpleNamespace(global_step=0), **attrs)


def test_the_verdict_of_a_rollout():
    assert not has_nonzero_advantage(rollout(0.0, 0.0, -0.0))
    assert has_nonzero_advantage(rollout(0.0, 1e-9))
    assert not has_nonzero_advantage(rollout())  # every group dropped (AT-GRPO's drop_zero_std_groups)


def test_the_warning_comes_after_a_streak_and_at_most_once_per_repeat_every_rollouts():
    monitor = LearningSignalMonitor(warn_after=3, repeat_every=5)
    notes = {step: monitor.observe(False, step) for step in range(1, 14)}
    warned = [step for step, note in notes.items() if note is not None]
    assert warned == [3, 8, 13]  # the streak reaches 3, then every 5 more
    level, message = notes[3]
    assert level == logging.WARNING
    assert message.startswith("no learning signal: 3 rollouts in a row (steps 1-3) had no sample with a non-zero "
                              "advantage")
    assert "loss and grad_norm are 0" in message and "Said again after 5 more such rollouts" in message
    assert notes[8][1].startswith("no learning signal: 8 rollouts in a row (steps 1-8)")
    # a signal ends the streak, and is said once, since a warning was given
    back = monitor.observe(True, 14)
    assert back == (logging.INFO, "learning signal back at step 14: a non-zero advantage after 13 rollouts without "
                                  "one")
    assert monitor.observe(True, 15) is None and monitor.observe(False, 16) is None
    assert monitor.observe(False, 17) is None and monitor.observe(False, 18)[1].startswith(
        "no learning signal: 3 rollouts in a row (steps 16-18)")


def test_a_short_lapse_is_not_worth_a_warning():
    monitor = LearningSignalMonitor(warn_after=2, repeat_every=20)
    assert [monitor.observe(signal, step) for step, signal in enumerate([False, True, False, True, False], 1)] == \
        [None] * 5


def test_the_trainer_hook_logs_on_the_main_process(caplog):
    caplog.set_level(logging.INFO, logger="trl_multiagent.trainers")
    trainer = fake_trainer()
    for step in range(WARN_AFTER + REPEAT_EVERY):
        trainer.state.global_step = step
        note_learning_signal(trainer, rollout(0.0, 0.0))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert warnings[0].startswith(f"no learning signal: {WARN_AFTER} rollouts in a row (steps 1-{WARN_AFTER})")
    assert warnings[1].startswith(f"no learning signal: {WARN_AFTER + REPEAT_EVERY} rollouts in a row")
    note_learning_signal(trainer, rollout(0.5, -0.5))
    assert caplog.records[-1].getMessage().startswith("learning signal back")
    caplog.clear()
    other = fake_trainer(main=False)  # another process counts along, but says nothing
    for _ in range(WARN_AFTER):
        assert note_learning_signal(other, rollout(0.0)) is None
    assert other._learning_signal.streak == WARN_AFTER and not caplog.records


def test_trainers_whose_advantages_come_later_are_not_watched():
    from trl_multiagent.trainers import CoLLMTrainer, MAGRPOTrainer, MAPoRLTrainer

    assert CoLLMTrainer.checks_learning_signal is False and MAPoRLTrainer.checks_learning_signal is False
    assert getattr(MAGRPOTrainer, "checks_learning_signal", True)
    trainer = fake_trainer(checks_learning_signal=False)
    for _ in range(WARN_AFTER + 1):
        assert note_learning_signal(trainer, rollout(0.0)) is None
    assert not hasattr(trainer, "_learning_signal")
