"""How each base of a team computes: the decisions :class:`~trl_multiagent.team.pool.AgentPool` takes once per base,
when the base loads and once every adapter is attached, and keeps in a :class:`BasePaths` per base.

* :func:`decide_weight_copies`: whether a 4-bit base computes with a de-quantised copy of its frozen weights
  (``dense_copy``), whether generation computes a float32 base's frozen linears on the CPU with oneDNN-packed copies
  (``packed_weights``), and whether the teacher-forced passes do too (``packed_training``: up to three copies);
* :func:`decide_lean`: whether generation's one-token decoding steps run through the lean step
  (:class:`~trl_multiagent.generation.lean_step.LeanStep`) or transformers' forward (``lean_decode``);
* :func:`decide_copy`: the one rule of ``auto`` for every copy (:data:`COPY_SHARE_OF_TOTAL_MEMORY`).

Each setting is ``"auto"``, ``"always"`` or ``"never"`` (:data:`DENSE_COPY`, :data:`PACKED_WEIGHTS`,
:data:`LEAN_DECODE`); every decision is logged with its reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from trl_multiagent.generation.frozen_weights import dense_weight_bytes, packed_weight_bytes, use_dense_copy
from trl_multiagent.generation.lean_step import lean_support

logger = logging.getLogger(__name__)

#: Whether a 4-bit base computes with a de-quantised copy of its frozen weights (``AgentPool.dense_copy_of``).
DENSE_COPY = ("auto", "always", "never")
#: Whether generation computes a base's frozen linears with oneDNN-packed weights (``AgentPool.packs_weights``).
PACKED_WEIGHTS = ("auto", "always", "never")
#: Whether generation computes a base's one-token decoding steps with the lean step (``AgentPool.lean_decodes``).
LEAN_DECODE = ("auto", "always", "never")
#: ``auto`` makes a copy of a base's weights when it takes at most this share of the device's TOTAL memory: a fixed
#: property of the machine, so that the same recipe on the same machine always takes the same path (the memory free
#: at load time would make the numerics depend on what else runs).
COPY_SHARE_OF_TOTAL_MEMORY = 0.25


@dataclass
class BasePaths:
    """What one base computes with: a de-quantised copy (``dense_copy``), packed frozen weights in generation
    (``packed_weights``) and in the teacher-forced passes (``packed_training``), the lean decoding step
    (``lean_decode``)."""

    dense_copy: bool = False
    packed_weights: bool = False
    packed_training: bool = False
    lean_decode: bool = False


def decide_copy(choice: str, needed: int, total: int) -> bool:
    """Make a copy of ``needed`` bytes (0: the copy does not apply to this base)? ``choice`` is ``always``, ``never``
    or ``auto`` (at most :data:`COPY_SHARE_OF_TOTAL_MEMORY` of the device's ``total`` memory)."""
    if needed == 0 or choice == "never":
        return False
    return choice == "always" or needed <= COPY_SHARE_OF_TOTAL_MEMORY * total


def decide_weight_copies(key: str, source: str, model: torch.nn.Module, total: int, dense_copy: str,
                         packed_weights: str, frozen_dtype: torch.dtype) -> BasePaths:
    """The copies base ``key`` (loaded from ``source``) computes with, on a device of ``total`` bytes of memory; makes
    the de-quantised copy when it decides for one. ``frozen_dtype`` bfloat16 needs the packed copies in generation and
    training alike: a :class:`ValueError` where they are not made."""
    needed = dense_weight_bytes(model)
    paths = BasePaths(dense_copy=decide_copy(dense_copy, needed, total))
    if paths.dense_copy:
        use_dense_copy(model)
    if needed:
        logger.info("base %s computes with %s (a de-quantised copy takes %.0f MiB)", key,
                    "a de-quantised copy of its 4-bit weights" if paths.dense_copy else "its 4-bit weights",
                    needed / 2**20)
    packed = packed_weight_bytes(model, frozen_dtype)
    paths.packed_weights = decide_copy(packed_weights, packed, total)
    # the teacher-forced passes: packed copies of the layers generation packs in concatenations, and of every
    # transposed weight (the input's gradient), besides generation's: up to three copies in all
    paths.packed_training = paths.packed_weights and decide_copy(packed_weights, 3 * packed, total)
    if frozen_dtype != torch.float32 and not paths.packed_training:
        raise ValueError(
            f"frozen_matmul_dtype 'bfloat16': base {key} ({source}) cannot compute with packed bfloat16 copies in "
            "generation and training (" + ("they apply to float32 bases on the CPU only" if not packed else
                                           f"three copies take {3 * packed / 2**20:.0f} MiB, more than a quarter of "
                                           "the device's memory; packed_weights 'always' makes them anyway")
            + "); use frozen_matmul_dtype 'float32'")
    if packed:
        logger.info("base %s generates %s (a packed copy of its frozen weights takes %.0f MiB); its teacher-forced "
                    "passes compute %s", key,
                    ("with oneDNN-packed frozen weights" + ("" if frozen_dtype == torch.float32 else " in bfloat16"))
                    if paths.packed_weights else "with F.linear",
                    packed / 2**20, "with packed weights (up to three copies)" if paths.packed_training
                    else "with F.linear")
    return paths


def decide_lean(key: str, source: str, model: torch.nn.Module, lean_decode: str) -> bool:
    """Whether base ``key``'s decoding steps run through the lean step (decided once every adapter is attached: LoRA
    outside the projections rules it out); ``lean_decode`` 'always' on a base it does not apply to is a
    :class:`ValueError`."""
    reason = lean_support(model)
    if lean_decode == "always" and reason is not None:
        raise ValueError(f"lean_decode='always', but base {key} ({source}) cannot decode with the lean step: "
                         f"{reason}. Use lean_decode 'auto' (it then decodes through transformers' forward) or "
                         "'never'.")
    lean = lean_decode != "never" and reason is None
    logger.info("base %s decodes %s", key,
                "with the lean step" if lean else
                "through transformers' forward (lean_decode never)" if lean_decode == "never" else
                f"through transformers' forward: the lean step does not apply ({reason})")
    return lean
