"""AT-GRPO's agent-wise credit and greedy transition (Stronger-MAS, Sec. 4.1, Algorithm 1, Eq. 3)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def mix_rewards(team: float, local: float, alpha: float) -> float:
    """AT-GRPO's agent-wise credit, Eq. 3: ``r_{t,i} = alpha * r_team_t + r_local_{t,i}``."""
    return alpha * float(team) + float(local)


def best_candidate(rewards: Sequence[Mapping[str, float]]) -> int:
    """The candidate to execute: AT-GRPO's greedy transition (Algorithm 1, line 11; Sec. 4.1: "we greedily select the
    candidate with the highest reward to be the executed action"), first one on ties.

    ``rewards[k]`` maps each agent acting in candidate k to its Eq. 3 reward ``r_{t,i}`` observed when candidate k
    was scored. With one acting agent (the paper's sequential order) this is the argmax of that agent's reward. With
    several agents acting at once (the parallel order, this project's extension), candidate k is the k-th JOINT
    action, scored together, and the one executed is the joint action with the highest sum of its agents' rewards,
    ``sum_i r_{t,i} = n * alpha * r_team + sum_i r_local_i``: a joint action whose rewards were observed, never a
    combination of each agent's best candidate from different joint actions (which nobody scored).
    """
    if not rewards:
        raise ValueError("no candidates to choose from")
    totals = [sum(float(r) for r in candidate.values()) for candidate in rewards]
    return max(range(len(totals)), key=totals.__getitem__)
