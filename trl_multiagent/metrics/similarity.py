"""How alike the outputs of a group are: MHGPO's intra-group similarity (Figure 9 of "Heterogeneous Group-Based
Reinforcement Learning for LLM-based Multi-Agent Systems", Chen et al.), logged per agent by the pipeline sampler."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence

from trl_multiagent.metrics.qa import token_f1


def intra_group_similarity(texts: Sequence[str], group_ids: Sequence[Hashable],
                           similarity: Callable[[str, str], float] = token_f1) -> float:
    """MHGPO Figure 9: the mean pairwise similarity (token F1 by default) of the outputs inside a group, averaged
    over the groups that have at least two members; NaN when none has.

    It measures how close a heterogeneous group is to a homogeneous one: it rises during training as sampling
    diversity falls, which is the paper's explanation of why heterogeneous groups work (Sec. "Question 4").
    """
    if len(texts) != len(group_ids):
        raise ValueError(f"{len(texts)} texts but {len(group_ids)} group ids")
    members: dict[Hashable, list[str]] = defaultdict(list)
    for t, g in zip(texts, group_ids):
        members[g].append(t)
    per_group = []
    for group in members.values():
        if len(group) < 2:
            continue
        pairs = list(itertools.combinations(group, 2))
        per_group.append(sum(similarity(a, b) for a, b in pairs) / len(pairs))
    return sum(per_group) / len(per_group) if per_group else math.nan
