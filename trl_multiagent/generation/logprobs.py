"""The one log-prob path: per-token log-probabilities (and entropies) of completions under a policy, for the losses
and for the behaviour / reference log-probs of a rollout.

Two things make it cheaper than a forward pass over every (prompt + completion) row:

- **shared prompts and prefixes**: the logits come from :func:`~trl_multiagent.generation.teacher_forcing.completion_outputs`,
  which runs a prompt shared by K samples, and an opening shared by several prompts (system message, worked
  examples), once, with gradients flowing through the shared computation into the adapter, so the result and its
  gradient are those of separate passes;
- **the LM head**: on CPU the logits of the completion positions are computed as one matrix product (TRL's fused,
  chunked head avoids materialising them, which saves GPU memory but is several times slower on a CPU); on CUDA the
  trainers use TRL's fused head instead of this module (``trainers/compat.py: token_logps``). The logits are then
  normalised by :func:`token_logps_and_entropies`, on the CPU a few rows at a time: each
  block of rows stays in the core's cache while its log-sum-exp, selected log-prob and entropy are computed, and the
  backward pass recomputes the probabilities from the saved log-sum-exp instead of keeping a ``(B, T, V)`` tensor of
  log-probs (``benchmarks/loss_head.py``: several times faster than ``log_softmax`` over the whole tensor).
"""

from __future__ import annotations

import torch

from trl_multiagent.generation.teacher_forcing import completion_outputs, lm_forward

#: The bytes of logits :func:`token_logps_and_entropies` normalises at a time on the CPU (float32 working copy): about
#: the size of the 2-core machine's level-2 caches (1 MiB a core on the AMD EPYC), so a block is read from memory once
#: and every later pass over it hits the cache.
HEAD_BLOCK_BYTES = 2 * 1024 * 1024
#: The same on any other device (a GPU): there each block costs a dozen kernel launches and no cache is to be kept, so
#: blocks are only a bound on the float32 working copy's memory. On an H200, ``(16, 256, 32000)`` bfloat16 logits took
#: 42 times as long in blocks of 16 rows as in one ``log_softmax``, and 1.6-1.7 times as long in blocks of 1,024 or
#: 4,096 rows (``experiments/speed/gpu/2026-11-28/loss_head_bf16.json``).
ACCELERATOR_HEAD_BLOCK_BYTES = 512 * 1024 * 1024


def head_block_rows(device: torch.device | str, vocab_size: int) -> int:
    """The rows of a ``vocab_size``-wide logits tensor on ``device`` that :func:`token_logps_and_entropies` normalises
    at a time by default: :data:`HEAD_BLOCK_BYTES` of float32 rows on the CPU, :data:`ACCELERATOR_HEAD_BLOCK_BYTES`
    elsewhere; at least one."""
    budget = HEAD_BLOCK_BYTES if torch.device(device).type == "cpu" else ACCELERATOR_HEAD_BLOCK_BYTES
    return max(1, budget // (4 * vocab_size))


def completion_logps(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                     completion_mask: torch.Tensor, temperature: float, compute_entropy: bool = False,
                     share_prompts: bool = True, prefix_store=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logps, entropies)`` of the ``(B, T)`` completion tokens after their left-padded ``(B, P)`` prompts under
    ``model`` (a causal LM, or a callable forwarding to one), at sampling ``temperature``; ``entropies`` is ``None``
    unless ``compute_entropy``. Shared prompts and prompt prefixes run once when ``share_prompts``; ``prefix_store``:
    the prefixes an update's micro-batches share, already run
    (:class:`~trl_multiagent.generation.teacher_forcing.PrefixStore`)."""
    logps, entropies = completion_outputs(
        lm_forward(model), prompt_ids, prompt_mask, completion_ids, completion_mask, share_prompts=share_prompts,
        prefix_store=prefix_store, head=lambda logits, ids: token_logps_and_entropies(logits, ids, temperature))
    return logps, entropies if compute_entropy else None


def token_logps_and_entropies(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0,
                              block_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logps, entropies)``, each of ``token_ids``' shape: the log-probability of each token and the entropy of the
    distribution it was drawn from, under ``softmax(logits / temperature)`` over the last dimension.

    With ``z = logits / T``, ``lse = log sum_v exp(z_v)`` and ``p = exp(z - lse)``: ``logp = z_token - lse`` and
    ``H = lse - sum_v p_v z_v``. Both are differentiable (TRL's entropy bonus, ``entropy_coef``, differentiates
    ``H``, as TRL's own fused head does): ``d logp / d z = onehot(token) - p`` and ``d H / d z = -p (log p + H)``, each
    divided by ``T`` for the logits. Half-precision logits are normalised in float32 (the outputs are float32, the
    logits' gradient has their dtype); float64 stays float64.

    The computation runs ``block_rows`` rows at a time (default: :func:`head_block_rows`) and keeps only
    ``lse`` and ``H`` for the backward pass, which recomputes ``p`` block by block; checked against the
    whole-tensor formulas, values and gradients, in ``tests/test_logprobs.py``."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if token_ids.shape != logits.shape[:-1]:
        raise ValueError(f"token_ids {tuple(token_ids.shape)} must have the logits' shape without the vocabulary "
                         f"dimension, {tuple(logits.shape[:-1])}")
    if block_rows is None:
        block_rows = head_block_rows(logits.device, logits.size(-1))
    return _TokenLogSoftmax.apply(logits, token_ids, float(temperature), int(block_rows))


class _TokenLogSoftmax(torch.autograd.Function):
    """:func:`token_logps_and_entropies`, block by block, forward and backward."""

    @staticmethod
    def forward(ctx, logits, token_ids, temperature, block_rows):
        work = logits.dtype if logits.dtype == torch.float64 else torch.float32
        rows = token_ids.numel()
        ids = token_ids.reshape(-1, 1)
        logps, entropies, lse = (torch.empty(rows, dtype=work, device=logits.device) for _ in range(3))
        for block, z in _blocks(logits, block_rows):
            z = z.to(work) / temperature
            norm = torch.logsumexp(z, dim=-1, keepdim=True)
            logps[block] = z.gather(-1, ids[block]).squeeze(-1) - norm.squeeze(-1)
            z.sub_(norm)  # log p
            entropies[block] = -(z.exp() * z).sum(-1)
            lse[block] = norm.squeeze(-1)
        ctx.save_for_backward(logits, token_ids, lse, entropies)
        ctx.temperature, ctx.block_rows = temperature, block_rows
        ctx.set_materialize_grads(False)  # an output no loss uses (the entropies, mostly) comes back as None: skipped
        return logps.view(token_ids.shape), entropies.view(token_ids.shape)

    @staticmethod
    def backward(ctx, grad_logps, grad_entropies):
        if grad_logps is None and grad_entropies is None:
            return None, None, None, None
        logits, token_ids, lse, entropies = ctx.saved_tensors
        temperature, block_rows = ctx.temperature, ctx.block_rows
        work = lse.dtype
        ids = token_ids.reshape(-1, 1)
        grad = logits.new_empty((token_ids.numel(), logits.size(-1)))
        g_logp = None if grad_logps is None else grad_logps.reshape(-1, 1).to(work) / temperature
        g_h = None if grad_entropies is None else grad_entropies.reshape(-1, 1).to(work) / temperature
        for block, z in _blocks(logits, block_rows):
            log_p = z.to(work) / temperature - lse[block].unsqueeze(-1)
            p = log_p.exp()
            if g_h is not None:  # -g_H p (log p + H)
                out = log_p.add_(entropies[block].unsqueeze(-1)).mul_(p).mul_(-g_h[block])
                if g_logp is not None:
                    out.sub_(p.mul_(g_logp[block]))
            else:
                out = p.mul_(-g_logp[block])
            if g_logp is not None:  # + g_logp at the token
                out.scatter_add_(-1, ids[block], g_logp[block])
            grad[block] = out
        return grad.view(logits.shape), None, None, None


def _blocks(logits: torch.Tensor, block_rows: int):
    """``(rows, view)``: consecutive blocks of at most ``block_rows`` of the ``(..., V)`` logits' rows, in row order,
    as 2-D views (``rows`` a slice of the flattened row index). Logits that cannot be viewed as one ``(rows, V)``
    matrix (a slice ``[:, :-1]`` of a call's outputs) are walked one leading index at a time, never copied."""
    vocab = logits.size(-1)
    try:
        matrices = [logits.view(-1, vocab)]
    except RuntimeError:
        matrices = list(logits.reshape(-1, *logits.shape[-2:]).unbind(0)) if logits.dim() > 2 else [logits]
    offset = 0
    for matrix in matrices:
        for start in range(0, matrix.size(0), block_rows):
            view = matrix[start:start + block_rows]
            yield slice(offset + start, offset + start + view.size(0)), view
        offset += matrix.size(0)
