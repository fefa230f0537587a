"""Shared prompt prefixes: which prompts begin with the same tokens, so that the prefix runs once.

:func:`shared_prefixes` is the one grouping: team-level generation prefills each group's prefix once
(:func:`~trl_multiagent.generation.decoding.decode`'s ``prefix``), and the teacher-forced pass runs it once
(:func:`~trl_multiagent.generation.teacher_forcing.completion_outputs`).
"""

from __future__ import annotations

from collections.abc import Sequence


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _runs(prompts, order: list[int], lcp: list[int], threshold: int) -> list[tuple[list[int], int]]:
    """The runs of the sorted ``order`` whose neighbours share at least ``threshold`` tokens, each with its prefix
    length (their common prefix, leaving every member at least one token; at least 1)."""
    out, run, common = [], [order[0]], len(prompts[order[0]])
    for j, shared in enumerate(lcp):
        nxt = order[j + 1]
        if shared >= threshold:
            run.append(nxt)
            common = min(common, shared)
        else:
            out.append((run, common))
            run, common = [nxt], len(prompts[nxt])
    out.append((run, common))
    return [(run, max(1, min(common, min(len(prompts[i]) for i in run) - 1))) for run, common in out]


def shared_prefixes(prompts: Sequence[Sequence[int]], keys: Sequence[object]) -> tuple[list[int], list[int]]:
    """Groups of prompts (token ids) that begin with the same tokens, to prefill each group's prefix once.

    Prompts group only with prompts of the same ``key`` (their adapter: the prefix's cache depends on it). Within a
    key, the prompts are sorted; a group is a run of neighbours whose common prefix is at least a threshold, and its
    prefix is the run's common prefix, shortened to leave every prompt at least one token of its own. The threshold
    is the one (among the neighbours' common prefix lengths) that saves the most prefilled tokens,
    ``sum over groups of (size - 1) x prefix length``. A prompt that shares nothing forms a group of its own (its
    prefix is all but its last token).

    Returns the group of each prompt and each group's prefix length, at least 1 when every prompt has at least two
    tokens; otherwise each prompt is its own group with a prefix of 0 (the caller then prefills as usual).
    """
    if any(len(p) < 2 for p in prompts):
        return list(range(len(prompts))), [0] * len(prompts)
    group_of = [0] * len(prompts)
    prefix_len: list[int] = []
    by_key: dict[object, list[int]] = {}
    for i, key in enumerate(keys):
        by_key.setdefault(key, []).append(i)
    for members in by_key.values():
        order = sorted(members, key=lambda i: tuple(prompts[i]))
        lcp = [_common_prefix(prompts[a], prompts[b]) for a, b in zip(order, order[1:])]

        candidates = sorted({t for t in lcp if t > 1})
        best = max((_runs(prompts, order, lcp, t) for t in candidates), default=_runs(prompts, order, lcp, 10**9),
                   key=lambda groups: sum((len(run) - 1) * length for run, length in groups))
        for run, length in best:
            for i in run:
                group_of[i] = len(prefix_len)
            prefix_len.append(length)
    return group_of, prefix_len


def _distinct_prefix_depths(prompts: Sequence[Sequence[int]]):
    """The length of every distinct non-empty prefix of ``prompts`` (the depth of each node of their token trie),
    each once."""
    root: dict = {}
    for prompt in prompts:
        node = root
        for depth, token in enumerate(prompt, 1):
            child = node.get(token)
            if child is None:
                child = node[token] = {}
                yield depth
            node = child


def distinct_prefix_tokens(prompts: Sequence[Sequence[int]]) -> int:
    """The token positions a pass over ``prompts`` needs at least when every shared prefix runs once: the number of
    distinct non-empty prefixes (the nodes of their token trie). ``[[1, 2, 3], [1, 2, 4], [1, 2, 3]]`` needs 4:
    ``1``, ``1 2``, ``1 2 3``, ``1 2 4``. The physical bound of the training passes counts prompts this way
    (``tokens/loss_needed``)."""
    return sum(1 for _ in _distinct_prefix_depths(prompts))


def needed_attention_pairs(prompts: Sequence[Sequence[int]], completion_lengths: Sequence[int]) -> int:
    """The (query, key) position pairs a causal pass over ``prompts`` and their completions needs at least, counted
    as :func:`distinct_prefix_tokens` counts positions: each distinct prompt prefix once, its last position attending
    to its every position (itself included), and the ``j``-th token of a completion of a prompt of ``n`` tokens to
    ``n + j`` positions. ``[[1, 2], [1, 3]]`` with completions of 2 and 0 tokens: the prefixes ``1``, ``1 2``, ``1 3``
    attend 1 + 2 + 2 positions, the first completion 3 + 4: 12 pairs. Masked pairs that a kernel computes anyway
    (padding, other completions packed into one sequence) are not counted. The physical bound of the training passes
    counts attention's score products by these pairs (``tokens/loss_attention_pairs``)."""
    if len(prompts) != len(completion_lengths):
        raise ValueError(f"{len(prompts)} prompts but {len(completion_lengths)} completion lengths")
    return sum(_distinct_prefix_depths(prompts)) + sum(
        c * len(p) + c * (c + 1) // 2 for p, c in zip(prompts, completion_lengths))
