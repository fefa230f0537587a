"""The trainers, one per family of methods, siblings over the shared loop of ``base.MultiAgentTrainer``, and the
registry the recipes dispatch on (``trainer:`` in a recipe).

``compat.py`` holds all of TRL's and transformers' private surface the trainers use.

May import every folder below the command: :mod:`trl_multiagent.rollout`, :mod:`trl_multiagent.credit`,
:mod:`trl_multiagent.evaluation` (the model card), :mod:`trl_multiagent.verifier`, :mod:`trl_multiagent.team`,
:mod:`trl_multiagent.environments`, :mod:`trl_multiagent.generation`, :mod:`trl_multiagent.models`,
:mod:`trl_multiagent.runtime`, :mod:`trl_multiagent.errors`; never :mod:`trl_multiagent.command`.
"""

from trl_multiagent.trainers.at_grpo import ATGRPOConfig, ATGRPOTrainer
from trl_multiagent.trainers.base import MultiAgentConfig, MultiAgentTrainer
from trl_multiagent.trainers.collm import CoLLMConfig, CoLLMTrainer
from trl_multiagent.trainers.magrpo import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.trainers.maporl import MAPoRLConfig, MAPoRLTrainer
from trl_multiagent.trainers.mhgpo import MHGPOConfig, MHGPOTrainer

#: ``trainer:`` name in a recipe -> (config class, trainer class).
TRAINERS = {
    "magrpo": (MAGRPOConfig, MAGRPOTrainer),
    "at_grpo": (ATGRPOConfig, ATGRPOTrainer),
    "mhgpo": (MHGPOConfig, MHGPOTrainer),
    "collm": (CoLLMConfig, CoLLMTrainer),
    "maporl": (MAPoRLConfig, MAPoRLTrainer),
}

__all__ = ["TRAINERS", "ATGRPOConfig", "ATGRPOTrainer", "CoLLMConfig", "CoLLMTrainer", "MAPoRLConfig",
           "MAPoRLTrainer", "MHGPOConfig", "MHGPOTrainer", "MultiAgentConfig",
           "MAGRPOConfig", "MAGRPOTrainer", "MultiAgentTrainer"]

#: The trainers' earlier class names (before each trainer got one name): importable for now, with a warning.
RENAMED_CLASSES = {"DebatePPOConfig": "MAPoRLConfig", "DebatePPOTrainer": "MAPoRLTrainer",
                   "ActorCriticConfig": "CoLLMConfig", "ActorCriticTrainer": "CoLLMTrainer",
                   "MultiAgentGRPOConfig": "MAGRPOConfig", "MultiAgentGRPOTrainer": "MAGRPOTrainer",
                   "HeterogeneousGroupConfig": "MHGPOConfig", "HeterogeneousGroupTrainer": "MHGPOTrainer"}


def __getattr__(name: str):
    if name in RENAMED_CLASSES:
        import warnings

        warnings.warn(f"{name} is now named {RENAMED_CLASSES[name]}", DeprecationWarning, stacklevel=2)
        return globals()[RENAMED_CLASSES[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
