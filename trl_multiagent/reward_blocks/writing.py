"""Building blocks of the collaborative-writing rewards: structure, style consistency and logical coherence (MAGRPO
paper, Appendix C; CoLLM paper, Appendix F.1), and their composition over a task's settings.

The task rewards that recipes name are ``rewards/writing.py:tldr_reward`` and ``rewards/writing.py:arxiv_reward`` at
the repository's top level: each is :func:`writing_reward` over the task's settings (:data:`TLDR`, :data:`ARXIV`),
which is also the default of the writing environments (:mod:`trl_multiagent.environments.writing`), so that an
installed package without the repository scores the same. A new two-part writing task composes its own reward from
the blocks below (see ``docs/guides/new_environment.md``).

Two agents write two parts of one text; the second part is compared with the first.

==================  ===================================================================================  =========
component           what is measured                                                                     max
==================  ===================================================================================  =========
structure           the mean of two banded scores: the length ratio (words of the second part / words    1.0
                    of the first) and the unique-word ratio (distinct non-stopwords of the second /
                    of the first). Inside the full band a ratio scores 1, in the acceptable band it
                    scores linearly less towards the band's edge, outside it the whole evaluation stops
                    with reward 0 ("early termination" in the papers)
style               the Jaccard similarity of the two parts' non-stopword vocabularies, capped at         1.0
                    ``jaccard_cap`` and divided by it: ``min(J, cap) / cap``
coherence           transition words of 12 categories in the combined text: with ``n`` categories used,  1.0
                    ``min(c * ln(n + 1), 1)``
==================  ===================================================================================  =========

The total is the weighted sum (weights :data:`WEIGHTS`, a third each, so the maximum is 1.0). The papers give the
components, bands, caps and coefficients, not the weights; these are this project's choice.

Task settings (:data:`TLDR`, :data:`ARXIV`):

* TLDR (summary, then elaboration): length ratio full 1.6-3.2, acceptable 1.1-5.0; unique-word ratio full >= 2.0,
  acceptable >= 1.3; Jaccard cap 0.03; coherence ``min(0.6 ln(n + 1), 1)``.
* arXiv (background, then method): length ratio full 1.0-1.3, acceptable 0.8-1.5; unique-word ratio full
  0.7-1.3, acceptable 0.5-1.7; Jaccard cap 0.23; coherence ``min(0.4 ln(n + 1), 1)``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

WEIGHTS: dict[str, float] = {"structure": 1.0 / 3.0, "style": 1.0 / 3.0, "coherence": 1.0 / 3.0}
MAX_REWARD = 1.0

#: Common English function words, left out of vocabularies (the unique-word ratio and the Jaccard similarity).
STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below between both but by
can could did do does doing down during each few for from further had has have having he her here hers herself him
himself his how i if in into is it its itself just me more most my myself no nor not now of off on once only or other
our ours ourselves out over own same she should so some such than that the their theirs them themselves then there
these they this those through to too under until up very was we were what when where which while who whom why will
with would you your yours yourself yourselves also s t don doesn didn isn wasn aren weren won wouldn shouldn couldn
""".split())

#: Transition words and phrases in 12 functional categories (lower case; matched on word boundaries).
TRANSITION_CATEGORIES: dict[str, tuple[str, ...]] = {
    "addition": ("additionally", "furthermore", "moreover", "in addition", "besides", "as well as"),
    "contrast": ("however", "on the other hand", "in contrast", "nevertheless", "whereas", "conversely"),
    "concession": ("although", "even though", "despite", "admittedly", "even so", "though"),
    "cause": ("because", "since", "due to", "owing to", "given that"),
    "consequence": ("therefore", "thus", "consequently", "hence", "as a result", "accordingly"),
    "example": ("for example", "for instance", "such as", "namely", "to illustrate"),
    "emphasis": ("indeed", "in fact", "notably", "especially", "particularly", "above all"),
    "sequence": ("first", "second", "third", "then", "next", "finally", "afterwards", "subsequently", "meanwhile"),
    "comparison": ("similarly", "likewise", "in the same way", "compared to", "compared with"),
    "conclusion": ("in conclusion", "in summary", "overall", "to sum up", "in short", "ultimately"),
    "clarification": ("in other words", "that is", "specifically", "to clarify", "to put it simply"),
    "condition": ("unless", "provided that", "otherwise", "in case", "as long as"),
}
_PATTERNS = {name: re.compile(r"\b(?:" + "|".join(re.escape(p) for p in phrases) + r")\b")
             for name, phrases in TRANSITION_CATEGORIES.items()}
_WORD = re.compile(r"[a-z][a-z']*")


@dataclass(frozen=True)
class WritingTask:
    """Bands, cap and coefficient of one writing task (see the module docstring)."""

    length_full: tuple[float, float]
    length_accept: tuple[float, float]
    unique_full: tuple[float, float]
    unique_accept: tuple[float, float]
    jaccard_cap: float
    coherence_coef: float


TLDR = WritingTask(length_full=(1.6, 3.2), length_accept=(1.1, 5.0), unique_full=(2.0, math.inf),
                   unique_accept=(1.3, math.inf), jaccard_cap=0.03, coherence_coef=0.6)
ARXIV = WritingTask(length_full=(1.0, 1.3), length_accept=(0.8, 1.5), unique_full=(0.7, 1.3),
                    unique_accept=(0.5, 1.7), jaccard_cap=0.23, coherence_coef=0.4)


@dataclass
class RewardBreakdown:
    """The joint reward and its components; ``stopped_at`` names the gate that ended the evaluation, if any."""

    total: float
    levels: dict[str, float] = field(default_factory=dict)
    stopped_at: str | None = None


def words(text: str) -> list[str]:
    """Lower-case words of a text."""
    return _WORD.findall(text.lower()) if isinstance(text, str) else []


def vocabulary(text: str) -> set[str]:
    """Distinct non-stopwords of a text."""
    return {w for w in words(text) if w not in STOPWORDS}


def banded_score(value: float, full: tuple[float, float], accept: tuple[float, float]) -> float | None:
    """1 inside ``full``; inside ``accept`` but outside ``full``, a linear ramp from 0 at the edge of ``accept`` to 1
    at the edge of ``full``; ``None`` outside ``accept`` (the evaluation stops)."""
    lo, hi = accept
    full_lo, full_hi = full
    if not lo <= value <= hi:
        return None
    if full_lo <= value <= full_hi:
        return 1.0
    if value < full_lo:
        return (value - lo) / (full_lo - lo)
    return (hi - value) / (hi - full_hi)


def length_ratio(first: str, second: str) -> float:
    """Words of the second part per word of the first."""
    return len(words(second)) / max(len(words(first)), 1)


def unique_word_ratio(first: str, second: str) -> float:
    """Distinct non-stopwords of the second part per distinct non-stopword of the first."""
    return len(vocabulary(second)) / max(len(vocabulary(first)), 1)


def jaccard(first: str, second: str) -> float:
    """Jaccard similarity of the two non-stopword vocabularies (0 when both are empty)."""
    a, b = vocabulary(first), vocabulary(second)
    return len(a & b) / len(a | b) if a | b else 0.0


def capped_jaccard(first: str, second: str, cap: float) -> float:
    """Style consistency: ``min(J, cap) / cap``."""
    return min(jaccard(first, second), cap) / cap


def transition_categories(text: str) -> set[str]:
    """The categories of :data:`TRANSITION_CATEGORIES` that ``text`` uses at least once."""
    low = text.lower() if isinstance(text, str) else ""
    return {name for name, pattern in _PATTERNS.items() if pattern.search(low)}


def coherence_score(text: str, coefficient: float) -> float:
    """Logical coherence: ``min(coefficient * ln(n + 1), 1)`` for ``n`` transition categories used."""
    return min(coefficient * math.log(len(transition_categories(text)) + 1), 1.0)


def writing_reward(first: str, second: str, task: WritingTask, weights: Mapping[str, float] | None = None) -> RewardBreakdown:
    """The weighted structure + style + coherence reward of a two-part text under ``task``'s bands, cap and
    coefficient (see the module docstring): the gates in order (empty text, length ratio, unique-word ratio), then
    the three components and their weighted sum."""
    w = {**WEIGHTS, **(weights or {})}
    if not words(first) or not words(second):
        return RewardBreakdown(0.0, {"structure": 0.0, "style": 0.0, "coherence": 0.0}, stopped_at="empty")
    ratio = length_ratio(first, second)
    unique = unique_word_ratio(first, second)
    levels = {"length_ratio": ratio, "unique_ratio": unique}
    length = banded_score(ratio, task.length_full, task.length_accept)
    if length is None:
        return RewardBreakdown(0.0, {**levels, "structure": 0.0, "style": 0.0, "coherence": 0.0}, stopped_at="length")
    diversity = banded_score(unique, task.unique_full, task.unique_accept)
    if diversity is None:
        return RewardBreakdown(0.0, {**levels, "structure": 0.0, "style": 0.0, "coherence": 0.0},
                               stopped_at="unique_words")
    levels["structure"] = (length + diversity) / 2.0
    levels["style"] = capped_jaccard(first, second, task.jaccard_cap)
    levels["coherence"] = coherence_score(first + "\n" + second, task.coherence_coef)
    total = sum(w[k] * levels[k] for k in ("structure", "style", "coherence"))
    return RewardBreakdown(total, levels)

