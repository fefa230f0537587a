"""Question-answering metrics: normalized answers, accuracy by containment, exact match and token F1.

These are the three metrics of the MHGPO paper (Sec. "Evaluation Metrics", Table 1), in the usual SQuAD / HotpotQA
form: answers are lower-cased, stripped of punctuation and of the articles "a", "an", "the", and whitespace is
collapsed before comparing.

- ``exact_match``: the normalized prediction equals the normalized gold answer.
- ``accuracy``: the normalized gold answer occurs in the normalized prediction (as whole words).
- ``token_f1``: the harmonic mean of precision and recall of the bag of normalized tokens.

With several gold answers (aliases) every metric takes the best one. The same ``token_f1`` is the reward of the
search task and the intra-group similarity of MHGPO's Figure 9 (:func:`trl_multiagent.metrics.similarity.intra_group_similarity`).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans({c: " " for c in string.punctuation})


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and the articles a/an/the, collapse whitespace."""
    text = str(text).lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _golds(gold: str | Sequence[str]) -> list[str]:
    golds = [gold] if isinstance(gold, str) else list(gold)
    if not golds:
        raise ValueError("at least one gold answer is needed")
    return golds


def exact_match(prediction: str, gold: str | Sequence[str]) -> float:
    """1.0 when the normalized prediction equals a normalized gold answer, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _golds(gold)))


def accuracy(prediction: str, gold: str | Sequence[str]) -> float:
    """1.0 when a normalized gold answer occurs, as whole words, in the normalized prediction, else 0.0.

    An empty normalized gold answer (e.g. "the") never counts as contained."""
    pred = f" {normalize_answer(prediction)} "
    for g in _golds(gold):
        norm = normalize_answer(g)
        if norm and f" {norm} " in pred:
            return 1.0
    return 0.0


def token_f1(prediction: str, gold: str | Sequence[str]) -> float:
    """Best token-level F1 between the normalized prediction and a normalized gold answer.

    Two empty strings score 1.0; an empty string against a non-empty one scores 0.0."""
    best = 0.0
    pred_tokens = normalize_answer(prediction).split()
    for g in _golds(gold):
        gold_tokens = normalize_answer(g).split()
        if not pred_tokens or not gold_tokens:
            best = max(best, float(pred_tokens == gold_tokens))
            continue
        common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
        if common == 0:
            continue
        precision, recall = common / len(pred_tokens), common / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def qa_scores(prediction: str, gold: str | Sequence[str]) -> dict[str, float]:
    """``{"acc": ..., "em": ..., "f1": ...}`` of one prediction."""
    return {"acc": accuracy(prediction, gold), "em": exact_match(prediction, gold), "f1": token_f1(prediction, gold)}
