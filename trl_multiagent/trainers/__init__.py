"""The trainers, one per family of methods, siblings over the shared loop of ``base.MultiAgentTrainer``, and the
registry the recipes dispatch on (``trainer:`` in a recipe)."""

from .actor_critic import ActorCriticConfig, ActorCriticTrainer
from .at_grpo import ATGRPOConfig, ATGRPOTrainer
from .base import MultiAgentConfig, MultiAgentTrainer
from .debate_ppo import DebatePPOConfig, DebatePPOTrainer
from .magrpo import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from .mhgpo import HeterogeneousGroupConfig, HeterogeneousGroupTrainer

#: ``trainer:`` name in a recipe -> (config class, trainer class).
TRAINERS = {
    "magrpo": (MultiAgentGRPOConfig, MultiAgentGRPOTrainer),
    "at_grpo": (ATGRPOConfig, ATGRPOTrainer),
    "mhgpo": (HeterogeneousGroupConfig, HeterogeneousGroupTrainer),
    "actor_critic": (ActorCriticConfig, ActorCriticTrainer),
    "debate_ppo": (DebatePPOConfig, DebatePPOTrainer),
}

__all__ = ["TRAINERS", "ATGRPOConfig", "ATGRPOTrainer", "ActorCriticConfig", "ActorCriticTrainer", "DebatePPOConfig",
           "DebatePPOTrainer", "HeterogeneousGroupConfig", "HeterogeneousGroupTrainer", "MultiAgentConfig",
           "MultiAgentGRPOConfig", "MultiAgentGRPOTrainer", "MultiAgentTrainer"]
