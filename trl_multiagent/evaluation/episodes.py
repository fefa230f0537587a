"""Team episodes on held-out tasks of any :class:`~trl_multiagent.environments.Environment`.

:func:`play_episodes` is a program (see :mod:`.core`): ``num_samples`` independent episodes per task, all of them
advancing together, so that each round asks for every live episode's responses at once. ``agent_order="parallel"``:
all agents answer the same state and the environment steps with the joint action; ``"sequential"`` (AT-GRPO on
environments that accept partial actions): agents act one after another within a turn, each on the state after the
previous agent's action.

:class:`EpisodeEvaluator` scores the episodes per task and sample:

* ``return``: the sum of the team rewards of the executed steps;
* ``success``: 1 when an executed step reports ``info["success"] >= 1`` (environments with a success checker: the
  AT-GRPO games, math, coding), else 0;
* ``final/<name>``: every ``info`` value of the episode's last step (final-state metrics, e.g. StrBuild's IoU);
* ``turns``: the turns played.

Environments may name inference-time baselines (``episode_baselines``: name -> the agents that act): each plays ONE
turn of the bases (adapters off) with only those agents acting, e.g. the math team's ``no_exchange`` (both agents
answer once, without seeing each other's answer). An environment that scores one agent's answer alone
(``score_alone``, :mod:`.alone`) gets a baseline per agent, ``<agent>_alone`` (one turn of its base, scored as the
team's answer; the math team's ``reasoner_alone``, once called ``single``, and ``tool_alone``), and
``<agent>_alone_turns`` for the agents that can play a whole episode alone (``alone_multi_turn``). Their records
are the team's (``return``, ``success``, ``final/<key>``, ``turns``), so every baseline is compared on the same metric.

Every response is kept with its task, sample, turn, agent and the team reward of its step (:func:`episode_texts`)
and written to ``eval_texts_<stage>.jsonl``. Its details hold the means of every turn's team reward and ``info``
values, and ``eval_per_task.jsonl`` the same turn by turn for every task (:func:`per_turn_by_task`). The headline
metric is ``success`` where the environment reports one, else ``return``. Decoding is greedy
unless the recipe says otherwise (AT-GRPO validates greedily; CoLLM's agents act greedily after training).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trl_multiagent.environments.base import Environment, StepResult
from trl_multiagent.environments.stepping import map_steps, reset_env, step_all
from trl_multiagent.evaluation.alone import alone_methods, score_alone
from trl_multiagent.evaluation.core import TEAM, Evaluator, MethodOutput, Program
from trl_multiagent.metrics.stats import mean
from trl_multiagent.team.pool import Generation, GenerationRequest


@dataclass
class PlayedEpisode:
    """One episode as played: every executed step, the responses, and the environment in its final state."""

    task: int
    sample: int
    env: Environment
    steps: list[StepResult] = field(default_factory=list)
    turns_of_steps: list[int] = field(default_factory=list)
    actions: list[dict[str, str]] = field(default_factory=list)
    completion_tokens: dict[str, list[int]] = field(default_factory=dict)

    @property
    def turns_played(self) -> int:
        return 1 + self.turns_of_steps[-1] if self.turns_of_steps else 0


def play_episodes(env_factory: Callable[[], Environment], tasks: Sequence[Mapping[str, Any]], num_samples: int,
                  num_turns: int, use_adapter: bool = True, agent_order: str = "parallel",
                  acting: Sequence[str] | None = None
                  ) -> Generator[list[GenerationRequest], list[list[Generation]], list[PlayedEpisode]]:
    """Play ``num_samples`` episodes per task for up to ``num_turns`` turns. A sub-program (``yield from`` it):
    yields each round's requests and returns the :class:`PlayedEpisode` list in task-major order. ``acting``: the
    agents that act (default: all); a subset needs an environment that accepts partial joint actions."""
    if agent_order not in ("parallel", "sequential"):
        raise ValueError(f"agent_order must be 'parallel' or 'sequential', got {agent_order!r}")
    episodes = [PlayedEpisode(t, s, env_factory()) for t in range(len(tasks)) for s in range(num_samples)]
    if not episodes:
        return []
    agents = list(episodes[0].env.agents)
    acting = agents if acting is None else list(acting)
    partial = agent_order == "sequential" or set(acting) != set(agents)
    if partial and not getattr(episodes[0].env, "supports_partial_actions", False):
        raise ValueError(f"{type(episodes[0].env).__name__} does not accept partial joint actions "
                         "(supports_partial_actions); evaluate with agent_order='parallel' and every agent acting")
    if not acting or not set(acting) <= set(agents):
        raise ValueError(f"acting agents {acting} must be some of the environment's agents {agents}")
    prompts = [dict(reset_env(ep.env, tasks[ep.task])) for ep in episodes]
    for ep, p in zip(episodes, prompts):
        if set(p) != set(agents):
            raise ValueError(f"{type(ep.env).__name__}.reset returned prompts for {sorted(p)}, expected {agents}")
    stages = [[a] for a in acting] if agent_order == "sequential" else [acting]
    live = list(range(len(episodes)))
    for turn in range(num_turns):
        for stage in stages:
            if not live:
                break
            # identical prompts of one agent (the samples of a task at its first turn) become one request
            slots: dict[tuple[str, str], list[int]] = {}
            for e in live:
                for a in stage:
                    slots.setdefault((a, _prompt_key(prompts[e][a])), []).append(e)
            keys = list(slots)
            requests = [GenerationRequest(a, prompts[slots[(a, key)][0]][a], len(slots[(a, key)]), use_adapter)
                        for a, key in keys]
            generations = yield requests
            chosen: dict[tuple[int, str], Generation] = {}
            for (a, key), gens in zip(keys, generations):
                for e, gen in zip(slots[(a, key)], gens):
                    chosen[(e, a)] = gen
            actions = []
            for e in live:
                action = {}
                for a in stage:
                    gen = chosen[(e, a)]
                    action[a] = gen.text
                    episodes[e].completion_tokens.setdefault(a, []).append(len(gen.completion_ids))
                actions.append(action)
            results = step_all([episodes[e].env for e in live], actions, [tasks[episodes[e].task] for e in live],
                               [turn] * len(live))
            still = []
            for e, action, result in zip(live, actions, results):
                ep = episodes[e]
                ep.steps.append(result)
                ep.turns_of_steps.append(turn)
                ep.actions.append(action)
                if result.done:
                    continue
                if result.next_prompts is None or set(result.next_prompts) != set(agents):
                    raise ValueError(f"{type(ep.env).__name__}.step must return next prompts for {agents} while "
                                     "the episode goes on")
                prompts[e] = dict(result.next_prompts)
                still.append(e)
            live = still
    return episodes


def _prompt_key(prompt) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


def by_task(episodes: Sequence[PlayedEpisode], num_tasks: int) -> list[list[PlayedEpisode]]:
    grouped: list[list[PlayedEpisode]] = [[] for _ in range(num_tasks)]
    for ep in episodes:
        grouped[ep.task].append(ep)
    return grouped


def episode_record(ep: PlayedEpisode) -> dict[str, float]:
    """The per-sample values of one episode (see the module docstring)."""
    record = {"return": float(sum(s.team_reward for s in ep.steps)), "turns": float(ep.turns_played)}
    if any("success" in s.info for s in ep.steps):
        record["success"] = float(any(float(s.info.get("success", 0.0)) >= 1.0 for s in ep.steps))
    if ep.steps:
        for key, value in ep.steps[-1].info.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                record[f"final/{key}"] = float(value)
    return record


def episode_texts(episodes: Sequence[PlayedEpisode]) -> list[dict[str, Any]]:
    """Every response of the episodes, one row each, in the order played: ``task`` (its index), ``sample``, ``turn``,
    ``agent``, ``text``, ``reward`` (the team reward of the step that executed it), ``local_reward`` (where the
    environment gave the agent one) and ``done`` (the step ended the episode)."""
    rows = []
    for ep in sorted(episodes, key=lambda e: (e.task, e.sample)):
        for action, result, turn in zip(ep.actions, ep.steps, ep.turns_of_steps):
            for agent, text in action.items():
                row = {"task": ep.task, "sample": ep.sample, "turn": turn, "agent": agent, "text": text,
                       "reward": float(result.team_reward)}
                if result.local_rewards and agent in result.local_rewards:
                    row["local_reward"] = float(result.local_rewards[agent])
                row["done"] = bool(result.done)
                rows.append(row)
    return rows


def per_turn_means(episodes: Sequence[PlayedEpisode]) -> dict[str, float]:
    """Means over the episodes that reached each turn: its team reward and ``info`` values."""
    out: dict[str, float] = {}
    last_turn = max((ep.turns_played for ep in episodes), default=0)
    for t in range(last_turn):
        steps = [s for ep in episodes for s, turn in zip(ep.steps, ep.turns_of_steps) if turn == t]
        out[f"turn{t + 1}/team_reward"] = mean([s.team_reward for s in steps])
        for key in dict.fromkeys(k for s in steps for k in s.info):
            out[f"turn{t + 1}/{key}"] = mean([float(s.info[key]) for s in steps if key in s.info])
    return out


def per_turn_by_task(episodes: Sequence[PlayedEpisode], num_tasks: int) -> list[dict[str, float]]:
    """:func:`per_turn_means` of every task's episodes (its samples), task by task: e.g. ``turn1/team_correct`` and
    ``turn2/team_correct`` show, per task, whether the exchange of the second turn changed the answer."""
    return [per_turn_means(eps) for eps in by_task(episodes, num_tasks)]


def token_means(episodes: Sequence[PlayedEpisode]) -> dict[str, float]:
    agents = dict.fromkeys(a for ep in episodes for a in ep.completion_tokens)
    return {f"tokens/{a}": mean([n for ep in episodes for n in ep.completion_tokens.get(a, [])]) for a in agents}


class EpisodeEvaluator(Evaluator):
    """Episodes of the team on held-out tasks of a turn-based environment (see the module docstring).

    Args:
        env_factory: a zero-argument factory of the environment (the trainer's).
        num_turns: the turn budget of an episode.
        agent_order: ``"parallel"`` or ``"sequential"`` (see :func:`play_episodes`).
    """

    name = "episodes"
    metrics_preference = ("success", "return")

    def __init__(self, env_factory: Callable[[], Environment], num_turns: int, agent_order: str = "parallel"):
        if num_turns < 1:
            raise ValueError(f"num_turns must be at least 1, got {num_turns}")
        self.env_factory, self.num_turns, self.agent_order = env_factory, num_turns, agent_order
        env = env_factory()
        self.num_agents = len(env.agents)
        #: baseline name -> the agents that act in its one turn (the environment's ``episode_baselines``)
        self.baseline_agents = {name: tuple(agents) for name, agents in
                                dict(getattr(env, "episode_baselines", None) or {}).items()}
        self.alone = alone_methods(env, num_turns)
        clash = sorted(set(self.alone) & set(self.baseline_agents))
        if clash:
            raise ValueError(f"{type(env).__name__}.episode_baselines names {clash}, the names of its agents-alone "
                             "baselines (score_alone); rename them")
        self.aliases = {k: v for k, v in dict(getattr(env, "method_aliases", None) or {}).items()
                        if v in self.alone or v in self.baseline_agents}
        self.baselines = (*self.alone, *self.baseline_agents)

    def expected_sequences(self, method: str, num_tasks: int, num_samples: int) -> int:
        if method in self.baseline_agents:
            return num_tasks * num_samples * len(self.baseline_agents[method])
        if method in self.alone:
            return num_tasks * num_samples * self.alone[method][1]
        return num_tasks * num_samples * self.num_agents * self.num_turns

    def program(self, method: str, tasks: Sequence[Mapping[str, Any]], num_samples: int) -> Program:
        if method in self.alone:  # one agent's base alone: one turn scored by score_alone, or an episode
            agent, turns = self.alone[method]
            if turns == 1:
                episodes = yield from play_alone(self.env_factory, agent, tasks, num_samples)
            else:
                episodes = yield from play_episodes(self.env_factory, tasks, num_samples, turns, use_adapter=False,
                                                    acting=(agent,))
            records = [[episode_record(ep) for ep in eps] for eps in by_task(episodes, len(tasks))]
            details = {"team_reward": mean([s.team_reward for ep in episodes for s in ep.steps])}
            return MethodOutput(records, {**details, **token_means(episodes)}, episode_texts(episodes),
                                per_turn_by_task(episodes, len(tasks)) if turns > 1 else [])
        if method in self.baseline_agents:  # one turn of the bases (adapters off), the named agents acting
            episodes = yield from play_episodes(self.env_factory, tasks, num_samples, 1, use_adapter=False,
                                                agent_order=self.agent_order, acting=self.baseline_agents[method])
            records = [[episode_record(ep) for ep in eps] for eps in by_task(episodes, len(tasks))]
            return MethodOutput(records, {"team_reward": mean([s.team_reward for ep in episodes for s in ep.steps])})
        if method != TEAM:
            raise ValueError(f"the {self.name} evaluation has no method {method!r}")
        episodes = yield from play_episodes(self.env_factory, tasks, num_samples, self.num_turns,
                                            agent_order=self.agent_order)
        records = [[episode_record(ep) for ep in eps] for eps in by_task(episodes, len(tasks))]
        details = {"team_reward": mean([s.team_reward for ep in episodes for s in ep.steps])}
        return MethodOutput(records, {**details, **per_turn_means(episodes), **token_means(episodes)},
                            episode_texts(episodes), per_turn_by_task(episodes, len(tasks)))


def success_rate(pool, env_factory: Callable[[], Environment], tasks: Sequence[Mapping[str, Any]], num_turns: int,
                 max_new_tokens: int, agent_order: str = "sequential") -> dict[str, Any]:
    """Greedy team episodes, one per task, as AT-GRPO validates: the fraction that ends in ``success``, with its
    95% bootstrap interval over tasks, and the mean team reward per executed step."""
    from transformers import GenerationConfig

    from trl_multiagent.evaluation.core import evaluate_team
    from trl_multiagent.metrics.stats import bootstrap_interval

    if agent_order == "sequential" and not getattr(env_factory(), "supports_partial_actions", False):
        agent_order = "parallel"
    evaluator = EpisodeEvaluator(env_factory, num_turns, agent_order)
    greedy = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False)
    result = evaluate_team(pool, evaluator, tasks, generation_config=greedy).methods[TEAM]
    per_task = result.per_task("success") if "success" in result.samples else [0.0] * len(tasks)
    return {"success_rate": mean(per_task), "ci95": bootstrap_interval(per_task), "episodes": float(len(tasks)),
            "team_reward": result.details["team_reward"]}


def play_alone(env_factory: Callable[[], Environment], agent: str, tasks: Sequence[Mapping[str, Any]],
               num_samples: int) -> Generator[list[GenerationRequest], list[list[Generation]], list]:
    """``agent`` alone, one turn, ``num_samples`` times per task: a sub-program (``yield from`` it) that returns one
    :class:`PlayedEpisode` per task and sample (task-major), each of one step,
    the ``score_alone`` of the response. The prompt is the agent's first prompt of the team's episode; a task's
    samples are one request of the bases (adapters off)."""
    if not tasks:
        return []
    prompts = [reset_env(env_factory(), task)[agent] for task in tasks]
    generations = yield [GenerationRequest(agent, prompt, num_samples, use_adapter=False) for prompt in prompts]
    jobs = [(t, s, gen) for t, gens in enumerate(generations) for s, gen in enumerate(gens[:num_samples])]
    probe = env_factory()

    def scored(job) -> Any:
        t, s, gen = job
        env = env_factory()
        result = score_alone(env, agent, gen.text, tasks[t])
        return PlayedEpisode(t, s, env, [result], [0], [{agent: gen.text}], {agent: [len(gen.completion_ids)]})

    return map_steps(scored, jobs, probe)
