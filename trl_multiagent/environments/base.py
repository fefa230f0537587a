"""The environment protocol: a cooperative Dec-POMDP seen by a team of LLM agents.

An environment is created for one task (one dataset row). ``reset(task)`` returns the first prompt of every agent;
``step(joint_action)`` takes one response per agent and returns a :class:`StepResult`: the team (joint) reward,
optional per-agent local rewards, the next prompt of every agent and whether the episode is over.

Tree-structured samplers explore several joint actions from the same state, so they call :meth:`Environment.clone`
before each ``step``; the default deep copy is right for environments whose state is plain Python data.

A prompt (:data:`~trl_multiagent.generation.requests.Prompt`, defined with the generation requests, the bottom of
the library) is either a string (wrapped as one user message when the agent's tokenizer has a chat template) or a
list of chat messages ``[{"role": ..., "content": ...}, ...]``.

Users who do not want to write a class wrap plain functions with :class:`FunctionEnvironment`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trl_multiagent.environments.trl_rewards import (
    COMPLETION_FORMATS,
    AgentRewards,
    as_completion,
    checked_reward,
    reward_name,
    reward_weights_of,
    warn_no_reward,
)
from trl_multiagent.generation.requests import Prompt
from trl_multiagent.runtime.user_code import call_with_supported_kwargs, import_object


@dataclass
class StepResult:
    """What the environment returns for one joint action.

    Attributes:
        team_reward: the joint reward ``r_t = R(s_t, a_t)`` shared by all agents.
        next_prompts: the next prompt of every agent (ignored when ``done``).
        done: the episode ends after this joint action (early termination).
        local_rewards: optional per-agent rewards (used by algorithms that mix team and local rewards).
        info: named reward components and other scalars, logged as ``env/<name>``; the values of the
            environment's reward functions (:attr:`Environment.reward_names`), under ``<function>`` or
            ``<agent>/<function>``, are logged as TRL logs them: ``rewards/<function>/mean`` and ``/std``.
    """

    team_reward: float
    next_prompts: dict[str, Prompt] | None = None
    done: bool = False
    local_rewards: dict[str, float] | None = None
    info: dict[str, float] = field(default_factory=dict)


class Environment:
    """Base class of all environments. Subclasses set ``agents`` and implement ``reset`` and ``step``.

    Attributes:
        agents: the role names, in acting order. A team's ``AgentSpec`` names must match them.
        max_turns: the turn budget H (the sampler also respects the trainer's ``num_turns``).
        required_columns: dataset columns that ``reset`` reads; checked before any model loads.
        concurrent_steps: ``step`` may run in several threads at once on independent clones (set it when ``step``
            mostly waits on subprocesses, such as sandboxed tests).
        supports_partial_actions: ``step`` accepts the actions of a subset of the agents (one agent acting after
            another within a turn), as sequential AT-GRPO needs.
        reward_names: the names of the environment's reward functions. ``step`` reports their values in ``info``
            under the function's name (a reward of the joint action) or ``<agent>/<function>`` (one agent's
            completion scored); the samplers log them under TRL's names, ``rewards/<function>/mean`` and ``/std``
            over all values and ``agent/<agent>/rewards/<function>/mean|std`` per agent, instead of ``env/<key>``
            (:func:`~trl_multiagent.rollout.experience.reward_function_stats`).
    """

    agents: tuple[str, ...] = ()
    max_turns: int = 1
    required_columns: tuple[str, ...] = ()
    concurrent_steps: bool = False
    supports_partial_actions: bool = False
    reward_names: Sequence[str] = ()

    def reset(self, task: Mapping[str, Any]) -> dict[str, Prompt]:
        raise NotImplementedError(f"{type(self).__name__} must implement reset(task)")

    def step(self, joint_action: Mapping[str, str]) -> StepResult:
        raise NotImplementedError(f"{type(self).__name__} must implement step(joint_action)")

    def acting_agents(self, joint_action: Mapping[str, str], acted: set[str], turn: int) -> list[str]:
        """The agents in a (possibly partial) joint action, in acting order; an unknown agent, an empty action or an
        agent acting twice in one turn is an error."""
        acting = [a for a in self.agents if a in joint_action]
        unknown = set(joint_action) - set(self.agents)
        if unknown or not acting:
            raise ValueError(f"{type(self).__name__}.step takes actions of {list(self.agents)}, "
                             f"got {sorted(joint_action)}")
        again = acted & set(acting)
        if again:
            raise ValueError(f"{sorted(again)} already acted in turn {turn}")
        return acting

    def clone(self) -> Environment:
        """An independent copy of the current state, used to branch the rollout tree."""
        return copy.deepcopy(self)

    @classmethod
    def validate_dataset_columns(cls, columns: Sequence[str], name: str = "dataset") -> None:
        missing = [c for c in cls.required_columns if c not in columns]
        if missing:
            raise ValueError(
                f"The {name} lacks the column(s) {missing} that the environment {cls.__name__} needs "
                f"(it has: {list(columns)})."
            )


def merge_weights(given: Mapping[str, float] | None, default: Mapping[str, float], name: str) -> dict[str, float]:
    """Reward-component weights: ``default`` with the entries of ``given`` replacing it; unknown names are an error."""
    if given is None:
        return dict(default)
    unknown = set(given) - set(default)
    if unknown:
        raise ValueError(f"{name} has unknown components {sorted(unknown)}; known: {sorted(default)}")
    return {**default, **{k: float(v) for k, v in given.items()}}


def chat_with_examples(system: str, examples: Sequence[tuple[str, str]], request: str) -> list[dict[str, str]]:
    """A first prompt as chat messages: ``system`` as the system message, every worked example ``(request, reply)``
    as an earlier user / assistant exchange, then ``request``. A small instruct model copies a reply it was shown
    far more often than a format it is told about (issue 18: SmolLM2-135M's right answers on easy arithmetic,
    experiments/training/math_easy_prompts/)."""
    messages = [{"role": "system", "content": system}]
    for shown_request, shown_reply in examples:
        messages += [{"role": "user", "content": shown_request}, {"role": "assistant", "content": shown_reply}]
    return [*messages, {"role": "user", "content": request}]


def revise_last_message(prompt: Prompt, revise: Callable[[str], str]) -> Prompt:
    """``prompt`` with ``revise`` applied to its text: the whole string, or the content of its last chat message
    (earlier messages, such as worked examples, are kept as they are)."""
    if isinstance(prompt, str):
        return revise(prompt)
    *earlier, last = prompt
    return [*earlier, {**last, "content": revise(last["content"])}]


RewardFunc = Callable[..., float]


class FunctionEnvironment(Environment):
    """An environment assembled from plain functions, so that users need not write a class.

    Every function argument may also be named by a string, ``"package.module:function"`` or
    ``"path/to/file.py:function"`` (:func:`~trl_multiagent.runtime.user_code.import_object`), so that a recipe can assemble one
    (``environment: trl_multiagent.environments:FunctionEnvironment`` with the functions in ``env_kwargs``).

    It takes rewards of two shapes, alone or together:

    * ``reward_funcs``: TRL's reward functions as they are (``trl.rewards.accuracy_reward``, a ``GRPOTrainer``
      script's own): batched, ``fn(prompts, completions, **columns) -> [float | None]``. Each scores EACH AGENT's
      response on its own, as TRL would score that agent alone (:mod:`~trl_multiagent.environments.trl_rewards`):
      a list scores every agent with every function, ``{agent: [functions]}`` names each agent's. Each agent's
      weighted sum is its local reward.
    * ``reward_fns``: functions of the joint action, ``fn(completions={agent: response}, ...) -> float``, for a
      reward that needs several agents' responses at once.

    The team reward is the weighted sum of both kinds. A reward of ``None`` is missing (left out of the sum, as in
    TRL); a joint action no function scores gets 0 with a warning. A NaN or infinite reward is an error naming the
    function and the agent, or a missing reward with ``nonfinite_rewards="missing"``.

    Args:
        agents: role names in acting order.
        prompt_fns: one function per agent, ``fn(task) -> Prompt`` giving its first prompt.
        reward_fns: functions of the joint action, returning a float or ``None``. Each is called with the keyword
            arguments it declares among ``completions`` (``{agent: response}``), ``task`` (the dataset row),
            ``turn``, ``history`` (earlier joint actions) and every task field by name; reported in ``info`` under
            its function name.
        reward_funcs: TRL reward functions (above), a list or ``{agent: [functions]}``; reported in ``info`` as
            ``<agent>/<function>``.
        reward_weights: one weight per reward function, in the order of :attr:`reward_names` (``reward_fns``
            first, then the distinct ``reward_funcs`` in order of appearance); default 1.0 each. A recipe's
            top-level ``reward_weights`` (TRL's ``GRPOConfig`` field) is passed here.
        transition_fn: ``fn(task=, history=, completions=, turn=) -> {agent: next prompt}``; without it the task
            is single-turn.
        done_fn: optional ``fn(task=, history=, completions=, turn=, team_reward=) -> bool`` for early termination.
        local_reward_fns: optional ``{agent: fn}`` per-agent rewards, called like ``reward_fns``; an agent named
            here takes this local reward instead of its ``reward_funcs`` sum.
        max_turns: the turn budget.
        required_columns: dataset columns the prompt functions read.
        completion_format: how ``reward_funcs`` get a response: ``"auto"`` (chat messages when the agent's prompt is
            a list of messages, the text when it is a string, as TRL decides by the dataset), ``"conversational"``
            or ``"standard"``.
        nonfinite_rewards: ``"error"`` (default) or ``"missing"``.
    """

    #: The recipe's top-level ``reward_weights`` is this environment's ``reward_weights`` (one per function).
    takes_reward_weights = True
    #: The recipe's top-level ``reward_funcs`` (TRL's name) is this argument (trl_multiagent/command/trl_names.py).
    trl_reward_funcs_argument = "reward_funcs"

    def __init__(
        self,
        agents: Sequence[str],
        prompt_fns: Mapping[str, Callable[[Mapping[str, Any]], Prompt] | str],
        reward_fns: Sequence[RewardFunc | str] | RewardFunc | str | None = None,
        reward_weights: Sequence[float] | None = None,
        transition_fn: Callable[..., Mapping[str, Prompt]] | str | None = None,
        done_fn: Callable[..., bool] | str | None = None,
        local_reward_fns: Mapping[str, RewardFunc | str] | None = None,
        max_turns: int = 1,
        required_columns: Sequence[str] = (),
        reward_funcs: Sequence[Callable | str] | Mapping[str, Sequence[Callable | str]] | Callable | str | None = None,
        completion_format: str = "auto",
        nonfinite_rewards: str = "error",
    ):
        self.agents = tuple(agents)
        if set(prompt_fns) != set(self.agents):
            raise ValueError(f"prompt_fns must have one function per agent {list(self.agents)}, got {list(prompt_fns)}")
        self.prompt_fns = {a: import_object(fn, "prompt_fn") for a, fn in prompt_fns.items()}
        if reward_fns is None:
            reward_fns = []
        elif isinstance(reward_fns, str) or not isinstance(reward_fns, Sequence):
            reward_fns = [reward_fns]
        self.reward_fns = [import_object(fn, "reward_fn") for fn in reward_fns]
        if isinstance(reward_funcs, str) or callable(reward_funcs):
            reward_funcs = [reward_funcs]
        self.agent_rewards = AgentRewards(reward_funcs, self.agents, nonfinite=nonfinite_rewards) \
            if reward_funcs else None
        if not self.reward_fns and self.agent_rewards is None:
            raise ValueError("FunctionEnvironment needs at least one reward function (reward_fns of the joint action, "
                             "or TRL-style reward_funcs scoring each agent)")
        if completion_format not in COMPLETION_FORMATS:
            raise ValueError(f"completion_format must be one of {COMPLETION_FORMATS}, got {completion_format!r}")
        self.completion_format, self.nonfinite_rewards = completion_format, nonfinite_rewards
        self.reward_names = [reward_name(fn) for fn in self.reward_fns] + \
            (self.agent_rewards.names if self.agent_rewards else [])
        self.reward_weights = reward_weights_of(self.reward_names, reward_weights)
        if self.agent_rewards is not None:
            own = self.reward_weights[len(self.reward_fns):]
            self.agent_rewards.weights = dict(zip(self.agent_rewards.names, own))
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be an integer >= 1, got {max_turns!r}")
        if max_turns > 1 and transition_fn is None:
            raise ValueError("A multi-turn FunctionEnvironment (max_turns > 1) needs a transition_fn")
        self.transition_fn = import_object(transition_fn, "transition_fn") if transition_fn is not None else None
        self.done_fn = import_object(done_fn, "done_fn") if done_fn is not None else None
        self.local_reward_fns = {a: import_object(fn, "local_reward_fn") for a, fn in (local_reward_fns or {}).items()}
        unknown = set(self.local_reward_fns) - set(self.agents)
        if unknown:
            raise ValueError(f"local_reward_fns names unknown agents {sorted(unknown)}")
        self.max_turns = max_turns
        self.required_columns = tuple(required_columns)
        self.task: Mapping[str, Any] = {}
        self.history: list[dict[str, str]] = []
        self.prompts: dict[str, Prompt] = {}

    def validate_dataset_columns(self, columns: Sequence[str], name: str = "dataset") -> None:  # instance-level
        missing = [c for c in self.required_columns if c not in columns]
        if missing:
            raise ValueError(f"The {name} lacks the column(s) {missing} that the prompt functions need.")

    def reset(self, task: Mapping[str, Any]) -> dict[str, Prompt]:
        self.task, self.history = dict(task), []
        self.prompts = {agent: self.prompt_fns[agent](self.task) for agent in self.agents}
        return dict(self.prompts)

    @property
    def alone_agents(self) -> tuple[str, ...]:
        """The agents that ``reward_funcs`` score on their own: each can be evaluated alone (``<agent>_alone``)."""
        return tuple(a for a in self.agents if self.agent_rewards is not None and self.agent_rewards.funcs.get(a))

    def score_alone(self, agent: str, response: str, task: Mapping[str, Any]) -> StepResult:
        """``response``, written by ``agent`` alone for ``task``, scored by that agent's ``reward_funcs`` as in a
        team step (the evaluation's ``<agent>_alone`` baseline, :mod:`trl_multiagent.evaluation.alone`)."""
        self.reset(task)
        prompt = self.prompts[agent]
        team, _, info = self.agent_rewards.score({agent: prompt}, {agent: as_completion(
            response, prompt, self.completion_format)}, {agent: response}, self.task)
        return StepResult(team_reward=0.0 if team is None else team, done=True, info=info)

    def step(self, joint_action: Mapping[str, str]) -> StepResult:
        turn = len(self.history)
        kwargs = {**self.task, "task": self.task, "completions": dict(joint_action), "turn": turn,
                  "history": list(self.history)}
        info: dict[str, float] = {}
        team: float | None = None
        joint_text = "; ".join(f"{a}: {t}" for a, t in joint_action.items())
        for fn, weight in zip(self.reward_fns, self.reward_weights):
            value = call_with_supported_kwargs(fn, **kwargs)
            value = checked_reward(None if value is None else float(value), fn, "(joint action)", joint_text,
                                   self.nonfinite_rewards)
            if value is not None:
                info[getattr(fn, "__name__", type(fn).__name__)] = value
                team = (team or 0.0) + weight * value
        local: dict[str, float] = {}
        if self.agent_rewards is not None:
            completions = {a: as_completion(t, self.prompts.get(a, ""), self.completion_format)
                           for a, t in joint_action.items()}
            own_team, local, own_info = self.agent_rewards.score(self.prompts, completions, joint_action, self.task)
            info.update(own_info)
            if own_team is not None:
                team = (team or 0.0) + own_team
        if team is None:
            warn_no_reward(self.task, turn)
            team = 0.0
        for agent, fn in self.local_reward_fns.items():
            value = call_with_supported_kwargs(fn, **kwargs)
            value = checked_reward(None if value is None else float(value), fn, agent, joint_action.get(agent, ""),
                                   self.nonfinite_rewards)
            if value is None:
                local.pop(agent, None)
            else:
                local[agent] = value
        self.history.append(dict(joint_action))
        done = turn + 1 >= self.max_turns
        if not done and self.done_fn is not None:
            done = bool(call_with_supported_kwargs(self.done_fn, **kwargs, team_reward=team))
        next_prompts = None
        if not done:
            next_prompts = dict(call_with_supported_kwargs(self.transition_fn, **kwargs))
            self.prompts.update(next_prompts)
        return StepResult(team_reward=team, next_prompts=next_prompts, done=done, local_rewards=local or None,
                          info=info)
