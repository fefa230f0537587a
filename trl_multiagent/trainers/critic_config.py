"""The critic settings the two trainers with learned critics share (CoLLM's CoLLMConfig, MAPoRL's
MAPoRLConfig): one field per setting, one check each, and the deprecated names that map onto them."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import ClassVar

#: Why trainers with value heads cannot run under FSDP (trainers/sharding.py), checked before any model loads.
CRITIC_FSDP_REFUSAL = ("its critics' value heads run outside the team's FSDP forward and their losses take a "
                       "per-process number of backward passes")

_warned: set[str] = set()


def warn_once(message: str, category: type[Warning] = FutureWarning) -> None:
    """``warnings.warn`` once per process for each message (a deprecated name read in every config of a run)."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, category, stacklevel=3)


def take_alias(config, old: str, new: str, unset=None) -> None:
    """Read the deprecated field ``old`` of ``config`` into ``new`` (warning once); both set differently is an
    error. ``old`` is then cleared, so the config holds each setting under one name."""
    value = getattr(config, old)
    if value is unset:
        return
    warn_once(f"{type(config).__name__}.{old} is deprecated: use {new} (it means the same)")
    current = getattr(config, new)
    default = type(config).__dataclass_fields__[new].default
    if current != default and current != value:
        raise ValueError(f"{old}={value!r} (the deprecated name of {new}) and {new}={current!r} disagree; set {new} "
                         f"only")
    setattr(config, new, value)
    setattr(config, old, unset)


@dataclass
class CriticSettings:
    r"""Settings of the learned critics (a value head on a LoRA adapter per critic), shared by the trainers that
    have them. Each trainer's config may give them its own defaults.

    Parameters:
        critic_lora_r (`int` or `None`, defaults to `None`):
            LoRA rank of the critics' adapters (`None`: the agent's `lora_r`).
        critic_learning_rate (`float` or `None`, defaults to `None`):
            Learning rate of the critics (`None`: `learning_rate`).
        critic_share_adapter (`bool`, defaults to `False`):
            The critic reads the hidden states through its agent's policy adapter (parameter sharing; only the
            value head is its own) instead of an adapter of its own.
        vf_coef (`float`, defaults to `1.0`):
            Weight of the value loss (0: the critics do not learn).
        cliprange_value (`float` or `None`, defaults to `None`):
            Clip of the value prediction around its rollout-time value in the value loss (PPO's clipped value
            loss; TRL's name); `None`: no clip.
        value_clip (deprecated):
            The old name of `cliprange_value` in the actor-critic trainer.
        num_epochs (deprecated):
            The old name of `num_iterations` (passes over each rollout) in the actor-critic trainer.
    """

    fsdp_refusal: ClassVar[str | None] = CRITIC_FSDP_REFUSAL

    critic_lora_r: int | None = field(default=None, metadata={
        "help": "LoRA rank of the critics' adapters (None: the agent's lora_r)."})
    critic_learning_rate: float | None = field(default=None, metadata={
        "help": "Learning rate of the critics (None: learning_rate)."})
    critic_share_adapter: bool = field(default=False, metadata={
        "help": "Critics read their agent's policy adapter (parameter sharing; only the value head is their own)."})
    vf_coef: float = field(default=1.0, metadata={"help": "Weight of the value loss (0: the critics do not learn)."})
    cliprange_value: float | None = field(default=None, metadata={
        "help": "Clip of the value prediction around its rollout-time value in the value loss; None: no clip."})
    value_clip: float | None = field(default=None, metadata={"help": "Deprecated: the old name of cliprange_value."})
    num_epochs: int | None = field(default=None, metadata={"help": "Deprecated: the old name of num_iterations."})

    def check_critic_settings(self) -> None:
        """The deprecated names onto the current ones, then the range checks (before any model loads)."""
        take_alias(self, "value_clip", "cliprange_value")
        take_alias(self, "num_epochs", "num_iterations")
        if self.critic_lora_r is not None and self.critic_lora_r <= 0:
            raise ValueError(f"critic_lora_r must be positive or None, got {self.critic_lora_r}")
        if self.critic_learning_rate is not None and self.critic_learning_rate <= 0:
            raise ValueError(f"critic_learning_rate must be positive or None, got {self.critic_learning_rate}")
        if self.vf_coef < 0:
            raise ValueError(f"vf_coef must be >= 0, got {self.vf_coef}")
        if self.cliprange_value is not None and self.cliprange_value < 0:
            raise ValueError(f"cliprange_value must be >= 0 or None, got {self.cliprange_value}")
