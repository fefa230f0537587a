"""TRL reward functions scoring the agents of a team, each agent's completion on its own.

A TRL reward function (``GRPOTrainer(reward_funcs=...)``, ``trl.rewards``) is batched: it is called as
``fn(prompts=[...], completions=[...], **columns)`` where every dataset column is a list, and returns one float per
completion, ``None`` meaning "no reward for this sample". A completion is a string for a dataset of plain-text
prompts and a list of chat messages (``[{"role": "assistant", "content": ...}]``) for a dataset of chat prompts;
``trl.rewards.accuracy_reward`` reads ``completion[0]["content"]``, so it needs the second form.

A team is scored here as TRL would score each agent alone: :class:`AgentRewards` calls every function named for an
agent on that agent's prompt and completion, as a batch of one. The team reward is the weighted sum over every
(agent, function) pair that gave a reward, and each agent's own weighted sum is its local reward (the reward that
AT-GRPO mixes in and that a MAPoRL debate scores each agent with). The rules carried over from TRL's
``GRPOTrainer._calculate_rewards``:

* ``None`` is a missing reward: left out of the sums (TRL's ``nansum`` over the functions); a joint action for which
  no function gave any reward scores 0, with a warning;
* one weight per reward function (TRL's ``reward_weights``), in the order the environment lists its functions
  (:attr:`AgentRewards.names`);
* a function must return one value per completion.

And one rule of this library's: a reward that is NaN or infinite is an error naming the function, the agent and
the start of its text (``nonfinite="error"``, the default), or a missing reward (``nonfinite="missing"``): a NaN that
reached the advantages would reach the adapters. Not passed (TRL passes them): ``completion_ids``, ``trainer_state``,
``log_extra`` and ``log_metric``; a function that needs them gets ``None`` from its own defaults.

In a recipe, a function is named by ``"module:function"``, ``"path/to/file.py:function"`` or, for TRL's own, its bare
name (``accuracy_reward``, looked up in ``trl.rewards`` as TRL's ``trl grpo`` command does).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trl_multiagent.runtime.user_code import call_with_supported_kwargs, import_object

logger = logging.getLogger(__name__)

#: What a non-finite reward means: an error (default) or a missing reward.
NONFINITE = ("error", "missing")
#: How an agent's completion reaches a reward function: ``auto`` follows the agent's prompt, as TRL follows the
#: dataset's (chat messages for a prompt of messages, plain text for a string prompt).
COMPLETION_FORMATS = ("auto", "conversational", "standard")


def resolve_reward_func(spec: Callable | str) -> Callable:
    """The reward function a spec names: a callable as it is, a bare name of ``trl.rewards`` (``accuracy_reward``),
    or ``"module:function"`` / ``"path/to/file.py:function"``."""
    if isinstance(spec, str) and ":" not in spec and "/" not in spec and not spec.endswith(".py"):
        import trl.rewards

        if not callable(getattr(trl.rewards, spec, None)):
            known = sorted(n for n in dir(trl.rewards) if not n.startswith("_") and callable(getattr(trl.rewards, n)))
            raise ValueError(f"reward function {spec!r} is not in trl.rewards (it has: {', '.join(known)}); name "
                             "another one as 'module:function' or 'path/to/file.py:function'")
        return getattr(trl.rewards, spec)
    return import_object(spec, "reward_fn")


def reward_name(fn: Callable) -> str:
    """The name a reward is logged and weighted under: the function's ``__name__`` (TRL's ``reward_func_names``)."""
    return getattr(fn, "__name__", None) or type(fn).__name__


def _start(text: Any, n: int = 60) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n] + "..."


def call_reward(fn: Callable, prompt: Any, completion: Any, task: Mapping[str, Any], **extra: Any) -> float | None:
    """``fn`` called as TRL calls it for a batch of one: ``prompts=[prompt]``, ``completions=[completion]``, every
    task field as a one-element list and ``extra`` as they are (e.g. ``environments=[...]``). Returns the float or
    ``None``; a result that is not one value (or a list of one) is a ``ValueError`` naming the function."""
    columns = {k: [v] for k, v in task.items() if k not in ("prompt", "completion", "completion_ids")}
    values = call_with_supported_kwargs(fn, **columns, prompts=[prompt], completions=[completion], **extra)
    if isinstance(values, (list, tuple)):
        if len(values) != 1:
            raise ValueError(f"reward function {reward_name(fn)!r} returned {len(values)} rewards for one completion "
                             "(a TRL reward function returns one per completion)")
        values = values[0]
    if values is None:
        return None
    try:
        return float(values)
    except (TypeError, ValueError):
        raise ValueError(f"reward function {reward_name(fn)!r} returned {values!r}, not a number or None") from None


def as_completion(text: str, prompt: Any, completion_format: str) -> Any:
    """An agent's response as TRL would hand it to a reward function: a list of one assistant message
    (conversational) or the text itself (standard); ``auto`` takes the form of the agent's prompt."""
    conversational = completion_format == "conversational" or (
        completion_format == "auto" and not isinstance(prompt, str))
    return [{"role": "assistant", "content": text}] if conversational else text


def checked_reward(value: float | None, fn: Callable, agent: str, text: Any, nonfinite: str) -> float | None:
    """``value``, or ``None`` for a non-finite one under ``nonfinite="missing"``; a ``ValueError`` naming the function,
    the agent and the start of its text under ``"error"``."""
    if value is None or math.isfinite(value):
        return value
    if nonfinite == "missing":
        return None
    raise ValueError(f"reward function {reward_name(fn)!r} returned {value} for agent {agent!r} (its text: "
                     f"{_start(text)!r}); a non-finite reward would reach the adapters (set nonfinite_rewards: missing "
                     "in env_kwargs to treat it as a missing reward)")


def reward_weights_of(names: Sequence[str], weights: Sequence[float] | None) -> list[float]:
    """One weight per reward function named in ``names`` (TRL's ``reward_weights``): ``weights`` as floats, or 1.0
    each; a count that differs is a ``ValueError`` naming the functions."""
    if weights is None:
        return [1.0] * len(names)
    weights = [float(w) for w in weights]
    if len(weights) != len(names):
        raise ValueError(f"{len(weights)} reward weights for {len(names)} reward functions {list(names)}")
    return weights


class AgentRewards:
    """TRL reward functions per agent and their weights (module docstring).

    Args:
        reward_funcs: a list (every agent is scored by each function) or ``{agent: [functions]}``; functions as
            callables or specs (:func:`resolve_reward_func`).
        agents: the team's roles.
        weights: ``{function name: weight}`` (missing names weigh 1.0).
        nonfinite: ``"error"`` or ``"missing"``.
    """

    def __init__(self, reward_funcs: Sequence | Mapping[str, Sequence], agents: Sequence[str],
                 weights: Mapping[str, float] | None = None, nonfinite: str = "error"):
        if nonfinite not in NONFINITE:
            raise ValueError(f"nonfinite_rewards must be one of {NONFINITE}, got {nonfinite!r}")
        if isinstance(reward_funcs, Mapping):
            unknown = sorted(set(reward_funcs) - set(agents))
            if unknown:
                raise ValueError(f"reward_funcs names agents {unknown} that are not in the team {list(agents)}")
            given = {a: reward_funcs[a] for a in agents if a in reward_funcs}
        else:
            given = {a: reward_funcs for a in agents}
        self.funcs: dict[str, list[Callable]] = {}
        by_name: dict[str, Callable] = {}
        for agent, specs in given.items():
            specs = [specs] if isinstance(specs, str) or callable(specs) else list(specs)
            self.funcs[agent] = []
            for spec in specs:
                fn = resolve_reward_func(spec)
                name = reward_name(fn)
                if by_name.setdefault(name, fn) is not fn:
                    raise ValueError(f"two different reward functions are named {name!r}; give them distinct names")
                self.funcs[agent].append(fn)
        if not any(self.funcs.values()):
            raise ValueError("reward_funcs names no reward function")
        self.names = list(by_name)
        unknown = sorted(set(weights or {}) - set(self.names))
        if unknown:
            raise ValueError(f"weights for {unknown}, which are not reward functions ({self.names})")
        self.weights = {n: float((weights or {}).get(n, 1.0)) for n in self.names}
        self.nonfinite = nonfinite

    def score(self, prompts: Mapping[str, Any], completions: Mapping[str, Any], texts: Mapping[str, Any],
              task: Mapping[str, Any], **extra: Any) -> tuple[float | None, dict[str, float], dict[str, float]]:
        """``(team reward, {agent: local reward}, {"<agent>/<function>": reward})`` of the agents in ``completions``
        (their prompts, completions and texts for the error messages); the team reward is ``None`` when no function
        gave a reward."""
        team, local, info = None, {}, {}
        for agent, funcs in self.funcs.items():
            if agent not in completions:
                continue
            for fn in funcs:
                value = call_reward(fn, prompts[agent], completions[agent], task, **extra)
                value = checked_reward(value, fn, agent, texts[agent], self.nonfinite)
                if value is None:
                    continue
                name = reward_name(fn)
                info[f"{agent}/{name}"] = value
                weighted = self.weights[name] * value
                local[agent] = local.get(agent, 0.0) + weighted
                team = (team or 0.0) + weighted
        return team, local, info


def warn_no_reward(task: Mapping[str, Any], turn: int) -> None:
    """TRL's warning for a sample that no reward function scored (its reward counts as 0)."""
    from trl_multiagent.errors import task_label

    logger.warning("No reward function gave a reward (all returned None) for task %s at turn %d: its reward is 0, as "
                   "in TRL; make sure at least one reward function scores every sample", task_label(task), turn)


__all__ = ["AgentRewards", "COMPLETION_FORMATS", "NONFINITE", "as_completion", "call_reward", "checked_reward",
           "reward_name", "reward_weights_of", "resolve_reward_func"]
