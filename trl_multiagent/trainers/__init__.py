"""The trainers, one per family of methods, and the registry the recipes dispatch on (``trainer:`` in a recipe)."""

from .actor_critic import ActorCriticConfig, ActorCriticTrainer
from .debate_ppo import DebatePPOConfig, DebatePPOTrainer
from .magrpo import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from .mhgpo import HeterogeneousGroupConfig, HeterogeneousGroupTrainer

#: ``trainer:`` name in a recipe -> (config class, trainer class).
TRAINERS = {
    "magrpo": (MultiAgentGRPOConfig, MultiAgentGRPOTrainer),
    "mhgpo": (HeterogeneousGroupConfig, HeterogeneousGroupTrainer),
    "actor_critic": (ActorCriticConfig, ActorCriticTrainer),
    "debate_ppo": (DebatePPOConfig, DebatePPOTrainer),
}

__all__ = ["TRAINERS", "ActorCriticConfig", "ActorCriticTrainer", "DebatePPOConfig", "DebatePPOTrainer",
           "HeterogeneousGroupConfig", "HeterogeneousGroupTrainer", "MultiAgentGRPOConfig", "MultiAgentGRPOTrainer"]
