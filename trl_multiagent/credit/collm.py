"""CoLLM-CC / CoLLM-DC credit: TD(0) targets and TD-error advantages (the critic's loss is
:func:`trl_multiagent.credit.losses.value_loss`).

Paper: "Learning Decentralized LLM Collaboration with Multi-Agent Actor Critic" (Liu, Chen, Amiri, Amato;
arXiv 2601.21972), Sec. 4.2, Eq. 2-5, Algorithm 1 (CC) and Algorithm 2 (DC).

The same functions serve both variants; only the value that goes in differs:

* CC (Eq. 4-5): one centralized value ``V(h_t)`` of the joint history (plus the global information ``m_t``); every
  agent's action at turn ``t`` is credited with the same ``delta_t = r_t + gamma * V(h_{t+1}) - V(h_t)``.
* DC (Eq. 2-3): agent ``i``'s own critic ``V_i(h_{i,t})`` of its local history; agent ``i`` is credited with
  ``delta_{i,t} = r_t + gamma * V_i(h_{i,t+1}) - V_i(h_{i,t})`` (the joint reward ``r_t`` is shared).

A transition whose episode ends after it (the last turn H - 1, or an early stop by the environment) has no
successor history: its target is ``r_t`` alone ("no bootstrap").

Everything here works on 1-D tensors (or lists) of transitions, in any order and from any episodes: a minibatch of
the rollout buffer is just such a batch, with ``next_values[k]`` the value of transition ``k``'s successor history.
:func:`normalize_per_turn` is the authors' released code's option of normalising the TD errors of each turn.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Numbers = Sequence[float] | torch.Tensor


def _as_tensor(x: Numbers, like: torch.Tensor | None = None) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    dtype = like.dtype if like is not None else torch.float64
    device = like.device if like is not None else None
    return torch.as_tensor(list(x), dtype=dtype, device=device)


def td_targets(rewards: Numbers, next_values: Numbers, dones: Sequence[bool] | torch.Tensor, gamma: float) -> torch.Tensor:
    """TD(0) targets ``y_t = r_t + gamma * V(h_{t+1})``, and ``y_t = r_t`` where the episode ends after ``t``.

    The bracket of Eq. 3 / Eq. 5 is ``y_t - V(h_t)``. ``next_values`` of terminal transitions are ignored (they may
    hold anything, e.g. 0 or a value the critic would give a history that never happens).

    Args:
        rewards: ``r_t`` of each transition (the joint reward).
        next_values: ``V(h_{t+1})`` (CC) or ``V_i(h_{i,t+1})`` (DC) of each transition's successor history.
        dones: ``True`` where the episode ended after the transition (last turn or early stop).
        gamma: discount factor.
    """
    next_values = _as_tensor(next_values)
    rewards = _as_tensor(rewards, next_values)
    dones = torch.as_tensor(dones if isinstance(dones, torch.Tensor) else list(dones), dtype=torch.bool,
                            device=next_values.device)
    if not (rewards.shape == next_values.shape == dones.shape):
        raise ValueError(f"rewards {tuple(rewards.shape)}, next_values {tuple(next_values.shape)} and dones "
                         f"{tuple(dones.shape)} must have the same shape")
    bootstrap = torch.where(dones, torch.zeros_like(next_values), next_values)
    return rewards + gamma * bootstrap


def td_errors(rewards: Numbers, values: Numbers, next_values: Numbers, dones: Sequence[bool] | torch.Tensor,
              gamma: float) -> torch.Tensor:
    """TD errors ``delta_t = y_t - V(h_t)``: the actors' advantages (Eq. 2 for DC, Eq. 4 for CC)."""
    values = _as_tensor(values)
    targets = td_targets(rewards, _as_tensor(next_values, values), dones, gamma)
    if targets.shape != values.shape:
        raise ValueError(f"values {tuple(values.shape)} do not match the transitions {tuple(targets.shape)}")
    return targets - values


def episode_td(rewards: Numbers, values: Numbers, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """TD targets and errors along ONE episode of ``T`` played turns (``T = H``, or fewer after an early stop).

    ``values[t] = V(h_t)`` for ``t = 0 .. T-1``. The successor of turn ``t < T-1`` is turn ``t+1``; turn ``T-1`` is
    terminal (no bootstrap past the last turn or an early stop). Returns ``(targets, deltas)``.
    """
    values = _as_tensor(values)
    if len(values) == 0 or len(_as_tensor(rewards)) != len(values):
        raise ValueError("an episode needs one reward and one value per played turn (at least one turn)")
    next_values = torch.cat([values[1:], values.new_zeros(1)])
    dones = [False] * (len(values) - 1) + [True]
    targets = td_targets(rewards, next_values, dones, gamma)
    return targets, targets - values



def normalize_per_turn(deltas: Numbers, turns: Sequence[int], eps: float = 1e-6) -> torch.Tensor:
    """The authors' released code's TD-error normalisation (CoMLRL, ``comlrl/trainers/actor_critic/ac_base.py``:
    ``_process_buffer`` splits each agent's rollout buffer by turn and ``_prepare_advantages`` turns every turn's
    advantages, the TD errors ``target - V``, into ``(delta - mean) / max(std, 1e-6)`` with the POPULATION standard
    deviation (``unbiased=False``), when ``advantage_normalization`` is on, its default); a turn with one transition
    keeps its TD error. The paper's Eq. 2 / Eq. 4 use the TD error itself, which stays the default.

    Example (issue 61): ``delta = [0.7, 0.8, 1.0]`` at one turn: mean 0.8333, std 0.1247, so
    ``[-1.069, -0.267, 1.336]``: the two positive errors below the mean change sign.
    """
    deltas = _as_tensor(deltas)
    if deltas.dim() != 1 or len(turns) != deltas.numel():
        raise ValueError(f"{deltas.numel()} TD errors but {len(turns)} turns")
    out = deltas.clone()
    for turn in dict.fromkeys(turns):
        idx = torch.tensor([i for i, t in enumerate(turns) if t == turn], device=deltas.device)
        if idx.numel() > 1:
            group = deltas[idx]
            out[idx] = (group - group.mean()) / group.std(unbiased=False).clamp(min=eps)
    return out
