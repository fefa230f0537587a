"""Micro-batches of a policy's samples for the update's forward and backward passes.

A policy's samples are cut into micro-batches of at most ``per_device_train_batch_size`` rows in the order of their
prompt tokens (:func:`prompt_order`): the samples of one prompt sit together, and so do the prompts that begin alike
(every prompt of an agent repeats its system message and worked examples), so that the teacher-forced pass
(:func:`~trl_multiagent.generation.teacher_forcing.completion_outputs`) runs each shared prefix and each distinct prompt once
per micro-batch it appears in, and it appears in as few as possible. Ordered by length instead, the samples of one
prompt land in several micro-batches, and each of them runs the prompt again. The loss is the same weighted sum
over micro-batches in any order (only the float summation order changes).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from trl_multiagent.rollout import Sample


def prompt_order(rows: Sequence[Sample]) -> list[int]:
    """The indices of ``rows`` sorted by prompt tokens (lexicographically: prompts sharing a longer prefix are
    nearer), the longer completions of one prompt first."""
    return sorted(range(len(rows)), key=lambda i: (list(rows[i].generation.prompt_ids),
                                                   -len(rows[i].generation.completion_ids)))


def chunks(rows: Sequence, size: int) -> Iterator[list]:
    """``rows`` in consecutive pieces of at most ``size``."""
    for i in range(0, len(rows), size):
        yield list(rows[i:i + size])


def prompt_grouped_chunks(rows: Sequence[Sample], size: int) -> Iterator[list[Sample]]:
    """Micro-batches of at most ``size`` samples in :func:`prompt_order`."""
    return chunks([rows[i] for i in prompt_order(rows)], size)


def weighted_chunks(rows: Sequence[Sample], weights: Sequence[float] | None, size: int,
                    equal_within: bool) -> list[tuple[list[Sample], list[float]]]:
    """Micro-batches of at most ``size`` samples in :func:`prompt_order`, each with its samples' shares of the
    policy's loss (``1/len(rows)`` each without ``weights``). ``equal_within``: group samples of equal weight first,
    so that a row-mean loss times the micro-batch's total weight is exactly the weighted sum of its rows (TRL's
    per-response losses)."""
    if weights is None:
        weights = [1.0 / len(rows)] * len(rows) if rows else []
    if len(weights) != len(rows):
        raise ValueError(f"{len(weights)} sample weights for {len(rows)} samples")
    order = prompt_order(rows)
    rows, weights = [rows[i] for i in order], [float(weights[i]) for i in order]
    if not equal_within:
        return [(rows[i:i + size], weights[i:i + size]) for i in range(0, len(rows), size)]
    classes: dict[float, list[Sample]] = {}
    for row, w in zip(rows, weights):
        classes.setdefault(w, []).append(row)
    return [(chunk, [w] * len(chunk)) for w, members in classes.items() for chunk in chunks(members, size)]


def store_per_token(samples: Sequence[Sample], attr: str, logps: torch.Tensor, batch) -> None:
    """Keep each sample's per-token values of a collated micro-batch (its real completion tokens) as ``attr``."""
    for s, row, m in zip(samples, logps, batch["completion_mask"]):
        setattr(s, attr, row[m.bool()].tolist())


def loss_mask(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The completion tokens the loss covers: ``completion_mask`` (real tokens) times ``tool_mask`` where the batch
    has one (0 on tool results, which the model reads but did not generate), as TRL's ``_compute_loss``."""
    mask = batch["completion_mask"]
    return mask if "tool_mask" not in batch else mask * batch["tool_mask"].to(mask.dtype)
