"""Environments (cooperative Dec-POMDPs) and the registry that recipes name them by."""

from .base import Environment, FunctionEnvironment, Prompt, StepResult
from .coder_tester import CoderTesterEnv
from .coding import AuxMainCodingEnv
from .games import PlanPathEnv, SokobanEnv, Sudoku9x9Env, SudokuEnv
from .math_tool import MathToolEnv
from .matrix_game import MatrixGameEnv

#: Environments a recipe can name by key (``environment: matrix_game``).
ENVIRONMENTS: dict[str, type[Environment]] = {
    "matrix_game": MatrixGameEnv,
    "humaneval_aux_main": AuxMainCodingEnv,
    "plan_path": PlanPathEnv,
    "sudoku": SudokuEnv,
    "sudoku_9x9": Sudoku9x9Env,
    "sokoban": SokobanEnv,
    "coder_tester": CoderTesterEnv,
    "math_tool": MathToolEnv,
}

__all__ = ["ENVIRONMENTS", "AuxMainCodingEnv", "CoderTesterEnv", "Environment", "FunctionEnvironment", "MathToolEnv", "MatrixGameEnv", "PlanPathEnv",
           "Prompt", "SokobanEnv", "StepResult", "Sudoku9x9Env", "SudokuEnv"]
