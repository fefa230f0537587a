"""Evaluation of agent pipelines (MHGPO's multi-agent search system) on held-out questions.

Each sample of a task is one pass through the pipeline's graph (one output per agent, greedy by default): stage by
stage in topological order, every agent answers all questions and samples of its stage in the round's one
generation call; tools run on each node's inputs. Per task and sample: ``reward`` (the pipeline's final reward),
every value of ``env.metrics`` (for the search task ``acc``, ``em`` and ``f1``, MHGPO Table 1) and every agent's
``env.output_stats`` as ``agent/<name>/<stat>`` (MHGPO Figure 8). The headline metric is ``f1`` where the pipeline
reports it, else ``reward``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trl_multiagent.environments.pipeline import PipelineEnvironment
from trl_multiagent.evaluation.core import TEAM, Evaluator, MethodOutput, Program
from trl_multiagent.team.pool import GenerationRequest


class PipelineEvaluator(Evaluator):
    """Pipeline passes on held-out tasks (see the module docstring).

    Args:
        env_factory: a zero-argument factory of the :class:`PipelineEnvironment` (pipelines are stateless: one
            instance serves every question).
    """

    name = "pipeline"
    metrics_preference = ("f1", "reward")
    default_num_tasks = 64

    def __init__(self, env_factory: Callable[[], PipelineEnvironment]):
        env = env_factory()
        if not isinstance(env, PipelineEnvironment):
            raise ValueError(f"the pipeline evaluation needs a PipelineEnvironment, got {type(env).__name__}")
        self.env = env
        self.graph = env.graph()

    def expected_sequences(self, method: str, num_tasks: int, num_samples: int) -> int:
        return num_tasks * num_samples * len(self.graph.agents)

    def program(self, method: str, tasks: Sequence[Mapping[str, Any]], num_samples: int) -> Program:
        if method != TEAM:
            raise ValueError(f"the pipeline evaluation has no method {method!r}")
        env, graph = self.env, self.graph
        paths = [(t, s) for t in range(len(tasks)) for s in range(num_samples)]
        outputs: list[dict[str, str]] = [{} for _ in paths]
        stats: list[dict[str, float]] = [{} for _ in paths]

        def inputs(i: int, name: str) -> dict[str, str]:
            return {p: outputs[i][p] for p in graph.predecessors[name]}

        for name in graph.order:
            if graph.is_agent(name):
                requests = [GenerationRequest(name, env.prompt(name, tasks[t], inputs(i, name)), 1)
                            for i, (t, _) in enumerate(paths)]
                generations = yield requests
                for i, gens in enumerate(generations):
                    outputs[i][name] = gens[0].text
                    stats[i].update({f"agent/{name}/{k}": float(v) for k, v in
                                     env.output_stats(name, inputs(i, name), gens[0].text).items()})
            else:
                for i, (t, _) in enumerate(paths):
                    outputs[i][name] = str(env.run_tool(name, tasks[t], inputs(i, name)))
        records: list[list[dict[str, float]]] = [[] for _ in tasks]
        for i, (t, _) in enumerate(paths):
            record = {"reward": float(env.final_reward(tasks[t], outputs[i]))}
            record.update({k: float(v) for k, v in env.metrics(tasks[t], outputs[i]).items()})
            record.update(stats[i])
            records[t].append(record)
        return MethodOutput(records, {})
