"""Task rewards of the two collaborative-writing tasks: TLDR summarization and arXiv expansion.

Name one in a recipe as ``env_kwargs: {reward_fn: rewards/writing.py:tldr_reward}``; the environment calls it as
``fn(first_text, second_text, weights=...)`` and reads ``total`` (the joint reward), ``levels`` and ``stopped_at``
from what it returns. Each reward is the paper's structure + style + coherence measure, built from the blocks of
``trl_multiagent.reward_blocks.writing``:

* structure: the words of the second text per word of the first (``length_ratio``) and its distinct non-stopwords
  per distinct non-stopword of the first (``unique_word_ratio``), each scored in the task's bands
  (``banded_score``: 1 in the full band, a linear ramp in the acceptable band); a ratio outside its acceptable band
  stops the evaluation with reward 0;
* style: the Jaccard similarity of the two vocabularies, capped (``capped_jaccard``);
* coherence: the transition-word categories of the joint text, ``min(c ln(n + 1), 1)`` (``coherence_score``).

The total is their weighted sum (a third each: ``WEIGHTS``), at most 1. ``writing_reward`` applies the gates and the
sum over a task's settings (``TLDR``, ``ARXIV``: bands, cap and coefficient); the environments use the same function
when no reward is named, so an installed package scores exactly as these functions do.

A different writing task copies this file and changes the settings (``WritingTask(...)``) or composes the blocks in
its own order (docs/guides/new_environment.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from trl_multiagent.reward_blocks.writing import ARXIV, TLDR, RewardBreakdown, writing_reward


def tldr_reward(summary: str, elaboration: str, weights: Mapping[str, float] | None = None) -> RewardBreakdown:
    """TLDR summarization (MAGRPO Sec. 5.1 "Writing Collaboration" and App. C; CoLLM App. F.1).

    ``summary`` is the concise summary, ``elaboration`` the detailed one. Settings (``TLDR``): the elaboration has
    1.6-3.2 times the summary's words (acceptable 1.1-5.0) and at least 2 times its distinct words (acceptable 1.3);
    Jaccard cap 0.03; coherence ``min(0.6 ln(n + 1), 1)``. ``weights`` overrides the component weights.
    """
    return writing_reward(summary, elaboration, TLDR, weights)


def arxiv_reward(background: str, method: str, weights: Mapping[str, float] | None = None) -> RewardBreakdown:
    """arXiv expansion (MAGRPO Sec. 5.1 "Writing Collaboration" and App. C; CoLLM App. F.1).

    ``background`` covers the background and motivation, ``method`` the method and its implications. Settings
    (``ARXIV``): length ratio 1.0-1.3 (acceptable 0.8-1.5), unique-word ratio 0.7-1.3 (acceptable 0.5-1.7); Jaccard
    cap 0.23; coherence ``min(0.4 ln(n + 1), 1)``. ``weights`` overrides the component weights.
    """
    return writing_reward(background, method, ARXIV, weights)
