"""The collaborate-or-act-alone game of MAPoRL Sec. 2 (Sec. 2.1 setup, Observations 1-2, Sec. 2.3 and App. C-D).

Each turn every agent chooses to **collaborate** (C) or to **act independently** (I). Before collaborative synergy is
reached, C earns ``reward_collaborate`` (r_C) and I earns ``reward_independent`` (r_I), with r_C < r_I: an exploratory
contribution is less likely to be right on its own. Once the agents' C actions, counted over all agents and all
earlier turns, reach the collaboration threshold (tau), synergy is achieved and every agent earns ``synergy`` (R > r_I)
in every later turn, whatever it plays. Reading taken (the symbols were lost): synergy counts the actions of the
turns BEFORE the current one, which is what the proof of Observation 1 uses ("if synergy has been achieved, the
agent receives R regardless of its action in the second turn"; the last turn's best action is always I).

With two turns and tau = 2, against a partner who collaborates with probability q, collaborating first is the best
response iff ``q > (r_I - r_C) / (R - r_I)`` (Observation 1, :func:`~trl_multiagent.credit.maporl.best_response_threshold`);
two agents trained together reach mutual collaboration when that bound is below 1/2 (Observation 2: C is then risk
dominant), while a single agent trained against a fixed, non-strategic partner with a small q learns to act alone
(Sec. 2.3, Figure 5).

``partner_collaborate_prob=None``: two learning agents (``agent1``, ``agent2``). A number q: one learning agent
(``agent1``) plays against a fixed partner who collaborates with probability q, drawn from a generator seeded by the
task, so the single-agent setting of Figure 5 trains with exactly the same trainer.

An agent's response is read by its first non-blank character: ``collaborate_token`` (default ``A``) is C,
``independent_token`` (default ``B``) is I; anything else is invalid, earns ``invalid_reward`` and does not count as C.
Every step reports each learning agent's reward of that turn as its local reward (the "verifier score" that MAPoRL's
reward modes accumulate), the mean as the team reward, and ``collaborate/<agent>`` and ``synergy`` in ``info``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from trl_multiagent.environments.base import Environment, StepResult
from trl_multiagent.environments.checks import need_int, need_number, need_str, need_tasks

DEFAULT_PROMPT = ("answer A to collaborate or B to act alone. {num_turns} rounds. collaborations so far: {count}. "
                  "synergy: {synergy}. round {turn}")


class CollaborationGameEnv(Environment):
    """The Sec. 2 game (see the module docstring).

    Args:
        num_turns: T, turns of the repeated game.
        threshold: tau, collaborative actions (all agents, all earlier turns) that achieve synergy.
        reward_collaborate, reward_independent, synergy: r_C < r_I < R.
        partner_collaborate_prob: ``None`` for two learners; q in [0, 1] for one learner against a fixed partner.
        collaborate_token, independent_token: the first characters that mean C and I.
        invalid_reward: the reward of an unreadable action.
        prompt: the prompt template (fields ``turn``, ``num_turns``, ``count``, ``synergy``, ``agent``).

    Rows of the dataset may override ``reward_collaborate``, ``reward_independent``, ``synergy`` and ``threshold``
    per question (App. D draws them per question); ``task_id`` seeds the fixed partner.
    """

    required_columns = ()

    def __init__(self, num_turns: int = 2, threshold: int = 2, reward_collaborate: float = 0.4,
                 reward_independent: float = 1.0, synergy: float = 3.0, partner_collaborate_prob: float | None = None,
                 collaborate_token: str = "A", independent_token: str = "B", invalid_reward: float = 0.0,
                 prompt: str = DEFAULT_PROMPT):
        need_int("num_turns", num_turns, minimum=1)
        need_int("threshold", threshold, minimum=1)
        for name, value in (("reward_collaborate", reward_collaborate), ("reward_independent", reward_independent),
                            ("synergy", synergy), ("invalid_reward", invalid_reward)):
            need_number(name, value)
        if partner_collaborate_prob is not None:
            need_number("partner_collaborate_prob", partner_collaborate_prob, minimum=0.0, maximum=1.0)
        need_str("collaborate_token", collaborate_token)
        need_str("independent_token", independent_token)
        need_str("prompt", prompt, non_empty=True)
        if len(collaborate_token) != 1 or len(independent_token) != 1 or collaborate_token == independent_token:
            raise ValueError("collaborate_token and independent_token must be two different single characters")
        self._check_rewards(reward_collaborate, reward_independent, synergy)
        self.max_turns = num_turns
        self.defaults = {"reward_collaborate": float(reward_collaborate),
                         "reward_independent": float(reward_independent), "synergy": float(synergy),
                         "threshold": int(threshold)}
        self.partner_prob = partner_collaborate_prob
        self.tokens = {"C": collaborate_token.upper(), "I": independent_token.upper()}
        self.invalid_reward = float(invalid_reward)
        self.prompt = prompt
        self.agents = ("agent1", "agent2") if partner_collaborate_prob is None else ("agent1",)
        self.params = dict(self.defaults)
        self.turn, self.count = 0, 0
        self.history: list[dict[str, str]] = []
        self._rng = random.Random(0)

    @staticmethod
    def _check_rewards(r_c: float, r_i: float, synergy: float) -> None:
        if not r_c < r_i < synergy:
            raise ValueError(f"the game needs reward_collaborate < reward_independent < synergy, got {r_c}, {r_i}, "
                             f"{synergy}")

    @classmethod
    def make_dataset(cls, num_tasks: int | None = 256, seed: int = 0, split: str = "train"):
        """Questions with their own rewards, drawn as App. D describes (its ranges were lost; ours: r_I ~ U(0.5, 1),
        r_C ~ U(0.1, r_I), R = 3, tau = 2)."""
        from datasets import Dataset

        need_tasks(num_tasks)

        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        rng = random.Random(f"collaboration-game/{split}/{seed}")
        rows = []
        for i in range(num_tasks or 256):
            r_i = rng.uniform(0.5, 1.0)
            rows.append({"task_id": f"game/{split}/{seed}/{i}", "reward_independent": r_i,
                         "reward_collaborate": rng.uniform(0.1, r_i - 1e-3), "synergy": 3.0, "threshold": 2})
        return Dataset.from_list(rows)

    @property
    def synergy_reached(self) -> bool:
        return self.count >= self.params["threshold"]

    def reset(self, task: Mapping[str, Any]) -> dict[str, str]:
        self.params = {k: type(v)(task[k]) if k in task else v for k, v in self.defaults.items()}
        self._check_rewards(self.params["reward_collaborate"], self.params["reward_independent"],
                            self.params["synergy"])
        self.turn, self.count, self.history = 0, 0, []
        self._rng = random.Random(f"partner/{task.get('task_id', '')}")
        return self._prompts()

    def parse(self, response: str) -> str | None:
        """``"C"``, ``"I"`` or ``None`` (invalid) from the first non-blank character of a response."""
        stripped = response.strip()
        if not stripped:
            return None
        first = stripped[0].upper()
        return next((action for action, token in self.tokens.items() if token == first), None)

    def step(self, joint_action: Mapping[str, str]) -> StepResult:
        if set(joint_action) != set(self.agents):
            raise ValueError(f"CollaborationGameEnv.step needs one action per agent {list(self.agents)}, got "
                             f"{sorted(joint_action)}")
        if self.turn >= self.max_turns:
            raise ValueError(f"the game is over: {self.max_turns} turns were played")
        actions = {a: self.parse(joint_action[a]) for a in self.agents}
        partner_collaborates = self.partner_prob is not None and self._rng.random() < self.partner_prob
        had_synergy = self.synergy_reached
        rewards = {}
        for agent, action in actions.items():
            if had_synergy:
                rewards[agent] = self.params["synergy"]
            elif action is None:
                rewards[agent] = self.invalid_reward
            else:
                rewards[agent] = self.params["reward_collaborate" if action == "C" else "reward_independent"]
        self.count += sum(a == "C" for a in actions.values()) + int(partner_collaborates)
        self.history.append({a: str(actions[a]) for a in self.agents})
        self.turn += 1
        done = self.turn >= self.max_turns
        info = {f"collaborate/{a}": float(actions[a] == "C") for a in self.agents}
        info["synergy"] = float(self.synergy_reached)
        info["invalid"] = sum(a is None for a in actions.values()) / len(actions)
        team = sum(rewards.values()) / len(rewards)
        return StepResult(team_reward=team, next_prompts=None if done else self._prompts(), done=done,
                          local_rewards=rewards, info=info)

    def _prompts(self) -> dict[str, str]:
        return {a: self.prompt.format(turn=self.turn + 1, num_turns=self.max_turns, count=self.count,
                                      synergy="yes" if self.synergy_reached else "no", agent=a)
                for a in self.agents}
