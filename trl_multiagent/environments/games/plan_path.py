"""Plan-Path: grid path planning by a tool agent and a plan agent (AT-GRPO Appendix B.4 and D).

A square map (5x5 to 8x8 by default) has free cells ``.``, obstacles ``#``, the walker ``A`` and the goal ``G``
(row 0 at the top). A move is ``U``, ``D``, ``L`` or ``R``. The plan agent answers ``ACTIONS: R R D ...``; the moves
are carried out in order and stop at the first illegal one (off the map or into an obstacle) or when the goal is
reached. Success: the walker stands on the goal.

Generation: an obstacle density is drawn in ``[0.1, 0.3]``, each cell becomes an obstacle with that probability,
start and goal are two distinct free cells at Manhattan distance at least 2, and the instance is kept only when
BFS finds a path (every instance is solvable). Dataset columns: ``task_id``, ``split``, ``grid`` (row strings),
``size``, ``shortest_path_length``.

Rewards (shaped, Appendix B.4). Let ``d_t`` be the Manhattan distance from the walker to the goal after turn ``t``,
``D = max(1, d_0)`` (the start's distance) and ``dist(p)`` the BFS distance from cell ``p`` to the goal.

* Team: ``r_team = (d_{t-1} - d_t) / D + 1[goal reached]``. Over an episode the distance terms telescope to
  ``(d_0 - d_T) / D``, which is 1 at the goal.
* Plan local, over the ``n`` moves it considered (up to and including the goal-reaching or the first illegal
  move): ``0.1 format + 0.3 legal + 0.4 sp_next + 0.2 goal`` with ``format = 1[answer parses]``,
  ``legal = (#legal moves) / n``, ``sp_next = (#moves from p to q with dist(q) = dist(p) - 1) / n`` (the move lies
  on a shortest path, the paper's SPNext) and ``goal = 1[goal reached]``.
* Tool local, on its proposal simulated from the state it saw: ``0.1 ran + 0.2 parsed + 0.2 legal + 0.2 potential
  + 0.3 goal`` with ``ran = 1[code ran to its end]``, ``parsed = 1[stdout holds a move list]``, ``legal`` as above,
  ``potential = 1[parsed and dist(after) <= dist(before)]`` (the potential ``-dist`` does not decrease) and
  ``goal = 1[the proposal reaches the goal]``.

Outcome mode (Appendix B.6): see :mod:`trl_multiagent.environments.games.base`.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trl_multiagent.environments.games.base import ToolPlanGameEnv, ToolReport, parse_moves

DELTAS = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
FREE, WALL, START, GOAL = ".", "#", "A", "G"


def find(grid: Sequence[str], char: str) -> tuple[int, int]:
    for r, row in enumerate(grid):
        c = row.find(char)
        if c >= 0:
            return r, c
    raise ValueError(f"no {char!r} in the grid")


def passable(grid: Sequence[str], r: int, c: int) -> bool:
    return 0 <= r < len(grid) and 0 <= c < len(grid[r]) and grid[r][c] != WALL


def distance_map(grid: Sequence[str], target: tuple[int, int]) -> dict[tuple[int, int], int]:
    """BFS distance from every reachable cell to ``target``."""
    dist = {target: 0}
    queue = deque([target])
    while queue:
        r, c = queue.popleft()
        for dr, dc in DELTAS.values():
            nxt = (r + dr, c + dc)
            if nxt not in dist and passable(grid, *nxt):
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    return dist


def solve_plan_path(grid: Sequence[str], start: tuple[int, int] | None = None) -> list[str] | None:
    """Reference solver: a shortest move list from ``start`` (default: ``A``) to ``G`` by BFS, ``None`` if none."""
    start = start if start is not None else find(grid, START)
    goal = find(grid, GOAL)
    dist = distance_map(grid, goal)
    if start not in dist:
        return None
    moves, (r, c) = [], start
    while (r, c) != goal:
        for name, (dr, dc) in DELTAS.items():
            if dist.get((r + dr, c + dc)) == dist[(r, c)] - 1:
                moves.append(name)
                r, c = r + dr, c + dc
                break
    return moves


def manhattan(a: tuple[int, int], b: tuple[int, int]) -> int:
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


@dataclass
class PathOutcome:
    """The result of carrying out a move list from ``before``."""

    parsed: bool
    before: tuple[int, int]
    after: tuple[int, int]
    considered: int = 0
    legal: int = 0
    on_shortest: int = 0
    reached: bool = False
    stop: str = ""


class PlanPathEnv(ToolPlanGameEnv):
    """Grid path planning with a ``tool`` (code) agent and a ``plan`` agent; see the module docstring.

    Args: those of :class:`~trl_multiagent.environments.games.base.ToolPlanGameEnv` (``max_turns``,
    ``reward_mode``, ``sandbox``, ``cache_tool_runs``).
    """

    game = "plan_path"
    required_columns = ("grid",)

    # ---------------------------------------------------------------- data
    @classmethod
    def encode(cls, task: Mapping[str, Any]) -> str:
        return "\n".join(task["grid"])

    @classmethod
    def draw(cls, rng: random.Random, sizes: Sequence[int] = (5, 6, 7, 8), min_density: float = 0.1,
             max_density: float = 0.3) -> dict | None:
        n = rng.choice(list(sizes))
        density = rng.uniform(min_density, max_density)
        cells = [[WALL if rng.random() < density else FREE for _ in range(n)] for _ in range(n)]
        free = [(r, c) for r in range(n) for c in range(n) if cells[r][c] == FREE]
        if len(free) < 2:
            return None
        start, goal = rng.sample(free, 2)
        if manhattan(start, goal) < 2:
            return None
        cells[start[0]][start[1]], cells[goal[0]][goal[1]] = START, GOAL
        grid = ["".join(row) for row in cells]
        path = solve_plan_path(grid)
        if path is None:
            return None
        return {"grid": grid, "size": n, "shortest_path_length": len(path)}

    @classmethod
    def make_dataset(cls, num_tasks: int = 256, seed: int = 0, split: str = "train",
                     sizes: Sequence[int] = (5, 6, 7, 8), min_density: float = 0.1, max_density: float = 0.3):
        """Solvable square maps of the given sizes (see the module docstring); train and eval never overlap."""
        sizes = tuple(int(s) for s in sizes)
        if not sizes or min(sizes) < 3 or max(sizes) > 20:
            raise ValueError(f"sizes must be between 3 and 20, got {sizes}")
        if not 0.0 <= min_density <= max_density < 0.8:
            raise ValueError(f"need 0 <= min_density <= max_density < 0.8, got {min_density}, {max_density}")
        return super().make_dataset(num_tasks, seed, split, sizes=sizes, min_density=min_density,
                                    max_density=max_density)

    # ---------------------------------------------------------------- state
    def load(self, task: Mapping[str, Any]) -> None:
        grid = [str(row) for row in task["grid"]]
        if not grid or any(len(row) != len(grid[0]) for row in grid):
            raise ValueError(f"{task.get('task_id', 'task')}: the grid must be a non-empty list of equal-length rows")
        self.start, self.goal = find(grid, START), find(grid, GOAL)
        self.map = [row.replace(START, FREE).replace(GOAL, FREE) for row in grid]
        self.pos = self.start
        self.dist = distance_map(self.map, self.goal)
        self.norm = max(1, manhattan(self.start, self.goal))

    def _grid_now(self) -> list[str]:
        rows = [list(row) for row in self.map]
        rows[self.goal[0]][self.goal[1]] = GOAL
        rows[self.pos[0]][self.pos[1]] = START
        return ["".join(row) for row in rows]

    def render(self) -> str:
        n_rows, n_cols = len(self.map), len(self.map[0])
        lines = [f"Path planning on a {n_rows}x{n_cols} map (row 0 at the top, column 0 at the left):"]
        lines += [" ".join(row) for row in self._grid_now()]
        lines.append(f"A = you at {self.pos}, G = goal at {self.goal}, # = obstacle, . = free. "
                     "Moves: U (up), D (down), L (left), R (right).")
        return "\n".join(lines)

    def tool_instructions(self) -> str:
        return ("You are the tool agent. Write Python code that finds a path from A to G and prints it on one line "
                "as: ACTIONS: <moves separated by spaces>\n"
                "Predefined variables: grid (list of row strings as above, without spaces), pos (row, col of A), "
                "goal (row, col of G). Reply with the code only, in a ```python block.")

    def plan_instructions(self) -> str:
        return ("You are the plan agent. Check the tool's result against the map and decide the moves. End your "
                "reply with one line: ACTIONS: <moves separated by spaces>")

    def preamble(self) -> str:
        return f"grid = {self._grid_now()!r}\npos = {self.pos!r}\ngoal = {self.goal!r}\n"

    def parse(self, text: str, from_stdout: bool) -> list[str] | None:
        limit = 4 * len(self.map) * len(self.map[0])
        return parse_moves(text, "ACTIONS", from_stdout=from_stdout, max_moves=limit)

    def simulate(self, answer: list[str] | None) -> PathOutcome:
        out = PathOutcome(parsed=answer is not None, before=self.pos, after=self.pos)
        if answer is None:
            return out
        r, c = self.pos
        for move in answer:
            out.considered += 1
            dr, dc = DELTAS[move]
            if not passable(self.map, r + dr, c + dc):
                out.stop = f"move {out.considered} ({move}) is blocked at {(r + dr, c + dc)}"
                break
            out.legal += 1
            if self.dist.get((r + dr, c + dc), -9) == self.dist.get((r, c), -9) - 1:
                out.on_shortest += 1
            r, c = r + dr, c + dc
            if (r, c) == self.goal:
                out.reached = True
                break
        out.after = (r, c)
        return out

    def commit(self, outcome: PathOutcome) -> None:
        self.pos = outcome.after

    def solved(self) -> bool:
        return self.pos == self.goal

    def outcome_solves(self, outcome: PathOutcome) -> bool:
        return outcome.after == self.goal

    # ---------------------------------------------------------------- rewards
    def team_components(self, outcome: PathOutcome) -> tuple[float, dict[str, float]]:
        gain = (manhattan(outcome.before, self.goal) - manhattan(outcome.after, self.goal)) / self.norm
        success = float(outcome.after == self.goal)
        return gain + success, {"distance_gain": gain, "success": success}

    def plan_components(self, outcome: PathOutcome) -> dict[str, tuple[float, float, bool]]:
        n = max(1, outcome.considered)
        return {
            "format": (0.1, float(outcome.parsed), True),
            "legal": (0.3, outcome.legal / n if outcome.parsed else 0.0, True),
            "sp_next": (0.4, outcome.on_shortest / n if outcome.parsed else 0.0, True),
            "goal": (0.2, float(outcome.reached), True),
        }

    def tool_components(self, report: ToolReport) -> dict[str, tuple[float, float, bool]]:
        out: PathOutcome = report.outcome
        n = max(1, out.considered)
        before = self.dist.get(out.before, 10**6)
        after = self.dist.get(out.after, 10**6)
        return {
            "ran": (0.1, float(report.ran), True),
            "parsed": (0.2, float(report.parsed), True),
            "legal": (0.2, out.legal / n if out.parsed else 0.0, True),
            "potential": (0.2, float(out.parsed and after <= before), True),
            "goal": (0.3, float(out.reached), True),
        }

    def describe_outcome(self, outcome: PathOutcome) -> str:
        if not outcome.parsed:
            return "the plan's answer had no ACTIONS line; you did not move."
        text = f"{outcome.legal} of {outcome.considered} moves done, from {outcome.before} to {outcome.after}"
        if outcome.reached:
            return text + "; the goal is reached."
        return text + (f"; {outcome.stop}." if outcome.stop else ".")
