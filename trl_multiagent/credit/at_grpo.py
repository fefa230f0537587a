"""AT-GRPO's agent-wise credit (Stronger-MAS, Sec. 4.1, Eq. 3)."""

from __future__ import annotations


def mix_rewards(team: float, local: float, alpha: float) -> float:
    """AT-GRPO's agent-wise credit, Eq. 3: ``r_{t,i} = alpha * r_team_t + r_local_{t,i}``."""
    return alpha * float(team) + float(local)
