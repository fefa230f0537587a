"""The cooperative one-step matrix game of the MAGRPO paper, Appendix A, Table 4.

Two agents each answer ``A`` or ``B``. The joint utility is

    ========  ====  ====
    a1 \\ a2    A     B
    ========  ====  ====
    A          10     7
    B           7     0
    ========  ====  ====

(A, A) is the joint optimum; (A, B) and (B, A) are the equilibria a decomposed, individual-reward version of the
game can get stuck in. An answer whose first non-blank character is not ``A`` or ``B`` is invalid and the joint
action earns ``invalid_reward`` (0 by default, the worst entry of the table).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import Environment, StepResult

#: Table 4 of the MAGRPO paper: joint utility of (agent 1's action, agent 2's action).
TEAM_PAYOFF: dict[tuple[str, str], float] = {("A", "A"): 10.0, ("A", "B"): 7.0, ("B", "A"): 7.0, ("B", "B"): 0.0}

DEFAULT_PROMPT = (
    "You are {agent}, one of two players in a cooperative game. Each player picks A or B without seeing the other. "
    "Answer with the single letter A or B."
)


def parse_choice(response: str) -> str | None:
    """The first non-blank character of a response, if it is ``A`` or ``B`` (case-insensitive)."""
    stripped = response.strip()
    if not stripped:
        return None
    first = stripped[0].upper()
    return first if first in ("A", "B") else None


class MatrixGameEnv(Environment):
    """One-turn, two-agent cooperative matrix game (MAGRPO Appendix A, Table 4)."""

    agents = ("agent1", "agent2")
    max_turns = 1
    required_columns = ()

    def __init__(self, prompt: str = DEFAULT_PROMPT, invalid_reward: float = 0.0, agents: tuple[str, str] | None = None):
        if agents is not None:
            if len(agents) != 2:
                raise ValueError(f"The matrix game has exactly two agents, got {list(agents)}")
            self.agents = tuple(agents)
        self.prompt = prompt
        self.invalid_reward = float(invalid_reward)

    def reset(self, task: Mapping[str, Any]) -> dict[str, str]:
        return {agent: self.prompt.format(agent=agent) for agent in self.agents}

    def step(self, joint_action: Mapping[str, str]) -> StepResult:
        choices = tuple(parse_choice(joint_action[a]) for a in self.agents)
        valid = all(c is not None for c in choices)
        reward = TEAM_PAYOFF[choices] if valid else self.invalid_reward
        info = {"valid": float(valid), "both_A": float(choices == ("A", "A"))}
        return StepResult(team_reward=reward, done=True, info=info)
