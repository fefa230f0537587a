"""The one log-prob path: per-token log-probabilities (and entropies) of completions under a policy, for the losses
and for the behaviour / reference log-probs of a rollout.

Two things make it cheaper than a forward pass over every (prompt + completion) row:

- **shared prompts**: the K samples of one prompt (a node of a rollout tree, a group) share their prompt, so the
  prompt runs once, with its KV cache handed to every one of its completions; gradients flow through the shared
  prompt computation into the adapter, so the result and its gradient are those of K separate passes;
- **the LM head**: on CPU the logits of the completion positions are computed as one matrix product and normalised
  with ``log_softmax`` (TRL's fused, chunked head avoids materialising them, which saves GPU memory but is several
  times slower on a CPU); on CUDA TRL's fused head is used.
"""

from __future__ import annotations

import torch


def completion_logps(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                     completion_mask: torch.Tensor, temperature: float, compute_entropy: bool = False,
                     share_prompts: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logps, entropies)`` of the ``(B, T)`` completion tokens after their left-padded ``(B, P)`` prompts under
    ``model`` (a causal LM, or a callable forwarding to one), at sampling ``temperature``; ``entropies`` is ``None``
    unless ``compute_entropy``. Rows with the same prompt share one prompt pass when ``share_prompts``."""
    groups: dict[tuple[int, ...], int] = {}
    owner = []
    for row in range(prompt_ids.size(0)):
        key = tuple(prompt_ids[row][prompt_mask[row].bool()].tolist())
        owner.append(groups.setdefault(key, len(groups)))
    if not share_prompts or len(groups) == prompt_ids.size(0):
        logits = _full_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask)
    else:
        logits = _shared_prompt_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, owner)
    return _logps_from_logits(logits, completion_ids, temperature, compute_entropy)


def _full_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
    """Logits predicting every completion token, from one pass over prompt + completion (``(B, T, V)``)."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    t = completion_ids.size(1)
    out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=t + 1, use_cache=False)
    return out.logits[:, :-1]


def _shared_prompt_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, owner) -> torch.Tensor:
    """The same logits as :func:`_full_logits`, with each distinct prompt run once: its KV cache (with its graph)
    is gathered for every row of that prompt, and the completions run on top of it."""
    first = {}
    for row, g in enumerate(owner):
        first.setdefault(g, row)
    unique_rows = torch.tensor([first[g] for g in range(len(first))], device=prompt_ids.device)
    index = torch.tensor(owner, device=prompt_ids.device)
    u_ids, u_mask = prompt_ids[unique_rows], prompt_mask[unique_rows]
    u_pos = (u_mask.long().cumsum(-1) - 1).clamp(min=0)
    prompt_out = model(input_ids=u_ids, attention_mask=u_mask, position_ids=u_pos, use_cache=True, logits_to_keep=1)
    cache = prompt_out.cache if hasattr(prompt_out, "cache") else prompt_out.past_key_values
    cache.batch_select_indices(index)  # every row gets its prompt's keys and values (a differentiable gather)
    t = completion_ids.size(1)
    start = prompt_mask.long().sum(-1, keepdim=True)  # the first completion position of each row
    positions = start + torch.arange(t, device=completion_ids.device)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    out = model(input_ids=completion_ids, attention_mask=attention_mask, position_ids=positions, cache=cache,
                use_cache=True)
    return torch.cat([prompt_out.logits[:, -1:][index], out.logits[:, :-1]], dim=1)


def _logps_from_logits(logits: torch.Tensor, completion_ids: torch.Tensor, temperature: float,
                       compute_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    logps_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    logps = logps_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    entropies = None
    if compute_entropy:
        with torch.no_grad():
            entropies = -(logps_all.exp() * logps_all).sum(-1)
    return logps, entropies
