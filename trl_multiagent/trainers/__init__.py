"""The trainers, one per family of methods, siblings over the shared loop of ``base.MultiAgentTrainer``, and the
registry the recipes dispatch on (``trainer:`` in a recipe).

``compat.py`` holds all of TRL's and transformers' private surface the trainers use.

May import every folder below the command: :mod:`trl_multiagent.rollout`, :mod:`trl_multiagent.credit`,
:mod:`trl_multiagent.evaluation` (the model card), :mod:`trl_multiagent.verifier`, :mod:`trl_multiagent.team`,
:mod:`trl_multiagent.environments`, :mod:`trl_multiagent.generation`, :mod:`trl_multiagent.models`,
:mod:`trl_multiagent.runtime`, :mod:`trl_multiagent.errors`; never :mod:`trl_multiagent.command`.
"""

from trl_multiagent.trainers.actor_critic import ActorCriticConfig, ActorCriticTrainer
from trl_multiagent.trainers.at_grpo import ATGRPOConfig, ATGRPOTrainer
from trl_multiagent.trainers.base import MultiAgentConfig, MultiAgentTrainer
from trl_multiagent.trainers.debate_ppo import DebatePPOConfig, DebatePPOTrainer
from trl_multiagent.trainers.magrpo import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from trl_multiagent.trainers.mhgpo import HeterogeneousGroupConfig, HeterogeneousGroupTrainer

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
