"""MAGRPO's rollout: a tree of joint actions with joint groups (MAGRPO Algorithm 1; tree returns and Eq. 1).

At every node of the tree each agent samples K responses, which form joint actions (``aligned`` or ``cross``); each
joint action gets the joint reward and, unless the episode ends, becomes a child node. Generation is batched: at each
turn, all agents answer all branch points of all episodes in one team-level call (``AgentPool.generate_many``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from transformers import GenerationConfig

from ..agents import AgentPool, Generation
from ..credit import cross_sample_credit, grouped_advantages, joint_action_indices, tree_returns
from ..environments.base import Environment
from ..generation.requests import Prompt
from .experience import Experience, JointAction, Sample, rollout_stats


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
        slots: list[tuple[Sample, int, int]] = []  # (sample, agent index, sample index k at its node)
        num_generations = 0

        for turn in range(self.num_turns):
            if not frontier:
                break
            # One team-level generation covers every agent at every branch point of this turn.
            gens: dict[str, list[list[Generation]]] = pool.generate_by_agent(
                {agent: [n.prompts[agent] for n in frontier] for agent in agents}, self.num_samples,
                generation_config)
            num_generations += len(agents) * len(frontier) * self.num_samples
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
                slots.extend((sample, agents.index(a), k) for (a, k), sample in node_samples.items())
            frontier = next_frontier

        returns = tree_returns([j.reward for j in joints], [j.children for j in joints], self.gamma)
        advantages, group_stats = grouped_advantages(returns, [j.node for j in joints], scale=self.scale_rewards)
        for j, r, a in zip(joints, returns, advantages):
            j.ret, j.advantage = r, a
        # each sample's credit: aligned, its one joint action's; cross, the mean over the K**(n-1) it appears in
        by_node: dict[int, list[JointAction]] = {}
        for j in joints:
            by_node.setdefault(j.node, []).append(j)
        for s, i, k in slots:
            node = by_node[s.node]
            indices = [j.sample_index for j in node]
            s.reward, s.ret, s.advantage = (cross_sample_credit([getattr(j, attr) for j in node], indices, i,
                                                                self.num_samples)[k]
                                            for attr in ("reward", "ret", "advantage"))
        stats = rollout_stats(agents, samples, joints, group_stats, num_generations, len(tasks))
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
