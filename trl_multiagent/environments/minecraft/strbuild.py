"""StrBuild (CoLLM Sec. 6.1, App. E.3): a string in a pixel font built as a wall with ``/setblock``."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from typing import Any

from trl_multiagent.environments.checks import need_bool, need_int
from trl_multiagent.environments.minecraft.build_env import AGENTS, BuildEnv
from trl_multiagent.environments.minecraft.commands import (
    SETBLOCK,
    CommandReport,
    Rejection,
    classify_unmatched,
    format_pos,
    list_positions,
)
from trl_multiagent.environments.minecraft.world import (
    AIR,
    BLOCK_FAMILIES,
    FONT,
    Pos,
    grid_cells,
    render_string,
    strbuild_metrics,
)


class StrBuildEnv(BuildEnv):
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
        m = SETBLOCK.match(line)
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
            parts.append(f"Still missing at: {list_positions(missing)}.")
        if extra:
            parts.append(f"Blocks on air cells, remove them: {list_positions(extra)}.")
        if same:
            parts.append(f"Same block as the neighbour above or to the right at: {list_positions(same)}; use a different "
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
