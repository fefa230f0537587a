"""Value models (critics): a scalar value head on a LoRA adapter of a base that the team already holds.

TRL no longer ships a value-head model, so the project has its own, and only this one: the actor-critic trainers
(CoLLM-CC / CoLLM-DC) and the debate PPO trainer (MAPoRL) both build their critics from :class:`CriticSpec`.

A critic is ``V(h) = w^T z_last(h) + b`` where ``z`` is the last hidden state of the backbone run with the critic's
own LoRA adapter active (``share_adapter=True``: with the adapter of the agent's policy instead, the paper's
parameter-sharing variant of CoLLM-DC). The critic sits on the base of the agent it names, so a team on one shared
4-bit base and its critics hold ONE copy of that base; only a critic that names another ``model`` gets a base of
its own. :meth:`AgentPool.values <trl_multiagent.team.pool.AgentPool.values>` returns one value per token, from which a
trainer reads the position it needs (the last prompt token for a sequence-level ``V(h_t)``, every completion token
for token-level GAE). ``num_heads > 1`` gives several heads on one adapter (e.g. one per debate turn).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from trl_multiagent.models.loading import check_lora_targets

_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]*$")


@dataclass
class CriticSpec:
    """One critic (value model) of a team.

    Attributes:
        name: the critic's name (its adapter's name unless it shares one); unique among policies and critics.
        agent: the agent whose base the critic sits on (and whose policy adapter it uses with ``share_adapter``).
        model: another model for the critic (hub id, local path or embedded short name); ``None``: the agent's base.
        quantization: quantization of that other model (``None`` or ``"4bit"``); ignored without ``model``.
        share_adapter: read the hidden states through the agent's policy adapter instead of an adapter of its own
            (only the head is the critic's own; the value loss then also trains the policy's adapter).
        lora_r, lora_alpha, lora_dropout, lora_target_modules: the critic adapter's LoRA settings.
        learning_rate: the critic's learning rate (adapter and head); ``None`` uses the trainer's critic rate.
        num_heads: scalar heads on the one adapter (e.g. one per turn); ``values`` picks one per row.
    """

    name: str
    agent: str
    model: str | None = None
    quantization: str | None = None
    share_adapter: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: str | list[str] = "all-linear"
    learning_rate: float | None = None
    num_heads: int = 1

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name) or self.name in ("default", "ref"):
            raise ValueError(f"Critic name {self.name!r} must start with a letter and use letters, digits, '_' or '-' "
                             "(not 'default'/'ref')")
        if self.share_adapter and self.model is not None:
            raise ValueError(f"Critic {self.name!r}: share_adapter uses the agent's own base; it cannot name a model")
        if self.quantization not in (None, "4bit"):
            raise ValueError(f"Critic {self.name!r}: quantization must be None or '4bit', got {self.quantization!r}")
        if self.lora_r <= 0 or self.num_heads < 1:
            raise ValueError(f"Critic {self.name!r}: lora_r and num_heads must be positive")
        if self.learning_rate is not None and self.learning_rate <= 0:
            raise ValueError(f"Critic {self.name!r}: learning_rate must be positive, got {self.learning_rate}")
        check_lora_targets(f"Critic {self.name!r}", self.lora_target_modules)


class ValueHead(nn.Module):
    """``num_heads`` linear maps from the backbone's hidden size to a scalar, zero-initialised (``V = 0`` at start).

    It runs in float32 at least (``dtype``; a float64 backbone gets a float64 head), as value regression targets are
    not bf16-friendly.
    """

    def __init__(self, hidden_size: int, num_heads: int = 1, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.linear = nn.Linear(hidden_size, num_heads, dtype=torch.promote_types(dtype, torch.float32))
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``(..., hidden) -> (..., num_heads)``."""
        return self.linear(hidden.to(self.linear.weight.dtype))


def select_head(values: torch.Tensor, head: int | torch.Tensor | None) -> torch.Tensor:
    """Pick one head of ``values`` ``(B, T, H)``: ``head`` an int (the same for every row) or a ``(B,)`` tensor (one
    per row); ``None`` is only allowed with a single head."""
    if head is None:
        if values.size(-1) != 1:
            raise ValueError(f"This critic has {values.size(-1)} heads; say which one (head=...)")
        return values[..., 0]
    if isinstance(head, int):
        return values[..., head]
    index = head.to(values.device).long().view(-1, 1, 1).expand(-1, values.size(1), 1)
    return values.gather(-1, index).squeeze(-1)
