"""Collaborative writing (TLDR summarisation, arXiv expansion): the trained pair against the four baselines.

Baselines (MAGRPO Sec. 5.1 and Appendix E), the same base model with the adapters OFF, the task description kept
fixed and only minimal coordination instructions added:

* ``single``: one agent is given the text and both roles, and writes both parts in one response, in the format
  ``<first label>: ...`` then ``<second label>: ...`` (:data:`SINGLE_PROMPT`); the parts are read back by their
  labels, or where the second label is missing, as the first paragraph and the rest, or the first sentence and the
  rest (:func:`split_single`). A response that cannot be split has an empty second part (reward 0, as the papers'
  early termination scores a missing part).
* ``naive``: each agent writes its part from its own prompt, in parallel, without seeing the other; the parts are
  joined. These are the team's own prompts (MAGRPO trains with the naive-concatenation prompts), so the untrained
  team IS this baseline (``eval_team_before_is_naive``).
* ``sequential``: the first agent writes; the second is shown the first's part and writes its own.
* ``discussion``: one round: both write as in ``naive``, then each is shown its own and the other's first answer and
  writes its part again; the revised parts are scored.

When they are evaluated together, ``sequential`` and ``discussion`` start from the very drafts the ``naive`` baseline
is scored on (:func:`~trl_multiagent.evaluation.core.run_programs` shares equal requests of one round between
methods): each method's samples keep their own distribution, and a third of the generation is saved.

``team`` is the pair with its adapters on, playing the training environment's episodes.

Per task and sample: ``reward`` (the joint writing reward of the environment's reward function, at most 1.0) and
its components ``structure``, ``style``, ``coherence`` (0 when the evaluation stopped early), and ``stopped`` (1 when
a gate of the reward stopped it). The details add each agent's mean response length in tokens.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trl_multiagent.environments.base import Environment
from trl_multiagent.environments.stepping import reset_env
from trl_multiagent.evaluation.core import PAIR_BASELINES, TEAM, MethodOutput, PairBaselinesEvaluator, Program, regroup
from trl_multiagent.evaluation.episodes import by_task, episode_texts, play_episodes
from trl_multiagent.metrics.stats import mean
from trl_multiagent.team.pool import GenerationRequest

BASELINES = PAIR_BASELINES
#: Every method of the writing evaluation, the team first.
METHODS = (TEAM, *BASELINES)
COMPONENTS = ("structure", "style", "coherence")

#: The single agent's prompt: the first agent's task, and the second part asked for in the same response.
SINGLE_PROMPT = """{first_prompt}

Then also do this:
{second_prompt}

Write both parts in this format:
{first_label}: <the first part>
{second_label}: <the second part>"""

SEQUENTIAL_SUFFIX = """

The other writer has written this {other_label}:
{other}
Write your own part so that it complements theirs."""

DISCUSSION_SUFFIX = """

Your previous answer:
{own}
The other writer's answer ({other_label}):
{other}
Revise your part so that the two parts work together. Output only your part."""


def label(agent: str) -> str:
    """A part's label in the single agent's format: the agent's name, capitalised (``Summary``, ``Elaboration``)."""
    return agent.replace("_", " ").capitalize()


def split_single(text: str, first_label: str, second_label: str) -> tuple[str, str]:
    """The two parts of a single agent's response, the most lenient reading first found of:

    1. by labels (case-insensitive, each at a line start, optionally in ``**``): the first part follows
       ``<first_label>:`` (or starts the response) up to ``<second_label>:``, the second follows ``<second_label>:``;
    2. without the second label, the first paragraph (up to a blank line) and the rest;
    3. without a blank line, the first sentence and the rest.

    A response that none of these splits has an empty second part.
    """
    second = re.search(rf"(?im)^[ \t*]*{re.escape(second_label)}[ \t*]*:", text)
    if second:
        head, tail = text[:second.start()], text[second.end():]
    else:
        head, tail = text, ""
    first = re.search(rf"(?im)^[ \t*]*{re.escape(first_label)}[ \t*]*:", head)
    if first:
        head = head[first.end():]
    if not second:
        head = head.strip()
        split = re.search(r"\n\s*\n", head) or re.search(r"(?<=[.!?])\s+(?=\S)", head)
        if split:
            head, tail = head[:split.start()], head[split.end():]
    return head.strip(), tail.strip()


def writing_record(breakdown) -> dict[str, float]:
    """One scored sample: the reward, its components (0 when the reward stopped early) and ``stopped``."""
    record = {"reward": float(breakdown.total), "stopped": float(breakdown.stopped_at is not None)}
    record.update({k: float(breakdown.levels.get(k, 0.0)) for k in COMPONENTS})
    return record


class WritingEvaluator(PairBaselinesEvaluator):
    """The writing evaluation (see the module docstring).

    Args:
        env_factory: the trainer's factory of a writing environment (:class:`~trl_multiagent.environments.TLDREnv`
            or :class:`~trl_multiagent.environments.ArxivExpansionEnv`); its reward function scores every method.
        num_turns: the team's turn budget (the papers' writing tasks have one turn).
    """

    name = "writing"
    metrics_preference = ("reward",)
    sampled = True
    default_num_tasks = 64
    own_held_out_split = True
    #: The team's prompts are the naive baseline's, so a fresh single-turn team is this baseline in distribution.
    naive_is_untrained_team = True

    def __init__(self, env_factory: Callable[[], Environment], num_turns: int = 1):
        env = env_factory()
        if len(env.agents) != 2 or not hasattr(env, "reward_fn") or not hasattr(env, "instruction"):
            raise ValueError(f"the writing evaluation needs a two-writer environment, got {type(env).__name__} "
                             f"with agents {list(env.agents)}")
        self.env_factory = env_factory
        self.num_turns = max(1, min(num_turns, env.max_turns))
        self.first, self.second = env.agents

    def program(self, method: str, tasks: Sequence[Mapping[str, Any]], num_samples: int) -> Program:
        if method == TEAM:
            episodes = yield from play_episodes(self.env_factory, tasks, num_samples, self.num_turns)
            records = [[self._score(ep.env, ep.actions[-1]) for ep in eps] for eps in by_task(episodes, len(tasks))]
            tokens = {a: [n for ep in episodes for n in ep.completion_tokens.get(a, [])] for a in (self.first,
                                                                                               self.second)}
            return MethodOutput(records, self._details(tokens), episode_texts(episodes))
        if method not in BASELINES:
            raise ValueError(f"the writing evaluation has the methods {list(METHODS)}, got {method!r}")
        return (yield from self._baseline(method, tasks, num_samples))

    def _score(self, env: Environment, action: Mapping[str, str]) -> dict[str, float]:
        return writing_record(env.reward_fn(action[self.first], action[self.second], weights=env.reward_weights))

    def _baseline(self, method: str, tasks: Sequence[Mapping[str, Any]], m: int) -> Program:
        first, second = self.first, self.second
        tokens: dict[str, list[int]] = {first: [], second: []}
        envs = [self.env_factory() for _ in tasks]
        prompts = [reset_env(env, task) for env, task in zip(envs, tasks)]
        n = len(tasks)

        def ask(agent: str, texts: Sequence[str], num: int) -> list[GenerationRequest]:
            return [GenerationRequest(agent, p, num, use_adapter=False) for p in texts]

        def texts(agent: str, generations) -> list[list[str]]:
            for group in generations:
                tokens[agent].extend(len(g.completion_ids) for g in group)
            return [[g.text for g in group] for group in generations]

        own = {a: [p[a] for p in prompts] for a in (first, second)}
        if method == "single":
            single = [SINGLE_PROMPT.format(first_prompt=p[first], second_prompt=p[second], first_label=label(first),
                                           second_label=label(second)) for p in prompts]
            answers = texts(first, (yield ask(first, single, m)))
            parts = [[split_single(t, label(first), label(second)) for t in group] for group in answers]
            firsts = [[a for a, _ in group] for group in parts]
            seconds = [[b for _, b in group] for group in parts]
        elif method == "naive":
            gens = yield ask(first, own[first], m) + ask(second, own[second], m)
            firsts, seconds = texts(first, gens[:n]), texts(second, gens[n:])
        elif method == "sequential":  # the second writer is shown the first's part: one prompt per sample
            firsts = texts(first, (yield ask(first, own[first], m)))
            shown = [own[second][i] + SEQUENTIAL_SUFFIX.format(other_label=label(first).lower(), other=a)
                     for i in range(n) for a in firsts[i]]
            seconds = regroup(texts(second, (yield ask(second, shown, 1))), m)
        else:  # discussion: one round of revision, each shown both first answers
            gens = yield ask(first, own[first], m) + ask(second, own[second], m)
            draft_a, draft_b = texts(first, gens[:n]), texts(second, gens[n:])
            pairs = [(i, a, b) for i in range(n) for a, b in zip(draft_a[i], draft_b[i])]
            revise = ask(first, [own[first][i] + DISCUSSION_SUFFIX.format(own=a, other=b,
                                                                          other_label=label(second).lower())
                                 for i, a, b in pairs], 1) + \
                ask(second, [own[second][i] + DISCUSSION_SUFFIX.format(own=b, other=a,
                                                                       other_label=label(first).lower())
                             for i, a, b in pairs], 1)
            gens = yield revise
            firsts = regroup(texts(first, gens[:len(pairs)]), m)
            seconds = regroup(texts(second, gens[len(pairs):]), m)
        records = [[self._score(envs[i], {first: a, second: b}) for a, b in zip(firsts[i], seconds[i])]
                   for i in range(n)]
        return MethodOutput(records, self._details(tokens))

    @staticmethod
    def _details(tokens: Mapping[str, list[int]]) -> dict[str, float]:
        return {f"tokens/{a}": mean(ns) for a, ns in tokens.items() if ns}

