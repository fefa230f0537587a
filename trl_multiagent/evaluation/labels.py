"""How ``report.md`` and the model card name a method and write a mean with its interval."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from trl_multiagent.evaluation.alone import ALONE_SUFFIX, TRAINED_SUFFIX, TURNS_SUFFIX
from trl_multiagent.evaluation.core import TEAM

METHOD_NAMES = {
    TEAM: "team",
    "single": "single agent",
    "naive": "naive concatenation",
    "sequential": "sequential pipeline",
    "discussion": "one-round discussion",
    "no_exchange": "agents answer once, no exchange",
}


def method_label(method: str) -> str:
    """A method's name in ``report.md``: :data:`METHOD_NAMES`, ``<agent> alone`` for ``<agent>_alone`` and
    ``<agent> alone, every turn`` for ``<agent>_alone_turns`` (``..., trained`` for their trained twins,
    ``<agent>_alone_trained``), else the name itself."""
    if method in METHOD_NAMES:
        return METHOD_NAMES[method]
    if method.endswith(TRAINED_SUFFIX) and method.removesuffix(TRAINED_SUFFIX).endswith((ALONE_SUFFIX, TURNS_SUFFIX)):
        return f"{method_label(method.removesuffix(TRAINED_SUFFIX))}, trained"
    if method.endswith(TURNS_SUFFIX):
        return f"{method.removesuffix(TURNS_SUFFIX)} alone, every turn"
    if method.endswith(ALONE_SUFFIX):
        return f"{method.removesuffix(ALONE_SUFFIX)} alone"
    return method


def _fmt(value: Any, ci: Any = None, signed: bool = False) -> str:
    if not isinstance(value, (int, float)) or (isinstance(value, float) and math.isnan(value)):
        return "-"
    text = f"{value:+.3f}" if signed else f"{value:.3f}"
    if ci and all(isinstance(c, (int, float)) and not math.isnan(c) for c in ci):
        text += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
    return text


def _cell(entry: Mapping[str, Any] | None, signed: bool = False) -> str:
    return _fmt(entry.get("mean"), entry.get("ci95"), signed) if entry else "-"
