"""Environments (cooperative Dec-POMDPs) and the registry that recipes name them by."""

from .base import Environment, FunctionEnvironment, Prompt, StepResult
from .matrix_game import MatrixGameEnv

#: Environments a recipe can name by key (``environment: matrix_game``).
ENVIRONMENTS: dict[str, type[Environment]] = {
    "matrix_game": MatrixGameEnv,
}

__all__ = ["ENVIRONMENTS", "Environment", "FunctionEnvironment", "MatrixGameEnv", "Prompt", "StepResult"]
