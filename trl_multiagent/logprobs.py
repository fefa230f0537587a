"""The one log-prob path: per-token log-probabilities (and entropies) of completions under a policy, for the losses
and for the behaviour / reference log-probs of a rollout.

Two things make it cheaper than a forward pass over every (prompt + completion) row:

- **shared prompts and prefixes**: the logits come from :func:`~trl_multiagent.teacher_forcing.completion_outputs`,
  which runs a prompt shared by K samples, and an opening shared by several prompts (system message, worked
  examples), once, with gradients flowing through the shared computation into the adapter, so the result and its
  gradient are those of separate passes;
- **the LM head**: on CPU the logits of the completion positions are computed as one matrix product and normalised
  with ``log_softmax`` (TRL's fused, chunked head avoids materialising them, which saves GPU memory but is several
  times slower on a CPU); on CUDA TRL's fused head is used.
"""

from __future__ import annotations

import torch

from .teacher_forcing import completion_outputs, lm_forward


def completion_logps(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                     completion_mask: torch.Tensor, temperature: float, compute_entropy: bool = False,
                     share_prompts: bool = True, prefix_store=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logps, entropies)`` of the ``(B, T)`` completion tokens after their left-padded ``(B, P)`` prompts under
    ``model`` (a causal LM, or a callable forwarding to one), at sampling ``temperature``; ``entropies`` is ``None``
    unless ``compute_entropy``. Shared prompts and prompt prefixes run once when ``share_prompts``; ``prefix_store``:
    the prefixes an update's micro-batches share, already run
    (:class:`~trl_multiagent.teacher_forcing.PrefixStore`)."""
    logits = completion_outputs(lm_forward(model), prompt_ids, prompt_mask, completion_ids, completion_mask,
                                share_prompts=share_prompts, prefix_store=prefix_store)
    return _logps_from_logits(logits, completion_ids, temperature, compute_entropy)


def _logps_from_logits(logits: torch.Tensor, completion_ids: torch.Tensor, temperature: float,
                       compute_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    if logits.dtype in (torch.float16, torch.bfloat16):  # half-precision logits normalise in float32; float64 stays
        logits = logits.float()
    logps_all = torch.log_softmax(logits / temperature, dim=-1)
    logps = logps_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    entropies = None
    if compute_entropy:
        with torch.no_grad():
            entropies = -(logps_all.exp() * logps_all).sum(-1)
    return logps, entropies
