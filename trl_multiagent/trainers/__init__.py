from .actor_critic import ActorCriticConfig, ActorCriticTrainer
from .debate_ppo import DebatePPOConfig, DebatePPOTrainer
from .magrpo import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from .mhgpo import HeterogeneousGroupConfig, HeterogeneousGroupTrainer

__all__ = ["ActorCriticConfig", "ActorCriticTrainer", "DebatePPOConfig", "DebatePPOTrainer", "HeterogeneousGroupConfig", "HeterogeneousGroupTrainer", "MultiAgentGRPOConfig", "MultiAgentGRPOTrainer"]
