"""trl-multiagent: multi-agent reinforcement learning for cooperating LLM agents on top of TRL.

The names below are imported on first use (``from trl_multiagent import AgentSpec`` works as before): importing the
package itself imports no torch, so that the command line answers ``--help`` and recipe errors quickly
(:mod:`trl_multiagent.command.recipe_fields`).
"""

from __future__ import annotations

import importlib
import logging
import sys

__version__ = "0.1.0"


class _NoKernelsNotice(logging.Filter):
    """bitsandbytes warns at import that its optional CPU 4-bit kernels (the ``kernels`` package) are missing, whether
    or not any model is 4-bit; the notice is dropped here, and :func:`trl_multiagent.models.loading.load_base_model` says it
    once where a 4-bit base is loaded on the CPU. Where ``kernels`` is installed (transformers 5.25 requires it),
    bitsandbytes' import looks its kernels up on the hub instead, and offline ``kernels`` warns that it skips the
    publisher check of ``kernels-community/quantization-bitsandbytes``: that notice is dropped too."""

    def __init__(self, mentions: str) -> None:
        super().__init__()
        self.mentions = mentions

    def filter(self, record: logging.LogRecord) -> bool:
        return self.mentions not in record.getMessage()


logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_NoKernelsNotice("kernels"))
logging.getLogger("kernels._internals.hf_hub").addFilter(_NoKernelsNotice("quantization-bitsandbytes"))


class _PrefixedLastResort(logging.Handler):
    """From Python, where the program configured no logging, Python's last-resort handler prints a warning of this
    library as its bare message; this one prints it as the command line does, ``WARNING trl_multiagent.<module>:
    <message>`` on stderr (warnings and errors, as the last resort). It stays silent wherever the record reaches a
    handler of the program's (logging.basicConfig, the command line, pytest): those print it instead."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            if any(handler is not self for handler in logger.handlers):
                return
            logger = logger.parent if logger.propagate else None
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - as logging's own handlers: a message that cannot be written is dropped
            self.handleError(record)


logging.getLogger(__name__).addHandler(_PrefixedLastResort())

#: Every public name -> the module that defines it.
_EXPORTS = {
    "AgentPool": "team.pool",
    "AgentSpec": "team.pool",
    "Environment": "environments",
    "FunctionEnvironment": "environments",
    "StepResult": "environments",
    "Team": "command.saved_team",
    "DEFAULT_MODEL": "models.loading",
    "ModelNotFoundError": "models.loading",
    "CoLLMConfig": "trainers",
    "CoLLMTrainer": "trainers",
    "ATGRPOConfig": "trainers",
    "ATGRPOTrainer": "trainers",
    "MAPoRLConfig": "trainers",
    "MAPoRLTrainer": "trainers",
    "MHGPOConfig": "trainers",
    "MHGPOTrainer": "trainers",
    "MAGRPOConfig": "trainers",
    "MAGRPOTrainer": "trainers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in ("DebatePPOConfig", "DebatePPOTrainer", "ActorCriticConfig", "ActorCriticTrainer", "MultiAgentGRPOConfig",
                "MultiAgentGRPOTrainer", "HeterogeneousGroupConfig", "HeterogeneousGroupTrainer"):
        return getattr(importlib.import_module(".trainers", __name__), name)  # an earlier name: warns, gives the new
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
