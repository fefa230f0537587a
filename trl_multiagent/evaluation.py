"""Evaluation: @k metrics, bootstrap intervals, and the inference-time baselines of the coding task.

Metrics (MAGRPO paper, Appendix B, Eq. 6-8). For problem j with M sampled solutions, the expected best value over a
random subset of k of them is

    E[max over k of v] = sum_i v_(i) * C(i - 1, k - 1) / C(M, k)        (v_(1) <= ... <= v_(M) sorted)

``pass@k`` is this with v = 1 when every test passes (it equals the unbiased estimator of Chen et al. 2021,
1 - C(M - c, k) / C(M, k)); ``acc@k`` with v = the fraction of tests passed; ``coop@k`` with v = the normalised
cooperation return. Each metric is the mean over problems.

Baselines (MAGRPO Appendix E), all with the same models: ``single`` (one agent writes the whole function),
``naive`` (aux and main write in parallel, their code is concatenated), ``sequential`` (main sees aux's code),
``discussion`` (one round: each agent sees the other's first answer and revises). The trained team is evaluated
with its adapters on; the baselines run the bases with the adapters disabled.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import GenerationConfig

KS = (1, 3, 5, 10)
METHODS = ("team", "single", "naive", "sequential", "discussion")
#: Sequences per generate call during evaluation (bounds the KV-cache memory on CPU).
MAX_BATCH_SEQUENCES = 48


# --------------------------------------------------------------------------------------------------- metrics
def expected_max_at_k(values: Sequence[float], k: int) -> float:
    """Expected maximum of ``values`` over a uniformly random subset of size ``k`` (Eq. 6-8 of MAGRPO App. B)."""
    n = len(values)
    if not 1 <= k <= n:
        raise ValueError(f"k={k} needs 1 <= k <= number of samples ({n})")
    ordered = sorted(float(v) for v in values)
    total = math.comb(n, k)
    return sum(v * math.comb(i, k - 1) for i, v in enumerate(ordered)) / total  # i = rank - 1


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. (2021): ``1 - C(n - c, k) / C(n, k)``."""
    if not 1 <= k <= num_samples:
        raise ValueError(f"k={k} needs 1 <= k <= num_samples ({num_samples})")
    if num_samples - num_correct < k:
        return 1.0
    return 1.0 - math.comb(num_samples - num_correct, k) / math.comb(num_samples, k)


def at_k_metrics(per_problem: Sequence[Sequence[Mapping[str, float]]], ks: Sequence[int] = KS) -> dict[str, float]:
    """pass@k, acc@k and coop@k (mean over problems) from M sample records per problem.

    Each record has ``passed_all`` (0/1), ``pass_rate`` (fraction of tests passed) and ``coop`` (normalised
    cooperation return).
    """
    out: dict[str, float] = {}
    for k in ks:
        usable = [recs for recs in per_problem if len(recs) >= k]
        if not usable:
            continue
        out[f"pass@{k}"] = _mean([pass_at_k(len(r), int(sum(x["passed_all"] for x in r)), k) for r in usable])
        out[f"acc@{k}"] = _mean([expected_max_at_k([x["pass_rate"] for x in r], k) for r in usable])
        out[f"coop@{k}"] = _mean([expected_max_at_k([x["coop"] for x in r], k) for r in usable])
    return out


def bootstrap_interval(per_problem_values: Sequence[float], num_resamples: int = 1000, alpha: float = 0.05,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean over problems (resampling problems with replacement)."""
    values = list(per_problem_values)
    if not values:
        return (math.nan, math.nan)
    rng = random.Random(seed)
    means = sorted(_mean([values[rng.randrange(len(values))] for _ in values]) for _ in range(num_resamples))
    lo = means[int(math.floor(alpha / 2 * (num_resamples - 1)))]
    hi = means[int(math.ceil((1 - alpha / 2) * (num_resamples - 1)))]
    return (lo, hi)


def _mean(xs: Sequence[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else math.nan


# --------------------------------------------------------------------------------------------------- coding methods
SINGLE_PROMPT = """Solve this coding problem by implementing the required function.
Problem: {prompt}
Instructions:
{rules}
- Implement the '{entry_point}' function as specified
Your output should follow this format:
def {entry_point}({params}):
    # your function code here
    return result"""  # {rules} is filled in by evaluate_coding

SEQUENTIAL_SUFFIX = """
The helper agent has written this aux function, which you can call:
{aux}"""

DISCUSSION_SUFFIX = """
Your previous answer:
{own}
The other agent's answer:
{other}
Revise your function so that the two work together. Output ONLY the function code."""


@dataclass
class EvalSettings:
    """How samples are drawn for evaluation.

    Attributes:
        num_samples: M solutions per problem and method (at least the largest k).
        ks: the k of the @k metrics.
        max_new_tokens, temperature, top_p: sampling of every agent.
        bootstrap_resamples: resamples of the 95% bootstrap intervals.
        seed: sampling and bootstrap seed.
    """

    num_samples: int = 10
    ks: tuple[int, ...] = KS
    max_new_tokens: int = 128
    temperature: float = 0.7
    top_p: float = 0.9
    bootstrap_resamples: int = 1000
    seed: int = 0
    methods: tuple[str, ...] = METHODS

    def generation_config(self) -> GenerationConfig:
        return GenerationConfig(max_new_tokens=self.max_new_tokens, do_sample=True, temperature=self.temperature,
                                top_p=self.top_p)


@dataclass
class MethodResult:
    """Per-problem sample records and aggregate metrics of one method."""

    method: str
    records: list[list[dict[str, float]]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)


def _adapters(pool, enabled: bool):
    """Context: run with the policies' adapters (``enabled``) or with the bare bases (baselines)."""
    if enabled:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    for base in pool.bases.values():
        stack.enter_context(base.disable_adapter())
    return stack


def _gen(pool, agent: str, prompts: Sequence[str], m: int, cfg: GenerationConfig, tokens: dict) -> list[list[str]]:
    start = time.perf_counter()
    out = pool.generate(agent, list(prompts), m, cfg, max_batch_sequences=MAX_BATCH_SEQUENCES)
    tokens.setdefault("time", 0.0)
    tokens["time"] += time.perf_counter() - start
    for group in out:
        for g in group:
            tokens.setdefault(agent, []).append(len(g.completion_ids))
    return [[g.text for g in group] for group in out]


def evaluate_coding(pool, problems: Sequence[Mapping[str, Any]], settings: EvalSettings,
                    reward_fn: Callable, sandbox=None, num_turns: int = 1,
                    progress: Callable[[str], None] | None = None) -> dict[str, MethodResult]:
    """Sample M solutions per problem for every method in ``settings.methods``; score them in the sandbox.

    ``team`` is the trained aux/main pair (adapters on, the prompts of training, ``num_turns`` turns with feedback);
    the other methods are the baselines of MAGRPO Appendix E on the adapter-free bases.
    """
    from .environments.coding import AUX_PROMPT, CODE_ONLY_RULES, MAIN_PROMPT, score_pair
    from .sandbox import SandboxConfig

    sandbox = sandbox or SandboxConfig(timeout_s=10)
    cfg = settings.generation_config()
    m = settings.num_samples
    results: dict[str, MethodResult] = {}
    for method in settings.methods:
        if progress:
            progress(method)
        tokens: dict[str, Any] = {}
        with _adapters(pool, enabled=(method == "team")):
            if method == "team":
                records = _team_records(pool, problems, m, cfg, tokens, reward_fn, sandbox, num_turns)
            else:
                aux_p = [AUX_PROMPT.format(prompt=p["prompt"]) for p in problems]
                main_p = [MAIN_PROMPT.format(prompt=p["prompt"], entry_point=p["entry_point"], params=p["params"])
                          for p in problems]
                if method == "single":
                    single = [SINGLE_PROMPT.format(prompt=p["prompt"], entry_point=p["entry_point"],
                                                   params=p["params"], rules=CODE_ONLY_RULES) for p in problems]
                    mains = _gen(pool, "main", single, m, cfg, tokens)
                    auxes = [[""] * m for _ in problems]
                elif method == "naive":
                    auxes = _gen(pool, "aux", aux_p, m, cfg, tokens)
                    mains = _gen(pool, "main", main_p, m, cfg, tokens)
                elif method == "sequential":  # main sees the aux written for it: one prompt per sample
                    auxes = _gen(pool, "aux", aux_p, m, cfg, tokens)
                    seq = [main_p[i] + SEQUENTIAL_SUFFIX.format(aux=a) for i in range(len(problems)) for a in auxes[i]]
                    mains = _regroup(_gen(pool, "main", seq, 1, cfg, tokens), m)
                elif method == "discussion":  # one round: each agent sees both first answers and revises
                    auxes0 = _gen(pool, "aux", aux_p, m, cfg, tokens)
                    mains0 = _gen(pool, "main", main_p, m, cfg, tokens)
                    pairs = [(i, a, b) for i in range(len(problems)) for a, b in zip(auxes0[i], mains0[i])]
                    a2 = [aux_p[i] + DISCUSSION_SUFFIX.format(own=a, other=b) for i, a, b in pairs]
                    b2 = [main_p[i] + DISCUSSION_SUFFIX.format(own=b, other=a) for i, a, b in pairs]
                    auxes = _regroup(_gen(pool, "aux", a2, 1, cfg, tokens), m)
                    mains = _regroup(_gen(pool, "main", b2, 1, cfg, tokens), m)
                else:
                    raise ValueError(f"Unknown method {method!r}; choose from {METHODS}")
                records = []
                for i, p in enumerate(problems):
                    recs = []
                    for a, b in zip(auxes[i], mains[i]):
                        s = score_pair(p, a, b, reward_fn, sandbox)
                        recs.append(_record(s))
                    records.append(recs)
        result = MethodResult(method, records)
        result.metrics = at_k_metrics(records, [k for k in settings.ks if k <= m])
        result.metrics["reward"] = _mean([_mean([r["reward"] for r in recs]) for recs in records])
        for agent in ("aux", "main"):
            if tokens.get(agent):
                result.metrics[f"tokens/{agent}"] = _mean(tokens[agent])
        result.metrics["seconds_per_solution"] = tokens.get("time", 0.0) / max(1, m * len(problems))
        per_problem = {
            "reward": [_mean([r["reward"] for r in recs]) for recs in records],
            "pass@1": [_mean([r["passed_all"] for r in recs]) for recs in records],
            "acc@1": [_mean([r["pass_rate"] for r in recs]) for recs in records],
        }
        result.intervals = {k: bootstrap_interval(v, settings.bootstrap_resamples, seed=settings.seed)
                            for k, v in per_problem.items()}
        results[method] = result
    return results


def _regroup(single_samples: list[list[str]], m: int) -> list[list[str]]:
    """One sample per prompt, prompts ordered problem by problem -> M samples per problem."""
    flat = [g[0] for g in single_samples]
    return [flat[i:i + m] for i in range(0, len(flat), m)]


def _record(scored: Mapping[str, Any]) -> dict[str, float]:
    info = scored["info"]
    coop = info.get("level/cooperation", 0.0)
    return {"reward": scored["reward"], "pass_rate": info["pass_rate"], "passed_all": info["passed_all"],
            "coop": max(0.0, coop) / 1.0}


def _team_records(pool, problems, m, cfg, tokens, reward_fn, sandbox, num_turns) -> list[list[dict[str, float]]]:
    """The trained pair: M independent episodes per problem (one sample per node), up to ``num_turns`` turns."""
    from .environments.coding import AuxMainCodingEnv

    records = []
    for p in problems:
        envs = [AuxMainCodingEnv(max_turns=num_turns, reward_fn=reward_fn, sandbox=sandbox) for _ in range(m)]
        prompts = [e.reset(p) for e in envs]
        recs: list[dict[str, float] | None] = [None] * m
        coop_return = [0.0] * m
        active = list(range(m))
        for _turn in range(num_turns):
            auxes = _gen(pool, "aux", [prompts[i]["aux"] for i in active], 1, cfg, tokens)
            mains = _gen(pool, "main", [prompts[i]["main"] for i in active], 1, cfg, tokens)
            still = []
            for j, i in enumerate(active):
                res = envs[i].step({"aux": auxes[j][0], "main": mains[j][0]})
                coop_return[i] += max(0.0, res.info.get("level/cooperation", 0.0))
                recs[i] = {"reward": res.team_reward, "pass_rate": res.info["pass_rate"],
                           "passed_all": res.info["passed_all"], "coop": coop_return[i] / num_turns}
                if not res.done:
                    prompts[i] = res.next_prompts
                    still.append(i)
            active = still
            if not active:
                break
        records.append([r for r in recs if r is not None])
    return records


# --------------------------------------------------------------------------------------------------- episode success
def success_rate(pool, env_factory: Callable, tasks: Sequence[Mapping[str, Any]], num_turns: int,
                 max_new_tokens: int, agent_order: str = "sequential") -> dict[str, float]:
    """Greedy (T=0) team episodes, one per task, as AT-GRPO validates: the fraction that ends in ``success``.

    Runs the AT-GRPO sampler with one candidate per agent, so the executed actions are the greedy decodes; an
    episode succeeds when any executed step reports ``info["success"] == 1``.
    """
    from .rollout import AgentTurnSampler

    greedy = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False)
    sampler = AgentTurnSampler(num_samples=1, num_turns=num_turns, agent_order=agent_order)
    experience = sampler.rollout(pool, env_factory, list(tasks), greedy)
    solved = {j.episode for j in experience.joint_actions if j.info.get("success", 0.0) >= 1.0}
    per_task = [1.0 if e in solved else 0.0 for e in range(len(tasks))]
    return {"success_rate": _mean(per_task), "ci95": bootstrap_interval(per_task), "episodes": float(len(tasks)),
            "team_reward": experience.stats.get("team_reward", math.nan)}
