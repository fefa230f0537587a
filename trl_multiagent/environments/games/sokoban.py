"""Sokoban in small rooms by a tool agent and a plan agent (AT-GRPO Appendix B.5 and the case study of H.1).

Symbols: ``#`` wall, ``_`` floor, ``.`` goal, ``$`` box, ``*`` box on a goal, ``@`` player, ``+`` player on a goal
(``_`` replaces the usual blank floor, which prompts and tokenizers handle badly). A move ``U``/``D``/``L``/``R``
walks one cell; walking into a box pushes it when the cell behind it is floor or goal. The plan agent answers
``ACTIONS: R R D ...``; the moves are carried out in order and stop at the first illegal one (into a wall, or a push
into a wall or another box) or when every box is on a goal. Success: every box on a goal.

Generation by reverse play, so that every instance is solvable: a room of ``size x size`` cells (default 6x6:
outer walls around 4x4 floor, plus 0-2 interior walls that keep the floor connected) gets 1-2 goals with a box on
each and a player on another floor cell; then the player walks randomly backwards for 10-40 steps, pulling the box
in front of it along with probability 0.7 (the reverse of a push). The result is kept when at least one box is off
its goal and the reference solver (BFS over player and box positions) confirms a solution of at least 3 moves.
Dataset columns: ``task_id``, ``split``, ``grid`` (row strings), ``size``, ``num_boxes``, ``optimal_moves``.

Rewards (shaped, Appendix B.5). Let ``b`` be the number of boxes, ``b_t`` the boxes on goals after turn ``t``, a
static corner deadlock a box off the goals with a wall above or below it AND a wall left or right of it, and
``Psi = -sum over boxes of the Manhattan distance to the nearest goal`` (the box-to-goal potential, larger is
better).

* Team: ``r_team = b_t / b + 1[b_t = b]``.
* Plan local, over the ``n`` moves it considered: ``0.2 format + 0.4 legal + 0.4 no_deadlock`` with ``format =
  1[answer parses]``, ``legal = (#legal moves) / n`` and ``no_deadlock = 1[parsed and no static corner deadlock
  after the moves]``.
* Tool local, on its proposal simulated from the state it saw: ``0.1 ran + 0.1 parsed + 0.2 legal +
  0.1 no_deadlock + 0.2 potential + 0.3 on_goal`` with ``ran = 1[code ran to its end]``, ``parsed = 1[stdout
  holds a move list]``, ``legal`` and ``no_deadlock`` as above, ``potential = 1[parsed and Psi(after) >=
  Psi(before)]`` and ``on_goal = b' / b`` after the proposal (0 when it does not parse).

Outcome mode (Appendix B.6): see :mod:`trl_multiagent.environments.games.base`.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trl_multiagent.environments.games.base import ToolPlanGameEnv, ToolReport, parse_moves
from trl_multiagent.environments.games.plan_path import DELTAS

WALL, FLOOR, GOAL, BOX, BOX_ON_GOAL, PLAYER, PLAYER_ON_GOAL = "#", "_", ".", "$", "*", "@", "+"
Cell = tuple[int, int]


@dataclass(frozen=True)
class Room:
    """A Sokoban instance: static walls and goals, movable boxes and player."""

    rows: int
    cols: int
    walls: frozenset[Cell]
    goals: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell

    @classmethod
    def parse(cls, grid: Sequence[str]) -> Room:
        walls, goals, boxes, player = set(), set(), set(), None
        for r, row in enumerate(grid):
            for c, ch in enumerate(row):
                if ch == WALL:
                    walls.add((r, c))
                if ch in (GOAL, BOX_ON_GOAL, PLAYER_ON_GOAL):
                    goals.add((r, c))
                if ch in (BOX, BOX_ON_GOAL):
                    boxes.add((r, c))
                if ch in (PLAYER, PLAYER_ON_GOAL):
                    if player is not None:
                        raise ValueError("two players in the grid")
                    player = (r, c)
                if ch not in (WALL, FLOOR, GOAL, BOX, BOX_ON_GOAL, PLAYER, PLAYER_ON_GOAL):
                    raise ValueError(f"unknown symbol {ch!r} in the grid")
        if player is None or not boxes or len(boxes) != len(goals):
            raise ValueError("a Sokoban grid needs one player, at least one box and as many goals as boxes")
        return cls(len(grid), max(len(row) for row in grid), frozenset(walls), frozenset(goals), frozenset(boxes),
                   player)

    def with_state(self, boxes: Iterable[Cell], player: Cell) -> Room:
        return Room(self.rows, self.cols, self.walls, self.goals, frozenset(boxes), player)

    def blocked(self, cell: Cell) -> bool:
        r, c = cell
        return cell in self.walls or not (0 <= r < self.rows and 0 <= c < self.cols)

    def grid(self) -> list[str]:
        out = []
        for r in range(self.rows):
            row = []
            for c in range(self.cols):
                cell = (r, c)
                if cell in self.walls:
                    row.append(WALL)
                elif cell == self.player:
                    row.append(PLAYER_ON_GOAL if cell in self.goals else PLAYER)
                elif cell in self.boxes:
                    row.append(BOX_ON_GOAL if cell in self.goals else BOX)
                else:
                    row.append(GOAL if cell in self.goals else FLOOR)
            out.append("".join(row))
        return out

    def on_goal(self) -> int:
        return len(self.boxes & self.goals)

    def solved(self) -> bool:
        return self.boxes <= self.goals

    def corner_deadlocked(self, box: Cell) -> bool:
        """A static corner deadlock: the box is off the goals with a wall on one vertical and one horizontal side."""
        if box in self.goals:
            return False
        r, c = box
        vertical = self.blocked((r - 1, c)) or self.blocked((r + 1, c))
        horizontal = self.blocked((r, c - 1)) or self.blocked((r, c + 1))
        return vertical and horizontal

    def deadlocked(self) -> bool:
        return any(self.corner_deadlocked(b) for b in self.boxes)

    def potential(self) -> int:
        """Psi: minus the sum over boxes of the Manhattan distance to the nearest goal."""
        return -sum(min(abs(b[0] - g[0]) + abs(b[1] - g[1]) for g in self.goals) for b in self.boxes)

    def move(self, direction: str) -> Room | None:
        """The room after one move, or ``None`` when the move is illegal."""
        dr, dc = DELTAS[direction]
        r, c = self.player
        nxt = (r + dr, c + dc)
        if self.blocked(nxt):
            return None
        if nxt in self.boxes:
            beyond = (nxt[0] + dr, nxt[1] + dc)
            if self.blocked(beyond) or beyond in self.boxes:
                return None
            return self.with_state((self.boxes - {nxt}) | {beyond}, nxt)
        return self.with_state(self.boxes, nxt)


def solve_sokoban(grid: Sequence[str] | Room, max_states: int = 200_000) -> list[str] | None:
    """Reference solver: a shortest move list by BFS over (player, boxes), pruning corner deadlocks.

    ``None`` when there is no solution (or none within ``max_states`` visited states).
    """
    room = grid if isinstance(grid, Room) else Room.parse(grid)
    if room.solved():
        return []
    start = (room.player, room.boxes)
    parents: dict[tuple, tuple | None] = {start: None}
    queue = deque([room])
    while queue:
        cur = queue.popleft()
        for name in DELTAS:
            nxt = cur.move(name)
            if nxt is None:
                continue
            key = (nxt.player, nxt.boxes)
            if key in parents or nxt.deadlocked():
                continue
            parents[key] = ((cur.player, cur.boxes), name)
            if nxt.solved():
                moves = []
                while parents[key] is not None:
                    key, step = parents[key]
                    moves.append(step)
                return moves[::-1]
            if len(parents) >= max_states:
                return None
            queue.append(nxt)
    return None


def _floor_connected(rows: int, cols: int, walls: set[Cell]) -> bool:
    floor = [(r, c) for r in range(rows) for c in range(cols) if (r, c) not in walls]
    if not floor:
        return False
    seen, queue = {floor[0]}, deque([floor[0]])
    while queue:
        r, c = queue.popleft()
        for dr, dc in DELTAS.values():
            nxt = (r + dr, c + dc)
            if nxt not in seen and nxt not in walls and 0 <= nxt[0] < rows and 0 <= nxt[1] < cols:
                seen.add(nxt)
                queue.append(nxt)
    return len(seen) == len(floor)


def reverse_play(room: Room, steps: int, rng: random.Random, pull_prob: float = 0.7) -> Room:
    """Walk the player backwards from ``room``; a step may pull the box in front of the player along."""
    boxes, player = set(room.boxes), room.player
    for _ in range(steps):
        name = rng.choice(list(DELTAS))
        dr, dc = DELTAS[name]
        dest = (player[0] + dr, player[1] + dc)
        if room.blocked(dest) or dest in boxes:
            continue
        front = (player[0] - dr, player[1] - dc)  # the box the player faces while stepping back
        if front in boxes and rng.random() < pull_prob:
            boxes.remove(front)
            boxes.add(player)
        player = dest
    return room.with_state(boxes, player)


@dataclass
class SokobanOutcome:
    parsed: bool
    before: Room
    after: Room
    considered: int = 0
    legal: int = 0
    reached: bool = False
    stop: str = ""


class SokobanEnv(ToolPlanGameEnv):
    """Sokoban with a ``tool`` (code) agent and a ``plan`` agent; see the module docstring.

    Args: those of :class:`~trl_multiagent.environments.games.base.ToolPlanGameEnv` (``max_turns``,
    ``reward_mode``, ``sandbox``, ``cache_tool_runs``).
    """

    game = "sokoban"
    required_columns = ("grid",)

    # ---------------------------------------------------------------- data
    @classmethod
    def encode(cls, task: Mapping[str, Any]) -> str:
        return "\n".join(task["grid"])

    @classmethod
    def draw(cls, rng: random.Random, sizes: Sequence[int] = (6,), boxes: Sequence[int] = (1, 2),
             max_interior_walls: int = 2, min_moves: int = 3) -> dict | None:
        n = rng.choice(list(sizes))
        walls = {(r, c) for r in range(n) for c in range(n) if r in (0, n - 1) or c in (0, n - 1)}
        interior = [(r, c) for r in range(1, n - 1) for c in range(1, n - 1)]
        walls |= set(rng.sample(interior, rng.randint(0, max_interior_walls)))
        if not _floor_connected(n, n, walls):
            return None
        floor = [cell for cell in interior if cell not in walls]
        nb = rng.choice(list(boxes))
        if len(floor) < nb + 2:
            return None
        picks = rng.sample(floor, nb + 1)
        goals, player = frozenset(picks[:nb]), picks[nb]
        solved = Room(n, n, frozenset(walls), goals, goals, player)
        room = reverse_play(solved, rng.randint(10, 40), rng)
        if room.solved():
            return None
        path = solve_sokoban(room)
        if path is None or len(path) < min_moves:
            return None
        return {"grid": room.grid(), "size": n, "num_boxes": nb, "optimal_moves": len(path)}

    @classmethod
    def make_dataset(cls, num_tasks: int = 256, seed: int = 0, split: str = "train", sizes: Sequence[int] = (6,),
                     boxes: Sequence[int] = (1, 2), max_interior_walls: int = 2, min_moves: int = 3):
        """Solvable rooms (see the module docstring); train and eval never overlap."""
        sizes, boxes = tuple(int(s) for s in sizes), tuple(int(b) for b in boxes)
        if not sizes or min(sizes) < 5 or max(sizes) > 10:
            raise ValueError(f"sizes must be between 5 and 10, got {sizes}")
        if not boxes or min(boxes) < 1 or max(boxes) > 3:
            raise ValueError(f"boxes must be between 1 and 3, got {boxes}")
        return super().make_dataset(num_tasks, seed, split, sizes=sizes, boxes=boxes,
                                    max_interior_walls=max_interior_walls, min_moves=min_moves)

    # ---------------------------------------------------------------- state
    def load(self, task: Mapping[str, Any]) -> None:
        try:
            self.room = Room.parse([str(row) for row in task["grid"]])
        except ValueError as exc:
            raise ValueError(f"{task.get('task_id', 'task')}: {exc}") from exc

    def render(self) -> str:
        lines = [f"Sokoban in a {self.room.rows}x{self.room.cols} room (row 0 at the top). Push every box onto a "
                 "goal."]
        lines += [" ".join(row) for row in self.room.grid()]
        lines.append("# = wall, _ = floor, . = goal, $ = box, * = box on a goal, @ = you, + = you on a goal. "
                     "Moves U, D, L, R walk one cell; walking into a box pushes it if the cell behind it is free.")
        return "\n".join(lines)

    def tool_instructions(self) -> str:
        return ("You are the tool agent. Write Python code that finds moves that put every box on a goal and prints "
                "them on one line as: ACTIONS: <moves separated by spaces>\n"
                "Predefined variable: grid (list of row strings as above, without spaces). Reply with the code only, "
                "in a ```python block.")

    def plan_instructions(self) -> str:
        return ("You are the plan agent. Check the tool's moves against the room (walls, pushes) and decide the "
                "moves. End your reply with one line: ACTIONS: <moves separated by spaces>")

    def preamble(self) -> str:
        return f"grid = {self.room.grid()!r}\n"

    def parse(self, text: str, from_stdout: bool) -> list[str] | None:
        return parse_moves(text, "ACTIONS", from_stdout=from_stdout, max_moves=8 * self.room.rows * self.room.cols)

    def simulate(self, answer: list[str] | None) -> SokobanOutcome:
        out = SokobanOutcome(parsed=answer is not None, before=self.room, after=self.room)
        if answer is None:
            return out
        room = self.room
        for move in answer:
            out.considered += 1
            nxt = room.move(move)
            if nxt is None:
                out.stop = f"move {out.considered} ({move}) is blocked"
                break
            out.legal += 1
            room = nxt
            if room.solved():
                out.reached = True
                break
        out.after = room
        return out

    def commit(self, outcome: SokobanOutcome) -> None:
        self.room = outcome.after

    def solved(self) -> bool:
        return self.room.solved()

    def outcome_solves(self, outcome: SokobanOutcome) -> bool:
        return outcome.after.solved()

    # ---------------------------------------------------------------- rewards
    def team_components(self, outcome: SokobanOutcome) -> tuple[float, dict[str, float]]:
        ratio = outcome.after.on_goal() / len(outcome.after.boxes)
        success = float(outcome.after.solved())
        return ratio + success, {"boxes_on_goal": ratio, "success": success}

    def plan_components(self, outcome: SokobanOutcome) -> dict[str, tuple[float, float, bool]]:
        n = max(1, outcome.considered)
        return {
            "format": (0.2, float(outcome.parsed), True),
            "legal": (0.4, outcome.legal / n if outcome.parsed else 0.0, True),
            "no_deadlock": (0.4, float(outcome.parsed and not outcome.after.deadlocked()), True),
        }

    def tool_components(self, report: ToolReport) -> dict[str, tuple[float, float, bool]]:
        out: SokobanOutcome = report.outcome
        n = max(1, out.considered)
        return {
            "ran": (0.1, float(report.ran), True),
            "parsed": (0.1, float(report.parsed), True),
            "legal": (0.2, out.legal / n if out.parsed else 0.0, True),
            "no_deadlock": (0.1, float(out.parsed and not out.after.deadlocked()), True),
            "potential": (0.2, float(out.parsed and out.after.potential() >= out.before.potential()), True),
            "on_goal": (0.3, out.after.on_goal() / len(out.after.boxes) if out.parsed else 0.0, True),
        }

    def describe_outcome(self, outcome: SokobanOutcome) -> str:
        if not outcome.parsed:
            return "the plan's answer had no ACTIONS line; nothing moved."
        b = len(outcome.after.boxes)
        text = f"{outcome.legal} of {outcome.considered} moves done; {outcome.after.on_goal()} of {b} boxes on goals"
        if outcome.reached:
            return text + "; solved."
        if outcome.after.deadlocked():
            text += "; a box is stuck in a corner"
        return text + (f"; {outcome.stop}." if outcome.stop else ".")
