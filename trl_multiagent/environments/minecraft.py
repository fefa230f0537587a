"""Text-Minecraft building, simulated (no game server): StrBuild and HouseBuild (CoLLM paper Sec. 6.1, App. E.3, F.3).

Two players (``player1``, ``player2``) build together for up to ``H = 4`` turns. Each turn both answer at the same
time with Minecraft commands, one per line; the simulator applies them (player 1's, then player 2's), scores the
world, and a simulated player writes each agent's next prompt: the task again, the current build, what is missing or
in excess, and which of that agent's commands were rejected and why.

**StrBuild**: a string (e.g. ``"HI"``) drawn in a 3x5 pixel font becomes a vertical wall of blocks: a grid of ``#``
(block) and ``.`` (air), top row first, in the plane ``z = z0``. Allowed: ``/setblock x y z block``. Each player holds
two block types (from two different families among wood, stone, concrete and obsidian) with a limited count of each
(``block_limit`` per type, about a quarter of the target plus one), so neither can finish alone. ``air`` removes a
block and is always allowed.

**HouseBuild**: a small house (floor, walls with a door gap, obsidian corner pillars, roof) given as layers of boxes
``(x1, y1, z1, x2, y2, z2, block)`` in ascending ``y``. Allowed: ``/fill x1 y1 z1 x2 y2 z2 block`` (each player owns
two of the house's block types; ``air`` clears) and ``/damage @e[type=spider,limit=1] <amount>`` (at most
``player_atk`` damage per hit, at most ``max_attacks`` hits per player per turn). Spiders appear on a per-task
schedule; after the players act, every living spider bites the team for its attack value.

**Rejected commands** (counted in ``info["rejected"]`` and per reason in ``info["rejected/<reason>"]``, never an
error): ``syntax`` (not a command of the allowed forms), ``command`` (a command outside the allowed set, e.g.
``/give``), ``bbox`` (a coordinate outside the build area), ``block`` (a block the player does not hold),
``inventory`` (none of that block left), ``attack`` (too strong a hit, no spider alive, or over the per-turn limit),
``limit`` (more than ``max_commands`` lines in one answer). Blank lines and markdown fences are skipped.

**Score** of a world state (Appendix F.3), with ``T`` target cells:

* StrBuild: ``2 * covered / T - 1.5 * extra / T - same_pairs / (2 * pairs)``, where ``covered`` counts target
  cells holding a block, ``extra`` blocks on air cells, and ``same_pairs`` / ``pairs`` the side-sharing pairs of
  placed blocks with the same block type / in total (the adjacency term is 0 without pairs).
* HouseBuild: ``2 * covered / T - 1.5 * extra / T - 0.2 * min(1, damage / player_hp)``, where ``covered`` counts
  target cells holding exactly their block and ``damage`` is the spiders' total damage so far.

The best score is 2 (``reward_max``). The paper gives the score terms, not how a turn's reward derives from them;
here **the reward of a turn is the change of the score it caused** (the first turn starts from the empty world at
score 0), so an episode's undiscounted return is the score of the final world whatever turn it ends at, and
finishing early is never worse than finishing late. An episode ends early when the build is complete (StrBuild:
every target cell covered, no extra block, no same-block neighbours; HouseBuild: the house exactly built and no
spider alive).

Metrics (``info``): ``score``, ``iou`` (``covered / (T + extra)``), ``coverage`` (``covered / T``), ``extra``,
``adjacency`` (StrBuild: ``same_pairs / pairs``), ``hp`` (HouseBuild: remaining HP as a fraction), ``accepted``,
``rejected``, ``complete``.

Data: ``make_dataset(num_tasks, seed, split)`` generates tasks procedurally; train and eval tasks come from separate
random streams and a task belongs to a split by a hash of its shape (the string for StrBuild), so no held-out shape
is ever trained on (the machinery of :mod:`trl_multiagent.environments.games.base`).
"""

from __future__ import annotations

import abc
import json
import logging
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .base import Environment, StepResult
from .checks import need_bool, need_int, need_tasks
from .games.base import generate_split

logger = logging.getLogger(__name__)

Pos = tuple[int, int, int]
AGENTS = ("player1", "player2")
REWARD_MAX = 2.0

#: A 3x5 pixel font (rows top to bottom).
FONT: dict[str, tuple[str, ...]] = {
    "A": (".#.", "#.#", "###", "#.#", "#.#"), "B": ("##.", "#.#", "##.", "#.#", "##."),
    "C": (".##", "#..", "#..", "#..", ".##"), "D": ("##.", "#.#", "#.#", "#.#", "##."),
    "E": ("###", "#..", "##.", "#..", "###"), "F": ("###", "#..", "##.", "#..", "#.."),
    "G": (".##", "#..", "#.#", "#.#", ".##"), "H": ("#.#", "#.#", "###", "#.#", "#.#"),
    "I": ("###", ".#.", ".#.", ".#.", "###"), "J": ("..#", "..#", "..#", "#.#", ".#."),
    "K": ("#.#", "#.#", "##.", "#.#", "#.#"), "L": ("#..", "#..", "#..", "#..", "###"),
    "M": ("#.#", "###", "#.#", "#.#", "#.#"), "N": ("##.", "#.#", "#.#", "#.#", "#.#"),
    "O": ("###", "#.#", "#.#", "#.#", "###"), "P": ("##.", "#.#", "##.", "#..", "#.."),
    "Q": (".#.", "#.#", "#.#", "##.", ".##"), "R": ("##.", "#.#", "##.", "#.#", "#.#"),
    "S": (".##", "#..", ".#.", "..#", "##."), "T": ("###", ".#.", ".#.", ".#.", ".#."),
    "U": ("#.#", "#.#", "#.#", "#.#", "###"), "V": ("#.#", "#.#", "#.#", "#.#", ".#."),
    "W": ("#.#", "#.#", "#.#", "###", "#.#"), "X": ("#.#", "#.#", ".#.", "#.#", "#.#"),
    "Y": ("#.#", "#.#", ".#.", ".#.", ".#."), "Z": ("###", "..#", ".#.", "#..", "###"),
}

#: Block families of the paper (wood, stone, concrete, obsidian); a StrBuild player holds one block of two families.
BLOCK_FAMILIES: dict[str, tuple[str, ...]] = {
    "wood": ("oak_planks", "birch_planks", "spruce_planks"),
    "stone": ("stone", "cobblestone", "stone_bricks"),
    "concrete": ("white_concrete", "red_concrete", "blue_concrete"),
    "obsidian": ("obsidian",),
}

REJECT_REASONS = ("syntax", "command", "bbox", "block", "inventory", "attack", "limit")
AIR = "air"

_COMMAND_WORD = re.compile(r"^/?([a-z_]+)\b")
_INT = r"(-?\d+)"
_BLOCK = r"(?:minecraft:)?([a-z_]+)"
_SETBLOCK = re.compile(rf"^/?setblock\s+{_INT}\s+{_INT}\s+{_INT}\s+{_BLOCK}\s*$")
_FILL = re.compile(rf"^/?fill\s+{_INT}\s+{_INT}\s+{_INT}\s+{_INT}\s+{_INT}\s+{_INT}\s+{_BLOCK}\s*$")
_DAMAGE = re.compile(r"^/?damage\s+@e\[type=(?:minecraft:)?spider,\s*limit=1\]\s+(\d+)"
                     r"(?:\s+(?:minecraft:)?player_attack)?\s*$")
#: Minecraft command words that count as a command even without the leading ``/``; those outside an environment's
#: allowed set are rejected as ``command``, as is any other ``/word`` line; any other line is ``syntax`` (so prose
#: such as "place the blocks" is a syntax error, not an attempted command).
_KNOWN_COMMANDS = {"setblock", "fill", "damage", "kill", "give", "summon", "tp", "teleport", "clone", "gamemode",
                   "effect", "execute"}


# --------------------------------------------------------------------------------------------------- geometry
def render_string(text: str) -> list[str]:
    """The ``#``/``.`` grid of ``text`` in :data:`FONT`, letters separated by one air column (top row first)."""
    if not text or any(c not in FONT for c in text):
        raise ValueError(f"StrBuild text must be non-empty capital letters A-Z, got {text!r}")
    return [".".join(FONT[c][r] for c in text) for r in range(5)]


def grid_cells(rows: Sequence[str], origin: Sequence[int]) -> set[Pos]:
    """World positions of the ``#`` cells of a top-down grid whose bottom-left cell is at ``origin``."""
    x0, y0, z0 = (int(v) for v in origin)
    height = len(rows)
    return {(x0 + c, y0 + height - 1 - r, z0) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch == "#"}


def neighbour_pairs(world: Mapping[Pos, str]) -> tuple[int, int]:
    """``(same, total)``: side-sharing pairs of placed blocks with the same block type, and all such pairs."""
    same = total = 0
    for (x, y, z), block in world.items():
        for nxt in ((x + 1, y, z), (x, y + 1, z), (x, y, z + 1)):
            other = world.get(nxt)
            if other is not None:
                total += 1
                same += other == block
    return same, total


def strbuild_metrics(target: set[Pos], world: Mapping[Pos, str]) -> dict[str, float]:
    """Appendix F.3 score of a StrBuild world and the evaluation metrics (see the module docstring)."""
    total = len(target)
    covered = sum(1 for p in target if p in world)
    extra = sum(1 for p in world if p not in target)
    same, pairs = neighbour_pairs(world)
    adjacency = same / pairs if pairs else 0.0
    score = 2.0 * covered / total - 1.5 * extra / total - (same / (2.0 * pairs) if pairs else 0.0)
    return {"score": score, "coverage": covered / total, "iou": covered / (total + extra), "extra": float(extra),
            "adjacency": adjacency, "same_pairs": float(same),
            "complete": float(covered == total and extra == 0 and same == 0)}


def housebuild_metrics(target: Mapping[Pos, str], world: Mapping[Pos, str], damage: float,
                       player_hp: float) -> dict[str, float]:
    """Appendix F.3 score of a HouseBuild world and the evaluation metrics (see the module docstring)."""
    total = len(target)
    covered = sum(1 for p, b in target.items() if world.get(p) == b)
    extra = sum(1 for p in world if p not in target)
    hurt = min(1.0, damage / player_hp)
    score = 2.0 * covered / total - 1.5 * extra / total - 0.2 * hurt
    return {"score": score, "coverage": covered / total, "iou": covered / (total + extra), "extra": float(extra),
            "hp": max(0.0, 1.0 - damage / player_hp), "damage": float(damage),
            "complete": float(covered == total and extra == 0)}


# --------------------------------------------------------------------------------------------------- commands
@dataclass
class Rejection:
    line: str
    reason: str
    detail: str


@dataclass
class CommandReport:
    """What became of one player's answer in one turn."""

    accepted: int = 0
    rejected: list[Rejection] = field(default_factory=list)
    hits: int = 0  # HouseBuild: accepted /damage commands

    def summary(self, limit: int = 4) -> str:
        if not self.rejected:
            return f"All {self.accepted} of your commands were carried out." if self.accepted else \
                "You sent no command."
        shown = "; ".join(f"'{r.line[:60]}' ({r.detail})" for r in self.rejected[:limit])
        more = f" and {len(self.rejected) - limit} more" if len(self.rejected) > limit else ""
        return f"{self.accepted} of your commands were carried out, {len(self.rejected)} rejected: {shown}{more}."


_LIST_MARKER = re.compile(r"^(?:[-*\u2022>]+|\d+[.)])\s*")


def command_lines(response: str) -> list[str]:
    """The candidate command lines of a response, lower-cased, without blank lines or markdown fences.

    A list marker or quotes around a line are dropped, and a line with text before its first ``/`` keeps the text
    from that ``/`` on (``"Place: /setblock 1 2 3 stone."`` -> ``"/setblock 1 2 3 stone"``); what remains is then
    either an allowed command or rejected.
    """
    lines = []
    for raw in (response if isinstance(response, str) else "").splitlines():
        line = raw.strip().lower()
        if not line or line.startswith("```"):
            continue
        line = _LIST_MARKER.sub("", line).strip("`'\" ")
        slash = line.find("/")
        if slash > 0:
            line = line[slash:]
        line = line.rstrip("`'\".,; ")
        if line:
            lines.append(line)
    return lines


def classify_unmatched(line: str, allowed: set[str]) -> Rejection:
    """Why a line matched no allowed command form: a command outside the set, or not a well-formed command."""
    m = _COMMAND_WORD.match(line)
    word = m.group(1) if m else ""
    if word and word not in allowed and (line.startswith("/") or word in _KNOWN_COMMANDS):
        return Rejection(line, "command", f"/{word} is not allowed")
    return Rejection(line, "syntax", "not a valid command")


def format_pos(p: Pos) -> str:
    return f"({p[0]} {p[1]} {p[2]})"


def _list(positions: Sequence[Pos], limit: int = 10) -> str:
    shown = ", ".join(format_pos(p) for p in positions[:limit])
    return shown + (f" and {len(positions) - limit} more" if len(positions) > limit else "")


# --------------------------------------------------------------------------------------------------- base env
class _BuildEnv(Environment, abc.ABC):
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


# --------------------------------------------------------------------------------------------------- StrBuild
class StrBuildEnv(_BuildEnv):
    """StrBuild: build a string shape with ``/setblock``; per-player block inventories, no same-block neighbours.

    Args:
        max_turns: the turn budget H (4 in the paper).
        max_commands: lines of one answer that are read; later ones are rejected (``limit``).
        list_target_cells: also list the world coordinates of every ``#`` cell in the prompt (a help for small
            models; the paper gives only the grid and the coordinate mapping).
        prompt_style: ``"paper"`` (the full instructions of App. E.3, in this project's words) or ``"compact"``
            (for very small models: the list of cells to fill, the player's blocks and a two-command example answer
            on two different cells for each player, nothing else; the reports of later turns drop the grid).

    Dataset columns: ``text``, ``target`` (grid rows), ``origin`` (``[x0, y0, z0]``, the bottom-left cell),
    ``agent_blocks`` (the block types of each player, in player order), ``block_limit`` (blocks of each type).
    """

    game = "strbuild"
    required_columns = ("target", "origin", "agent_blocks", "block_limit")
    allowed_commands = frozenset({"setblock"})

    def __init__(self, max_turns: int = 4, max_commands: int = 64, list_target_cells: bool = False,
                 prompt_style: str = "paper"):
        super().__init__(max_turns=max_turns, max_commands=max_commands)
        if prompt_style not in ("paper", "compact"):
            raise ValueError(f"prompt_style must be 'paper' or 'compact', got {prompt_style!r}")
        self.list_target_cells = need_bool("list_target_cells", list_target_cells)
        self.prompt_style = prompt_style

    def load(self, task: Mapping[str, Any]) -> None:
        self.rows = [str(r) for r in task["target"]]
        if not self.rows or len({len(r) for r in self.rows}) != 1 or set("".join(self.rows)) - {"#", "."}:
            raise ValueError(f"StrBuild target must be equal-length rows of '#' and '.', got {self.rows!r}")
        x0, y0, z0 = (int(v) for v in task["origin"])
        self.bbox = ((x0, y0, z0), (x0 + len(self.rows[0]) - 1, y0 + len(self.rows) - 1, z0))
        self.target = grid_cells(self.rows, (x0, y0, z0))
        if not self.target:
            raise ValueError("StrBuild target has no '#' cell")
        blocks = [list(b) for b in task["agent_blocks"]]
        if len(blocks) != len(self.agents):
            raise ValueError(f"agent_blocks needs one list per player {list(self.agents)}, got {blocks!r}")
        self.blocks = {a: [str(x) for x in b] for a, b in zip(self.agents, blocks)}
        self.inventory = {a: {b: int(task["block_limit"]) for b in self.blocks[a]} for a in self.agents}

    def metrics(self) -> dict[str, float]:
        return strbuild_metrics(self.target, self.world)

    def execute(self, agent: str, line: str, report: CommandReport) -> None:
        m = _SETBLOCK.match(line)
        if m is None:
            report.rejected.append(classify_unmatched(line, set(self.allowed_commands)))
            return
        pos = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        block = m.group(4)
        if not self.in_bbox(pos):
            report.rejected.append(Rejection(line, "bbox", f"{format_pos(pos)} is outside the build area"))
            return
        if block == AIR:
            self.world.pop(pos, None)
            report.accepted += 1
            return
        if block not in self.inventory[agent]:
            report.rejected.append(Rejection(line, "block", f"you have no {block}"))
            return
        if self.inventory[agent][block] <= 0:
            report.rejected.append(Rejection(line, "inventory", f"no {block} left"))
            return
        self.inventory[agent][block] -= 1
        self.world[pos] = block
        report.accepted += 1

    def ordered_target(self) -> list[Pos]:
        """The target cells, top row first, left to right."""
        return sorted(self.target, key=lambda p: (-p[1], p[0]))

    def compact_instructions(self, agent: str) -> str:
        cells = self.ordered_target()
        blocks = self.blocks[agent]
        example = cells[:2] if self.agents.index(agent) == 0 else cells[-2:]
        return "\n".join([
            "Minecraft building. Place blocks with: /setblock x y z block",
            "Cells to fill: " + ", ".join(f"{x} {y} {z}" for x, y, z in cells),
            f"Your blocks: {', '.join(blocks)}. Neighbouring blocks must differ.",
            "Example answer:",
            *[f"/setblock {x} {y} {z} {blocks[k % len(blocks)]}" for k, (x, y, z) in enumerate(example)],
            "Your answer, commands only:",
        ])

    def instructions(self, agent: str) -> str:
        if self.prompt_style == "compact":
            return self.compact_instructions(agent)
        (x0, y0, z0), (x1, y1, _) = self.bbox
        number = self.agents.index(agent) + 1
        grid = "\n".join(self.rows)
        lines = [
            f"You are player {number} of a {len(self.agents)}-player Minecraft building team; each player places "
            "part of the blocks. Reply with Minecraft commands only, one per line, with no other text.",
            f"Build this shape as a wall of blocks. The grid is shown row by row from the top; '#' is a block, "
            f"'.' is air:\n{grid}",
            f"Build area (inclusive): from ({x0} {y0} {z0}) to ({x1} {y1} {z0}). Column k of a row (k = 0 at the "
            f"left) is x = {x0} + k; the top row is y = {y1} and each row below it is one lower; z is always {z0}.",
        ]
        if self.list_target_cells:
            cells = self.ordered_target()
            lines.append("The '#' cells are at (x y z): " + ", ".join(format_pos(p) for p in cells))
        stock = ", ".join(f"{b} ({self.inventory[agent][b]} left)" for b in self.blocks[agent])
        lines += [
            f"Your blocks: {stock}. Your teammates hold other blocks.",
            "Rules: only /setblock; whole-number coordinates inside the build area; blocks only on '#' cells; two "
            "blocks that share a side must be different blocks. /setblock x y z air removes a block.",
            "Format: /setblock x y z block",
        ]
        return "\n".join(lines)

    def state_report(self, agent: str) -> str:
        (x0, y0, z0), (x1, y1, _) = self.bbox
        rows = []
        for y in range(y1, y0 - 1, -1):
            rows.append("".join("#" if (x, y, z0) in self.world else "." for x in range(x0, x1 + 1)))
        missing = sorted((p for p in self.target if p not in self.world), key=lambda p: (-p[1], p[0]))
        extra = sorted((p for p in self.world if p not in self.target), key=lambda p: (-p[1], p[0]))
        same = sorted({p for p, b in self.world.items() for q in ((p[0] + 1, p[1], p[2]), (p[0], p[1] + 1, p[2]))
                       if self.world.get(q) == b}, key=lambda p: (-p[1], p[0]))
        m = self.metrics()
        parts = [] if self.prompt_style == "compact" else \
            ["Current wall ('#' = a block stands there):\n" + "\n".join(rows)]
        parts += [f"Covered {int(round(m['coverage'] * len(self.target)))} of {len(self.target)} '#' cells."]
        if missing:
            parts.append(f"Still missing at: {_list(missing)}.")
        if extra:
            parts.append(f"Blocks on air cells, remove them: {_list(extra)}.")
        if same:
            parts.append(f"Same block as the neighbour above or to the right at: {_list(same)}; use a different "
                         "block there.")
        parts.append(self.reports[agent].summary() if agent in self.reports else "")
        return "\n".join(p for p in parts if p)

    # data
    @classmethod
    def check_options(cls, min_letters: int = 1, max_letters: int = 2) -> None:
        need_int("min_letters", min_letters, minimum=1)
        need_int("max_letters", max_letters, minimum=1)
        if not 1 <= min_letters <= max_letters:
            raise ValueError(f"need 1 <= min_letters <= max_letters, got {min_letters}, {max_letters}")

    @classmethod
    def draw(cls, rng: random.Random, min_letters: int = 1, max_letters: int = 2) -> dict:
        text = "".join(rng.choice(sorted(FONT)) for _ in range(rng.randint(min_letters, max_letters)))
        rows = render_string(text)
        families = list(BLOCK_FAMILIES)
        rng.shuffle(families)
        blocks = [[rng.choice(BLOCK_FAMILIES[f]) for f in families[2 * i:2 * i + 2]] for i in range(len(AGENTS))]
        total = sum(r.count("#") for r in rows)
        return {"text": text, "target": rows, "origin": [rng.randint(0, 9), rng.randint(0, 4), rng.randint(0, 9)],
                "agent_blocks": blocks, "block_limit": math.ceil(total / 4) + 1}

    @classmethod
    def encode(cls, task: Mapping[str, Any]) -> str:
        return json.dumps([task["text"], list(task["origin"]), [list(b) for b in task["agent_blocks"]]])

    @classmethod
    def split_key(cls, task: Mapping[str, Any]) -> str:
        return str(task["text"])  # the shape: a string is either always trained on or always held out


# --------------------------------------------------------------------------------------------------- HouseBuild
def parse_box(spec: str) -> tuple[Pos, Pos, str]:
    """``"x1 y1 z1 x2 y2 z2 block"`` -> (low corner, high corner, block)."""
    parts = spec.split()
    if len(parts) != 7:
        raise ValueError(f"a box is 'x1 y1 z1 x2 y2 z2 block', got {spec!r}")
    a = tuple(int(v) for v in parts[:3])
    b = tuple(int(v) for v in parts[3:6])
    lo = tuple(min(a[k], b[k]) for k in range(3))
    hi = tuple(max(a[k], b[k]) for k in range(3))
    return lo, hi, parts[6]  # type: ignore[return-value]


def box_cells(lo: Pos, hi: Pos) -> list[Pos]:
    return [(x, y, z) for x in range(lo[0], hi[0] + 1) for y in range(lo[1], hi[1] + 1) for z in range(lo[2], hi[2] + 1)]


class HouseBuildEnv(_BuildEnv):
    """HouseBuild: a 3D house from layers of boxes with ``/fill``, while spiders attack unless hit with ``/damage``.

    Args:
        max_turns: the turn budget H (4 in the paper).
        max_commands: lines of one answer that are read.
        max_attacks: ``/damage`` hits each player may deal per turn.

    Dataset columns: ``boxes`` (``"x1 y1 z1 x2 y2 z2 block"`` strings, ascending y), ``bbox`` (``[x1, y1, z1, x2,
    y2, z2]``), ``agent_blocks`` (each player's block types), ``spiders`` (per turn, the attack values of the spiders
    that appear), ``spider_hp``, ``player_hp``, ``player_atk``.
    """

    game = "housebuild"
    required_columns = ("boxes", "bbox", "agent_blocks", "spiders", "spider_hp", "player_hp", "player_atk")
    allowed_commands = frozenset({"fill", "damage"})

    def __init__(self, max_turns: int = 4, max_commands: int = 64, max_attacks: int = 2):
        super().__init__(max_turns=max_turns, max_commands=max_commands)
        self.max_attacks = need_int("max_attacks", max_attacks, minimum=0)

    def load(self, task: Mapping[str, Any]) -> None:
        self.boxes = [parse_box(str(b)) for b in task["boxes"]]
        self.target: dict[Pos, str] = {}
        for lo, hi, block in self.boxes:
            for p in box_cells(lo, hi):
                self.target[p] = block
        bb = [int(v) for v in task["bbox"]]
        self.bbox = (tuple(bb[:3]), tuple(bb[3:]))
        if not all(self.in_bbox(p) for p in self.target):
            raise ValueError("HouseBuild boxes must lie inside the bbox")
        blocks = [list(b) for b in task["agent_blocks"]]
        if len(blocks) != len(self.agents):
            raise ValueError(f"agent_blocks needs one list per player {list(self.agents)}, got {blocks!r}")
        self.blocks = {a: [str(x) for x in b] for a, b in zip(self.agents, blocks)}
        self.schedule = [[int(a) for a in turn] for turn in task["spiders"]]
        self.spider_hp = int(task["spider_hp"])
        self.player_hp = float(task["player_hp"])
        self.player_atk = int(task["player_atk"])
        self.damage_taken = 0.0
        self.spiders: list[list[int]] = []  # [hp left, attack] of the living spiders
        self.last_bites = 0.0
        self._spawn(0)

    def _spawn(self, turn: int) -> None:
        if turn < len(self.schedule):
            self.spiders += [[self.spider_hp, atk] for atk in self.schedule[turn]]

    def metrics(self) -> dict[str, float]:
        m = housebuild_metrics(self.target, self.world, self.damage_taken, self.player_hp)
        m["spiders"] = float(len(self.spiders))
        m["complete"] = float(m["complete"] and not self.spiders)
        return m

    def execute(self, agent: str, line: str, report: CommandReport) -> None:
        if line.startswith(("/damage", "damage")):
            m = _DAMAGE.match(line)
            if m is None:
                report.rejected.append(Rejection(line, "syntax", "use /damage @e[type=spider,limit=1] <amount>"))
                return
            amount = int(m.group(1))
            if amount > self.player_atk:
                report.rejected.append(Rejection(line, "attack", f"you deal at most {self.player_atk} damage"))
            elif report.hits >= self.max_attacks:
                report.rejected.append(Rejection(line, "attack", f"at most {self.max_attacks} hits per turn"))
            elif not self.spiders:
                report.rejected.append(Rejection(line, "attack", "no spider is alive"))
            else:
                report.hits += 1
                self.spiders[0][0] -= amount
                if self.spiders[0][0] <= 0:
                    self.spiders.pop(0)
                report.accepted += 1
            return
        m = _FILL.match(line)
        if m is None:
            report.rejected.append(classify_unmatched(line, set(self.allowed_commands)))
            return
        a = tuple(int(m.group(k)) for k in (1, 2, 3))
        b = tuple(int(m.group(k)) for k in (4, 5, 6))
        block = m.group(7)
        if not (self.in_bbox(a) and self.in_bbox(b)):  # type: ignore[arg-type]
            report.rejected.append(Rejection(line, "bbox", "a corner is outside the build area"))
            return
        if block != AIR and block not in self.blocks[agent]:
            report.rejected.append(Rejection(line, "block", f"you have no {block}"))
            return
        lo = tuple(min(a[k], b[k]) for k in range(3))
        hi = tuple(max(a[k], b[k]) for k in range(3))
        for p in box_cells(lo, hi):  # type: ignore[arg-type]
            if block == AIR:
                self.world.pop(p, None)
            else:
                self.world[p] = block
        report.accepted += 1

    def end_of_turn(self) -> None:
        self.last_bites = float(sum(atk for _, atk in self.spiders))
        self.damage_taken += self.last_bites
        self._spawn(self.turn + 1)

    def _threat(self) -> str:
        hp = max(0.0, self.player_hp - self.damage_taken)
        if not self.spiders:
            return f"Threat check: no spider nearby; you have {hp:g} HP."
        attacks = [atk for _, atk in self.spiders]
        return (f"Threat check: {len(self.spiders)} spider(s) nearby with attacks {attacks} (total {sum(attacks)} "
                f"damage per turn); you have {hp:g} HP. To hit one, output: /damage @e[type=spider,limit=1] "
                f"{self.player_atk} minecraft:player_attack")

    def instructions(self, agent: str) -> str:
        number = self.agents.index(agent) + 1
        layers: dict[int, list[str]] = {}
        for lo, hi, block in self.boxes:
            layers.setdefault(lo[1], []).append(f"({lo[0]}, {lo[1]}, {lo[2]}, {hi[0]}, {hi[1]}, {hi[2]}, {block})")
        (bx0, by0, bz0), (bx1, by1, bz1) = self.bbox
        lines = [
            f"You are player {number} of a {len(self.agents)}-player Minecraft building team; each player places "
            "part of the blocks. Reply with Minecraft commands only, one per line, with no other text.",
            "Build the house below. Each layer (ascending y) is a list of boxes (x1, y1, z1, x2, y2, z2, block):",
            *[f"y={y}: " + ", ".join(boxes) for y, boxes in sorted(layers.items())],
            f"Build area (inclusive): from ({bx0} {by0} {bz0}) to ({bx1} {by1} {bz1}).",
            f"Your blocks: {', '.join(self.blocks[agent])}. Your teammates hold the other blocks.",
            self._threat(),
            "Rules: only /fill and /damage; whole-number coordinates inside the build area; only your blocks "
            "(or air to clear a box).",
            "Format: /fill x1 y1 z1 x2 y2 z2 block",
        ]
        return "\n".join(lines)

    def state_report(self, agent: str) -> str:
        wrong = sorted(p for p, b in self.target.items() if self.world.get(p) != b)
        extra = sorted(p for p in self.world if p not in self.target)
        m = self.metrics()
        parts = [f"Correct blocks: {int(round(m['coverage'] * len(self.target)))} of {len(self.target)}.",
                 f"The spiders dealt {self.last_bites:g} damage last turn ({self.damage_taken:g} in total)."]
        by_block: dict[str, list[Pos]] = {}
        for p in wrong:
            by_block.setdefault(self.target[p], []).append(p)
        for block, cells in sorted(by_block.items()):
            owner = [a for a in self.agents if block in self.blocks[a]]
            who = "you" if agent in owner else (owner[0] if owner else "nobody")
            parts.append(f"Missing {block} ({who}): {_list(cells, 6)}.")
        if extra:
            parts.append(f"Blocks outside the plan, clear them with air: {_list(extra, 6)}.")
        parts.append(self.reports[agent].summary() if agent in self.reports else "")
        return "\n".join(p for p in parts if p)

    # data
    @classmethod
    def check_options(cls, max_width: int = 5, max_height: int = 3) -> None:
        need_int("max_width", max_width, minimum=3)
        need_int("max_height", max_height, minimum=2)
        if max_width < 3 or max_height < 2:
            raise ValueError(f"need max_width >= 3 and max_height >= 2, got {max_width}, {max_height}")

    @classmethod
    def draw(cls, rng: random.Random, max_width: int = 5, max_height: int = 3) -> dict:
        w, d, h = rng.randint(3, max_width), rng.randint(3, max_width), rng.randint(2, max_height)
        x0, y0, z0 = rng.randint(0, 9), rng.randint(0, 4), rng.randint(0, 9)
        floor, wall, roof = rng.sample(["stone", "cobblestone", "oak_planks", "white_concrete", "stone_bricks"], 3)
        pillar = "obsidian"
        x1, z1 = x0 + w - 1, z0 + d - 1
        door = rng.randint(x0 + 1, x1 - 1)
        boxes = [f"{x0} {y0} {z0} {x1} {y0} {z1} {floor}"]
        for y in range(y0 + 1, y0 + h + 1):
            for cx, cz in ((x0, z0), (x1, z0), (x0, z1), (x1, z1)):
                boxes.append(f"{cx} {y} {cz} {cx} {y} {cz} {pillar}")
            # front wall (z0) with a door gap at the two lowest wall layers
            front = [x for x in range(x0 + 1, x1) if not (x == door and y <= y0 + 2)]
            for run in _runs(front):
                boxes.append(f"{run[0]} {y} {z0} {run[-1]} {y} {z0} {wall}")
            boxes.append(f"{x0 + 1} {y} {z1} {x1 - 1} {y} {z1} {wall}")
            boxes.append(f"{x0} {y} {z0 + 1} {x0} {y} {z1 - 1} {wall}")
            boxes.append(f"{x1} {y} {z0 + 1} {x1} {y} {z1 - 1} {wall}")
        boxes.append(f"{x0} {y0 + h + 1} {z0} {x1} {y0 + h + 1} {z1} {roof}")
        kinds = [floor, wall, pillar, roof]
        rng.shuffle(kinds)
        schedule = [[rng.randint(1, 3) for _ in range(rng.choice((0, 1, 1, 2)))] for _ in range(4)]
        return {"boxes": boxes, "bbox": [x0 - 1, y0, z0 - 1, x1 + 1, y0 + h + 2, z1 + 1],
                "agent_blocks": [kinds[:2], kinds[2:]], "spiders": schedule, "spider_hp": rng.choice((4, 8)),
                "player_hp": 20, "player_atk": 4, "shape": f"{w}x{d}x{h}/{door - x0}/{floor},{wall},{roof}"}

    @classmethod
    def encode(cls, task: Mapping[str, Any]) -> str:
        return json.dumps([list(task["boxes"]), [list(s) for s in task["spiders"]], task["spider_hp"]])

    @classmethod
    def split_key(cls, task: Mapping[str, Any]) -> str:
        return str(task["shape"])  # the house's form and materials, wherever it stands


def _runs(xs: Sequence[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for x in xs:
        if runs and x == runs[-1][-1] + 1:
            runs[-1].append(x)
        else:
            runs.append([x])
    return runs
