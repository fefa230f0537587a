"""trl-multiagent: multi-agent reinforcement learning for cooperating LLM agents on top of TRL.

The names below are imported on first use (``from trl_multiagent import AgentSpec`` works as before): importing the
package itself imports no torch, so that the command line answers ``--help`` and recipe errors quickly
(:mod:`trl_multiagent.recipe_fields`).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: Every public name -> the module that defines it.
_EXPORTS = {
    "AgentPool": "agents",
    "AgentSpec": "agents",
    "Environment": "environments",
    "FunctionEnvironment": "environments",
    "StepResult": "environments",
    "DEFAULT_MODEL": "models",
    "ModelNotFoundError": "models",
    "ActorCriticConfig": "trainers",
    "ActorCriticTrainer": "trainers",
    "ATGRPOConfig": "trainers",
    "ATGRPOTrainer": "trainers",
    "DebatePPOConfig": "trainers",
    "DebatePPOTrainer": "trainers",
    "HeterogeneousGroupConfig": "trainers",
    "HeterogeneousGroupTrainer": "trainers",
    "MultiAgentGRPOConfig": "trainers",
    "MultiAgentGRPOTrainer": "trainers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
