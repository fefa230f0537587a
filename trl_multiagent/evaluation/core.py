"""The evaluation engine: evaluators, the per-task result type, and the batched driver.

An :class:`Evaluator` knows how one family of tasks is played and scored. For every method it evaluates (the team,
or an inference-time baseline) it gives a *program*: a generator that yields the generation requests of one round
(every task x sample of that method at once), receives their generations, and finally returns one record per task
and sample (``{metric: value}``). :func:`evaluate_team` runs the programs of all requested methods in lock step and
makes ONE :meth:`AgentPool.generate_many` call per round, covering all problems x samples x methods, so the pool can
put them into as few forward passes as it can.

Results are per task (:class:`MethodResult`): a task's value of a metric is the mean over its samples, and every
comparison (after vs before training, the team vs a baseline) is paired by task (:mod:`.stats`).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import random
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trl_multiagent.metrics.stats import mean
from trl_multiagent.team.pool import Generation, GenerationRequest

#: The trained (or to-be-trained) team: the agents' policies with their adapters on.
TEAM = "team"

Records = list[list[dict[str, float]]]


@dataclass
class MethodOutput:
    """What a program returns: ``records[task][sample] = {metric: value}``, aggregates that are not means of
    per-task values (``details``: e.g. pass@k for k > 1, transition fractions, per-turn means) and, where the program
    keeps them, the texts it generated (``texts``: one row per response, ``{"task": index, "sample", "turn",
    "agent", "text", "reward", ...}``, see :func:`~trl_multiagent.evaluation.episodes.episode_texts`) and each
    task's values turn by turn (``per_turn[task] = {"turn<t>/<name>": mean over the task's samples}``, written to
    ``eval_per_task.jsonl`` beside the task's metrics: what each exchange changed, task by task)."""

    records: Records
    details: dict[str, Any] = field(default_factory=dict)
    texts: list[dict[str, Any]] = field(default_factory=list)
    per_turn: list[dict[str, float]] = field(default_factory=list)


Program = Generator[list[GenerationRequest], list[list[Generation]], MethodOutput]


@dataclass
class MethodResult:
    """One method at one stage: the values of every metric per task and sample, in the order of ``task_ids``."""

    method: str
    task_ids: list[str]
    samples: dict[str, list[list[float]]]
    details: dict[str, Any] = field(default_factory=dict)
    #: The responses, one row each (``task_id``, ``sample``, ``turn``, ``agent``, ``text``, ``reward``, ...), where
    #: the evaluator keeps them (the team's episodes); written to ``eval_texts_<stage>.jsonl``.
    texts: list[dict[str, Any]] = field(default_factory=list)
    #: Per task, its values turn by turn (``turn<t>/<name>``), where the evaluator gives them; empty otherwise.
    per_turn: list[dict[str, float]] = field(default_factory=list)

    @classmethod
    def from_output(cls, method: str, task_ids: Sequence[str], output: MethodOutput) -> MethodResult:
        if len(output.records) != len(task_ids):
            raise ValueError(f"method {method!r} returned records for {len(output.records)} tasks, not {len(task_ids)}")
        names = list(dict.fromkeys(k for recs in output.records for r in recs for k in r))
        samples = {m: [[float(r[m]) for r in recs if m in r] for recs in output.records] for m in names}
        texts = [{"task_id": task_ids[row["task"]], **{k: v for k, v in row.items() if k != "task"}}
                 for row in output.texts]
        if output.per_turn and len(output.per_turn) != len(task_ids):
            raise ValueError(f"method {method!r} returned per-turn values for {len(output.per_turn)} tasks, not "
                             f"{len(task_ids)}")
        return cls(method, list(task_ids), samples, dict(output.details), texts, [dict(t) for t in output.per_turn])

    @property
    def metrics(self) -> list[str]:
        return list(self.samples)

    def per_task(self, metric: str) -> list[float]:
        """The mean over each task's samples (NaN for a task without a value)."""
        if metric not in self.samples:
            raise KeyError(f"method {self.method!r} has no metric {metric!r}; it has {self.metrics}")
        return [mean(values) for values in self.samples[metric]]

    def mean(self, metric: str) -> float:
        return mean(self.per_task(metric))

    def subset(self, indices: Sequence[int]) -> MethodResult:
        """The result on the tasks at ``indices`` only (aggregate ``details`` are over all tasks and are dropped)."""
        ids = [self.task_ids[i] for i in indices]
        keep = set(ids)
        return MethodResult(self.method, ids, {m: [v[i] for i in indices] for m, v in self.samples.items()}, {},
                            [row for row in self.texts if row.get("task_id") in keep],
                            [self.per_turn[i] for i in indices] if self.per_turn else [])


@dataclass
class StageResult:
    """Every method evaluated at one stage (``"before"`` or ``"after"`` training), on the same tasks."""

    stage: str
    methods: dict[str, MethodResult]
    wall_time_s: float = 0.0
    generated_sequences: int = 0
    generate_calls: int = 0

    def subset(self, indices: Sequence[int]) -> StageResult:
        """Every method on the tasks at ``indices`` only (:meth:`MethodResult.subset`; timings stay the stage's)."""
        return StageResult(self.stage, {m: r.subset(indices) for m, r in self.methods.items()}, self.wall_time_s,
                           self.generated_sequences, self.generate_calls)


class Evaluator:
    """How a family of tasks is evaluated. Subclasses implement :meth:`program`.

    Attributes:
        name: the evaluator's name (``evaluator:`` in a recipe).
        metrics_preference: the headline metric is the first of these that the results have.
        baselines: the inference-time baselines it can evaluate besides the team.
        sampled: evaluated with the training temperature (``True``) or greedily (``False``) unless the recipe says.
        default_num_tasks: held-out tasks when the recipe asks for "all" (``eval_num_problems: 0``); ``None`` is
            every task of the held-out split.
        own_held_out_split: the environment's generated held-out split is the evaluation's default even when the
            training data come from a hub dataset (a recipe naming ``eval_dataset_split`` still wins).
        naive_is_untrained_team: the ``naive`` baseline plays the team's own single-turn prompts with the adapters
            off, so it is the untrained team in distribution (``eval_team_before_is_naive`` may reuse it).
        alone: the baselines of one agent alone (:mod:`.alone`): method name -> (agent, turns); they are among
            ``baselines`` too.
        aliases: other names of methods (an older name -> the method), e.g. the math team's ``single`` for
            ``reasoner_alone``.

    Every alone method ``m`` has a trained twin, ``m + "_trained"`` (:attr:`trained_alone`): the same play with the
    agent's adapter on, i.e. the agent as the team's training left it, playing alone (the ``evaluate`` command plays
    it after training; :func:`~trl_multiagent.evaluation.alone.adapters_on`).
    """

    name = "custom"
    metrics_preference: tuple[str, ...] = ("reward",)
    baselines: tuple[str, ...] = ()
    sampled = False
    default_num_tasks: int | None = 32
    own_held_out_split = False
    naive_is_untrained_team = False
    alone: Mapping[str, tuple[str, int]] = {}
    aliases: Mapping[str, str] = {}

    @property
    def methods(self) -> tuple[str, ...]:
        return (TEAM, *self.baselines)

    @property
    def trained_alone(self) -> dict[str, str]:
        """Every trained agent-alone method -> its untrained twin: ``<agent>_alone_trained`` -> ``<agent>_alone``."""
        from trl_multiagent.evaluation.alone import trained_method

        return {trained_method(m): m for m in self.alone}

    def resolve_methods(self, names: Sequence[str]) -> list[str]:
        """``names`` as methods of this evaluation, in order and without repeats: an alias becomes its method and
        ``alone`` (:data:`~trl_multiagent.evaluation.alone.ALL_ALONE`) every alone method (it stays as it is when
        there is none, so that whoever asked can be told). Unknown names are kept for the caller to report."""
        from trl_multiagent.evaluation.alone import ALL_ALONE, ALL_ALONE_TRAINED

        out: list[str] = []
        for name in names:
            if name == ALL_ALONE and self.alone:
                out.extend(self.alone)
            elif name == ALL_ALONE_TRAINED and self.alone:
                out.extend(self.trained_alone)
            else:
                out.append(self.aliases.get(name, name))
        return list(dict.fromkeys(out))

    def program(self, method: str, tasks: Sequence[Mapping[str, Any]], num_samples: int) -> Program:
        raise NotImplementedError(f"{type(self).__name__} must implement program(method, tasks, num_samples)")

    def expected_sequences(self, method: str, num_tasks: int, num_samples: int) -> int:
        """An upper bound of the sequences ``method`` generates (sizes the progress bar)."""
        return num_tasks * num_samples

    def headline_metric(self, results: Mapping[str, MethodResult]) -> str:
        have = {m for r in results.values() for m in r.metrics}
        for name in self.metrics_preference:
            if name in have:
                return name
        if not have:
            raise ValueError(f"the {self.name} evaluation produced no metric")
        return sorted(have)[0]


#: The inference-time baselines of MAGRPO (Sec. 5.1, App. E) for two-agent tasks, and the sequences each generates
#: per task and sample (single: one response; naive, sequential: one per agent; discussion: two rounds of two).
PAIR_BASELINES = ("single", "naive", "sequential", "discussion")
PAIR_BASELINE_SEQUENCES = {"single": 1, "naive": 2, "sequential": 2, "discussion": 4}


class PairBaselinesEvaluator(Evaluator):
    """An evaluator of a two-agent team against :data:`PAIR_BASELINES` (the coding and writing evaluations); the team
    plays ``num_turns`` turns of two responses."""

    baselines = PAIR_BASELINES
    num_turns = 1

    def expected_sequences(self, method: str, num_tasks: int, num_samples: int) -> int:
        per_sample = 2 * self.num_turns if method == TEAM else PAIR_BASELINE_SEQUENCES[method]
        return num_tasks * num_samples * per_sample


def task_ids_of(tasks: Sequence[Mapping[str, Any]]) -> list[str]:
    """The tasks' ``task_id`` (or ``id``) when they have one, else their index."""
    ids = []
    for i, task in enumerate(tasks):
        value = task.get("task_id", task.get("id")) if isinstance(task, Mapping) else None
        ids.append(str(value) if value is not None else str(i))
    return ids


# ------------------------------------------------------------------------------------------------------- driver
def generate(pool, requests: Sequence[GenerationRequest], generation_config, max_batch_sequences: int | None = None,
             progress: Callable[[int], None] | None = None) -> list[list[Generation]]:
    """One team-level generation call for ``requests``.

    Uses ``pool.generate_many`` (passing ``progress`` on when it accepts one: it is then called with the number of
    sequences finished after each internal batch). A stand-in pool that only has ``generate(agent, prompts,
    num_samples, generation_config)`` (a test double) is served request group by request group.
    """
    if not requests:
        return []
    many = getattr(pool, "generate_many", None)
    if many is not None:
        kwargs = {}
        if progress is not None and "progress" in inspect.signature(many).parameters:
            kwargs["progress"], progress = progress, None
        out = many(list(requests), generation_config, max_batch_sequences=max_batch_sequences, **kwargs)
    else:
        out: list = [None] * len(requests)
        buckets: dict[tuple[str, int], list[int]] = {}
        for i, req in enumerate(requests):
            if not req.use_adapter:
                raise TypeError(f"{type(pool).__name__} has no generate_many, so it cannot sample without adapters")
            buckets.setdefault((req.agent, req.num_samples), []).append(i)
        for (agent, num_samples), idxs in buckets.items():
            for i, gens in zip(idxs, pool.generate(agent, [requests[i].prompt for i in idxs], num_samples,
                                                   generation_config)):
                out[i] = gens
    if progress is not None:
        progress(sum(r.num_samples for r in requests))
    return out


def _request_key(request: GenerationRequest, adapters_are_identity: bool = False) -> tuple:
    """What makes two requests draw from one distribution: the agent, the prompt and the adapter on/off (not the
    number of samples: the first ``n`` of ``m >= n`` independent draws are ``n`` independent draws). Messages may hold
    lists (an assistant's ``tool_calls``) and a prompt may carry tools (``ToolPrompt``): the key is their JSON. While
    the adapters compute nothing (``adapters_are_identity``: untrained, B = 0) on and off are one distribution."""
    prompt = request.prompt if isinstance(request.prompt, str) else \
        json.dumps(list(request.prompt), sort_keys=True, default=str)
    tools = json.dumps(getattr(request.prompt, "tools", []), sort_keys=True, default=str)
    return request.agent, prompt, tools, request.use_adapter or adapters_are_identity, request.prompt_ids


def run_programs(pool, programs: Mapping[str, Program], generation_config, max_batch_sequences: int | None = None,
                 progress: Callable[[int], None] | None = None,
                 share_draws: bool = True) -> tuple[dict[str, MethodOutput], int, int]:
    """Drive ``programs`` in lock step: every round, ONE generation call for the requests of all of them.

    With ``share_draws``, a program's request for ``n`` samples that equals (agent, prompt, adapter on/off) a request
    of an earlier program in the same round for ``m >= n`` samples takes the first ``n`` of that request's
    generations instead of new ones: the baselines whose first round is the naive baseline's drafts (sequential,
    discussion) then revise the very drafts the naive baseline is scored on (all of them, or the first ``n`` when
    they are evaluated with fewer samples). Each program still sees draws from its own distribution, and within one
    program equal requests are never shared (they stay independent samples). While the pool's adapters compute
    nothing (``pool.adapters_are_identity()``, before training) adapters on and off are one distribution, so the
    baselines share the team's draws too (the math team's ``reasoner_alone``, ``tool_alone`` and ``no_exchange`` are
    then its first turn).

    Returns each program's output, the number of generation calls and the number of generated sequences.
    """
    outputs: dict[str, MethodOutput] = {}
    pending: dict[str, list[GenerationRequest]] = {}

    def advance(name: str, value) -> None:
        try:
            while True:
                requests = programs[name].send(value)
                if requests:
                    pending[name] = list(requests)
                    return
                value = []  # a round without generation: go on
        except StopIteration as stop:
            pending.pop(name, None)
            if not isinstance(stop.value, MethodOutput):
                raise TypeError(f"program {name!r} must return a MethodOutput, got {type(stop.value).__name__}") \
                    from None
            outputs[name] = stop.value

    identity = share_draws and bool(getattr(pool, "adapters_are_identity", lambda: False)())
    for name in programs:
        advance(name, None)
    calls = sequences = 0
    while pending:
        names = list(pending)
        flat: list[GenerationRequest] = []
        served: dict[str, list[tuple[int, int]]] = {}  # each program's requests -> (index in flat, samples taken)
        earlier: dict[tuple, list[int]] = {}  # the requests of the programs before, by key, in order
        for name in names:
            taken: dict[tuple, int] = {}
            mine: dict[tuple, list[int]] = {}
            served[name] = []
            for req in pending[name]:
                key = _request_key(req, identity)
                used = taken.get(key, 0)
                if share_draws and used < len(earlier.get(key, ())) and \
                        flat[earlier[key][used]].num_samples >= req.num_samples:
                    served[name].append((earlier[key][used], req.num_samples))
                    taken[key] = used + 1
                    continue
                mine.setdefault(key, []).append(len(flat))
                served[name].append((len(flat), req.num_samples))
                flat.append(req)
            for key, idxs in mine.items():
                earlier.setdefault(key, []).extend(idxs)
        generations = generate(pool, flat, generation_config, max_batch_sequences, progress)
        if len(generations) != len(flat):
            raise RuntimeError(f"generate_many returned {len(generations)} results for {len(flat)} requests")
        calls += 1
        sequences += sum(r.num_samples for r in flat)
        if progress is not None:  # the shared requests are done too
            shared = sum(r.num_samples for name in names for r in pending[name]) - sum(r.num_samples for r in flat)
            if shared:
                progress(shared)
        for name in names:
            advance(name, [generations[i][:n] for i, n in served[name]])
    return outputs, calls, sequences


@contextlib.contextmanager
def isolated_rng(seed: int):
    """Seed Python, NumPy and torch for an evaluation and restore their states after it, so that evaluating (or
    not) never changes the random stream of training, and before/after share their random numbers."""
    import numpy as np
    import torch

    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []):
        random.seed(seed)
        np.random.seed(seed % (2**32))
        torch.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


@contextlib.contextmanager
def inference_mode(pool):
    """The pool in eval mode (no dropout) for the evaluation, restored after."""
    was_training = getattr(pool, "training", None)
    if was_training is not None:
        pool.eval()
    try:
        yield
    finally:
        if was_training:
            pool.train()


def evaluate_team(pool, evaluator: Evaluator, tasks: Sequence[Mapping[str, Any]], methods: Sequence[str] = (TEAM,),
                  num_samples: int | Mapping[str, int] = 1, generation_config=None, stage: str = "eval", seed: int = 0,
                  max_batch_sequences: int | None = None, progress=None, share_draws: bool = True) -> StageResult:
    """Evaluate ``methods`` (the team and/or the evaluator's baselines) on ``tasks``, ``num_samples`` each.

    All methods advance together: one generation call per round covers every task, sample and method. The team
    acts with its adapters (trained or not); the baselines run the bases with the adapters off.

    Args:
        pool: the team's :class:`~trl_multiagent.team.pool.AgentPool`.
        evaluator: how the tasks are played and scored.
        tasks: the held-out tasks (dataset rows).
        methods: ``"team"`` and/or names in ``evaluator.baselines`` (an alias or ``alone`` is resolved by
            :meth:`Evaluator.resolve_methods`; the results are keyed by the method's own name), and the trained
            agents alone, ``<agent>_alone_trained`` (:attr:`Evaluator.trained_alone`).
        num_samples: samples (episodes) per task and method: one number for every method, or one per method
            (a mapping from every name in ``methods``).
        generation_config: a ``transformers.GenerationConfig`` (greedy when ``None``, 128 new tokens).
        stage: a label for the result and the progress bar.
        seed: the evaluation's random seed (the global random state is restored afterwards).
        max_batch_sequences: the most sequences one forward batch may hold (memory bound), ``None``: no bound.
        progress: an :class:`~trl_multiagent.evaluation.progress.EvalProgress` (or ``None``).
        share_draws: methods asking the same requests in the same round share one draw (:func:`run_programs`): the
            sequential and discussion baselines start from the naive baseline's drafts.
    """
    from transformers import GenerationConfig

    from trl_multiagent.evaluation.alone import adapters_on

    if not tasks:
        raise ValueError("evaluate_team needs at least one task")
    asked = list(methods)
    methods = evaluator.resolve_methods(asked)
    trained = evaluator.trained_alone
    unknown = [m for m in methods if m not in evaluator.methods and m not in trained]
    if unknown or not methods:
        raise ValueError(f"the {evaluator.name} evaluation has the methods {list(evaluator.methods)}, got "
                         f"{asked}")
    if isinstance(num_samples, Mapping):
        counts = {evaluator.aliases.get(m, m): n for m, n in num_samples.items()}
        missing = [m for m in methods if m not in counts]
        if missing:
            raise ValueError(f"num_samples has no count for the method(s) {missing}")
        samples = {m: counts[m] for m in methods}
    else:
        samples = {m: num_samples for m in methods}
    bad = {m: n for m, n in samples.items() if not isinstance(n, int) or n < 1}
    if bad:
        raise ValueError(f"num_samples must be at least 1, got {bad}")
    generation_config = generation_config or GenerationConfig(max_new_tokens=128, do_sample=False)
    tasks = list(tasks)
    ids = task_ids_of(tasks)
    start = time.perf_counter()
    total = sum(evaluator.expected_sequences(trained.get(m, m), len(tasks), samples[m]) for m in methods)
    with contextlib.ExitStack() as stack:
        advance = stack.enter_context(progress.stage(stage, total)) if progress is not None else None
        stack.enter_context(isolated_rng(seed))
        stack.enter_context(inference_mode(pool))
        programs = {m: adapters_on(evaluator.program(trained[m], tasks, samples[m])) if m in trained
                    else evaluator.program(m, tasks, samples[m]) for m in methods}
        outputs, calls, sequences = run_programs(pool, programs, generation_config, max_batch_sequences, advance,
                                                 share_draws=share_draws)
    results = {m: MethodResult.from_output(m, ids, outputs[m]) for m in methods}
    return StageResult(stage, results, time.perf_counter() - start, sequences, calls)


def regroup(single_samples: list[list[Generation]] | list[list[str]], m: int) -> list[list]:
    """Generations of one sample per prompt, prompts ordered task by task -> ``m`` samples per task."""
    flat = [g[0] for g in single_samples]
    return [flat[i:i + m] for i in range(0, len(flat), m)]


def nan_to_none(value: Any) -> Any:
    """JSON has no NaN: NaN floats (also inside lists and dicts) become ``None``."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: nan_to_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [nan_to_none(v) for v in value]
    return value
