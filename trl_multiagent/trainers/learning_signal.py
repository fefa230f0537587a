"""A warning when training has nothing to learn from: every advantage of a rollout is 0.

Group-relative credit (MAGRPO, AT-GRPO, MHGPO) compares each sample with its group; when every group's rewards tie
(every sample wrong, or every sample right, or a reward that does not depend on the response), every advantage is 0,
and so are the loss and the gradient: the step changes nothing. One such step is common; many in a row mean the run
is not learning (the task is too hard or too easy for the model, the reward does not vary with the response, or the
group is too small to hold a difference). :func:`note_learning_signal`, called by the trainer after each rollout's
credit, counts the rollouts in a row without a non-zero advantage (over all processes) and, on the main process, logs a
warning with that count when it reaches :data:`WARN_AFTER`, then at most once every :data:`REPEAT_EVERY` rollouts
while it lasts, and one line when a non-zero advantage comes back after a warning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger("trl_multiagent.trainers")

#: Rollouts in a row without a non-zero advantage before the first warning.
WARN_AFTER = 2
#: While it lasts, the warning is repeated at most once per this many rollouts.
REPEAT_EVERY = 20


@dataclass
class LearningSignalMonitor:
    """Counts the rollouts in a row whose advantages are all 0 and decides when to warn (see the module docstring).

    ``observe(has_signal, step)`` takes one rollout's verdict and the optimizer step it serves, and returns what to
    log, ``(logging level, message)``, or ``None``."""

    warn_after: int = WARN_AFTER
    repeat_every: int = REPEAT_EVERY
    streak: int = 0
    first_step: int | None = None
    warned: bool = False

    def observe(self, has_signal: bool, step: int) -> tuple[int, str] | None:
        if has_signal:
            note = None
            if self.warned:
                note = (logging.INFO, f"learning signal back at step {step}: a non-zero advantage after {self.streak} "
                                      "rollouts without one")
            self.streak, self.first_step, self.warned = 0, None, False
            return note
        if self.streak == 0:
            self.first_step = step
        self.streak += 1
        due = self.streak == self.warn_after or \
            (self.streak > self.warn_after and (self.streak - self.warn_after) % self.repeat_every == 0)
        if not due:
            return None
        self.warned = True
        steps = f"step {step}" if self.first_step == step else f"steps {self.first_step}-{step}"
        return logging.WARNING, (
            f"no learning signal: {self.streak} rollouts in a row ({steps}) had no sample with a non-zero advantage: "
            "every group's rewards tie, so the loss and grad_norm are 0 and these steps change nothing. Check that "
            "the reward varies with the response (the metrics env/<component> and frac_reward_zero_std; "
            "completions.jsonl with log_completions: true), that the model solves some tasks and fails others (an "
            "easier task, a longer max_completion_length), or sample more per group (num_generations, temperature). "
            f"Said again after {self.repeat_every} more such rollouts.")


def has_nonzero_advantage(experience) -> bool:
    """Whether any training sample of the rollout has a non-zero advantage."""
    return any(getattr(s, "advantage", 0.0) != 0.0 for s in getattr(experience, "samples", ()) or ())


def note_learning_signal(trainer, experience) -> str | None:
    """Give ``trainer``'s monitor this rollout's verdict (all processes' rollouts together); the main process logs.

    A trainer whose credit is not each sample's ``advantage`` after ``assign_credit`` sets
    ``checks_learning_signal = False`` and is skipped (the actor-critic TD errors, computed in the update; MAPoRL's
    per-token GAE advantages)."""
    if not getattr(trainer, "checks_learning_signal", True):
        return None
    has_signal = has_nonzero_advantage(experience)
    accelerator = trainer.accelerator
    if accelerator.num_processes > 1:
        import torch.distributed as dist

        verdicts: list[bool | None] = [None] * accelerator.num_processes
        dist.all_gather_object(verdicts, has_signal)
        has_signal = any(verdicts)
    monitor = trainer.__dict__.setdefault("_learning_signal", LearningSignalMonitor())
    note = monitor.observe(has_signal, trainer.state.global_step + 1)
    if note is None or not accelerator.is_main_process:
        return None
    logger.log(*note)
    return note[1]
