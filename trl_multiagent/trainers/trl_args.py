"""What a team trainer takes from a TRL script as it is (a ``GRPOConfig`` as ``args``) and what it refuses
(``reward_funcs``).

``MAGRPOTrainer(agents, env, args=GRPOConfig(...), ...)``: the fields the ``GRPOConfig`` sets (those that
differ from a ``GRPOConfig`` left at its defaults) are taken over into the trainer's own config class, which extends
``GRPOConfig``, so every field keeps its meaning; the fields it leaves at their defaults keep the trainer's defaults
(the papers' choices, e.g. ``loss_type="response"``), and a log line names both. A value the trainer refuses
(``gradient_accumulation_steps`` above 1, ...) is refused as it would be in the trainer's own config, naming the
``GRPOConfig``. ``per_device_train_batch_size`` keeps its name but is the update's micro-batch here (TRL counts
completions per device and step with it): a speed and memory setting, the loss is the same.

``reward_funcs=`` is ``GRPOTrainer``'s keyword: a team's reward functions belong to its environment, which calls
each on each agent's completion (``FunctionEnvironment(reward_funcs=...)``), so the trainer refuses the keyword with
one line that says so.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any

logger = logging.getLogger(__name__)

#: The fields a reference ``GRPOConfig`` is built with (copied from the one given): the precision and device settings
#: a default ``GRPOConfig`` may not be built without on this machine, and the batch fields its derived
#: ``generation_batch_size`` / ``steps_per_generation`` depend on. They are taken over whenever they differ from the
#: field's default.
REFERENCE_BASIS = ("bf16", "fp16", "use_cpu", "per_device_train_batch_size", "gradient_accumulation_steps",
                   "num_generations")


def refuse_reward_funcs(reward_funcs: Any) -> None:
    """``reward_funcs`` passed to a team trainer: one ``TypeError`` saying where they go."""
    if reward_funcs is not None:
        raise TypeError("reward_funcs is GRPOTrainer's keyword; a team's reward functions belong to its environment, "
                        "which scores each agent's completion with them as TRL would score that agent alone: pass "
                        "them there, FunctionEnvironment(..., reward_funcs=[...]) (or TRLEnvironmentTeam(..., "
                        "reward_fns=[...])), and leave them out of the trainer")


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) and isinstance(a, bool) == isinstance(b, bool)
    except Exception:  # noqa: BLE001 - values without a plain equality: differ
        return a is b


def _default_of(cls: type, name: str) -> Any:
    f = cls.__dataclass_fields__[name]
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING


def reference_config(grpo_config):
    """A ``GRPOConfig`` left at its defaults but for :data:`REFERENCE_BASIS`, copied from ``grpo_config`` (so that the
    values ``__post_init__`` derives from them compare equal); ``None`` where those alone make no valid one."""
    from trl import GRPOConfig

    with warnings.catch_warnings():  # GRPOConfig's own deprecation warnings, of fields nobody set here
        warnings.simplefilter("ignore")
        try:
            return GRPOConfig(**{k: getattr(grpo_config, k) for k in REFERENCE_BASIS})
        except ValueError:  # the basis alone makes no valid GRPOConfig: compare with the fields' defaults instead
            return None


def _value_of(reference, name: str) -> Any:
    """``name``'s value in the reference ``GRPOConfig``, or its default where there is none."""
    from trl import GRPOConfig

    return _default_of(GRPOConfig, name) if reference is None else getattr(reference, name)


_UNSET = object()


def grpo_fields_set(grpo_config, reference: Any = _UNSET) -> dict[str, Any]:
    """The fields a ``GRPOConfig`` sets: those whose value differs from :func:`reference_config`'s, and the basis
    fields that differ from their defaults."""
    from trl import GRPOConfig

    reference = reference_config(grpo_config) if reference is _UNSET else reference
    taken = {f.name: getattr(grpo_config, f.name) for f in dataclasses.fields(GRPOConfig) if f.init
             and f.name not in REFERENCE_BASIS
             and not _same(getattr(grpo_config, f.name), _value_of(reference, f.name))}
    taken.update({k: getattr(grpo_config, k) for k in REFERENCE_BASIS
                  if not _same(getattr(grpo_config, k), _default_of(GRPOConfig, k))})
    return taken


#: Fields whose defaults differ between GRPOConfig and the team configs in ways worth a line of the log.
NOTED_DEFAULTS = ("num_generations", "loss_type", "learning_rate", "logging_steps", "beta", "use_bias_correction_kl",
                  "max_completion_length", "activation_checkpointing")


def config_from_grpo(grpo_config, config_class: type):
    """A ``config_class`` with the fields ``grpo_config`` sets (:func:`grpo_fields_set`), logged with the defaults
    that differ from ``GRPOConfig``'s; the trainer's own checks refuse what they refuse, in one line that names the
    ``GRPOConfig``."""
    reference = reference_config(grpo_config)
    taken = grpo_fields_set(grpo_config, reference)
    try:
        config = config_class(**taken)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"args is a GRPOConfig; its fields {sorted(taken)} were taken over into "
                         f"{config_class.__name__}, which refuses them: {exc}") from exc
    differ = [f"{n} {getattr(config, n)!r} (GRPOConfig: {_value_of(reference, n)!r})" for n in NOTED_DEFAULTS
              if n not in taken and not _same(getattr(config, n), _value_of(reference, n))]
    batch = " (per_device_train_batch_size is the update's micro-batch here)" \
        if "per_device_train_batch_size" in taken else ""
    logger.info("args is a GRPOConfig: took over %s into %s%s; the fields it leaves at their defaults keep %s's%s",
                ", ".join(sorted(taken)) or "no field", config_class.__name__, batch, config_class.__name__,
                f", among them {', '.join(differ)}" if differ else "")
    return config


def trainer_config(config_class: type, args, reward_funcs: Any = None):
    """The config a team trainer runs with: ``args`` itself when it is a ``config_class``, a ``config_class`` with a
    plain ``GRPOConfig``'s fields taken over (:func:`config_from_grpo`); anything else is a ``TypeError``.
    ``reward_funcs`` given is refused (:func:`refuse_reward_funcs`)."""
    refuse_reward_funcs(reward_funcs)
    if isinstance(args, config_class):
        return args
    from trl import GRPOConfig

    from trl_multiagent.trainers.base_config import MultiAgentConfig

    if isinstance(args, GRPOConfig) and not isinstance(args, MultiAgentConfig):
        return config_from_grpo(args, config_class)
    hint = "" if isinstance(args, MultiAgentConfig) else " or a GRPOConfig (its fields are taken over)"
    raise TypeError(f"args must be a {config_class.__name__}{hint}, got {type(args).__name__}")


__all__ = ["NOTED_DEFAULTS", "REFERENCE_BASIS", "config_from_grpo", "grpo_fields_set", "reference_config",
           "refuse_reward_funcs", "trainer_config"]
