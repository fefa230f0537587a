"""The objectives the trainers minimise, as small pure functions of per-token log-probabilities.

| function | paper | what |
|---|---|---|
| :func:`response_policy_loss` | MAGRPO Eq. 2; CoLLM Eq. 2 (DC) and Eq. 4 (CC) | clipped surrogate over WHOLE responses (a response is one macro action) |
| :func:`value_loss` | CoLLM Eq. 3 / Eq. 5; MAPoRL's PPO critic | squared TD / return error, optionally clipped around the rollout-time value |

The per-token objectives of MHGPO (Eq. 6-7), AT-GRPO (GRPO's per-response token mean) and MAPoRL (token-level PPO)
are TRL's own loss types (``"grpo"``, ``"bnpo"``), computed by ``GRPOTrainer._compute_loss``; the trainers select
them by ``loss_type``. The policy losses work on ``(B, T)`` tensors: ``B`` responses padded to ``T`` tokens, with a
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
    With ``epsilon_low = epsilon_high = inf`` nothing is clipped and the objective is ``rho * A``: CoLLM Eq. 2 / Eq. 4,
    ``rho * grad log pi * delta`` (the actor-critic trainer's default, ``actor_ratio_clip=None``).
    The KL term is the whole-response KL estimated as the sum over the response's tokens of the per-token estimator
    ``exp(r) - r - 1`` with ``r = log pi_ref - log pi`` (the estimator TRL uses per token).

    Args:
        per_token_logps: ``(B, T)`` log-probs of the response tokens under the current policy (with grad).
        old_per_token_logps: ``(B, T)`` under the policy that sampled them (equal to ``per_token_logps.detach()``
            when each rollout serves one update).
        mask: ``(B, T)`` 1 for response tokens, 0 for padding.
        advantages: ``(B,)`` one advantage per response (Eq. 1 for MAGRPO, the TD error for CoLLM).
        epsilon_low, epsilon_high: the clip range of the response-level ratio (``inf``: no clip).
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



def value_loss(
    values: torch.Tensor,
    targets: torch.Tensor,
    old_values: torch.Tensor | None = None,
    clip: float | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The squared error of a value model, ``mean (V - y)^2``, optionally clipped around the rollout-time value.

    CoLLM Eq. 3 (DC) / Eq. 5 (CC): ``values`` are ``V(h_t)`` of a minibatch of transitions (shape ``(B,)``) and
    ``targets`` the TD targets ``y_t = r_t + gamma * V(h_{t+1})``. MAPoRL's critic (token-level PPO, Sec. 3.2):
    ``(B, T)`` per-token values and GAE returns with a ``mask``; the mean is over the masked tokens (MAPoRL's trainer
    scales it by PPO's conventional 1/2).

    ``targets`` are constants (semi-gradient TD: nothing flows into the bootstrap). With ``clip`` (PPO's value
    clipping), a value may move at most ``clip`` from ``old_values`` and the larger of the clipped and unclipped
    squared errors counts: ``max((V - y)^2, (V_old + clamp(V - V_old, -clip, clip) - y)^2)``.

    Returns ``(loss, stats)`` with ``stats["clip_fraction"]``: the share of (masked) entries whose clipped error was
    the larger one (0 without ``clip``).
    """
    targets = targets.detach().to(values.dtype)
    loss = (values - targets).pow(2)
    clipped_larger = torch.zeros_like(loss)
    if clip is not None:
        if old_values is None:
            raise ValueError("value clipping needs the values at rollout time (old_values)")
        old_values = old_values.detach().to(values.dtype)
        clipped_error = (old_values + (values - old_values).clamp(-clip, clip) - targets).pow(2)
        clipped_larger = (clipped_error > loss).to(loss.dtype)
        loss = torch.maximum(loss, clipped_error)
    if mask is None:
        return loss.mean(), {"clip_fraction": clipped_larger.detach().mean()}
    mask = mask.to(loss.dtype)
    count = mask.sum().clamp(min=1.0)
    return (loss * mask).sum() / count, {"clip_fraction": ((clipped_larger * mask).sum() / count).detach()}
