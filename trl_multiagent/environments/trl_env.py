"""TRL environments as teams: a TRL ``environment_factory`` class (or a dict of them) played by a team of agents.

TRL's ``GRPOTrainer(environment_factory=...)`` takes a class whose instances are the state of one rollout: ``reset
(**row)`` starts it from a dataset row (its return, ``None`` or text, is appended to the prompt), every public method
is a tool the model may call (type hints and a Google-style docstring), and ``get_reward()``, when it exists, scores
the rollout. :class:`TRLEnvironmentTeam` takes such a class UNCHANGED and makes a team
:class:`~trl_multiagent.environments.base.Environment` of it:

* **which agent gets which tools**: ``tools={agent: [method names]}`` (default: every agent every method); a call of a
  method the agent was not given is answered as an unknown tool;
* **whose turn it is**: at every turn each agent writes one response; their tool calls run on the shared instance in
  the agents' order (``agents``), at most ``max_tool_calls_per_turn`` per response; a sampler that steps agents one
  at a time (AT-GRPO's sequential order) shows each agent the actions taken before it in the turn. A turn in which no agent calls a
  tool ends the episode (TRL's rollout ends when the model stops calling tools), as does ``max_turns``;
* **what each agent observes**: the dataset prompt with ``reset``'s text, then the transcript: ``observe="team"``
  shows every agent's messages and tool results (the others' as user messages naming the agent), ``"own"`` only
  its own; an agent's own calls and their results are assistant and ``tool`` messages, rendered by its chat template
  with its tools' schemas (``ToolPrompt``);
* **where the team reward comes from**: ``get_reward()`` times ``env_reward_weight`` and/or ``reward_fns``: TRL
  reward functions, called as TRL calls them for a batch of one (``prompts``, ``completions`` (the team's transcript
  as messages), ``environments`` and every dataset column, each a list), weighted by ``reward_weights``. The team
  reward comes when the episode ends (0 before); each component is logged in ``info``.

Tool calls are parsed from each response's text in the ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
format (:func:`trl_multiagent.tools.parse_text`), and bad calls (unknown tool, bad arguments, a raising method)
become ``{'error': ...}`` tool messages, as in :mod:`trl_multiagent.tools`. Each tool result reaches the agents in
their next prompt, never in a completion, so no loss ever trains on it. Every joint action steps its own clone of the
instance (``clone`` deep-copies it), so the tree samplers branch the environment's state as they branch the team.

From a recipe::

    environment: trl_multiagent.environments:TRLEnvironmentTeam
    env_kwargs:
      environment_factory: examples/trl_environments/counter_env.py:CounterEnv
      agents: [adder, subtractor]
      tools: {adder: [increment], subtractor: [decrement]}

docs/guides/trl_environments.md works through an example.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..generation.requests import Prompt, ToolPrompt
from ..utils import import_object
from .base import Environment, StepResult, _call_with_supported_kwargs

OBSERVE = ("team", "own")
_RESERVED = ("reset", "get_reward")


def _tool_methods(cls: type) -> list[str]:
    """The public methods of an environment class, its tools (as TRL lists them: functions of the class, not of an
    instance, so that properties are not evaluated)."""
    return [name for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if not name.startswith("_") and name not in _RESERVED]


class TRLEnvironmentTeam(Environment):
    """A TRL ``environment_factory`` class played by a team (module docstring). It accepts partial joint actions
    (``supports_partial_actions``): agents stepping one after another within a turn (AT-GRPO's sequential order)
    each see the actions of those before them; the turn ends once every agent has acted.

    Args:
        environment_factory: the class (or any zero-argument factory of instances), ``"module:Class"`` or
            ``"path/to/file.py:Class"``; or a dict ``{name: factory}``, each row naming its environment in the
            column ``environment_column`` (TRL's multi-environment form).
        agents: the team's roles, in acting order.
        tools: ``{agent: [method names]}``; agents left out get every tool (default: all of them, every agent).
        observe: ``"team"`` (everyone's messages and results) or ``"own"``.
        reward_fns: TRL reward functions (callables or specs); their weighted sum joins ``get_reward``'s.
        reward_weights: one weight per reward function (default 1.0 each).
        env_reward_weight: the weight of ``get_reward()`` (where the class has one; 0 leaves it out).
        max_turns: the turn budget.
        max_tool_calls_per_turn: the most calls of one response that run (later ones are answered with an error).
        prompt_column: the dataset column of the prompt (a string or chat messages); without it the prompt is
            ``reset``'s text alone.
        environment_column: the column that names a row's environment when ``environment_factory`` is a dict.
    """

    def __init__(self, environment_factory: Any, agents: Sequence[str] = ("first", "second"),
                 tools: Mapping[str, Sequence[str]] | None = None, observe: str = "team",
                 reward_fns: Sequence[Callable | str] | Callable | str | None = None,
                 reward_weights: Sequence[float] | None = None, env_reward_weight: float = 1.0, max_turns: int = 3,
                 max_tool_calls_per_turn: int = 5, prompt_column: str = "prompt",
                 environment_column: str = "environment"):
        self.agents = tuple(agents)
        if not self.agents or len(set(self.agents)) != len(self.agents):
            raise ValueError(f"agents must be distinct role names, got {list(agents)}")
        if observe not in OBSERVE:
            raise ValueError(f"observe must be one of {OBSERVE}, got {observe!r}")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be an integer >= 1, got {max_turns!r}")
        if isinstance(max_tool_calls_per_turn, bool) or not isinstance(max_tool_calls_per_turn, int) \
                or max_tool_calls_per_turn < 0:
            raise ValueError(f"max_tool_calls_per_turn must be an integer >= 0, got {max_tool_calls_per_turn!r}")
        self.multi = isinstance(environment_factory, Mapping)
        given = environment_factory if self.multi else {None: environment_factory}
        if not given:
            raise ValueError("environment_factory is an empty dict")
        self.factories = {name: import_object(f, "environment_factory") for name, f in given.items()}
        self.methods: dict[Any, list[str]] = {}
        self.has_reward: dict[Any, bool] = {}
        self.schemas: dict[Any, dict[str, dict]] = {}
        for name, factory in self.factories.items():
            probe = factory()
            cls = type(probe)
            if not callable(getattr(probe, "reset", None)):
                raise ValueError(f"{cls.__name__} (environment_factory) must define reset(**kwargs), as TRL's "
                                 "environments do")
            self.methods[name] = _tool_methods(cls)
            self.has_reward[name] = callable(getattr(cls, "get_reward", None))
            from ..tools import resolve_tools, tool_schema

            bound = resolve_tools([getattr(probe, m) for m in self.methods[name]], f"{cls.__name__}'s tools")
            self.schemas[name] = {m: tool_schema(fn) for m, fn in zip(self.methods[name], bound)}
        every = sorted({m for ms in self.methods.values() for m in ms})
        tools = dict(tools or {})
        unknown_agents = set(tools) - set(self.agents)
        if unknown_agents:
            raise ValueError(f"tools names agents {sorted(unknown_agents)} that are not in the team {list(self.agents)}")
        for agent, names in tools.items():
            missing = sorted(set(names) - set(every))
            if missing:
                raise ValueError(f"tools of {agent!r} name {missing}, which are not tools of the environment "
                                 f"(its public methods: {every})")
        self.agent_tools = {a: list(tools.get(a, every)) for a in self.agents}
        if isinstance(reward_fns, str) or callable(reward_fns):
            reward_fns = [reward_fns]
        self.reward_fns = [import_object(fn, "reward_fn") for fn in reward_fns or ()]
        self.reward_weights = [float(w) for w in reward_weights] if reward_weights is not None \
            else [1.0] * len(self.reward_fns)
        if len(self.reward_weights) != len(self.reward_fns):
            raise ValueError(f"{len(self.reward_weights)} reward weights for {len(self.reward_fns)} reward functions")
        self.env_reward_weight = float(env_reward_weight)
        if not self.reward_fns and not (self.env_reward_weight and all(self.has_reward.values())):
            raise ValueError("No reward source: pass reward_fns, or an environment class that defines get_reward() "
                             "(with env_reward_weight != 0), as TRL's GRPOTrainer requires")
        self.max_turns, self.max_tool_calls_per_turn = max_turns, max_tool_calls_per_turn
        self.observe, self.prompt_column, self.environment_column = observe, prompt_column, environment_column
        self.required_columns = ((environment_column,) if self.multi else ())
        self.task: dict[str, Any] = {}
        self.kind: Any = None
        self.instance: Any = None
        self.base: list[dict[str, Any]] = []
        self.transcript: list[tuple[str, dict, list[dict]]] = []  # (agent, assistant message, tool messages)
        self.turn = 0
        self.acted: set[str] = set()  # the agents that acted in this turn (partial joint actions)
        self.turn_calls = 0

    supports_partial_actions = True

    def validate_dataset_columns(self, columns: Sequence[str], name: str = "dataset") -> None:  # instance-level
        missing = [c for c in self.required_columns if c not in columns]
        if missing:
            raise ValueError(f"The {name} lacks the column(s) {missing} that TRLEnvironmentTeam needs (it has: "
                             f"{list(columns)}).")

    # -------------------------------------------------------------------------------------------- the episode
    def reset(self, task: Mapping[str, Any]) -> dict[str, Prompt]:
        self.task = dict(task)
        kwargs = dict(self.task)
        if self.multi:
            self.kind = kwargs.pop(self.environment_column, None)
            if self.kind not in self.factories:
                raise ValueError(f"row's {self.environment_column!r} is {self.kind!r}; environments: "
                                 f"{sorted(self.factories)}")
        self.instance = self.factories[self.kind]()
        observation = self.instance.reset(**kwargs)
        prompt = self.task.get(self.prompt_column)
        if prompt is None:
            messages = [{"role": "user", "content": ""}]
        elif isinstance(prompt, str):
            messages = [{"role": "user", "content": prompt}]
        else:
            messages = [dict(m) for m in prompt]
        if observation is not None:
            messages[-1] = {**messages[-1], "content": messages[-1]["content"] + str(observation)}
        self.base, self.transcript, self.turn, self.acted, self.turn_calls = messages, [], 0, set(), 0
        return {a: self.observation(a) for a in self.agents}

    def step(self, joint_action: Mapping[str, str]) -> StepResult:
        from ..tools import call_tool, parse_text

        acting = self.acting_agents(joint_action, self.acted, self.turn)
        calls = failures = 0
        for agent in acting:
            message = parse_text(joint_action[agent])
            allowed = {m: getattr(self.instance, m) for m in self.agent_tools[agent] if m in self.methods[self.kind]}
            results = []
            for k, call in enumerate(message.get("tool_calls", [])):
                if k >= self.max_tool_calls_per_turn:
                    name = call.get("function", {}).get("name", "unknown")
                    content, failed = str({"error": f"More than {self.max_tool_calls_per_turn} tool calls in one "
                                                    "response; this one was not run."}), True
                else:
                    name, content, failed = call_tool(allowed, call)
                results.append({"role": "tool", "name": name, "content": content})
                calls, failures = calls + 1, failures + failed
            self.transcript.append((agent, message, results))
        info = {"tool_calls": float(calls), "tool_failures": float(failures)}
        self.acted |= set(acting)
        self.turn_calls += calls
        if self.acted != set(self.agents):  # the turn goes on: the agents still to act see these actions
            return StepResult(team_reward=0.0, next_prompts={a: self.observation(a) for a in self.agents}, info=info)
        self.turn += 1
        done = self.turn >= self.max_turns or self.turn_calls == 0
        self.acted, self.turn_calls = set(), 0
        reward = 0.0
        if done:
            reward, components = self.team_reward()
            info.update(components)
        next_prompts = None if done else {a: self.observation(a) for a in self.agents}
        return StepResult(team_reward=reward, next_prompts=next_prompts, done=done, info=info)

    # -------------------------------------------------------------------------------------------- views
    def observation(self, agent: str) -> ToolPrompt:
        """What ``agent`` sees now: the prompt with ``reset``'s text, then the transcript (``observe``), with the
        schemas of its tools for the chat template."""
        messages = [dict(m) for m in self.base]
        for who, message, results in self.transcript:
            if who == agent:
                own = {"role": "assistant", "content": message.get("content", "")}
                calls = [c for c in message.get("tool_calls", []) if "error" not in c]
                if calls:
                    own["tool_calls"] = calls
                messages.append(own)
                messages.extend(dict(r) for r in results)
            elif self.observe == "team":
                lines = [f"[{who}] {self._said(message)}"]
                lines += [f"[{who} -> {r['name']}] {r['content']}" for r in results]
                messages.append({"role": "user", "content": "\n".join(lines)})
        if messages[-1]["role"] == "assistant":
            messages.append({"role": "user", "content": "Go on."})
        schemas = [self.schemas[self.kind][m] for m in self.agent_tools[agent] if m in self.schemas[self.kind]]
        return ToolPrompt(messages, tools=schemas)

    @staticmethod
    def _said(message: Mapping[str, Any]) -> str:
        parts = [message.get("content", "")]
        for call in message.get("tool_calls", []):
            fn = call.get("function", {})
            parts.append(f"calls {fn.get('name')}({fn.get('arguments')})")
        return " ".join(p for p in parts if p) or "(nothing)"

    def completion_messages(self) -> list[dict[str, Any]]:
        """The team's transcript as chat messages (each agent's text as an assistant message naming it, each tool
        result as a tool message): the ``completions`` the reward functions get."""
        out: list[dict[str, Any]] = []
        for who, message, results in self.transcript:
            out.append({"role": "assistant", "name": who, "content": message.get("content", ""),
                        **({"tool_calls": message["tool_calls"]} if message.get("tool_calls") else {})})
            out.extend(dict(r) for r in results)
        return out

    def team_reward(self) -> tuple[float, dict[str, float]]:
        """``env_reward_weight * get_reward()`` (where the class has one) plus the weighted reward functions; the
        components by name."""
        components: dict[str, float] = {}
        total = 0.0
        if self.env_reward_weight and self.has_reward[self.kind]:
            value = float(self.instance.get_reward())
            components[type(self.instance).__name__] = value
            total += self.env_reward_weight * value
        columns = {k: [v] for k, v in self.task.items()}
        for fn, weight in zip(self.reward_fns, self.reward_weights):
            values = _call_with_supported_kwargs(fn, **columns, prompts=[copy.deepcopy(self.base)],
                                                 completions=[self.completion_messages()],
                                                 environments=[self.instance])
            value = float(values[0] if isinstance(values, (list, tuple)) else values)
            components[getattr(fn, "__name__", type(fn).__name__)] = value
            total += weight * value
        return total, components


__all__ = ["TRLEnvironmentTeam"]
