"""MHGPO's rollout over a pipeline of agents: Independent Sampling, Fork-on-first and Round-robin.

Paper: "Heterogeneous Group-Based Reinforcement Learning for LLM-based Multi-Agent Systems" (MHGPO), Sec.
"Multi-Agent Group Rollout Sampling", Algorithms 2-5, Figures 3-4.

All three strategies are built from one operation, ``fork_on(q, G, A_j)`` (Algorithm 2): run the pipeline with one
output per node up to agent ``A_j``, sample G outputs at ``A_j``, and finish each of the G branches with one output
per node. In a DAG, the nodes with G copies are ``A_j`` and everything downstream of it; every other node runs once
and is shared by all branches.

- ``independent`` (IS, Algorithm 4): for every agent k, ``fork_on(q, G, A_k)``; keep only agent k's G samples, a
  homogeneous group keyed ``(question, k)``. n*G training samples per question, more generations.
- ``fork_on_first`` (FoF, Algorithm 3): one ``fork_on(q, G, entry agent)``; every agent's G samples of a question form
  one group keyed ``(question, agent)``: homogeneous (same input) at the entry agent, heterogeneous (different
  inputs) downstream.
- ``round_robin`` (RR, Algorithm 5): per question, the fork agent j is drawn with probability ``p_j`` (by default
  the paper's (0.7, 0.1, 0.2), :func:`default_fork_probabilities`); agents at and after j are grouped as in FoF; an
  agent before the fork (or otherwise not downstream of it) has one sample per question, grouped ACROSS the batch
  with the other questions whose fork agent is also j, keyed ``("fork", j, agent)`` (the paper's main text); a group
  left with one member (the only question of the batch forking at j) is then regrouped as Algorithm 5 does: all such
  singletons shuffled and cut into groups of G, the ``|singletons| mod G`` left over out of training
  (:func:`~trl_multiagent.credit.mhgpo.regroup_singletons`; ``regroup_singletons=False`` keeps them, advantage 0).

Generation is batched per agent: the nodes of one agent, over all questions, fork instances and branches, go to the
pool in ONE ``generate`` call; tools run on each node's inputs. The rollout returns the final answers' rewards, each
kept output's agent-specific (format) reward and the links of the DAG (:class:`PipelineExperience`); carrying the
rewards backward (Eq. 4) and normalising them in the groups above (Eq. 5) is the trainer's credit
(:func:`~trl_multiagent.trainers.mhgpo.pipeline_credit`, with :mod:`trl_multiagent.credit.mhgpo`).
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import GenerationConfig

from trl_multiagent.credit.mhgpo import regroup_singletons as regroup
from trl_multiagent.environments.pipeline import PipelineEnvironment, PipelineGraph
from trl_multiagent.generation.requests import Prompt
from trl_multiagent.metrics.similarity import intra_group_similarity
from trl_multiagent.rollout.experience import Experience, JointAction, Sample, rollout_stats
from trl_multiagent.team.pool import Generation

#: The group rollout strategies of MHGPO.
STRATEGIES = ("independent", "fork_on_first", "round_robin")


@dataclass
class PipelineNode:
    """One execution of an agent or a tool in a rollout.

    Attributes:
        id: index in the rollout (inputs always have smaller ids).
        question: index of the task in the batch.
        instance: index of the ``fork_on`` call this node belongs to (IS makes one per agent and question).
        fork: the fork agent of that call.
        name: the agent or tool.
        copy: the branch (0..G-1) for forked nodes, 0 for nodes shared by all branches.
        forked: the node is the fork agent or downstream of it (G copies per call).
        inputs: the node ids of its direct predecessors, by name.
        kept: an agent node that becomes a training sample (IS keeps only the fork agent's).
        group: its group identifier ``m`` (Eq. 5), for kept nodes.
    """

    id: int
    question: int
    instance: int
    fork: str
    name: str
    copy: int
    forked: bool
    inputs: dict[str, int]
    is_agent: bool
    kept: bool = False
    group: tuple = ()
    prompt: Prompt | None = None
    generation: Generation | None = None
    output: str = ""
    consumers: list[int] = field(default_factory=list)


@dataclass
class Trajectory:
    """One path from the question to a final answer: branch ``copy`` of one ``fork_on`` call."""

    question: int
    instance: int
    copy: int
    sink: int
    node_ids: dict[str, int]
    reward: float = 0.0
    info: dict[str, float] = field(default_factory=dict)


@dataclass
class PipelineRollout:
    """The executed plan: every node, every trajectory, the generation count."""

    nodes: list[PipelineNode]
    trajectories: list[Trajectory]
    forks: list[str]
    generated_samples: int = 0
    num_tool_calls: int = 0

    def outputs(self, trajectory: Trajectory) -> dict[str, str]:
        return {name: self.nodes[i].output for name, i in trajectory.node_ids.items()}


@dataclass
class PipelineSample(Sample):
    """A kept agent output, with its agent-specific reward ``R_spe`` (MHGPO Eq. 4, second line: a format reward)."""

    format_reward: float = 0.0


@dataclass
class PipelineExperience(Experience):
    """:class:`Experience` of a pipeline rollout, with the links MHGPO Eq. 4 carries the rewards back along.

    Attributes:
        consumers: every agent output (by node id) -> the agent outputs of its direct successors that consumed it
            (tools looked through; :meth:`PipelineSampler.agent_consumers`).
        terminal_rewards: the final answers' outputs (by node id) -> the reward of the system's answer.
    """

    consumers: dict[int, list[int]] = field(default_factory=dict)
    terminal_rewards: dict[int, float] = field(default_factory=dict)


#: MHGPO's Round-robin fork probabilities for its three-agent pipeline (Rewriter, Reranker, Answerer; Sec.
#: "Experiments & Discussion": "the round-robin probabilities for each agent are set to (0.7, 0.1, 0.2)").
PAPER_FORK_PROBABILITIES = (0.7, 0.1, 0.2)


def default_fork_probabilities(num_agents: int) -> list[float]:
    """Round-robin's default ``p_j`` for a pipeline of ``num_agents`` agents in topological order (MHGPO's RR, Sec.
    "Round-robin (RR)"; the values of its experiments).

    The paper gives (0.7, 0.1, 0.2) for its three agents: the entry agent (Rewriter), the agent in between (Reranker)
    and the final agent (Answerer). Three agents get exactly those. Another length keeps the three shares by
    position: 0.7 at the entry agent (most questions fork there, as in Fork-on-first), 0.2 at the final agent, and
    the 0.1 spread evenly over the agents in between (four agents: 0.7, 0.05, 0.05, 0.2). Two agents have no agent in
    between, and its 0.1 goes to the final agent (0.7, 0.3); one agent forks always (1.0).
    """
    if num_agents < 1:
        raise ValueError(f"a pipeline has at least one agent, got {num_agents}")
    if num_agents == 1:
        return [1.0]
    if num_agents == 2:
        return [PAPER_FORK_PROBABILITIES[0], PAPER_FORK_PROBABILITIES[1] + PAPER_FORK_PROBABILITIES[2]]
    middle = PAPER_FORK_PROBABILITIES[1] / (num_agents - 2)
    return [PAPER_FORK_PROBABILITIES[0], *[middle] * (num_agents - 2), PAPER_FORK_PROBABILITIES[2]]


def choose_fork_agents(num_questions: int, agents: Sequence[str], probabilities: Sequence[float],
                       rng: random.Random | None = None) -> list[str]:
    """Round-robin's fork agent of each question, drawn from ``Categorical(p_1, ..., p_n)`` (MHGPO Algorithm 5)."""
    if len(agents) != len(probabilities):
        raise ValueError(f"{len(probabilities)} fork probabilities for {len(agents)} agents {list(agents)}")
    draw = rng if rng is not None else random
    return list(draw.choices(list(agents), weights=list(probabilities), k=num_questions))


class PipelineSampler:
    """MHGPO's group rollout over a :class:`~trl_multiagent.environments.pipeline.PipelineEnvironment`.

    Args:
        num_samples: G, the outputs sampled at the fork agent (and so the branches of a ``fork_on`` call).
        strategy: ``"independent"``, ``"fork_on_first"`` or ``"round_robin"``.
        fork_probabilities: Round-robin's ``p_j`` per agent, by agent name (``None``: the paper's,
            :func:`default_fork_probabilities` over the agents in topological order).
        rng: random source of Round-robin's fork agents and of its regrouping (default: the ``random`` module,
            seeded by the trainer).
        regroup_singletons: Round-robin only: regroup the samples whose group has one member as Algorithm 5 does
            (:func:`~trl_multiagent.credit.mhgpo.regroup_singletons`); ``False`` keeps them as groups of one.
    """

    def __init__(self, num_samples: int, strategy: str = "fork_on_first",
                 fork_probabilities: Mapping[str, float] | None = None, rng: random.Random | None = None,
                 regroup_singletons: bool = True):
        if num_samples < 1:
            raise ValueError(f"num_samples (G) must be at least 1, got {num_samples}")
        if strategy not in STRATEGIES:
            raise ValueError(f"Unknown sampling strategy {strategy!r}; expected one of {list(STRATEGIES)}")
        if fork_probabilities is not None and strategy != "round_robin":
            raise ValueError("fork_probabilities are used by the round_robin strategy only")
        if fork_probabilities is not None:
            if any(p < 0 for p in fork_probabilities.values()) or not math.isclose(
                    sum(fork_probabilities.values()), 1.0, abs_tol=1e-6):
                raise ValueError(f"fork_probabilities must be non-negative and sum to 1, got {dict(fork_probabilities)}")
        self.num_samples, self.strategy = num_samples, strategy
        self.fork_probabilities = dict(fork_probabilities) if fork_probabilities is not None else None
        self.rng = rng
        self.regroup_singletons = regroup_singletons

    # --------------------------------------------------------------------------------------------- the plan
    def fork_agents(self, graph: PipelineGraph, num_questions: int) -> list[str]:
        """The fork agent of each question (FoF: the entry agent; RR: drawn with ``fork_probabilities``)."""
        if self.strategy == "round_robin":
            probs = self.fork_probabilities or dict(zip(graph.agents, default_fork_probabilities(len(graph.agents))))
            unknown = set(probs) - set(graph.agents)
            if unknown:
                raise ValueError(f"fork_probabilities name unknown agents {sorted(unknown)}; agents: "
                                 f"{list(graph.agents)}")
            return choose_fork_agents(num_questions, graph.agents, [probs.get(a, 0.0) for a in graph.agents],
                                      self.rng)
        return [graph.entry] * num_questions

    def plan(self, graph: PipelineGraph, num_questions: int, forks: Sequence[str] | None = None
             ) -> tuple[list[PipelineNode], list[Trajectory], list[str]]:
        """The nodes and trajectories of one rollout, before anything runs (group ids included).

        ``forks`` overrides the fork agent of each question (FoF and RR; IS forks at every agent).
        """
        if self.strategy == "independent":
            if forks is not None:
                raise ValueError("independent sampling forks at every agent; forks cannot be given")
            instances = [(q, a, {a}) for q in range(num_questions) for a in graph.agents]
        else:
            forks = list(forks) if forks is not None else self.fork_agents(graph, num_questions)
            if len(forks) != num_questions:
                raise ValueError(f"{len(forks)} fork agents for {num_questions} questions")
            bad = [f for f in forks if f not in graph.agents]
            if bad:
                raise ValueError(f"fork agents {sorted(set(bad))} are not agents of the pipeline {list(graph.agents)}")
            instances = [(q, forks[q], set(graph.agents)) for q in range(num_questions)]
        nodes: list[PipelineNode] = []
        trajectories: list[Trajectory] = []
        for inst, (q, fork, keep) in enumerate(instances):
            forked = {fork} | graph.descendants[fork]
            ids: dict[tuple[str, int], int] = {}
            for name in graph.order:
                copies = self.num_samples if name in forked else 1
                for c in range(copies):
                    inputs = {p: ids[(p, c if p in forked else 0)] for p in graph.predecessors[name]}
                    node = PipelineNode(id=len(nodes), question=q, instance=inst, fork=fork, name=name, copy=c,
                                        forked=name in forked, inputs=inputs, is_agent=graph.is_agent(name))
                    if node.is_agent and name in keep:
                        node.kept = True
                        node.group = ("question", q, name) if node.forked else ("fork", fork, name)
                    for i in inputs.values():
                        nodes[i].consumers.append(node.id)
                    ids[(name, c)] = node.id
                    nodes.append(node)
            for c in range(self.num_samples):  # the sink is downstream of every node, so it is always forked
                trajectories.append(Trajectory(question=q, instance=inst, copy=c, sink=ids[(graph.sink, c)],
                                               node_ids={n: ids[(n, c if n in forked else 0)] for n in graph.order}))
        return nodes, trajectories, [fork for _, fork, _ in instances]

    # --------------------------------------------------------------------------------------------- execution
    def run(self, pool, env: PipelineEnvironment, tasks: Sequence[Mapping[str, Any]],
            generation_config: GenerationConfig, forks: Sequence[str] | None = None) -> PipelineRollout:
        """Execute the plan: stage by stage in topological order, ONE ``generate`` call per agent covering every
        question, fork instance and branch; tools run on each node's inputs. Fills outputs and trajectory rewards."""
        graph = env.graph()
        nodes, trajectories, instance_forks = self.plan(graph, len(tasks), forks)
        by_name: dict[str, list[PipelineNode]] = defaultdict(list)
        for node in nodes:
            by_name[node.name].append(node)
        generated_samples = num_tool_calls = 0
        for name in graph.order:
            stage = by_name[name]
            if graph.is_agent(name):
                for node in stage:
                    node.prompt = env.prompt(name, tasks[node.question], self._inputs(nodes, node))
                generations = pool.generate(name, [n.prompt for n in stage], 1, generation_config)
                generated_samples += len(stage)
                for node, gens in zip(stage, generations):
                    node.generation = gens[0]
                    node.output = gens[0].text
            else:
                for node in stage:
                    node.output = str(env.run_tool(name, tasks[node.question], self._inputs(nodes, node)))
                num_tool_calls += len(stage)
        result = PipelineRollout(nodes, trajectories, instance_forks, generated_samples, num_tool_calls)
        for traj in trajectories:
            task, outputs = tasks[traj.question], result.outputs(traj)
            traj.reward = float(env.final_reward(task, outputs))
            traj.info = {k: float(v) for k, v in env.metrics(task, outputs).items()}
        return result

    @staticmethod
    def _inputs(nodes: Sequence[PipelineNode], node: PipelineNode) -> dict[str, str]:
        return {name: nodes[i].output for name, i in node.inputs.items()}

    # --------------------------------------------------------------------------------------------- links
    @staticmethod
    def agent_consumers(nodes: Sequence[PipelineNode]) -> dict[int, list[int]]:
        """For every agent node, the agent nodes of its direct successors that consumed it: the consumers, with
        tool nodes looked through (a tool is no agent, so the agents behind it are direct successors, Eq. 4)."""
        memo: dict[int, list[int]] = {}

        def through(i: int) -> list[int]:
            if i not in memo:
                found: list[int] = []
                for c in nodes[i].consumers:
                    for j in ([c] if nodes[c].is_agent else through(c)):
                        if j not in found:
                            found.append(j)
                memo[i] = found
            return memo[i]

        return {n.id: through(n.id) for n in nodes if n.is_agent}

    # --------------------------------------------------------------------------------------------- experience
    def rollout(self, pool, env_factory: Callable[[], PipelineEnvironment], tasks: Sequence[Mapping[str, Any]],
                generation_config: GenerationConfig, forks: Sequence[str] | None = None) -> PipelineExperience:
        """Run and return :class:`PipelineExperience`: one :class:`PipelineSample` per kept agent output (its group
        ``m`` of Eq. 5 and its format reward; ``reward``, ``ret`` and ``advantage`` are the credit's), one
        ``JointAction`` per trajectory (``reward`` = the final reward of its answer, ``info`` = the environment's
        metrics) and the links of the DAG."""
        env = env_factory()
        tasks = list(tasks)
        result = self.run(pool, env, tasks, generation_config, forks)
        consumers = self.agent_consumers(result.nodes)
        kept = [result.nodes[i] for i in sorted(consumers) if result.nodes[i].kept]
        specific = [float(env.format_reward(n.name, tasks[n.question], self._inputs(result.nodes, n), n.output))
                    for n in kept]
        joints = [JointAction(id=t_id, node=t.sink, episode=t.question, turn=0, sample_index=(t.copy,),
                              reward=t.reward, done=True, info=dict(t.info), ret=t.reward)
                  for t_id, t in enumerate(result.trajectories)]
        member_of: dict[int, list[int]] = defaultdict(list)
        for t_id, t in enumerate(result.trajectories):
            for node_id in t.node_ids.values():
                member_of[node_id].append(t_id)
        samples = [PipelineSample(agent=n.name, policy=pool.policy_of(n.name), episode=n.question, turn=0, node=n.id,
                                  generation=n.generation, joint_ids=member_of[n.id], group=n.group, format_reward=r)
                   for n, r in zip(kept, specific)]
        regrouped = dropped = 0
        if self.strategy == "round_robin" and self.regroup_singletons:  # Algorithm 5's last block
            groups = regroup([s.group for s in samples], self.num_samples, self.rng)
            regrouped = sum(1 for s, g in zip(samples, groups) if g is not None and g != s.group)
            dropped = sum(1 for g in groups if g is None)
            for s, g in zip(samples, groups):
                s.group = g
            samples = [s for s in samples if s.group is not None]
        graph = env.graph()
        stats = rollout_stats(list(graph.agents), samples, joints, result.generated_samples, len(tasks))
        stats.update(self._pipeline_stats(env, graph, result, kept, specific))
        if self.strategy == "round_robin":
            stats["rr/regrouped_singletons"], stats["rr/dropped_singletons"] = float(regrouped), float(dropped)
        return PipelineExperience(samples, joints, stats, list(graph.agents), consumers=consumers,
                                  terminal_rewards={t.sink: t.reward for t in result.trajectories})

    def _pipeline_stats(self, env, graph, result, kept, specific) -> dict[str, float]:
        def mean(xs):
            xs = list(xs)
            return sum(xs) / len(xs) if xs else math.nan

        stats: dict[str, float] = {"num_tool_calls": float(result.num_tool_calls),
                                   "num_samples": float(len(kept))}
        for agent in graph.agents:
            mine = [(n, s) for n, s in zip(kept, specific) if n.name == agent]
            stats[f"agent/{agent}/format_reward"] = mean(s for _, s in mine)
            stats[f"agent/{agent}/num_samples"] = float(len(mine))
            stats[f"agent/{agent}/similarity"] = intra_group_similarity([n.output for n, _ in mine],
                                                                        [n.group for n, _ in mine])
            values: dict[str, list[float]] = defaultdict(list)
            for n, _ in mine:
                for key, value in env.output_stats(agent, self._inputs(result.nodes, n), n.output).items():
                    values[key].append(float(value))
            for key, vs in values.items():
                stats[f"agent/{agent}/{key}"] = mean(vs)
        if self.strategy == "round_robin":
            for agent in graph.agents:
                stats[f"fork/{agent}"] = result.forks.count(agent) / max(len(result.forks), 1)
        return stats
