"""Cooperative coding (aux + main on HumanEval): the trained pair against the four inference-time baselines.

Baselines (MAGRPO Appendix E), all with the same models and their adapters OFF (the untrained bases):
``single`` (one agent writes the whole function), ``naive`` (aux and main write in parallel, their code is
concatenated), ``sequential`` (main sees aux's code), ``discussion`` (one round: each agent sees the other's first
answer and revises). ``team`` is the pair with its adapters on, playing the training environment's episodes (the
training prompts, up to ``num_turns`` turns with feedback).

Per task and sample: ``reward`` (the level-based joint reward of the last turn), ``pass@1`` (1 when every unit test
passes), ``acc@1`` (the fraction of tests passed), ``coop@1`` (the normalised cooperation return). Their per-task
means are the unbiased @1 metrics; the details add pass@k, acc@k and coop@k for every k of :data:`.at_k.KS` up to
the number of samples (MAGRPO App. B), and the mean response length of each agent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trl_multiagent.environments.base import Environment
from trl_multiagent.environments.stepping import thread_map
from trl_multiagent.evaluation.core import PAIR_BASELINES, TEAM, MethodOutput, PairBaselinesEvaluator, Program, regroup
from trl_multiagent.evaluation.episodes import by_task, episode_texts, play_episodes
from trl_multiagent.metrics.at_k import KS, at_k_metrics
from trl_multiagent.metrics.stats import mean
from trl_multiagent.team.pool import GenerationRequest

BASELINES = PAIR_BASELINES
#: Every method of the coding evaluation, the team first.
METHODS = (TEAM, *BASELINES)

SINGLE_PROMPT = """Solve this coding problem by implementing the required function.
Problem: {prompt}
Instructions:
{rules}
- Implement the '{entry_point}' function as specified
Your output should follow this format:
def {entry_point}({params}):
    # your function code here
    return result"""

SEQUENTIAL_SUFFIX = """
The helper agent has written this aux function, which you can call:
{aux}"""

DISCUSSION_SUFFIX = """
Your previous answer:
{own}
The other agent's answer:
{other}
Revise your function so that the two work together. Output ONLY the function code."""


def _params(task: Mapping[str, Any]) -> str:
    from trl_multiagent.environments.coding import signature_params

    return task.get("params") or signature_params(task)


def coding_record(reward: float, info: Mapping[str, float], coop: float) -> dict[str, float]:
    return {"reward": float(reward), "pass@1": float(info["passed_all"]), "acc@1": float(info["pass_rate"]),
            "coop@1": float(coop)}


class CodingEvaluator(PairBaselinesEvaluator):
    """The coding evaluation (see the module docstring).

    Args:
        env_factory: the trainer's factory of :class:`~trl_multiagent.environments.AuxMainCodingEnv` (its reward
            function and sandbox score the baselines too).
        num_turns: the team's turn budget.
    """

    name = "coding"
    metrics_preference = ("reward", "pass@1")
    sampled = True
    default_num_tasks = None  # every held-out problem
    own_held_out_split = True  # HumanEval's held-out cooperative problems, also for a team trained on MBPP
    naive_is_untrained_team = True  # MAGRPO trains with the naive-concatenation prompts

    def __init__(self, env_factory: Callable[[], Environment], num_turns: int):
        env = env_factory()
        if set(env.agents) != {"aux", "main"}:
            raise ValueError(f"the coding evaluation needs the aux/main environment, got agents {list(env.agents)}")
        self.env_factory, self.num_turns = env_factory, max(1, min(num_turns, env.max_turns))
        self.reward_fn, self.sandbox = env.reward_fn, env.sandbox

    def program(self, method: str, tasks: Sequence[Mapping[str, Any]], num_samples: int) -> Program:
        if method == TEAM:
            episodes = yield from play_episodes(self.env_factory, tasks, num_samples, self.num_turns)
            records = []
            for eps in by_task(episodes, len(tasks)):
                recs = []
                for ep in eps:
                    last = ep.steps[-1]
                    coop = sum(max(0.0, s.info.get("level/cooperation", 0.0)) for s in ep.steps) / self.num_turns
                    recs.append(coding_record(last.team_reward, last.info, coop))
                records.append(recs)
            tokens = {a: [n for ep in episodes for n in ep.completion_tokens.get(a, [])] for a in ("aux", "main")}
            return MethodOutput(records, self._details(records, num_samples, tokens), episode_texts(episodes))
        if method not in BASELINES:
            raise ValueError(f"the coding evaluation has the methods {list(METHODS)}, got {method!r}")
        return (yield from self._baseline(method, tasks, num_samples))

    def _baseline(self, method: str, tasks: Sequence[Mapping[str, Any]], m: int) -> Program:
        from trl_multiagent.environments.coding import AUX_PROMPT, CODE_ONLY_RULES, MAIN_PROMPT

        tokens: dict[str, list[int]] = {"aux": [], "main": []}

        def ask(agent: str, prompts: Sequence[str], n: int) -> list[GenerationRequest]:
            return [GenerationRequest(agent, p, n, use_adapter=False) for p in prompts]

        def texts(agent: str, generations) -> list[list[str]]:
            for group in generations:
                tokens[agent].extend(len(g.completion_ids) for g in group)
            return [[g.text for g in group] for group in generations]

        aux_p = [AUX_PROMPT.format(prompt=t["prompt"]) for t in tasks]
        main_p = [MAIN_PROMPT.format(prompt=t["prompt"], entry_point=t["entry_point"], params=_params(t))
                  for t in tasks]
        n = len(tasks)
        if method == "single":
            single = [SINGLE_PROMPT.format(prompt=t["prompt"], entry_point=t["entry_point"], params=_params(t),
                                           rules=CODE_ONLY_RULES) for t in tasks]
            mains = texts("main", (yield ask("main", single, m)))
            auxes = [[""] * m for _ in tasks]
        elif method == "naive":
            gens = yield ask("aux", aux_p, m) + ask("main", main_p, m)
            auxes, mains = texts("aux", gens[:n]), texts("main", gens[n:])
        elif method == "sequential":  # main sees the aux written for it: one prompt per sample
            auxes = texts("aux", (yield ask("aux", aux_p, m)))
            seq = [main_p[i] + SEQUENTIAL_SUFFIX.format(aux=a) for i in range(n) for a in auxes[i]]
            mains = regroup(texts("main", (yield ask("main", seq, 1))), m)
        else:  # discussion: one round, each agent sees both first answers and revises
            gens = yield ask("aux", aux_p, m) + ask("main", main_p, m)
            first_aux, first_main = texts("aux", gens[:n]), texts("main", gens[n:])
            pairs = [(i, a, b) for i in range(n) for a, b in zip(first_aux[i], first_main[i])]
            revise = ask("aux", [aux_p[i] + DISCUSSION_SUFFIX.format(own=a, other=b) for i, a, b in pairs], 1) + \
                ask("main", [main_p[i] + DISCUSSION_SUFFIX.format(own=b, other=a) for i, a, b in pairs], 1)
            gens = yield revise
            auxes = regroup(texts("aux", gens[:len(pairs)]), m)
            mains = regroup(texts("main", gens[len(pairs):]), m)
        records = self._score(tasks, auxes, mains)
        return MethodOutput(records, self._details(records, m, tokens))

    def _score(self, tasks, auxes: list[list[str]], mains: list[list[str]]) -> list[list[dict[str, float]]]:
        """Score every (problem, aux, main) in the sandbox, several at once (each run waits on a subprocess)."""
        from trl_multiagent.environments.coding import score_pair

        jobs = [(i, a, b) for i in range(len(tasks)) for a, b in zip(auxes[i], mains[i])]

        def score(job):
            i, a, b = job
            s = score_pair(tasks[i], a, b, self.reward_fn, self.sandbox)
            return i, coding_record(s["reward"], s["info"], max(0.0, s["info"].get("level/cooperation", 0.0)))

        scored = thread_map(score, jobs)
        records: list[list[dict[str, float]]] = [[] for _ in tasks]
        for i, record in scored:
            records[i].append(record)
        return records

    @staticmethod
    def _details(records, num_samples: int, tokens: Mapping[str, list[int]]) -> dict[str, float]:
        as_at_k = [[{"passed_all": r["pass@1"], "pass_rate": r["acc@1"], "coop": r["coop@1"]} for r in recs]
                   for recs in records]
        details = at_k_metrics(as_at_k, [k for k in KS if k <= num_samples])
        details.update({f"tokens/{a}": mean(ns) for a, ns in tokens.items() if ns})
        return details

