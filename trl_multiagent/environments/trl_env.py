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
  tool ends the episode (TRL's rollout ends when the model stops calling tools; ``stop_without_tool_calls=False``
  plays on to ``max_turns``, for a class whose turns are a structure of their own), as does ``max_turns``;
* **what each agent observes**: the dataset prompt with ``reset``'s text, then the transcript: ``observe="team"``
  shows every agent's messages and tool results (the others' as user messages naming the agent), ``"own"`` only
  its own; an agent's own calls and their results are assistant and ``tool`` messages, rendered by its chat template
  with its tools' schemas (``ToolPrompt``);
* **where the team reward comes from**: ``get_reward()`` times ``env_reward_weight`` and/or ``reward_fns``: TRL
  reward functions, called as TRL calls them for a batch of one (``prompts``, ``completions``, ``environments`` and
  every dataset column, each a list), weighted by ``reward_weights``. With ``reward_scope="agent"`` (the default)
  each agent's completion is its own messages (its responses and its tool calls' results), scored on its own as TRL
  would score that agent alone (:mod:`~trl_multiagent.environments.trl_rewards`; ``reward_fns`` may then be
  ``{agent: [functions]}``), and each agent's weighted sum is its local reward; with ``reward_scope="transcript"``
  the completion is the whole team's transcript (every agent's messages, each naming its agent), scored once. The
  team reward comes when the episode ends (0 before); each component is logged in ``info``.

Tool calls are parsed from each response's text in the ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
format (:func:`trl_multiagent.environments.tools.parse_text`), and bad calls (unknown tool, bad arguments, a raising method)
become ``{'error': ...}`` tool messages, as in :mod:`trl_multiagent.environments.tools`. Each tool result reaches the agents in
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

from trl_multiagent.environments.base import Environment, StepResult
from trl_multiagent.environments.trl_rewards import (
    NONFINITE,
    AgentRewards,
    call_reward,
    checked_reward,
    resolve_reward_func,
    reward_name,
    reward_weights_of,
    warn_no_reward,
)
from trl_multiagent.generation.requests import Prompt, ToolPrompt
from trl_multiagent.runtime.user_code import import_object

OBSERVE = ("team", "own")
#: Whose messages a reward function scores: each agent's own (each scored apart) or the team's whole transcript.
REWARD_SCOPES = ("agent", "transcript")
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
        reward_fns: TRL reward functions (callables or specs; a bare name is one of ``trl.rewards``): a list, or with
            ``reward_scope="agent"`` ``{agent: [functions]}``; their weighted sum joins ``get_reward``'s.
        reward_weights: one weight per reward function (default 1.0 each), in the order of :attr:`reward_names`.
            A recipe's top-level ``reward_weights`` (TRL's ``GRPOConfig`` field) is passed here.
        reward_scope: ``"agent"`` (each agent's own messages scored on their own) or ``"transcript"`` (the team's
            transcript scored once).
        stop_without_tool_calls: end the episode after a turn in which no agent called a tool (TRL's rule).
        nonfinite_rewards: ``"error"`` (a NaN or infinite reward stops the run naming it) or ``"missing"``.
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
                 environment_column: str = "environment", reward_scope: str = "agent",
                 stop_without_tool_calls: bool = True, nonfinite_rewards: str = "error"):

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
            from trl_multiagent.environments.tools import resolve_tools, tool_schema

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
        if reward_scope not in REWARD_SCOPES:
            raise ValueError(f"reward_scope must be one of {REWARD_SCOPES}, got {reward_scope!r}")
        if nonfinite_rewards not in NONFINITE:
            raise ValueError(f"nonfinite_rewards must be one of {NONFINITE}, got {nonfinite_rewards!r}")
        if isinstance(reward_fns, str) or callable(reward_fns):
            reward_fns = [reward_fns]
        self.reward_scope, self.nonfinite_rewards = reward_scope, nonfinite_rewards
        self.stop_without_tool_calls = bool(stop_without_tool_calls)
        self.agent_rewards = None
        if reward_scope == "agent" and reward_fns:
            self.agent_rewards = AgentRewards(reward_fns, self.agents, nonfinite=nonfinite_rewards)
            self.reward_fns = [fn for fns in self.agent_rewards.funcs.values() for fn in fns]
            self.reward_names = list(self.agent_rewards.names)
        else:
            if isinstance(reward_fns, Mapping):
                raise ValueError("reward_fns per agent ({agent: [functions]}) need reward_scope 'agent'")
            self.reward_fns = [resolve_reward_func(fn) for fn in reward_fns or ()]
            self.reward_names = [reward_name(fn) for fn in self.reward_fns]
        self.reward_weights = reward_weights_of(self.reward_names, reward_weights)
        if self.agent_rewards is not None:
            self.agent_rewards.weights = dict(zip(self.reward_names, self.reward_weights))
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
    #: The recipe's top-level ``reward_weights`` is this environment's ``reward_weights`` (one per function).
    takes_reward_weights = True
    #: The recipe's top-level ``reward_funcs`` (TRL's name) is this argument (trl_multiagent/command/trl_names.py).
    trl_reward_funcs_argument = "reward_fns"

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
        from trl_multiagent.environments.tools import call_tool, parse_text

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
        done = self.turn >= self.max_turns or (self.stop_without_tool_calls and self.turn_calls == 0)
        self.acted, self.turn_calls = set(), 0
        reward, local = 0.0, None
        if done:
            reward, local, components = self.team_reward()
            info.update(components)
        next_prompts = None if done else {a: self.observation(a) for a in self.agents}
        return StepResult(team_reward=reward, next_prompts=next_prompts, done=done, local_rewards=local, info=info)

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

    def completion_messages(self, agent: str | None = None) -> list[dict[str, Any]]:
        """The transcript as chat messages: each response as an assistant message, each tool result as a tool
        message. For one ``agent``, its own messages (what TRL would hand a reward function for that agent alone);
        for the team (``None``), every agent's, each assistant message naming its agent."""
        out: list[dict[str, Any]] = []
        for who, message, results in self.transcript:
            if agent is not None and who != agent:
                continue
            named = {"name": who} if agent is None else {}
            out.append({"role": "assistant", **named, "content": message.get("content", ""),
                        **({"tool_calls": message["tool_calls"]} if message.get("tool_calls") else {})})
            out.extend(dict(r) for r in results)
        return out

    def team_reward(self) -> tuple[float, dict[str, float] | None, dict[str, float]]:
        """``(team reward, local rewards, components by name)``: ``env_reward_weight * get_reward()`` (where the class
        has one) plus the weighted reward functions (per agent under ``reward_scope="agent"``, each agent's sum its
        local reward; else on the transcript). A reward of ``None`` is missing; a non-finite one is an error
        (``nonfinite_rewards``)."""
        components: dict[str, float] = {}
        total: float | None = None
        local = None
        if self.env_reward_weight and self.has_reward[self.kind]:
            value = self.instance.get_reward()
            value = checked_reward(None if value is None else float(value), type(self.instance).get_reward, "(team)",
                                   self._said_all(), self.nonfinite_rewards)
            if value is not None:
                components[type(self.instance).__name__] = value
                total = self.env_reward_weight * value
        extra = {"environments": [self.instance]}
        if self.agent_rewards is not None:
            prompts = {a: copy.deepcopy(self.base) for a in self.agents}
            completions = {a: self.completion_messages(a) for a in self.agents}
            texts = {a: " ".join(m.get("content", "") for m in completions[a] if m["role"] == "assistant")
                     for a in self.agents}
            own, local, info = self.agent_rewards.score(prompts, completions, texts, self.task, **extra)
            components.update(info)
            if own is not None:
                total = (total or 0.0) + own
        else:
            for fn, weight in zip(self.reward_fns, self.reward_weights):
                value = call_reward(fn, copy.deepcopy(self.base), self.completion_messages(), self.task, **extra)
                value = checked_reward(value, fn, "(team transcript)", self._said_all(), self.nonfinite_rewards)
                if value is not None:
                    components[reward_name(fn)] = value
                    total = (total or 0.0) + weight * value
        if total is None:
            warn_no_reward(self.task, self.turn - 1)
            total = 0.0
        return total, local or None, components

    def _said_all(self) -> str:
        return " | ".join(f"{who}: {self._said(message)}" for who, message, _ in self.transcript)


__all__ = ["TRLEnvironmentTeam"]
