"""Rollout engines ("samplers"): how a team explores an environment and what experience it keeps.

A sampler turns a batch of tasks into :class:`Experience`: one :class:`Sample` per (agent, turn, sampled response)
with its token ids, the group it is compared within, and its reward, return and advantage. The advantages come from
the pure functions of :mod:`trl_multiagent.credit`.

:class:`JointTreeSampler` is MAGRPO's rollout (Algorithm 1): at every node of the tree each agent samples K
responses, which form joint actions (``aligned`` or ``cross``); each joint action gets the joint reward and, unless
the episode ends, becomes a child node. Generation is batched: at each turn, every agent answers all branch points
of all episodes in one ``generate`` call.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from transformers import GenerationConfig

from .agents import AgentPool, Generation
from .credit import grouped_advantages, joint_action_indices, mix_rewards, tree_returns
from .environments.base import Environment, Prompt


@dataclass
class Sample:
    """One agent's sampled response at one node: a training row for that agent's policy."""

    agent: str
    policy: str
    episode: int
    turn: int
    node: int
    generation: Generation
    joint_ids: list[int]
    group: tuple = ()
    reward: float = 0.0
    ret: float = 0.0
    advantage: float = 0.0
    old_logps: list[float] | None = None
    ref_logps: list[float] | None = None


@dataclass
class JointAction:
    """One joint action of the tree: which sample of each agent, its joint reward, and its continuations."""

    id: int
    node: int
    episode: int
    turn: int
    sample_index: tuple[int, ...]
    reward: float
    done: bool
    info: dict[str, float] = field(default_factory=dict)
    local_rewards: dict[str, float] | None = None
    children: list[int] = field(default_factory=list)
    ret: float = 0.0
    advantage: float = 0.0


@dataclass
class Experience:
    """The result of one rollout: training samples, the joint actions behind them, and summary statistics."""

    samples: list[Sample]
    joint_actions: list[JointAction]
    stats: dict[str, float]

    def samples_of(self, policy: str) -> list[Sample]:
        return [s for s in self.samples if s.policy == policy]


@dataclass
class _Node:
    id: int
    episode: int
    turn: int
    env: Environment
    prompts: Mapping[str, Prompt]
    parent_joint: int | None


class JointTreeSampler:
    """MAGRPO's tree rollout with joint groups (MAGRPO Algorithm 1; tree returns and Eq. 1 advantages).

    Args:
        num_samples: K, the responses each agent samples at every node.
        num_turns: H, the horizon; the tree stops earlier where the environment says ``done``.
        joint_mode: ``"aligned"`` (K joint actions per node) or ``"cross"`` (K**n).
        gamma: discount of later turns' rewards.
        scale_rewards: ``"group"``, ``"batch"`` or ``"none"`` (as ``GRPOConfig.scale_rewards``).
    """

    def __init__(self, num_samples: int, num_turns: int, joint_mode: str = "aligned", gamma: float = 1.0,
                 scale_rewards: str = "group"):
        if num_samples < 1 or num_turns < 1:
            raise ValueError("num_samples and num_turns must be at least 1")
        joint_action_indices(1, 1, joint_mode)  # validates the mode
        self.num_samples, self.num_turns, self.joint_mode = num_samples, num_turns, joint_mode
        self.gamma, self.scale_rewards = gamma, scale_rewards

    def rollout(self, pool: AgentPool, env_factory: Callable[[], Environment], tasks: Sequence[Mapping[str, Any]],
                generation_config: GenerationConfig) -> Experience:
        agents = list(pool.agent_names)
        frontier: list[_Node] = []
        for e, task in enumerate(tasks):
            env = env_factory()
            frontier.append(_Node(len(frontier), e, 0, env, env.reset(task), None))
        node_count = len(frontier)
        joints: list[JointAction] = []
        samples: list[Sample] = []
        num_generations = 0

        for turn in range(self.num_turns):
            if not frontier:
                break
            # One batched generate call per agent covers every branch point of this turn.
            gens: dict[str, list[list[Generation]]] = {}
            for agent in agents:
                gens[agent] = pool.generate(agent, [n.prompts[agent] for n in frontier], self.num_samples,
                                            generation_config)
                num_generations += len(frontier) * self.num_samples
            next_frontier: list[_Node] = []
            index_sets = joint_action_indices(len(agents), self.num_samples, self.joint_mode)
            outcomes = self._step_all(frontier, index_sets, agents, gens)
            for pos, node in enumerate(frontier):
                node_samples = {
                    (a, k): Sample(agent=a, policy=pool.policy_of(a), episode=node.episode, turn=turn, node=node.id,
                                   generation=gens[a][pos][k], joint_ids=[], group=(node.episode, node.id))
                    for a in agents for k in range(self.num_samples)
                }
                for idx in index_sets:
                    child_env, result = outcomes[(pos, idx)]
                    ja = JointAction(id=len(joints), node=node.id, episode=node.episode, turn=turn,
                                     sample_index=tuple(idx), reward=float(result.team_reward), done=result.done,
                                     info=dict(result.info), local_rewards=result.local_rewards)
                    joints.append(ja)
                    if node.parent_joint is not None:
                        joints[node.parent_joint].children.append(ja.id)
                    for a, k in zip(agents, idx):
                        node_samples[(a, k)].joint_ids.append(ja.id)
                    if not result.done and turn + 1 < self.num_turns:
                        if result.next_prompts is None or set(result.next_prompts) != set(agents):
                            raise ValueError(
                                f"{type(child_env).__name__}.step returned next prompts for "
                                f"{sorted(result.next_prompts or {})}, expected one per agent {sorted(agents)}"
                            )
                        next_frontier.append(_Node(node_count, node.episode, turn + 1, child_env,
                                                   result.next_prompts, ja.id))
                        node_count += 1
                samples.extend(node_samples.values())
            frontier = next_frontier

        returns = tree_returns([j.reward for j in joints], [j.children for j in joints], self.gamma)
        advantages, group_stats = grouped_advantages(returns, [j.node for j in joints], scale=self.scale_rewards)
        for j, r, a in zip(joints, returns, advantages):
            j.ret, j.advantage = r, a
        for s in samples:  # aligned: one joint action per sample; cross: the mean over those it appears in
            members = [joints[i] for i in s.joint_ids]
            s.reward = sum(j.reward for j in members) / len(members)
            s.ret = sum(j.ret for j in members) / len(members)
            s.advantage = sum(j.advantage for j in members) / len(members)
        stats = self._stats(agents, samples, joints, group_stats, num_generations, len(tasks))
        return Experience(samples, joints, stats)

    @staticmethod
    def _step_all(frontier, index_sets, agents, gens) -> dict:
        """Step a clone of every node's environment with every joint action of this turn.

        Environments that set ``concurrent_steps = True`` (their ``step`` waits on subprocesses, e.g. sandboxed
        tests) are stepped from a thread pool with one worker per CPU core; the others in order.
        """
        jobs = [(pos, idx) for pos in range(len(frontier)) for idx in index_sets]

        def run(job):
            pos, idx = job
            env = frontier[pos].env.clone()
            return env, env.step({a: gens[a][pos][k].text for a, k in zip(agents, idx)})

        if len(jobs) > 1 and getattr(frontier[0].env, "concurrent_steps", False):
            with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as executor:
                return dict(zip(jobs, executor.map(run, jobs)))
        return {job: run(job) for job in jobs}

    @staticmethod
    def _stats(agents, samples, joints, group_stats, num_generations, num_episodes) -> dict[str, float]:
        def mean(xs):
            xs = list(xs)
            return sum(xs) / len(xs) if xs else math.nan

        rewards = [j.reward for j in joints]
        roots = [j for j in joints if j.turn == 0]
        stats = {
            "reward": mean(rewards),
            "reward_std": (mean([(r - mean(rewards)) ** 2 for r in rewards]) ** 0.5) if rewards else math.nan,
            "return": mean(j.ret for j in roots),
            "frac_reward_zero_std": group_stats["frac_zero_std_groups"],
            "num_groups": group_stats["num_groups"],
            "num_generations": float(num_generations),
            "num_joint_actions": float(len(joints)),
            "episodes": float(num_episodes),
            "turns": mean(1 + max((j.turn for j in joints if j.episode == e), default=0) for e in range(num_episodes)),
        }
        by_turn: dict[int, list[float]] = defaultdict(list)
        infos: dict[str, list[float]] = defaultdict(list)
        for j in joints:
            by_turn[j.turn].append(j.reward)
            for k, v in j.info.items():
                infos[k].append(float(v))
        for t, rs in by_turn.items():
            stats[f"turn/{t}/reward"] = mean(rs)
        for k, vs in infos.items():
            stats[f"env/{k}"] = mean(vs)
        for a in agents:
            mine = [s for s in samples if s.agent == a]
            stats[f"agent/{a}/reward"] = mean(s.reward for s in mine)
            stats[f"agent/{a}/return"] = mean(s.ret for s in mine)
            stats[f"agent/{a}/completion_length"] = mean(len(s.generation.completion_ids) for s in mine)
            stats[f"agent/{a}/clipped_ratio"] = mean(float(s.generation.truncated) for s in mine)
        return stats


class AgentTurnSampler:
    """AT-GRPO's rollout: agent-and-turn groups, tree sampling with greedy execution (AT-GRPO Sec. 4.1, Alg. 1).

    In every environment instance e, at turn t, each agent i samples K candidates from the CURRENT state. Each
    candidate is scored with the mixed reward of Eq. 3, ``r = alpha * team + local_i``; the K candidates form the
    group keyed ``(e, t, i)`` (never two problems, turns or agents in one group), and the best-scoring candidate is
    executed (greedy; the first one on ties) before the rollout moves on.

    ``agent_order="sequential"``: agents act one after another within a turn; agent i+1 samples and is scored on
    the state after agent i's executed action. Each candidate is scored by stepping a clone of the environment with
    that agent's action alone, so the environment must accept partial joint actions
    (``supports_partial_actions = True``).
    ``agent_order="parallel"``: all agents sample from the same state; candidate k of every agent forms the k-th
    joint action, which scores all of them; the executed joint action combines every agent's best candidate.

    Args:
        num_samples: K candidates per agent per turn.
        num_turns: the turn budget (episodes end earlier when the environment says ``done``).
        agent_order: ``"sequential"`` or ``"parallel"``.
        alpha: weight of the team reward in Eq. 3.
        scale_rewards: ``"group"``, ``"batch"`` or ``"none"``.
        drop_zero_std_groups: leave groups whose candidates all tie out of the update (they are still counted).
    """

    def __init__(self, num_samples: int, num_turns: int, agent_order: str = "sequential", alpha: float = 1.0,
                 scale_rewards: str = "group", drop_zero_std_groups: bool = False):
        if agent_order not in ("sequential", "parallel"):
            raise ValueError(f"agent_order must be 'sequential' or 'parallel', got {agent_order!r}")
        if num_samples < 1 or num_turns < 1:
            raise ValueError("num_samples and num_turns must be at least 1")
        self.num_samples, self.num_turns, self.agent_order = num_samples, num_turns, agent_order
        self.alpha, self.scale_rewards, self.drop_zero_std_groups = alpha, scale_rewards, drop_zero_std_groups

    def rollout(self, pool: AgentPool, env_factory: Callable[[], Environment], tasks: Sequence[Mapping[str, Any]],
                generation_config: GenerationConfig) -> Experience:
        envs = [env_factory() for _ in tasks]
        agents = list(envs[0].agents) if envs else list(pool.agent_names)
        if self.agent_order == "sequential" and envs and not getattr(envs[0], "supports_partial_actions", False):
            raise ValueError(f"{type(envs[0]).__name__} does not accept partial joint actions "
                             "(supports_partial_actions); use agent_order='parallel'")
        prompts = [env.reset(task) for env, task in zip(envs, tasks)]
        active = list(range(len(envs)))
        samples: list[Sample] = []
        executed: list[JointAction] = []
        num_generations = 0
        stages = [[a] for a in agents] if self.agent_order == "sequential" else [agents]
        for turn in range(self.num_turns):
            for stage in stages:
                if not active:
                    break
                gens = {a: pool.generate(a, [prompts[e][a] for e in active], self.num_samples, generation_config)
                        for a in stage}
                num_generations += len(stage) * len(active) * self.num_samples
                finished = []
                for pos, e in enumerate(active):
                    candidates = self._score(envs[e], stage, {a: gens[a][pos] for a in stage})
                    best: dict[str, int] = {}
                    for a in stage:
                        rewards = [c[2][a] for c in candidates]
                        best[a] = max(range(len(rewards)), key=rewards.__getitem__)
                        for k, g in enumerate(gens[a][pos]):
                            samples.append(Sample(agent=a, policy=pool.policy_of(a), episode=e, turn=turn, node=e,
                                                  generation=g, joint_ids=[], group=(e, turn, a),
                                                  reward=rewards[k], ret=rewards[k]))
                    env, result = self._execute(envs[e], stage, candidates, best, {a: gens[a][pos] for a in stage})
                    envs[e] = env
                    executed.append(JointAction(id=len(executed), node=e, episode=e, turn=turn,
                                                sample_index=tuple(best[a] for a in stage), reward=result.team_reward,
                                                done=result.done, info=dict(result.info),
                                                local_rewards=result.local_rewards))
                    if result.done:
                        finished.append(e)
                    else:
                        if result.next_prompts is None or set(result.next_prompts) != set(agents):
                            raise ValueError(f"{type(env).__name__}.step must return next prompts for {agents} "
                                             "when the episode goes on")
                        prompts[e] = result.next_prompts
                active = [e for e in active if e not in finished]
        advantages, group_stats = grouped_advantages([s.reward for s in samples], [s.group for s in samples],
                                                     scale=self.scale_rewards)
        for s, a in zip(samples, advantages):
            s.advantage = a
        kept = samples
        if self.drop_zero_std_groups:
            spread: dict[tuple, list[float]] = defaultdict(list)
            for s in samples:
                spread[s.group].append(s.reward)
            kept = [s for s in samples if max(spread[s.group]) - min(spread[s.group]) > 1e-12]
        stats = JointTreeSampler._stats(agents, samples, executed, group_stats, num_generations, len(tasks))
        stats["reward"] = sum(s.reward for s in samples) / len(samples) if samples else math.nan
        stats["team_reward"] = sum(j.reward for j in executed) / len(executed) if executed else math.nan
        stats["dropped_samples"] = float(len(samples) - len(kept))
        return Experience(kept, executed, stats)

    def _score(self, env: Environment, stage: list[str], gens: Mapping[str, list[Generation]]):
        """Step a clone per candidate (sequential) or per aligned joint candidate (parallel); mixed rewards."""
        out = []
        for k in range(self.num_samples):
            clone = env.clone()
            result = clone.step({a: gens[a][k].text for a in stage})
            local = result.local_rewards or {}
            mixed = {a: mix_rewards(result.team_reward, local.get(a, 0.0), self.alpha) for a in stage}
            out.append((clone, result, mixed))
        return out

    @staticmethod
    def _execute(env, stage, candidates, best, gens):
        """Carry out the greedy choice: reuse the scored clone when one candidate index is best for every agent."""
        chosen = {best[a] for a in stage}
        if len(chosen) == 1:
            clone, result, _ = candidates[chosen.pop()]
            return clone, result
        clone = env.clone()
        return clone, clone.step({a: gens[a][best[a]].text for a in stage})
