"""The shared machinery of the two building tasks: turns, command handling, rewards, rejection counts, task data."""

from __future__ import annotations

import abc
import logging
import random
from collections.abc import Mapping
from typing import Any

from trl_multiagent.environments.base import Environment, StepResult
from trl_multiagent.environments.checks import need_int, need_tasks
from trl_multiagent.environments.games.base import generate_split
from trl_multiagent.environments.minecraft.commands import REJECT_REASONS, CommandReport, Rejection, command_lines
from trl_multiagent.environments.minecraft.world import Pos

logger = logging.getLogger(__name__)

AGENTS = ("player1", "player2")
REWARD_MAX = 2.0


class BuildEnv(Environment, abc.ABC):
    """Shared machinery of the two building tasks: command parsing, turns, rewards, rejection counts."""

    agents = AGENTS
    max_turns = 4
    reward_max = REWARD_MAX
    game = "build"
    allowed_commands: frozenset[str] = frozenset()

    def __init__(self, max_turns: int = 4, max_commands: int = 64):
        self.max_turns = need_int("max_turns", max_turns, minimum=1)
        self.max_commands = need_int("max_commands", max_commands, minimum=1)
        self.task: dict[str, Any] = {}
        self.world: dict[Pos, str] = {}
        self.turn = 0
        self.done = False
        self.last_score = 0.0
        self.reports: dict[str, CommandReport] = {}

    # hooks
    @abc.abstractmethod
    def load(self, task: Mapping[str, Any]) -> None:
        """Read one task row: the target, the build area (``self.bbox``) and the players' blocks."""

    @abc.abstractmethod
    def metrics(self) -> dict[str, float]:
        """The score of the current world (Appendix F.3) and the evaluation metrics, with ``complete``."""

    @abc.abstractmethod
    def instructions(self, agent: str) -> str:
        """The task as ``agent`` reads it at every turn."""

    @abc.abstractmethod
    def state_report(self, agent: str) -> str:
        """The simulated player's report on the current build for ``agent`` (turns after the first)."""

    @abc.abstractmethod
    def execute(self, agent: str, line: str, report: CommandReport) -> None:
        """Apply one command line of ``agent`` to the world, or add its rejection to ``report``."""

    def end_of_turn(self) -> None:
        """World events after both players acted (HouseBuild: spiders bite, new spiders come)."""

    # protocol
    def reset(self, task: Mapping[str, Any]) -> dict[str, str]:
        self.task = dict(task)
        self.world, self.turn, self.done, self.last_score = {}, 0, False, 0.0
        self.reports = {}
        self.load(self.task)
        return self.prompts()

    def in_bbox(self, p: Pos) -> bool:
        lo, hi = self.bbox
        return all(lo[k] <= p[k] <= hi[k] for k in range(3))

    def prompts(self) -> dict[str, str]:
        out = {}
        for agent in self.agents:
            text = self.instructions(agent)
            if self.turn > 0:
                text += f"\n\nTurn {self.turn + 1} of {self.max_turns}. Report from the builder on duty:\n" + \
                        self.state_report(agent)
            out[agent] = text
        return out

    def step(self, joint_action: Mapping[str, str]) -> StepResult:
        if self.done:
            raise RuntimeError(f"{type(self).__name__}.step called after the episode ended; reset it first")
        if set(joint_action) != set(self.agents):
            raise ValueError(f"{type(self).__name__}.step expects one answer per player {list(self.agents)}, "
                             f"got {sorted(joint_action)}")
        self.reports = {}
        for agent in self.agents:
            report = CommandReport()
            lines = command_lines(joint_action[agent])
            for k, line in enumerate(lines):
                if k >= self.max_commands:
                    report.rejected.append(Rejection(line, "limit", f"over {self.max_commands} commands"))
                    continue
                self.execute(agent, line, report)
            self.reports[agent] = report
        self.end_of_turn()
        metrics = self.metrics()
        reward = metrics["score"] - self.last_score
        self.last_score = metrics["score"]
        self.turn += 1
        self.done = bool(metrics["complete"]) or self.turn >= self.max_turns
        info = dict(metrics)
        info["accepted"] = float(sum(r.accepted for r in self.reports.values()))
        info["rejected"] = float(sum(len(r.rejected) for r in self.reports.values()))
        for reason in REJECT_REASONS:
            info[f"rejected/{reason}"] = float(sum(1 for r in self.reports.values() for x in r.rejected
                                                   if x.reason == reason))
        return StepResult(team_reward=float(reward), next_prompts=None if self.done else self.prompts(),
                          done=self.done, info=info)

    # data
    @classmethod
    @abc.abstractmethod
    def draw(cls, rng: random.Random, **options: Any) -> dict | None:
        """One random task row."""

    @classmethod
    @abc.abstractmethod
    def encode(cls, task: Mapping[str, Any]) -> str:
        """A canonical string of a task (duplicates in a dataset are dropped by it)."""

    @classmethod
    @abc.abstractmethod
    def split_key(cls, task: Mapping[str, Any]) -> str:
        """What decides a task's split (its shape), so that no held-out shape is trained on."""

    @classmethod
    def make_rows(cls, num_tasks: int, seed: int = 0, split: str = "train", **options: Any) -> list[dict]:
        """:meth:`make_dataset` as a list of dicts."""
        cls.check_options(**options)
        return generate_split(cls.game, num_tasks, seed, split, lambda rng: cls.draw(rng, **options), cls.encode,
                              split_key=cls.split_key)

    @classmethod
    def make_dataset(cls, num_tasks: int = 64, seed: int = 0, split: str = "train", **options: Any):
        """``num_tasks`` distinct generated tasks of ``split`` (``"train"`` or ``"eval"``) as a ``Dataset``."""
        from datasets import Dataset

        need_tasks(num_tasks)

        rows = cls.make_rows(num_tasks, seed, split, **options)
        logger.info("%s: generated %d %s tasks (seed %d)", cls.game, len(rows), split, seed)
        return Dataset.from_list(rows)

    @classmethod
    @abc.abstractmethod
    def check_options(cls, **options: Any) -> None:
        """Check the generator's options before any task is drawn."""
