"""The sampler: the next token of every row from its logits, under a GenerationConfig.

:func:`sample_next` applies repetition penalty, suppressed tokens, EOS held back before ``min_new_tokens``,
temperature, top-k, top-p and min-p with the semantics of transformers' logits processors, without sorting the whole
vocabulary at every step: truncation works on the most likely candidates (:func:`nucleus_candidates`) and the draw on
them alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from transformers import GenerationConfig

#: Candidates taken with ``topk`` before top-p; a row whose nucleus is larger falls back to a full sort.
TOP_P_CANDIDATES = 64


def sample_next(logits: torch.Tensor, config: GenerationConfig, seen: torch.Tensor | None = None,
                step: int = 0, eos_ids: Sequence[int] = ()) -> torch.Tensor:
    """The next token of every row from its ``(rows, vocab)`` logits, under ``config`` and with the semantics of
    transformers' processors, in their order: repetition penalty over the ``seen`` ids (prompt and completion so
    far; repeats are harmless), suppressed tokens, EOS held back before ``min_new_tokens``; then greedy argmax, or
    temperature, top-k, top-p and min-p and a draw. Truncation works on the most likely candidates
    (:func:`nucleus_candidates`) and the draw on them alone: no sort of the whole vocabulary and no full-vocabulary
    multinomial at every step."""
    scores = logits.float()
    penalty = config.repetition_penalty
    if penalty is not None and penalty != 1.0 and seen is not None:
        picked = scores.gather(1, seen)
        scores = scores.scatter(1, seen, torch.where(picked < 0, picked * penalty, picked / penalty))
    if config.suppress_tokens:
        scores = scores.index_fill(1, torch.tensor(list(config.suppress_tokens), device=scores.device), -float("inf"))
    if config.min_new_tokens and step < config.min_new_tokens and eos_ids:
        scores = scores.index_fill(1, torch.tensor(list(eos_ids), device=scores.device), -float("inf"))
    if not config.do_sample:
        return scores.argmax(dim=-1)
    if config.temperature is not None and config.temperature != 1.0:
        scores = scores / config.temperature
    truncating = bool(config.top_k) or (config.top_p is not None and config.top_p < 1.0) or bool(config.min_p)
    if not truncating:
        return _inverse_cdf_draw(scores)
    tokens = torch.empty(scores.size(0), dtype=torch.long, device=scores.device)
    for rows, values, ids in nucleus_candidates(scores, config):
        tokens[rows] = ids.gather(1, _inverse_cdf_draw(values)[:, None]).squeeze(1)
    return tokens


def _inverse_cdf_draw(scores: torch.Tensor) -> torch.Tensor:
    """One draw per row from ``softmax(scores)`` by inverting its cumulative sum (``-inf`` scores never drawn)."""
    cdf = (scores - scores.max(dim=-1, keepdim=True).values).exp().cumsum(-1)
    # u in (0, total]: the first index whose cumulative mass reaches u has a non-zero probability
    u = (1.0 - torch.rand((scores.size(0), 1), device=scores.device, dtype=cdf.dtype)) * cdf[:, -1:]
    return torch.searchsorted(cdf, u).squeeze(1).clamp(max=scores.size(-1) - 1)


def nucleus_candidates(scores: torch.Tensor, config: GenerationConfig):
    """The tokens that survive top-k, top-p and min-p, as groups ``(rows, values, ids)``: for the rows ``rows``,
    candidate ids sorted by score and their scores, ``-inf`` where truncated. The candidates are the top
    :data:`TOP_P_CANDIDATES` tokens (or top-k); rows whose nucleus is larger try 16 times as many, then the whole
    vocabulary (transformers' own sort)."""
    vocab = scores.size(-1)
    top_p = config.top_p if config.top_p is not None and config.top_p < 1.0 else None
    rows = torch.arange(scores.size(0), device=scores.device)
    k = min(int(config.top_k), vocab) if config.top_k else min(TOP_P_CANDIDATES, vocab)
    full_norm = None if config.top_k else torch.logsumexp(scores, dim=-1, keepdim=True)
    while rows.numel():
        values, ids = torch.topk(scores[rows], k, dim=-1)
        if top_p is not None:
            # top-k (when set) comes first: the nucleus is then taken of the top-k tokens' renormalised probabilities
            norm = torch.logsumexp(values, dim=-1, keepdim=True) if config.top_k else full_norm[rows]
            probs = (values - norm).exp()
            keep = (probs.cumsum(-1) - probs) < top_p
            keep[:, 0] = True
            values = values.masked_fill(~keep, -float("inf"))
        if config.min_p:  # relative to the most likely token (the ratio does not depend on the normalisation)
            values = values.masked_fill(values < values[:, :1] + math.log(config.min_p), -float("inf"))
        # the candidates hold every survivor unless the last one survived and more tokens exist beyond them
        complete = ~torch.isfinite(values[:, -1]) if not config.top_k and k < vocab else \
            torch.ones(rows.numel(), dtype=torch.bool, device=scores.device)
        done = complete.nonzero().squeeze(1)
        if done.numel():
            yield rows[done], values[done], ids[done]
        rows = rows[~complete]
        k = vocab if k * 16 >= vocab else k * 16
