"""The objectives the trainers minimise, as small pure functions of per-token log-probabilities.

| function | paper | what |
|---|---|---|
| :func:`response_policy_loss` | MAGRPO Eq. 2; CoLLM Eq. 2 (DC) and Eq. 4 (CC) | clipped surrogate over WHOLE responses (a response is one macro action) |

The per-token objectives of MHGPO (Eq. 6-7), AT-GRPO (GRPO's per-response token mean) and MAPoRL (token-level PPO)
are TRL's own loss types (``"grpo"``, ``"bnpo"``), computed by ``GRPOTrainer._compute_loss``; the trainers select
them by ``loss_type``. Everything here works on ``(B, T)`` tensors: ``B`` responses padded to ``T`` tokens, with a
0/1 ``mask`` of the real tokens.
"""

from __future__ import annotations

import torch

#: The loss type of the whole-response objective (MAGRPO Eq. 2, CoLLM Eq. 2/4), next to TRL's loss types.
RESPONSE_LOSS = "response"


def response_policy_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    ref_per_token_logps: torch.Tensor | None = None,
    beta: float = 0.0,
    weights: torch.Tensor | None = None,
    delta: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""The whole-response clipped objective of MAGRPO Eq. 2 (and the actor of CoLLM Eq. 2 / Eq. 4), as a loss.

    An agent's action is its whole response ``a`` to its history ``h``, so the importance ratio is one per response,
    of whole-response probabilities:

        rho = pi(a|h) / pi_old(a|h) = exp( sum_t [log pi(a_t|h, a_<t) - log pi_old(a_t|h, a_<t)] )

    and the objective of one policy is the mean over its responses in the batch (``1/|B| 1/|G|`` of Eq. 2) of

        min(rho * A, clip(rho, 1 - epsilon_low, 1 + epsilon_high) * A)

    minus ``beta`` times a KL estimate to the reference policy. The gradient of ``rho * A`` is ``rho * A *
    grad log pi(a|h)`` with ``log pi(a|h)`` the SUM of the response's token log-probs (not their mean); with one
    update per rollout (``rho = 1``) this is REINFORCE with the group baseline, ``A * grad sum_t log pi(a_t|...)``.
    The KL term is the whole-response KL estimated as the sum over the response's tokens of the per-token estimator
    ``exp(r) - r - 1`` with ``r = log pi_ref - log pi`` (the estimator TRL uses per token).

    Args:
        per_token_logps: ``(B, T)`` log-probs of the response tokens under the current policy (with grad).
        old_per_token_logps: ``(B, T)`` under the policy that sampled them (equal to ``per_token_logps.detach()``
            when each rollout serves one update).
        mask: ``(B, T)`` 1 for response tokens, 0 for padding.
        advantages: ``(B,)`` one advantage per response (Eq. 1 for MAGRPO, the TD error for CoLLM).
        epsilon_low, epsilon_high: the clip range of the response-level ratio.
        ref_per_token_logps: ``(B, T)`` under the reference policy; needed when ``beta != 0``.
        beta: KL coefficient.
        weights: optional ``(B,)`` weights of the responses; ``None`` is the plain mean. The loss is
            ``sum_b weights[b] * loss_b``, so weights that sum to the batch's share of the policy's responses let a
            policy's batch be split into micro-batches.
        delta: optional cap of the unclipped ratio (two-sided clipping, as TRL's ``delta``).

    Returns:
        ``(loss, stats)``: the scalar loss and detached per-response statistics (``ratio``, ``clipped`` (0/1, the
        clip was active), ``kl`` (0 when ``beta == 0``), ``logp`` (the summed response log-prob)).
    """
    mask = mask.to(per_token_logps.dtype)
    seq_logps = (per_token_logps * mask).sum(-1)
    old_seq_logps = (old_per_token_logps * mask).sum(-1)
    ratio = torch.exp(seq_logps - old_seq_logps)
    advantages = advantages.to(per_token_logps.dtype)
    clipped_ratio = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    unclipped = ratio if delta is None else torch.clamp(ratio, max=delta)
    per_response = -torch.min(unclipped * advantages, clipped_ratio * advantages)
    kl = torch.zeros_like(seq_logps)
    if beta != 0.0:
        if ref_per_token_logps is None:
            raise ValueError("beta != 0 needs the reference log-probs (ref_per_token_logps)")
        log_ratio_ref = ref_per_token_logps - per_token_logps
        kl = ((torch.exp(log_ratio_ref) - log_ratio_ref - 1.0) * mask).sum(-1)
        per_response = per_response + beta * kl
    if weights is None:
        loss = per_response.mean()
    else:
        loss = (per_response * weights.to(per_response.dtype)).sum()
    clipped = ((ratio < 1.0 - epsilon_low) & (advantages < 0)) | ((ratio > 1.0 + epsilon_high) & (advantages > 0))
    stats = {"ratio": ratio.detach(), "clipped": clipped.to(ratio.dtype).detach(), "kl": kl.detach(),
             "logp": seq_logps.detach()}
    return loss, stats

