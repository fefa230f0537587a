"""Sudoku (4x4 and 9x9) by a tool agent and a plan agent (AT-GRPO Appendix B.3 and the Sudoku workflow of C.2).

Fill the empty cells (``0``) with ``1..n`` so that every row, column and box holds each digit once. The plan agent
answers ``ANSWER:`` followed by the whole grid (``n * n`` digits, row by row, any separators; ``0`` leaves a cell
empty). A submitted grid is *accepted* (becomes the current grid) when it keeps every clue and has no repeated digit
in any row, column or box; otherwise the grid stays as it was. Success: the current grid is complete and valid.

Generation: a complete grid is built by randomized backtracking; cells are then emptied in random order. With
``unique=True`` (default) a cell is emptied only if the puzzle keeps exactly one solution (checked by the
backtracking solver), and the split of an instance is decided by its solution (unique puzzles with different
solutions differ); with ``unique=False`` cells are emptied freely (the generating grid stays a solution, so at
least one exists) and the split is decided by the puzzle. Holes: 6-10 of 16 cells (4x4), 36-48 of 81 (9x9); a
unique puzzle may end with fewer. Dataset columns: ``task_id``, ``split``, ``size``, ``puzzle`` and ``solution``
(lists of rows of ints), ``holes``, ``unique``.

Rewards (shaped, Appendix B.3). The team reward is the sparse success signal of the paper; validity and progress
live in the local rewards.

* Team: ``r_team = 1[the grid is solved after this step]``.
* Plan local: ``0.1 format + 0.2 givens + 0.3 valid + 0.2 progress + 0.2 solved`` with ``format = 1[answer
  parses]``, ``givens = 1[it keeps every clue]``, ``valid = 1[no repeated digit among its filled cells]``,
  ``progress = max(0, filled(g_t) - filled(g_{t-1})) / empty(g_{t-1})`` when the answer is accepted (else 0; g is
  the current grid, masked when ``g_{t-1}`` has no empty cell) and ``solved = 1[accepted and complete]``.
* Tool local: ``0.1 ran + 0.2 parsed + 0.3 consistent + 0.4 solved`` with ``ran = 1[code ran to its end]``,
  ``parsed = 1[stdout holds a grid]``, ``consistent = 1[that grid keeps the clues and repeats no digit]`` and
  ``solved = 1[it is a complete solution]``.

Outcome mode (Appendix B.6): see :mod:`trl_multiagent.environments.games.base`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trl_multiagent.environments.games.base import (
    ToolPlanGameEnv,
    ToolReport,
    check_options,
    generate_split,
    parse_grid,
    split_of_encoding,
)

Grid = list[list[int]]
HOLES = {4: (6, 10), 9: (36, 48)}


def box_size(n: int) -> int:
    b = math.isqrt(n)
    if b * b != n:
        raise ValueError(f"a Sudoku side must be a square number, got {n}")
    return b


def _search(cells: list[int], n: int, b: int, limit: int, rng: random.Random | None, found: list[list[int]]) -> None:
    """Depth-first search with the fewest-candidates cell first; appends up to ``limit`` solutions to ``found``."""
    rows, cols, boxes = [0] * n, [0] * n, [0] * n
    for i, v in enumerate(cells):
        if v:
            r, c = divmod(i, n)
            bit = 1 << v
            rows[r] |= bit
            cols[c] |= bit
            boxes[(r // b) * b + c // b] |= bit

    def recurse() -> bool:
        best, best_cands = -1, None
        for i, v in enumerate(cells):
            if v == 0:
                r, c = divmod(i, n)
                used = rows[r] | cols[c] | boxes[(r // b) * b + c // b]
                cands = [d for d in range(1, n + 1) if not used >> d & 1]
                if best_cands is None or len(cands) < len(best_cands):
                    best, best_cands = i, cands
                    if len(cands) <= 1:
                        break
        if best_cands is None:
            found.append(list(cells))
            return len(found) >= limit
        if rng is not None:
            rng.shuffle(best_cands)
        r, c = divmod(best, n)
        k = (r // b) * b + c // b
        for d in best_cands:
            bit = 1 << d
            cells[best] = d
            rows[r] |= bit
            cols[c] |= bit
            boxes[k] |= bit
            stop = recurse()
            cells[best] = 0
            rows[r] &= ~bit
            cols[c] &= ~bit
            boxes[k] &= ~bit
            if stop:
                return True
        return False

    recurse()


def conflicts(grid: Grid) -> list[str]:
    """The rows/columns/boxes that repeat a digit among their filled cells (``"row 1"``, ``"box 3"``...)."""
    n = len(grid)
    b = box_size(n)
    units = [(f"row {r}", [(r, c) for c in range(n)]) for r in range(n)]
    units += [(f"column {c}", [(r, c) for r in range(n)]) for c in range(n)]
    units += [(f"box {k}", [((k // b) * b + i, (k % b) * b + j) for i in range(b) for j in range(b)])
              for k in range(n)]
    bad = []
    for name, cells in units:
        values = [grid[r][c] for r, c in cells if grid[r][c]]
        if len(values) != len(set(values)):
            bad.append(name)
    return bad


def solve_sudoku(puzzle: Grid, limit: int = 1) -> list[Grid]:
    """Reference solver (backtracking): up to ``limit`` solutions of ``puzzle`` (0 = empty)."""
    n = len(puzzle)
    b = box_size(n)
    if conflicts(puzzle):
        return []
    found: list[list[int]] = []
    _search([v for row in puzzle for v in row], n, b, limit, None, found)
    return [[cells[r * n:(r + 1) * n] for r in range(n)] for cells in found]


def is_solution(puzzle: Grid, grid: Grid) -> bool:
    """``grid`` is complete, repeats no digit and keeps every clue of ``puzzle``."""
    n = len(puzzle)
    return (len(grid) == n and all(len(row) == n for row in grid)
            and all(1 <= v <= n for row in grid for v in row)
            and all(p == 0 or p == g for prow, grow in zip(puzzle, grid) for p, g in zip(prow, grow))
            and not conflicts(grid))


def random_full_grid(n: int, rng: random.Random) -> Grid:
    found: list[list[int]] = []
    _search([0] * (n * n), n, box_size(n), 1, rng, found)
    return [found[0][r * n:(r + 1) * n] for r in range(n)]


def dig(solution: Grid, holes: int, unique: bool, rng: random.Random) -> Grid:
    """Empty up to ``holes`` cells of ``solution`` in random order (only while the solution stays unique)."""
    n = len(solution)
    puzzle = [list(row) for row in solution]
    order = [(r, c) for r in range(n) for c in range(n)]
    rng.shuffle(order)
    made = 0
    for r, c in order:
        if made >= holes:
            break
        keep = puzzle[r][c]
        puzzle[r][c] = 0
        if unique and len(solve_sudoku(puzzle, limit=2)) != 1:
            puzzle[r][c] = keep
            continue
        made += 1
    return puzzle


def _flat(grid: Grid) -> str:
    return "".join(str(v) for row in grid for v in row)


@dataclass
class SudokuOutcome:
    parsed: bool
    grid: Grid  # the current grid after the step (unchanged unless accepted)
    keeps_givens: bool = False
    bad_units: tuple[str, ...] = ()
    accepted: bool = False
    filled_before: int = 0
    filled_after: int = 0
    empty_before: int = 0
    solved: bool = False


class SudokuEnv(ToolPlanGameEnv):
    """Sudoku with a ``tool`` (code) agent and a ``plan`` agent; see the module docstring.

    Args: those of :class:`~trl_multiagent.environments.games.base.ToolPlanGameEnv` (``max_turns``,
    ``reward_mode``, ``sandbox``, ``cache_tool_runs``). The grid size comes from each task (4 or 9).
    """

    game = "sudoku"
    required_columns = ("puzzle",)
    default_sizes: tuple[int, ...] = (4,)

    # ---------------------------------------------------------------- data
    @classmethod
    def encode(cls, task: Mapping[str, Any]) -> str:
        return f"{len(task['puzzle'])}:{_flat(task['puzzle'])}"

    @classmethod
    def draw(cls, rng: random.Random, sizes: Sequence[int] = (4,), unique: bool = True,
             split: str | None = None) -> dict | None:
        n = rng.choice(list(sizes))
        solution = random_full_grid(n, rng)
        if unique and split is not None and split_of_encoding(cls.game, cls._solution_key(solution)) != split:
            return None  # cheap early rejection: the split of a unique puzzle is that of its solution
        low, high = HOLES[n]
        puzzle = dig(solution, rng.randint(low, high), unique, rng)
        holes = sum(v == 0 for row in puzzle for v in row)
        return {"size": n, "puzzle": puzzle, "solution": solution, "holes": holes, "unique": unique}

    @staticmethod
    def _solution_key(solution: Grid) -> str:
        return f"solution:{len(solution)}:{_flat(solution)}"

    @classmethod
    def make_rows(cls, num_tasks: int, seed: int = 0, split: str = "train", sizes: Sequence[int] | None = None,
                  unique: bool = True) -> list[dict]:
        sizes = check_options("sizes", sizes if sizes is not None else cls.default_sizes, (4, 9))
        key = (lambda t: cls._solution_key(t["solution"])) if unique else None
        return generate_split(cls.game, num_tasks, seed, split,
                              lambda rng: cls.draw(rng, sizes=sizes, unique=unique, split=split), cls.encode,
                              split_key=key)

    @classmethod
    def make_dataset(cls, num_tasks: int = 256, seed: int = 0, split: str = "train",
                     sizes: Sequence[int] | None = None, unique: bool = True):
        """Sudoku puzzles of the given sizes (default ``default_sizes``: 4x4); train and eval never overlap."""
        return super().make_dataset(num_tasks, seed, split, sizes=sizes, unique=unique)

    # ---------------------------------------------------------------- state
    def load(self, task: Mapping[str, Any]) -> None:
        puzzle = [[int(v) for v in row] for row in task["puzzle"]]
        n = len(puzzle)
        if n not in HOLES or any(len(row) != n for row in puzzle) or any(not 0 <= v <= n for r in puzzle for v in r):
            raise ValueError(f"{task.get('task_id', 'task')}: the puzzle must be a 4x4 or 9x9 grid of 0..n")
        self.n, self.box = n, box_size(n)
        self.givens = puzzle
        self.grid = [list(row) for row in puzzle]

    def render(self) -> str:
        n, b = self.n, self.box
        lines = [f"Sudoku {n}x{n} (boxes {b}x{b}). Fill every 0 with a digit 1-{n} so that each row, column and "
                 "box holds each digit once. Current grid:"]
        lines += [" ".join(str(v) for v in row) for row in self.grid]
        return "\n".join(lines)

    def tool_instructions(self) -> str:
        return ("You are the tool agent. Write Python code that solves the Sudoku and prints a line ANSWER: and "
                "then the full grid, one row per line, digits separated by spaces.\n"
                "Predefined variables: puzzle (list of rows of ints, the original clues, 0 = empty) and grid (the "
                "current grid, same form). Reply with the code only, in a ```python block.")

    def plan_instructions(self) -> str:
        return ("You are the plan agent. Check the tool's grid (clues kept, no repeated digit) and decide the "
                "answer. End your reply with ANSWER: and then the full grid, one row per line.")

    def preamble(self) -> str:
        return f"puzzle = {self.givens!r}\ngrid = {self.grid!r}\n"

    def parse(self, text: str, from_stdout: bool) -> Grid | None:
        return parse_grid(text, self.n, "ANSWER", from_stdout=from_stdout)

    @staticmethod
    def _filled(grid: Grid) -> int:
        return sum(v != 0 for row in grid for v in row)

    def simulate(self, answer: Grid | None) -> SudokuOutcome:
        filled = self._filled(self.grid)
        out = SudokuOutcome(parsed=answer is not None, grid=self.grid, filled_before=filled, filled_after=filled,
                            empty_before=self.n * self.n - filled, solved=self._filled(self.grid) == self.n ** 2)
        if answer is None:
            return out
        out.keeps_givens = all(g == 0 or g == a for grow, arow in zip(self.givens, answer) for g, a in zip(grow, arow))
        out.bad_units = tuple(conflicts(answer))
        out.accepted = out.keeps_givens and not out.bad_units
        if out.accepted:
            out.grid = [list(row) for row in answer]
            out.filled_after = self._filled(answer)
            out.solved = out.filled_after == self.n * self.n
        return out

    def commit(self, outcome: SudokuOutcome) -> None:
        self.grid = [list(row) for row in outcome.grid]

    def solved(self) -> bool:
        return is_solution(self.givens, self.grid)

    def outcome_solves(self, outcome: SudokuOutcome) -> bool:
        return outcome.solved

    # ---------------------------------------------------------------- rewards
    def team_components(self, outcome: SudokuOutcome) -> tuple[float, dict[str, float]]:
        success = float(outcome.solved)
        return success, {"success": success}

    def plan_components(self, outcome: SudokuOutcome) -> dict[str, tuple[float, float, bool]]:
        gain = 0.0
        if outcome.accepted and outcome.empty_before > 0:
            gain = max(0, outcome.filled_after - outcome.filled_before) / outcome.empty_before
        return {
            "format": (0.1, float(outcome.parsed), True),
            "givens": (0.2, float(outcome.parsed and outcome.keeps_givens), True),
            "valid": (0.3, float(outcome.parsed and not outcome.bad_units), True),
            "progress": (0.2, gain, outcome.empty_before > 0),
            "solved": (0.2, float(outcome.accepted and outcome.solved), True),
        }

    def tool_components(self, report: ToolReport) -> dict[str, tuple[float, float, bool]]:
        out: SudokuOutcome = report.outcome
        return {
            "ran": (0.1, float(report.ran), True),
            "parsed": (0.2, float(report.parsed), True),
            "consistent": (0.3, float(out.accepted), True),
            "solved": (0.4, float(out.accepted and out.solved), True),
        }

    def describe_outcome(self, outcome: SudokuOutcome) -> str:
        if not outcome.parsed:
            return "the plan's answer had no complete ANSWER grid; the grid is unchanged."
        if not outcome.keeps_givens:
            return "the plan's grid changed a clue; the grid is unchanged."
        if outcome.bad_units:
            return f"the plan's grid repeats a digit in {', '.join(outcome.bad_units[:4])}; the grid is unchanged."
        left = self.n * self.n - outcome.filled_after
        return "the grid is solved." if outcome.solved else f"the grid was accepted; {left} cells are still empty."


class Sudoku9x9Env(SudokuEnv):
    """:class:`SudokuEnv` whose generated datasets are 9x9 by default (the registry key of 9x9 recipes)."""

    default_sizes = (9,)
