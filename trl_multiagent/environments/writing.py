"""Collaborative writing (MAGRPO paper, Sec. 5 and Appendix C-D; CoLLM paper, Sec. 6.1, App. E.1, F.1).

Two agents write two parts of one text at the same time, each from its own prompt:

* :class:`TLDREnv`: ``summary`` writes a concise summary of a post, ``elaboration`` a detailed one that uses
  transition words (TLDR summarization; column ``prompt``, as in the hub dataset ``trl-lib/tldr``).
* :class:`ArxivExpansionEnv`: ``background`` expands an abstract into the background and motivation of an
  introduction, ``method`` into its method and implications (column ``abstract``).

The joint reward is the structure + style + coherence reward of :mod:`trl_multiagent.reward_blocks.writing` (its
``total``, at most 1.0) over the task's settings, with the second agent's text compared against the first's; recipes
name it as ``rewards/writing.py:tldr_reward`` / ``rewards/writing.py:arxiv_reward``. The papers' writing tasks have
one turn; with ``max_turns > 1`` each agent gets the reward components and its own previous draft and writes again.

Offline data: ``make_dataset(num_tasks, seed, split)`` generates Reddit-like posts (TLDR) or paper abstracts (arXiv)
from templates and word lists of this module; train and eval texts come from separate random streams, and a text
belongs to a split by a hash of itself (no eval text is ever trained on). Recipes name a hub dataset instead
(``dataset: trl-lib/tldr``), which loads only where a hub is reachable.
"""

from __future__ import annotations

import abc
import functools
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

from trl_multiagent.environments.base import Environment, StepResult
from trl_multiagent.environments.checks import need_int, need_tasks, need_weights
from trl_multiagent.environments.games.base import generate_split
from trl_multiagent.reward_blocks.writing import ARXIV, TLDR, WritingTask, writing_reward
from trl_multiagent.runtime.user_code import import_object

logger = logging.getLogger(__name__)


class _WritingEnv(Environment, abc.ABC):
    """Two writers, one joint reward ``reward_fn(first_text, second_text).total``."""

    agents: tuple[str, str] = ("first", "second")
    max_turns = 1
    reward_max = 1.0
    game = "writing"
    source_column = "text"
    #: The bands, cap and coefficient of the default reward (:func:`.reward_blocks.writing.writing_reward`).
    writing_task: WritingTask

    def __init__(self, max_turns: int = 1, reward_fn: str | Callable | None = None,
                 reward_weights: Mapping[str, float] | None = None):
        self.max_turns = need_int("max_turns", max_turns, minimum=1)
        default = functools.partial(writing_reward, task=self.writing_task)
        self.reward_fn = import_object(reward_fn, "reward_fn") if reward_fn else default
        self.reward_weights = dict(need_weights("reward_weights", reward_weights)) if reward_weights else None
        self.source = ""
        self.turn = 0
        self.drafts: dict[str, str] = {}
        self.feedback = ""

    @abc.abstractmethod
    def instruction(self, agent: str) -> str:
        """The prompt of ``agent`` for the current source text."""

    def reset(self, task: Mapping[str, Any]) -> dict[str, str]:
        self.source = str(task[self.source_column])
        self.turn, self.drafts, self.feedback = 0, {}, ""
        return self.prompts()

    def prompts(self) -> dict[str, str]:
        out = {}
        for agent in self.agents:
            text = self.instruction(agent)
            if self.turn > 0:
                text += (f"\n\nRound {self.turn + 1} of {self.max_turns}. Scores of the last joint text: "
                         f"{self.feedback}\nYour last draft:\n{self.drafts[agent]}\nWrite an improved version.")
            out[agent] = text
        return out

    def step(self, joint_action: Mapping[str, str]) -> StepResult:
        if set(joint_action) != set(self.agents):
            raise ValueError(f"{type(self).__name__}.step expects one text per agent {list(self.agents)}, "
                             f"got {sorted(joint_action)}")
        first, second = (joint_action[a] if isinstance(joint_action[a], str) else "" for a in self.agents)
        breakdown = self.reward_fn(first, second, weights=self.reward_weights)
        info = {k: float(v) for k, v in breakdown.levels.items()}
        info["stopped"] = float(breakdown.stopped_at is not None)
        info["score"] = float(breakdown.total)
        self.drafts = {a: joint_action[a] for a in self.agents}
        self.feedback = ", ".join(f"{k} {v:.2f}" for k, v in info.items() if k in ("structure", "style", "coherence"))
        if breakdown.stopped_at is not None:
            self.feedback += f" (stopped at {breakdown.stopped_at}: reward 0)"
        self.turn += 1
        done = self.turn >= self.max_turns
        return StepResult(team_reward=float(breakdown.total), next_prompts=None if done else self.prompts(),
                          done=done, info=info)

    # data
    @classmethod
    @abc.abstractmethod
    def draw(cls, rng: random.Random) -> dict:
        """One generated task row (the source text in ``source_column``)."""

    @classmethod
    def make_rows(cls, num_tasks: int, seed: int = 0, split: str = "train") -> list[dict]:
        """:meth:`make_dataset` as a list of dicts."""
        return generate_split(cls.game, num_tasks, seed, split, cls.draw, lambda t: t[cls.source_column])

    @classmethod
    def make_dataset(cls, num_tasks: int = 64, seed: int = 0, split: str = "train"):
        """``num_tasks`` distinct generated texts of ``split`` (``"train"`` or ``"eval"``) as a ``Dataset``."""
        from datasets import Dataset

        need_tasks(num_tasks)

        rows = cls.make_rows(num_tasks, seed, split)
        logger.info("%s: generated %d %s texts (seed %d)", cls.game, len(rows), split, seed)
        return Dataset.from_list(rows)


class TLDREnv(_WritingEnv):
    """TLDR summarization by a ``summary`` agent and an ``elaboration`` agent.

    Args:
        max_turns: writing rounds (1 in the papers).
        reward_fn: ``fn(first, second, weights=...)`` returning an object with ``total``, ``levels`` and
            ``stopped_at``, or its ``"module:function"`` / ``"path/to/file.py:function"`` name. Default:
            :func:`~trl_multiagent.reward_blocks.writing.writing_reward` over :attr:`writing_task`, the reward that
            ``rewards/writing.py:tldr_reward`` names.
        reward_weights: overrides of the component weights (``trl_multiagent.reward_blocks.writing.WEIGHTS``).
    """

    agents = ("summary", "elaboration")
    game = "tldr"
    source_column = "prompt"
    required_columns = ("prompt",)
    writing_task = TLDR

    def instruction(self, agent: str) -> str:
        if agent == "summary":
            return (f"Write a short summary of this post.\nPost: {self.source}\n"
                    "Keep it brief: a few focused sentences.")
        return (f"Write a detailed summary of this post.\nPost: {self.source}\n"
                "Cover the details, and link your sentences with transition words.")

    @classmethod
    def draw(cls, rng: random.Random) -> dict:
        return {"prompt": synthetic_post(rng)}


class ArxivExpansionEnv(_WritingEnv):
    """arXiv expansion by a ``background`` agent and a ``method`` agent.

    Args: those of :class:`TLDREnv` (the default reward is the one ``rewards/writing.py:arxiv_reward`` names).
    """

    agents = ("background", "method")
    game = "arxiv"
    source_column = "abstract"
    required_columns = ("abstract",)
    writing_task = ARXIV

    def instruction(self, agent: str) -> str:
        mine, theirs = ("the background and motivation", "the method and its implications") \
            if agent == "background" else ("the method and its implications", "the background and motivation")
        return (f"Expand this paper abstract into a paragraph of the introduction.\nAbstract: {self.source}\n"
                f"Another writer covers {theirs}; write only about {mine}, without repeating the other part.")

    @classmethod
    def draw(cls, rng: random.Random) -> dict:
        return {"abstract": synthetic_abstract(rng)}


# --------------------------------------------------------------------------------------------------- offline texts
_NAMES = ["my roommate", "my sister", "my best friend", "my manager", "my neighbour", "my partner", "my cousin",
          "a coworker", "my landlord", "my brother"]
_TOPICS = ["splitting rent", "a borrowed car", "a surprise party", "a noisy dog", "a missed deadline",
           "a wedding invitation", "a shared kitchen", "a group trip", "an unpaid loan", "a job offer in another city",
           "a broken laptop", "weekend plans", "a secret about a friend", "the thermostat", "a new puppy"]
_FEELINGS = ["frustrated", "confused", "guilty", "annoyed", "anxious", "hurt", "torn", "embarrassed", "relieved"]
_EVENTS = [
    "{who} told me about {topic} only the night before",
    "we argued about {topic} for most of the evening",
    "{who} promised to handle {topic} but never did",
    "I found out that {who} had talked to everyone about {topic}",
    "{who} asked me to cover for them regarding {topic}",
    "we agreed on a plan for {topic} and then {who} changed it without asking",
]
_QUESTIONS = ["Am I overreacting?", "How do I bring this up without a fight?", "What would you do?",
              "Should I just let it go?", "Is it fair to ask for an apology?"]


def synthetic_post(rng: random.Random) -> str:
    """A Reddit-style advice post of a few sentences (offline stand-in for the TLDR dataset's ``prompt``)."""
    who, topic = rng.choice(_NAMES), rng.choice(_TOPICS)
    age = rng.randint(19, 45)
    sentences = [f"I ({age}) have known {who} for {rng.randint(2, 15)} years and we usually get along."]
    for event in rng.sample(_EVENTS, rng.randint(2, 3)):
        sentences.append(event.format(who=who, topic=topic).capitalize() + ".")
    sentences.append(f"Now I feel {rng.choice(_FEELINGS)} and a bit {rng.choice(_FEELINGS)}.")
    sentences.append(rng.choice(_QUESTIONS))
    return "SUBREDDIT: r/relationship_advice\nPOST: " + " ".join(sentences) + "\nTL;DR:"


_FIELDS = ["graph neural networks", "speech recognition", "protein folding", "reinforcement learning",
           "machine translation", "image segmentation", "time-series forecasting", "recommender systems",
           "code generation", "federated learning", "3D reconstruction", "anomaly detection"]
_PROBLEMS = ["require large labelled datasets", "degrade under distribution shift", "scale poorly with input length",
             "are expensive to train", "ignore uncertainty", "struggle with rare classes", "are hard to interpret"]
_METHODS = ["a contrastive pre-training objective", "a sparse mixture of experts", "a hierarchical attention module",
            "a curriculum over task difficulty", "a learned data augmentation policy", "a lightweight adapter layer",
            "a probabilistic calibration step", "a retrieval component"]
_RESULTS = ["improves accuracy by {n} points", "reduces training cost by {n} percent",
            "matches the state of the art with {n} times fewer parameters", "cuts error rates by {n} percent"]


def synthetic_abstract(rng: random.Random) -> str:
    """A paper abstract of a few sentences (offline stand-in for an arXiv dataset's ``abstract``)."""
    topic, problem, method = rng.choice(_FIELDS), rng.choice(_PROBLEMS), rng.choice(_METHODS)
    result = rng.choice(_RESULTS).format(n=rng.randint(2, 30))
    benchmarks = rng.randint(2, 6)
    return (f"Recent methods for {topic} {problem}. We study why this happens and show that it limits their use in "
            f"practice. We propose {method} that addresses this limitation with little extra computation. On "
            f"{benchmarks} benchmarks, our approach {result} over strong baselines. We also analyse when the method "
            f"helps most and release our code.")
