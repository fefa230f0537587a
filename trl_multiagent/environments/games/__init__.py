"""Procedurally generated games played by a tool agent (Python code run in the sandbox) and a plan agent.

The three symbolic tasks of AT-GRPO (Plan-Path, Sudoku, Sokoban); :mod:`.base` describes the shared turn
structure, partial joint actions, reward modes and train/eval split rule.
"""

from trl_multiagent.environments.games.base import (
    EVAL_PERCENT,
    ToolPlanGameEnv,
    masked_convex,
    parse_grid,
    parse_moves,
    split_of_encoding,
)
from trl_multiagent.environments.games.plan_path import PlanPathEnv, solve_plan_path
from trl_multiagent.environments.games.sokoban import SokobanEnv, solve_sokoban
from trl_multiagent.environments.games.sudoku import Sudoku9x9Env, SudokuEnv, solve_sudoku

#: Registry entries for :data:`trl_multiagent.environments.ENVIRONMENTS`.
GAME_ENVIRONMENTS = {
    "plan_path": PlanPathEnv,
    "sudoku": SudokuEnv,
    "sudoku_9x9": Sudoku9x9Env,
    "sokoban": SokobanEnv,
}

__all__ = [
    "EVAL_PERCENT",
    "GAME_ENVIRONMENTS",
    "PlanPathEnv",
    "SokobanEnv",
    "Sudoku9x9Env",
    "SudokuEnv",
    "ToolPlanGameEnv",
    "masked_convex",
    "parse_grid",
    "parse_moves",
    "solve_plan_path",
    "solve_sokoban",
    "solve_sudoku",
    "split_of_encoding",
]
