"""MAGRPO's rollout: a tree of joint actions (MAGRPO Algorithm 1).

At every node of the tree each agent samples K responses, which form joint actions (``aligned`` or ``cross``); each
joint action gets the joint reward and, unless the episode ends, becomes a child node. Generation is batched: at each
turn, all agents answer all branch points of all episodes in one team-level call (``AgentPool.generate_many``).
The returns along the tree, Eq. 1 within each node's joint actions and each sample's share of its joint actions are
the trainer's credit (:func:`~trl_multiagent.trainers.magrpo.tree_credit`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import GenerationConfig

from trl_multiagent.credit.magrpo import joint_action_indices
from trl_multiagent.environments.base import Environment
from trl_multiagent.environments.stepping import map_steps, reset_env, step_env
from trl_multiagent.generation.requests import Prompt
from trl_multiagent.rollout.experience import Experience, JointAction, Sample, rollout_stats
from trl_multiagent.team.pool import AgentPool, Generation


@dataclass
class _Node:
    id: int
    episode: int
    turn: int
    env: Environment
    prompts: Mapping[str, Prompt]
    parent_joint: int | None


class JointTreeSampler:
    """MAGRPO's tree rollout (MAGRPO Algorithm 1): joint actions with their joint rewards, each sample's node (its
    group) and joint actions, each joint action's children; no returns or advantages (the trainer's credit).

    Args:
        num_samples: K, the responses each agent samples at every node.
        num_turns: H, the horizon; the tree stops earlier where the environment says ``done``.
        joint_mode: ``"aligned"`` (K joint actions per node) or ``"cross"`` (K**n).
    """

    def __init__(self, num_samples: int, num_turns: int, joint_mode: str = "aligned"):
        if num_samples < 1 or num_turns < 1:
            raise ValueError("num_samples and num_turns must be at least 1")
        joint_action_indices(1, 1, joint_mode)  # validates the mode
        self.num_samples, self.num_turns, self.joint_mode = num_samples, num_turns, joint_mode

    def rollout(self, pool: AgentPool, env_factory: Callable[[], Environment], tasks: Sequence[Mapping[str, Any]],
                generation_config: GenerationConfig) -> Experience:
        agents = list(pool.agent_names)
        frontier: list[_Node] = []
        for e, task in enumerate(tasks):
            env = env_factory()
            frontier.append(_Node(len(frontier), e, 0, env, reset_env(env, task), None))
        node_count = len(frontier)
        reward_names = getattr(frontier[0].env, "reward_names", ()) if frontier else ()
        joints: list[JointAction] = []
        samples: list[Sample] = []
        generated_samples = 0

        for turn in range(self.num_turns):
            if not frontier:
                break
            # One team-level generation covers every agent at every branch point of this turn.
            gens: dict[str, list[list[Generation]]] = pool.generate_by_agent(
                {agent: [n.prompts[agent] for n in frontier] for agent in agents}, self.num_samples,
                generation_config)
            generated_samples += len(agents) * len(frontier) * self.num_samples
            next_frontier: list[_Node] = []
            index_sets = joint_action_indices(len(agents), self.num_samples, self.joint_mode)
            outcomes = self._step_all(frontier, index_sets, agents, gens, tasks, turn)
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
        stats = rollout_stats(agents, samples, joints, generated_samples, len(tasks), reward_names=reward_names)
        return Experience(samples, joints, stats, agents)

    @staticmethod
    def _step_all(frontier, index_sets, agents, gens, tasks, turn) -> dict:
        """Step a clone of every node's environment with every joint action of this turn.

        Environments that set ``concurrent_steps = True`` (their ``step`` waits on subprocesses, e.g. sandboxed
        tests) are stepped from a thread pool with one worker per CPU core; the others in order
        (:func:`~trl_multiagent.environments.stepping.map_steps`).
        """
        jobs = [(pos, idx) for pos in range(len(frontier)) for idx in index_sets]

        def run(job):
            pos, idx = job
            env = frontier[pos].env.clone()
            return env, step_env(env, {a: gens[a][pos][k].text for a, k in zip(agents, idx)},
                                 tasks[frontier[pos].episode], turn)

        return dict(zip(jobs, map_steps(run, jobs, frontier[0].env)))
