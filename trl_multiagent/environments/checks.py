"""Argument checks of the environments' constructors: one ``ValueError`` naming the argument, the rule and the value.

Recipes pass ``env_kwargs`` from YAML or JSON, so a count may arrive as a string or a flag as a number; each check
refuses a value of the wrong type as clearly as one out of range, before any model loads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any


def _fail(name: str, rule: str, value: Any):
    return ValueError(f"{name} must be {rule}, got {value!r}")


def need_int(name: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer (not a bool) within ``[minimum, maximum]``."""
    rule = "an integer" + (f" >= {minimum}" if minimum is not None and maximum is None else "") + \
        (f" in [{minimum}, {maximum}]" if minimum is not None and maximum is not None else "") + \
        (f" <= {maximum}" if maximum is not None and minimum is None else "")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, rule, value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise _fail(name, rule, value)
    return value


def need_number(name: str, value: Any, minimum: float | None = None, maximum: float | None = None,
                above: float | None = None) -> float:
    """A finite real number, at least ``minimum``, at most ``maximum``, strictly above ``above``."""
    parts = []
    if minimum is not None:
        parts.append(f">= {minimum}")
    if above is not None:
        parts.append(f"> {above}")
    if maximum is not None:
        parts.append(f"<= {maximum}")
    rule = "a number" + (" " + " and ".join(parts) if parts else "")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(name, rule, value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum) or \
            (above is not None and value <= above):
        raise _fail(name, rule, value)
    return float(value)


def need_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(name, "true or false", value)
    return value


def need_str(name: str, value: Any, choices: Sequence[str] | None = None, non_empty: bool = False) -> str:
    if not isinstance(value, str) or (non_empty and not value):
        raise _fail(name, "a non-empty string" if non_empty else "a string", value)
    if choices is not None and value not in choices:
        raise _fail(name, f"one of {list(choices)}", value)
    return value


def need_mapping(name: str, value: Any, optional: bool = True) -> Mapping | None:
    if value is None and optional:
        return None
    if not isinstance(value, Mapping):
        raise _fail(name, "a mapping", value)
    return value


def need_weights(name: str, value: Any) -> Mapping[str, float] | None:
    """``None`` or a mapping of component names to numbers (unknown names are checked by ``merge_weights``)."""
    if need_mapping(name, value) is None:
        return None
    for key, weight in value.items():
        need_number(f"{name}[{key!r}]", weight)
    return value


def sandbox_settings(value: Any, defaults: Mapping[str, Any], name: str = "sandbox"):
    """A :class:`~trl_multiagent.sandbox.SandboxConfig` from one, or from a mapping of its fields on top of
    ``defaults``; unknown fields, and limits that are not positive numbers, are refused."""
    from trl_multiagent.sandbox import SandboxConfig

    if isinstance(value, SandboxConfig):
        return value
    given = need_mapping(name, value) or {}
    known = {f.name: f for f in dataclasses.fields(SandboxConfig)}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"{name} has unknown settings {unknown}; known: {sorted(known)}")
    for key, setting in given.items():
        if key.endswith(("_s", "_mb", "_bytes", "_files", "processes")) and setting is not None:
            need_number(f"{name}.{key}", setting, minimum=0 if key == "total_memory_mb" else None,
                        above=None if key == "total_memory_mb" else 0)
    return SandboxConfig(**{**dict(defaults), **dict(given)})


def need_tasks(num_tasks: Any) -> None:
    """``make_dataset``'s ``num_tasks``: ``None`` (the generator's default or every task) or an integer >= 1."""
    if num_tasks is not None:
        need_int("num_tasks", num_tasks, minimum=1)
