"""The one-step matrix games of the MAGRPO paper, Appendix A: Table 4 (joint utility) and Table 5 (individual).

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

from trl_multiagent.environments.base import Environment, StepResult
from trl_multiagent.environments.checks import need_number, need_str

#: Table 4 of the MAGRPO paper: joint utility of (agent 1's action, agent 2's action).
TEAM_PAYOFF: dict[tuple[str, str], float] = {("A", "A"): 10.0, ("A", "B"): 7.0, ("B", "A"): 7.0, ("B", "B"): 0.0}

#: Table 5 of the MAGRPO paper: two decompositions of Table 4 into individual rewards (agent 1, agent 2).
#: In POSG 1 the Nash equilibrium (A, A) is also the joint optimum; in POSG 2 the pure equilibria are (A, B) and
#: (B, A), worth 7, and the mixed one is worth 6 in expectation: individual rewards miss the optimum of 10.
LOCAL_PAYOFFS: dict[str, dict[tuple[str, str], tuple[float, float]]] = {
    "posg1": {("A", "A"): (5.0, 5.0), ("A", "B"): (3.0, 4.0), ("B", "A"): (4.0, 3.0), ("B", "B"): (0.0, 0.0)},
    "posg2": {("A", "A"): (5.0, 5.0), ("A", "B"): (1.0, 6.0), ("B", "A"): (6.0, 1.0), ("B", "B"): (0.0, 0.0)},
}

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
    """One-turn, two-agent matrix game: team reward of Table 4; with ``local_payoff`` also the individual rewards
    of Table 5 (``"posg1"`` or ``"posg2"``) as per-agent local rewards."""

    agents = ("agent1", "agent2")
    max_turns = 1
    required_columns = ()

    def __init__(self, prompt: str = DEFAULT_PROMPT, invalid_reward: float = 0.0, agents: tuple[str, str] | None = None,
                 local_payoff: str | None = None):
        if agents is not None:
            if isinstance(agents, str) or len(agents) != 2 or len(set(agents)) != 2 or \
                    not all(isinstance(a, str) and a for a in agents):
                raise ValueError(f"The matrix game has exactly two agents with distinct names, got {agents!r}")
            self.agents = tuple(agents)
        if local_payoff is not None and local_payoff not in LOCAL_PAYOFFS:
            raise ValueError(f"local_payoff must be one of {sorted(LOCAL_PAYOFFS)} or None, got {local_payoff!r}")
        need_str("prompt", prompt, non_empty=True)
        self.prompt = prompt
        self.invalid_reward = need_number("invalid_reward", invalid_reward)
        self.local_payoff = local_payoff

    def reset(self, task: Mapping[str, Any]) -> dict[str, str]:
        return {agent: self.prompt.format(agent=agent) for agent in self.agents}

    def step(self, joint_action: Mapping[str, str]) -> StepResult:
        choices = tuple(parse_choice(joint_action[a]) for a in self.agents)
        valid = all(c is not None for c in choices)
        reward = TEAM_PAYOFF[choices] if valid else self.invalid_reward
        info = {"valid": float(valid), "both_A": float(choices == ("A", "A"))}
        local = None
        if self.local_payoff is not None:
            pair = LOCAL_PAYOFFS[self.local_payoff][choices] if valid else (self.invalid_reward,) * 2
            local = dict(zip(self.agents, pair))
        return StepResult(team_reward=reward, done=True, local_rewards=local, info=info)
