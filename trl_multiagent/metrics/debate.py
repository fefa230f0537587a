"""Debate metrics of MAPoRL (Park et al., arXiv 2502.18439): the majority vote with its tie rule (Sec. 4.1), the
majority of an agent's peers (Tables 1-2) and the correctness transitions between turns (Sec. 4.3, Tables 3-4).

They score debates; the collaboration incentives of :mod:`trl_multiagent.credit.maporl` read :func:`peer_majority`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def majority_vote_accuracy(answers: Sequence[Hashable | None], correct: Sequence[bool | float]) -> float:
    """Accuracy of the majority vote over one turn's answers, with the tie rule of Sec. 4.1.

    ``answers[i]`` is agent i's answer as a canonical key (equal keys = the same answer; ``None`` = no answer, which
    casts no vote) and ``correct[i]`` whether it is right. The answers with the most votes win; when several tie,
    the score is the expected accuracy of picking one of the tied answers uniformly ("the expected accuracy of
    selecting the first agent's answer"), i.e. the fraction of the tied answers that are right. No vote at all
    scores 0.
    """
    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} answers but {len(correct)} correctness flags")
    votes: dict[Hashable, int] = {}
    right: dict[Hashable, bool] = {}
    for key, ok in zip(answers, correct):
        if key is None:
            continue
        votes[key] = votes.get(key, 0) + 1
        right[key] = right.get(key, False) or bool(ok)
    if not votes:
        return 0.0
    top = max(votes.values())
    tied = [k for k, v in votes.items() if v == top]
    return sum(right[k] for k in tied) / len(tied)


def peer_majority(answers: Sequence[Hashable | None], correct: Sequence[bool | float], agent: int) -> float:
    """Tie-rule majority accuracy (:func:`majority_vote_accuracy`) of the answers of every agent but ``agent``.

    This is "Majority (t)" of Tables 1-2 in our reading: the answers the agent reads (Table 1) or influences
    (Table 2) are the others'; with two agents it is simply the other agent's correctness.
    """
    others = [i for i in range(len(answers)) if i != agent]
    if not others:
        raise ValueError("a peer majority needs at least two agents")
    return majority_vote_accuracy([answers[i] for i in others], [correct[i] for i in others])


def transition_fractions(correct: Sequence[Sequence[Sequence[bool | float]]],
                         answers: Sequence[Sequence[Sequence[Hashable | None]]] | None = None) -> list[dict[str, float]]:
    """Fractions of answers changing correctness from turn t to t+1 (Sec. 4.3 and the columns of Tables 3-4).

    ``correct[d][i][t]``: whether agent i's answer at turn t of debate d is right; ``answers[d][i][t]`` its canonical
    answer key (``None``: no answer), used for the majorities. Every debate needs the same number of turns (fill
    early-stopped debates first, :func:`~trl_multiagent.credit.maporl.fill_after_early_stop`). Returns one dict per transition t -> t+1 with
    ``"RR"``, ``"RW"``, ``"WR"``, ``"WW"`` (answer at t, answer at t+1) over all (debate, agent) pairs, and the
    Table 3-4 triples ``"RWR"``, ``"RWW"``, ``"WRW"``, ``"WRR"`` (answer t, answer t+1, majority of the OTHER agents
    at t: :func:`peer_majority`, whose tie rule splits a tied majority between R and W by its expected accuracy).
    Without ``answers`` every wrong answer counts as a different answer.
    """
    if not correct:
        return []
    turns = {len(row) for debate in correct for row in debate}
    if len(turns) != 1:
        raise ValueError("every agent of every debate needs the same number of turns")
    num_turns = turns.pop()
    out = []
    for t in range(num_turns - 1):
        counts = dict.fromkeys(("RR", "RW", "WR", "WW", "RWR", "RWW", "WRW", "WRR"), 0.0)
        pairs = 0
        for d, debate in enumerate(correct):
            n = len(debate)
            now = [bool(debate[i][t]) for i in range(n)]
            if answers is not None:
                keys = [answers[d][j][t] for j in range(n)]
            else:
                keys = ["right" if now[j] else ("wrong", j) for j in range(n)]
            for i in range(n):
                key = ("R" if now[i] else "W") + ("R" if debate[i][t + 1] else "W")
                counts[key] += 1
                pairs += 1
                if n > 1 and key in ("RW", "WR"):
                    m = peer_majority(keys, now, i)
                    counts[key + "R"] += m
                    counts[key + "W"] += 1 - m
        out.append({k: v / pairs for k, v in counts.items()} if pairs else counts)
    return out
