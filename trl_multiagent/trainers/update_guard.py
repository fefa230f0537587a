"""Non-finite updates: a step whose loss or gradient norm is NaN or infinite changes nothing, and too many of them in
a row end the run with one error.

Without this, one bad batch (a NaN reward or advantage, an overflow in a log-prob) writes NaN into every weight of an
adapter at the optimizer step, every later step trains on NaN, and a long run goes on for hours writing NaN checkpoints
(``save_total_limit`` rotating the good ones away) and NaN final adapters. Instead, once per optimizer step, after the
gradients were averaged over processes and clipped and right before ``optimizer.step()`` (the trainer's
:meth:`check_update <trl_multiagent.trainers.base.MultiAgentTrainer.check_update>`, from the training loop's
``_get_grad_norm``, :mod:`~trl_multiagent.trainers.compat`), :func:`check_update` looks at the step's loss and gradient
norm. When either is not finite (on any process: the processes decide together), the update is skipped: every gradient
is dropped, so the optimizer steps no parameter (torch's optimizers skip every parameter whose ``grad`` is ``None``,
and so do transformers' Adafactor and bitsandbytes'; only the schedule-free ones, ``optim: schedule_free_*``, would
still advance a counter of their own) and the adapters, the optimizer's moments and its step counts stay as they were;
the step itself still counts (``global_step``, the learning-rate schedule, checkpoints, ``max_steps``). The optimizer's
own step hooks (:func:`watch_optimizer_steps`, torch's ``register_step_pre_hook`` / ``register_step_post_hook``) see
that decision: a skipped update counts no ``time/optimizer`` and leaves vLLM's adapters as they were. The main process
logs a warning that names the step, what was not finite for which policy (or critic) and the counts::

    step 7: non-finite loss (nan) for policy 'shared': update skipped (3 skipped so far, 2 in a row; ...)

and from the first skipped update on every training log carries ``skipped_updates``, the number skipped so far (a
resumed run continues the count of its checkpoint's log). After ``max_nonfinite_updates_in_a_row`` skipped updates
in a row (0: none), the next non-finite one ends the run with :class:`~trl_multiagent.errors.NonFiniteUpdateError`
(one line on the command line, ``run_status.json`` ``failed``).

Under fp16 mixed precision a gradient scaler skips the steps whose gradients overflow and lowers its scale: that is
its own mechanism, part of normal training, so there only a non-finite loss counts here.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from trl_multiagent.errors import NonFiniteUpdateError

logger = logging.getLogger("trl_multiagent.trainers")

#: The training-log key of the number of updates skipped so far.
SKIPPED_UPDATES_KEY = "skipped_updates"


@dataclass
class NonFiniteUpdateGuard:
    """The counts of one run: updates skipped in all (``skipped``) and in a row (``in_a_row``, since ``first_step``),
    and whether the optimizer step about to run is skipped (``skip_step``)."""

    limit: int
    skipped: int = 0
    in_a_row: int = 0
    first_step: int | None = None
    skip_step: bool = False

    def observe(self, step: int, problem: str | None) -> str | None:
        """Take one update's verdict (``problem``: what was not finite, or ``None``); return the warning to log, or
        raise :class:`~trl_multiagent.errors.NonFiniteUpdateError` when the streak goes past ``limit``."""
        if problem is None:
            self.in_a_row, self.first_step, self.skip_step = 0, None, False
            return None
        if self.in_a_row == 0:
            self.first_step = step
        self.in_a_row += 1
        if self.in_a_row > self.limit:
            steps = f"step {step}" if self.first_step == step else f"steps {self.first_step}-{step}"
            last_good = ("the adapters are still the initial ones" if self.first_step <= 1 else
                         f"the adapters are those of step {self.first_step - 1}, as are the checkpoints saved since")
            raise NonFiniteUpdateError(
                f"step {step}: {problem}; {self.in_a_row} optimizer updates in a row ({steps}) had a non-finite loss "
                f"or gradient norm, more than max_nonfinite_updates_in_a_row={self.limit}, so the run stops "
                f"({self.skipped} skipped before this one; {last_good}). Look for NaN or infinite rewards or "
                "advantages (metrics.jsonl, log_completions), or lower learning_rate or max_grad_norm")
        self.skipped += 1
        self.skip_step = True
        return (f"step {step}: {problem}: update skipped ({self.skipped} skipped so far, {self.in_a_row} in a row; "
                f"max_nonfinite_updates_in_a_row={self.limit})")


_PLURAL = {"policy": "policies", "critic": "critics"}


def _names(kind: str, names) -> str:
    names = list(names)
    return f"{kind if len(names) == 1 else _PLURAL.get(kind, kind + 's')} {', '.join(repr(n) for n in names)}"


def _values(values) -> str:
    return "/".join(dict.fromkeys(str(v) for v in values))


def describe_problem(losses: dict[str, float], total_loss: float, group_norms: dict[tuple[str, str], float],
                     total_norm: float) -> str | None:
    """What was not finite in one update, or ``None`` when everything was: the policies whose loss was not finite
    (``losses``), else the total loss; then the policies and critics whose gradient norm was not finite
    (``group_norms``, keyed by ``(kind, name)``; known where ``clip_gradients`` computed them), else the total
    gradient norm."""
    parts = []
    bad_losses = {p: v for p, v in losses.items() if not math.isfinite(v)}
    if bad_losses:
        parts.append(f"non-finite loss ({_values(bad_losses.values())}) for {_names('policy', bad_losses)}")
    elif not math.isfinite(total_loss):
        parts.append(f"non-finite loss ({total_loss})")
    bad_norms = {g: v for g, v in group_norms.items() if not math.isfinite(v)}
    by_kind = {}
    for (kind, name), value in bad_norms.items():
        if not (kind == "policy" and name in bad_losses):  # a NaN loss's gradient is NaN too: said once
            by_kind.setdefault(kind, {})[name] = value
    for kind, norms in by_kind.items():
        parts.append(f"non-finite gradient norm ({_values(norms.values())}) for {_names(kind, norms)}")
    if not parts and not math.isfinite(total_norm):
        parts.append(f"non-finite gradient norm ({total_norm})")
    return ", ".join(parts) or None


def _as_float(value) -> float:
    if value is None:
        return 0.0
    return float(value.detach().float().item()) if isinstance(value, torch.Tensor) else float(value)


def check_update(trainer, grad_norm) -> bool:
    """Decide whether ``trainer``'s optimizer update of this step is skipped (see the module docstring); returns
    ``True`` when it is. Reads the step's loss (``trainer.step_loss``, per policy ``trainer.step_losses``) and the
    per-group gradient norms of ``clip_gradients`` (``trainer.group_grad_norms``, where it ran)."""
    guard = trainer.__dict__.get("_update_guard")
    if guard is None:  # one per run; a resumed run continues the count its checkpoint's log ends with
        done = [h[SKIPPED_UPDATES_KEY] for h in trainer.state.log_history if SKIPPED_UPDATES_KEY in h]
        guard = trainer.__dict__["_update_guard"] = NonFiniteUpdateGuard(
            limit=trainer.args.max_nonfinite_updates_in_a_row, skipped=int(done[-1]) if done else 0)
    losses = {p: _as_float(v) for p, v in (getattr(trainer, "step_losses", None) or {}).items()}
    total_loss = _as_float(getattr(trainer, "step_loss", None))
    total_norm = _as_float(grad_norm)
    # with a gradient scaler (fp16) an overflowing gradient is the scaler's to skip (module docstring)
    judge_norm = getattr(trainer.accelerator, "scaler", None) is None
    local_bad = not (math.isfinite(total_loss) and all(math.isfinite(v) for v in losses.values())
                     and (math.isfinite(total_norm) or not judge_norm))
    bad = local_bad
    if trainer.accelerator.num_processes > 1:  # every process skips the same updates (DDP keeps them equal)
        flag = torch.tensor([float(local_bad)], device=trainer.accelerator.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        bad = bool(flag.item())
    step = trainer.state.global_step + 1  # the step being computed
    problem = None
    if bad:
        group_norms = (getattr(trainer, "group_grad_norms", None) or {}) if judge_norm else {}
        problem = describe_problem(losses, total_loss, group_norms, total_norm if judge_norm else 0.0) or \
            "a non-finite loss or gradient norm on another process"
    warning = guard.observe(step, problem)
    if warning is None:
        return False
    for group in trainer.pool.trainable_groups():  # nothing of this step's gradients reaches the optimizer
        for p in group["params"]:
            p.grad = None
    if trainer.accelerator.is_main_process:
        logger.warning(warning)
    return True


def skips_optimizer_step(trainer) -> bool:
    """Whether the optimizer step about to run is skipped (:func:`check_update` decided so); resets the decision."""
    guard = trainer.__dict__.get("_update_guard")
    if guard is None or not guard.skip_step:
        return False
    guard.skip_step = False
    return True


class OptimizerStepWatch:
    """The trainer's step hooks on its optimizer (:func:`watch_optimizer_steps`): before a step, whether
    :func:`check_update` skipped its update; after a step that was not skipped, its time (``time/optimizer``) and, with
    vLLM, the engine's adapters marked stale (the new ones are synced before the next rollout)."""

    def __init__(self, trainer):
        self.trainer, self.timer = trainer, None

    def before(self, optimizer, args, kwargs) -> None:
        """torch's step pre-hook."""
        if skips_optimizer_step(self.trainer):
            self.timer = None
            for group in optimizer.param_groups:  # no gradient reaches the step (check_update dropped them too)
                for p in group["params"]:
                    p.grad = None
            return
        # the step runs after training_step logged its times: its time goes to the next step's time/optimizer
        self.timer = self.trainer.timed("optimizer")
        self.timer.__enter__()

    def after(self, optimizer, args, kwargs) -> None:
        """torch's step post-hook (not called when the step raised: the error ends the run)."""
        timer, self.timer = self.timer, None
        if timer is None:  # a skipped update: no time, and the adapters are unchanged
            return
        timer.__exit__(None, None, None)
        backend = self.trainer.pool.generation_backend
        if backend is not None:
            backend.mark_stale()


def watch_optimizer_steps(trainer, optimizer) -> OptimizerStepWatch:
    """Register :class:`OptimizerStepWatch`'s hooks on ``optimizer`` (torch's public step hooks; the optimizer and its
    ``step`` are left as they are). Returns the watch."""
    watch = OptimizerStepWatch(trainer)
    optimizer.register_step_pre_hook(watch.before)
    optimizer.register_step_post_hook(watch.after)
    return watch


def add_skipped_updates(trainer, logs: dict) -> None:
    """Add ``skipped_updates`` to a training log (one with ``loss``) once an update of the run was skipped."""
    guard = trainer.__dict__.get("_update_guard")
    if guard is not None and guard.skipped and "loss" in logs:
        logs[SKIPPED_UPDATES_KEY] = guard.skipped
