"""trl-multiagent: multi-agent reinforcement learning for cooperating LLM agents on top of TRL."""

from .agents import AgentPool, AgentSpec
from .environments import Environment, FunctionEnvironment, StepResult
from .models import DEFAULT_MODEL, ModelNotFoundError
from .trainers import (
    ActorCriticConfig,
    ActorCriticTrainer,
    ATGRPOConfig,
    ATGRPOTrainer,
    DebatePPOConfig,
    DebatePPOTrainer,
    HeterogeneousGroupConfig,
    HeterogeneousGroupTrainer,
    MultiAgentGRPOConfig,
    MultiAgentGRPOTrainer,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL",
    "ATGRPOConfig",
    "ATGRPOTrainer",
    "ActorCriticConfig",
    "ActorCriticTrainer",
    "AgentPool",
    "AgentSpec",
    "DebatePPOConfig",
    "DebatePPOTrainer",
    "Environment",
    "FunctionEnvironment",
    "HeterogeneousGroupConfig",
    "HeterogeneousGroupTrainer",
    "ModelNotFoundError",
    "MultiAgentGRPOConfig",
    "MultiAgentGRPOTrainer",
    "StepResult",
]
