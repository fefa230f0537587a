"""The pipeline protocol: agents that act in sequence on each other's outputs, with tool steps in between.

A multi-agent pipeline (MHGPO's multi-agent search system: Rewriter -> retriever -> Reranker -> Answerer) does not
fit the turn-based joint-action protocol of :class:`~trl_multiagent.environments.base.Environment`: agents do not
act together on a shared state, each one reads the outputs of the agents (and tools) before it. A
:class:`PipelineEnvironment` describes such a system as a directed acyclic graph and is STATELESS: every method gets
the task (the dataset row) and the outputs it needs, so one instance serves every question and every branch of a
rollout, and the sampler can batch each agent's generation across all of them.

Nodes are agents (LLM calls, trained) and tools (deterministic functions of their inputs, e.g. a retriever; not
trained). ``edges`` are ``(producer, consumer)`` pairs. The graph must be acyclic and have exactly one sink, an
agent, whose output is the system's answer (every node then reaches it). Methods:

- ``prompt(agent, task, inputs) -> Prompt``: the agent's prompt, from the task and ``inputs`` = the outputs of its
  direct predecessors by name (an agent without predecessors gets ``{}``);
- ``run_tool(tool, task, inputs) -> str``: a tool's output (only for graphs with tools);
- ``final_reward(task, outputs) -> float``: the shared reward of one trajectory, ``outputs`` = every node's output on
  it by name (MHGPO: the F1 of the final answer);
- ``format_reward(agent, task, inputs, output) -> float``: the agent-specific reward ``R_spe`` of MHGPO Eq. 4 (0 by
  default), e.g. a format penalty;
- ``metrics(task, outputs) -> {name: value}``: scalars of one trajectory logged as ``env/<name>`` (e.g. EM, F1);
- ``output_stats(agent, inputs, output) -> {name: value}``: per-agent output statistics logged as
  ``agent/<agent>/<name>`` (MHGPO Figure 8: sub-query count, passages selected, answer length).

``make_dataset(num_tasks, seed, split)`` (a classmethod) generates tasks where the environment can, as for the other
environments.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trl_multiagent.generation.requests import Prompt


@dataclass(frozen=True)
class PipelineGraph:
    """The validated graph of a pipeline.

    Attributes:
        agents: the agents, in topological order.
        tools: the tool names.
        order: every node (agents and tools) in topological order; ties keep the declaration order (agents first).
        predecessors / successors: the direct neighbours of every node, in ``order``.
        descendants: every node reachable from a node (not the node itself).
        sink: the final agent, whose output is the answer.
        entry: the first agent in topological order (MHGPO's fork point for Fork-on-first).
    """

    agents: tuple[str, ...]
    tools: tuple[str, ...]
    order: tuple[str, ...]
    predecessors: dict[str, tuple[str, ...]]
    successors: dict[str, tuple[str, ...]]
    descendants: dict[str, frozenset[str]]
    sink: str
    entry: str

    def is_agent(self, name: str) -> bool:
        return name in self.agents

    @classmethod
    def build(cls, agents: Sequence[str], tools: Sequence[str], edges: Sequence[tuple[str, str]],
              owner: str = "pipeline") -> PipelineGraph:
        """Check the declaration and compute the graph; every problem raises one ``ValueError`` naming it."""
        agents, tools = tuple(agents), tuple(tools)
        if not agents:
            raise ValueError(f"{owner} declares no agents")
        names = agents + tools
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"{owner}: node names must be unique across agents and tools; repeated: {dupes}")
        known = set(names)
        preds: dict[str, list[str]] = {n: [] for n in names}
        succs: dict[str, list[str]] = {n: [] for n in names}
        for edge in edges:
            if len(edge) != 2:
                raise ValueError(f"{owner}: an edge is a (producer, consumer) pair, got {edge!r}")
            src, dst = edge
            unknown = [x for x in (src, dst) if x not in known]
            if unknown:
                raise ValueError(f"{owner}: edge {edge!r} names unknown node(s) {unknown}; nodes: {list(names)}")
            if src == dst:
                raise ValueError(f"{owner}: edge {edge!r} is a self-loop")
            if src in preds[dst]:
                raise ValueError(f"{owner}: edge {edge!r} is declared twice")
            preds[dst].append(src)
            succs[src].append(dst)
        # Kahn's algorithm; among ready nodes the earliest declared goes first.
        rank = {n: i for i, n in enumerate(names)}
        indegree = {n: len(preds[n]) for n in names}
        ready = sorted((n for n in names if indegree[n] == 0), key=rank.get)
        order: list[str] = []
        while ready:
            node = ready.pop(0)
            order.append(node)
            for nxt in succs[node]:
                indegree[nxt] -= 1
                if indegree[nxt] == 0:
                    ready.append(nxt)
                    ready.sort(key=rank.get)
        if len(order) != len(names):
            raise ValueError(f"{owner}: the edges form a cycle through {sorted(set(names) - set(order))}")
        sinks = [n for n in order if not succs[n]]
        if len(sinks) != 1:
            raise ValueError(f"{owner}: a pipeline needs exactly one final node (without consumers), got {sinks}")
        if sinks[0] not in agents:
            raise ValueError(f"{owner}: the final node {sinks[0]!r} must be an agent (its output is the answer)")
        position = {n: i for i, n in enumerate(order)}
        descendants: dict[str, frozenset[str]] = {}
        for node in reversed(order):
            below: set[str] = set()
            for nxt in succs[node]:
                below |= {nxt} | descendants[nxt]
            descendants[node] = frozenset(below)
        return cls(
            agents=tuple(n for n in order if n in agents),
            tools=tuple(n for n in order if n in tools),
            order=tuple(order),
            predecessors={n: tuple(sorted(preds[n], key=position.get)) for n in order},
            successors={n: tuple(sorted(succs[n], key=position.get)) for n in order},
            descendants=descendants,
            sink=sinks[0],
            entry=next(n for n in order if n in agents),
        )


class PipelineEnvironment(abc.ABC):
    """Base class of pipeline environments (see the module docstring for the protocol).

    Attributes:
        agents: the agent (role) names; a team's ``AgentSpec`` names must match them. Their order is the order of
            per-agent settings such as MHGPO's ``fork_probabilities``.
        tools: the tool-step names.
        edges: ``(producer, consumer)`` pairs over agents and tools.
        required_columns: dataset columns the methods read; checked before any model loads.
    """

    agents: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    edges: tuple[tuple[str, str], ...] = ()
    required_columns: tuple[str, ...] = ()

    @abc.abstractmethod
    def prompt(self, agent: str, task: Mapping[str, Any], inputs: Mapping[str, str]) -> Prompt:
        """The prompt of ``agent`` for ``task``, given its direct predecessors' outputs ``inputs`` (by name)."""

    @abc.abstractmethod
    def final_reward(self, task: Mapping[str, Any], outputs: Mapping[str, str]) -> float:
        """The shared reward of one trajectory; ``outputs`` holds every node's output on it by name."""

    def run_tool(self, tool: str, task: Mapping[str, Any], inputs: Mapping[str, str]) -> str:
        """The output of tool step ``tool``; pipelines that declare tools override it."""
        raise ValueError(f"{type(self).__name__} has no tool {tool!r} (tools: {list(self.tools)})")

    def format_reward(self, agent: str, task: Mapping[str, Any], inputs: Mapping[str, str], output: str) -> float:
        """The agent-specific reward ``R_spe_k(q, o)`` of MHGPO Eq. 4 (a format penalty) of ``output``, produced from
        ``inputs``; 0 unless overridden."""
        return 0.0

    def metrics(self, task: Mapping[str, Any], outputs: Mapping[str, str]) -> dict[str, float]:
        """Scalars of one trajectory, logged as ``env/<name>``; none unless overridden."""
        return {}

    def output_stats(self, agent: str, inputs: Mapping[str, str], output: str) -> dict[str, float]:
        """Statistics of one output of ``agent`` (produced from ``inputs``), logged as ``agent/<agent>/<name>``; none
        unless overridden."""
        return {}

    def graph(self) -> PipelineGraph:
        """The validated graph (cached); a pipeline with tools must override :meth:`run_tool`."""
        cached = self.__dict__.get("_graph")
        if cached is None:
            cached = PipelineGraph.build(self.agents, self.tools, self.edges, owner=type(self).__name__)
            if cached.tools and type(self).run_tool is PipelineEnvironment.run_tool:
                raise ValueError(f"{type(self).__name__} declares tools {list(cached.tools)} but does not implement "
                                 "run_tool")
            self.__dict__["_graph"] = cached
        return cached

    @classmethod
    def validate_dataset_columns(cls, columns: Sequence[str], name: str = "dataset") -> None:
        missing = [c for c in cls.required_columns if c not in columns]
        if missing:
            raise ValueError(f"The {name} lacks the column(s) {missing} that the pipeline {cls.__name__} needs "
                             f"(it has: {list(columns)}).")
