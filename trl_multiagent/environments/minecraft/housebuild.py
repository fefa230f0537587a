"""HouseBuild (CoLLM Sec. 6.1, App. E.3): a house from layers of boxes with ``/fill``, while spiders attack unless
hit with ``/damage``."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

from trl_multiagent.environments.checks import need_int
from trl_multiagent.environments.minecraft.build_env import BuildEnv
from trl_multiagent.environments.minecraft.commands import (
    DAMAGE,
    FILL,
    CommandReport,
    Rejection,
    classify_unmatched,
    list_positions,
)
from trl_multiagent.environments.minecraft.world import AIR, Pos, box_cells, housebuild_metrics, parse_box


class HouseBuildEnv(BuildEnv):
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
            m = DAMAGE.match(line)
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
        m = FILL.match(line)
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
            parts.append(f"Missing {block} ({who}): {list_positions(cells, 6)}.")
        if extra:
            parts.append(f"Blocks outside the plan, clear them with air: {list_positions(extra, 6)}.")
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
