"""Asynchronous rollouts (``max_staleness`` k > 0): the next k steps' rollouts are generated in a worker thread while
the trainer updates, each with the adapters of the step that started it, and none is trained on more than k optimizer
steps after them.

How a run goes (:class:`AsyncRollouts`, one per trainer; the trainer's ``sample`` calls :meth:`AsyncRollouts.take`):

* **the same tasks, in the same order.** The training loop takes each step's batch of tasks through
  ``get_batch_samples`` (:mod:`~trl_multiagent.trainers.compat`); there the epoch's batch iterator is wrapped in a
  :class:`Lookahead`, which hands the loop the very batches it would have had, in order, and lets this module take the
  next ones early. The rollout started for a batch is the one step t trains on when the loop hands it that batch, so
  the tasks of step t are the tasks of step t whatever k.
* **one step, on the training thread** (:meth:`AsyncRollouts.take`, from the trainer's ``sample``), at the step's
  ``global_step`` g (the optimizer steps done):

  1. the rollout trained at the previous step releases the adapter versions it held;
  2. the next steps' batches (up to k, never past ``max_steps`` or the end of the epoch) are taken from the look-ahead,
     and a rollout is started for each that has none: the generation backend pins every policy's adapter as it is
     now (``pin`` of the backend: :meth:`VLLMServerBackend.pin
     <trl_multiagent.generation.vllm_server.VLLMServerBackend.pin>` through a server, :meth:`VLLMGenerationBackend.pin
     <trl_multiagent.generation.vllm.VLLMGenerationBackend.pin>` with the colocated engine, which then runs in the
     worker; the changed adapters are written first: they are read here, between optimizer steps, never in the
     worker), and the worker thread runs the trainer's sampler with those versions (the backend's ``pinned``); the
     rollout's version is g, recorded on each of its samples (``Sample.version``);
  3. this step's rollout is awaited (``time/rollout_wait``). Its staleness is g minus its version: at most k by
     construction (a rollout started at step g' is trained at a step g <= g' + k); one that is more (a ``global_step``
     moved by other means) is dropped, its samples counted (``async/dropped_samples``), and generated again now, on
     this thread, with the current adapters;
  4. the rest of the step is the trainer's as in a synchronous run, on this thread: the credit, the trainer's
     log-probs of the samples with the adapters of step g (``old_per_token_logps``), and TRL's importance-sampling
     correction, whose ratio of those to the engine's log-probs (the behaviour policy's, ``sampling_logps``) weighs
     every sample, per policy; the staleness is in that ratio.

* **the versions.** A pinned version stays loaded on the server (served by the colocated engine, its folder kept)
  until the rollout that pinned it has been trained on (released at the next step) or dropped; with the version
  being trained, those of the k rollouts ahead and the current one, a policy has at most ``1 + k`` versions loaded
  at once (``--max-loras``: policies x (1 + k)).
* **the seeds.** Each rollout draws one seed from torch's RNG on the training thread when it starts; the seeds of its
  sampled requests come from a generator of that seed, so a seeded run sends the same seeds whatever the threads do.
* **the ends.** At the end of training (or on an error) the rollouts not started are cancelled, the one running is
  awaited (not on an error) and every pinned version is released. A rollout is not checkpointed: a resumed run starts
  its pipeline again. At an epoch's end the look-ahead stops at the epoch's last batch: the first step of the next
  epoch waits for its rollout (a bubble of one rollout per epoch).

Metrics, per step: ``async/staleness_mean`` and ``async/staleness_max`` over the samples trained on (versions behind
g), ``async/dropped_samples`` (so far), ``async/ahead`` (rollouts started for later steps), ``async/rollout_time``
(the rollout's own time in the worker), ``rollout_tokens_per_s`` and ``tokens/generated``.

k = 0 (the default) is the synchronous path exactly: no look-ahead, no worker, nothing of this module runs.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)

#: The name of the worker thread.
WORKER_NAME = "trl-multiagent-rollouts"


def check_async_config(config) -> None:
    """``max_staleness`` and what k > 0 needs, checked when the config is built (one line each): a generation backend
    that serves several versions of an adapter at once (``vllm_mode: server``), TRL's importance-sampling correction
    (the samples are off-policy), and every rollout trained in one optimizer step."""
    k = getattr(config, "max_staleness", 0)
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError("max_staleness must be an integer >= 0 (how many optimizer steps a rollout may be generated "
                         f"ahead of the step that trains on it; 0: synchronous rollouts), got {k!r}")
    if k == 0:
        return
    if not config.use_vllm:
        raise ValueError(f"max_staleness={k} (asynchronous rollouts) needs use_vllm: true (vllm_mode colocate or "
                         "server): the library's own decoding generates with the adapters being trained and cannot "
                         "serve the older adapter versions of rollouts generated ahead; generate with vLLM "
                         "(docs/guides/vllm.md) or set max_staleness: 0")
    if not config.vllm_importance_sampling_correction:
        raise ValueError(f"max_staleness={k} needs vllm_importance_sampling_correction: true: the samples come from "
                         "adapters up to max_staleness optimizer steps old (off-policy), and the correction weighs each "
                         "by the trained policy's probability of it over the probability the engine sampled it with")
    minibatches = getattr(config, "num_minibatches", 1) or 1
    if config.num_iterations * minibatches != 1:
        parts = f"num_iterations={config.num_iterations}" + (f", num_minibatches={minibatches}" if minibatches != 1
                                                               else "")
        raise ValueError(f"max_staleness={k} needs every rollout trained in one optimizer step ({parts}): a rollout "
                         "reused for several steps would be trained on further behind its version than max_staleness; "
                         "set them to 1 or max_staleness: 0")


# ---------------------------------------------------------------------------------------------------- the parts
@dataclass
class _Rollout:
    """One step's tasks and, once started, the rollout generated for them: its version (the ``global_step`` whose
    adapters it uses), the versions it pinned, its seed, and the future of ``(experience, stats)``."""

    tasks: Any
    version: int | None = None
    pins: dict | None = None
    seed: int = 0
    future: Future | None = None


class Lookahead:
    """An epoch's batch iterator as the training loop sees it (the same batches in the same order), from which the
    next batches can be taken early (:meth:`peek`); each batch handed to the loop is noted on ``owner.handed_out``."""

    def __init__(self, source: Iterator, owner: AsyncRollouts):
        self.source, self.owner = source, owner
        self.pending: deque[_Rollout] = deque()
        self.exhausted = False

    def __iter__(self):
        return self

    def __next__(self):
        if self.pending:
            entry = self.pending.popleft()
        elif self.exhausted:
            raise StopIteration
        else:
            entry = _Rollout(next(self.source))
        self.owner.handed_out = entry
        return entry.tasks

    def peek(self, n: int) -> list[_Rollout]:
        """The next ``n`` batches (fewer at the end of the epoch), taken from the iterator now if need be."""
        while len(self.pending) < n and not self.exhausted:
            try:
                self.pending.append(_Rollout(next(self.source)))
            except StopIteration:
                self.exhausted = True
        return list(self.pending)[:n]


class _Worker:
    """One daemon thread that runs jobs in the order they come (a process can exit while it runs)."""

    def __init__(self):
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name=WORKER_NAME, daemon=True)
        self.thread.start()

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        self.jobs.put((future, fn, args))
        return future

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as error:  # noqa: BLE001  (raised where the result is awaited)
                future.set_exception(error)

    def stop(self, wait: bool) -> None:
        self.jobs.put(None)
        if wait:
            self.thread.join()


# ---------------------------------------------------------------------------------------------------- the pipeline
class AsyncRollouts:
    """The rollouts of a trainer with ``max_staleness`` k > 0 (see the module docstring).

    Args:
        trainer: the :class:`~trl_multiagent.trainers.base.MultiAgentTrainer`; its pool's generation backend must pin
            adapter versions (:class:`~trl_multiagent.generation.vllm_server.VLLMServerBackend`, the server's, or
            :class:`~trl_multiagent.generation.vllm.VLLMGenerationBackend`, the colocated engine's).
    """

    def __init__(self, trainer):
        backend = trainer.pool.generation_backend
        if not all(hasattr(backend, name) for name in ("pin", "unpin", "pinned")):
            raise ValueError(f"max_staleness={trainer.args.max_staleness} needs a generation backend that serves "
                             "several versions of an adapter at once (use_vllm: true); the pool's is "
                             f"{type(backend).__name__}")
        self.trainer, self.backend = trainer, backend
        self.max_staleness = int(trainer.args.max_staleness)
        self.handed_out: _Rollout | None = None  # the batch the loop took last (Lookahead)
        self._lookahead: Lookahead | None = None
        self._trained: _Rollout | None = None  # the rollout of the step in progress: its pins go at the next step
        self._worker: _Worker | None = None
        #: Samples generated and dropped as too stale, so far.
        self.dropped_samples = 0

    # ------------------------------------------------------------------------------------------- the loop's side
    def lookahead(self, epoch_iterator: Iterator) -> Lookahead:
        """The look-ahead over ``epoch_iterator`` (a new one for each epoch's iterator)."""
        if self._lookahead is None or self._lookahead.source is not epoch_iterator:
            if self._lookahead is not None:
                self._discard(self._lookahead.pending)
            self._lookahead = Lookahead(epoch_iterator, self)
        return self._lookahead

    def take(self, tasks: Sequence[Mapping[str, Any]]):
        """This step's rollout of ``tasks`` (the batch the loop handed over), started ahead or now, no staler than
        ``max_staleness``; starts the next steps' rollouts and logs the step's ``async/*`` metrics."""
        trainer = self.trainer
        if trainer.num_iterations != 1:
            raise ValueError(f"max_staleness={self.max_staleness} needs every rollout trained in one optimizer step; "
                             f"this trainer reuses a rollout for {trainer.num_iterations}")
        step = trainer.state.global_step
        entry, self.handed_out = self.handed_out, None
        if entry is None or entry.tasks is not tasks:  # a call outside the loop's batches: its own rollout, now
            entry = _Rollout(tasks)
        self._release(self._trained)
        self._trained = None
        if entry.future is None:
            self._start(entry, step)
        if self._lookahead is not None:  # the next steps' rollouts start now, with the adapters as they are
            left = trainer.state.max_steps - step - 1 if trainer.state.max_steps > 0 else self.max_staleness
            for ahead in self._lookahead.peek(max(0, min(self.max_staleness, left))):
                if ahead.future is None:
                    self._start(ahead, step)
        try:
            with trainer.timed("rollout_wait"):
                experience, stats = entry.future.result()
        except BaseException:
            self._release(entry)
            raise
        if step - entry.version > self.max_staleness:  # too stale (global_step moved by other means): dropped
            trainer.generated_samples.add(experience)
            self.dropped_samples += len(experience.samples)
            logger.warning("step %d: a rollout of the adapters of step %d is %d steps behind, more than max_staleness="
                           "%d: its %d samples are dropped and the rollout generated again", step, entry.version,
                           step - entry.version, self.max_staleness, len(experience.samples))
            self._release(entry)
            entry = _Rollout(tasks, version=step, pins=self.backend.pin(), seed=self._seed())
            experience, stats = self._roll_out(entry)  # on this thread: the worker has later steps' rollouts queued
        self._trained = entry
        trainer.generated_samples.add(experience)
        staleness = [step - s.version for s in experience.samples]
        trainer.log_metric("async/staleness_mean", sum(staleness) / len(staleness) if staleness else 0.0)
        trainer.log_metric("async/staleness_max", float(max(staleness, default=0)))
        trainer.log_metric("async/dropped_samples", float(self.dropped_samples))
        trainer.log_metric("async/ahead", float(sum(1 for e in self._pending() if e.future is not None)))
        trainer.log_metric("async/rollout_time", stats["seconds"])
        trainer.log_metric("tokens/generated", float(stats["tokens"]))
        if stats["generation_seconds"] > 0:
            trainer.log_metric("rollout_tokens_per_s", stats["tokens"] / stats["generation_seconds"])
        return experience

    def close(self, wait: bool = True) -> None:
        """Cancel the rollouts not started, await the one running (``wait``), release every pinned version; the
        pipeline can start again (a later ``train``)."""
        entries = list(self._pending())
        for entry in (self.handed_out, self._trained):
            if entry is not None and entry not in entries:
                entries.append(entry)
        for entry in entries:
            if entry.future is not None:
                entry.future.cancel()
        if self._worker is not None:
            self._worker.stop(wait)
            self._worker = None
        self._discard(entries)
        self._lookahead, self.handed_out, self._trained = None, None, None

    # ------------------------------------------------------------------------------------------- the rollouts
    def _pending(self) -> list[_Rollout]:
        return list(self._lookahead.pending) if self._lookahead is not None else []

    def _seed(self) -> int:
        return int(torch.randint(0, 2**31 - 1, (1,)).item())

    def _start(self, entry: _Rollout, step: int) -> None:
        """Pin the adapters as they are (version ``step``) and queue the rollout in the worker."""
        entry.version, entry.pins, entry.seed = step, self.backend.pin(), self._seed()
        if self._worker is None:
            self._worker = _Worker()
        entry.future = self._worker.submit(self._roll_out, entry)

    def _roll_out(self, entry: _Rollout):
        """The trainer's sampler on ``entry``'s tasks with its pinned versions (in the worker, or on the training
        thread for a regenerated rollout); the samples get the rollout's version."""
        trainer = self.trainer
        pool = trainer.pool
        before = dict(pool.generation_stats)
        start = time.perf_counter()
        generator = torch.Generator().manual_seed(entry.seed)
        with torch.no_grad(), self.backend.pinned(entry.pins, generator):
            experience = trainer.sampler.rollout(pool, trainer.environment_factory, list(entry.tasks),
                                                 trainer.generation_config)
        for sample in experience.samples:
            sample.version = entry.version
        # the pool's counts: exact while only this rollout generates (an evaluation at the same time adds its own)
        stats = {"seconds": time.perf_counter() - start,
                 "generation_seconds": pool.generation_stats["seconds"] - before["seconds"],
                 "tokens": pool.generation_stats["tokens"] - before["tokens"]}
        return experience, stats

    def _release(self, entry: _Rollout | None) -> None:
        """Release ``entry``'s pinned versions (once its rollout is done or was never started)."""
        if entry is None or entry.pins is None:
            return
        pins, entry.pins = entry.pins, None
        if entry.future is None or entry.future.done():
            self.backend.unpin(pins)
        else:  # still generating: its requests need the versions until it ends
            entry.future.add_done_callback(lambda _, pins=pins: self.backend.unpin(pins))

    def _discard(self, entries) -> None:
        for entry in entries:
            if entry.future is not None:
                entry.future.cancel()
            self._release(entry)


@contextlib.contextmanager
def running_rollouts(rollouts: AsyncRollouts | None):
    """Around ``train``: the asynchronous rollouts are closed at its end (on an error without awaiting the one
    running); nothing without them."""
    if rollouts is None:
        yield
        return
    try:
        yield
    except BaseException:
        rollouts.close(wait=False)
        raise
    rollouts.close()
