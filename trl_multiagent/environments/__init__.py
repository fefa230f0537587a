"""Environments (cooperative Dec-POMDPs) and the registry that recipes name them by."""

from .base import Environment, FunctionEnvironment, Prompt, StepResult
from .coding import AuxMainCodingEnv
from .matrix_game import MatrixGameEnv

#: Environments a recipe can name by key (``environment: matrix_game``).
ENVIRONMENTS: dict[str, type[Environment]] = {
    "matrix_game": MatrixGameEnv,
    "humaneval_aux_main": AuxMainCodingEnv,
}

__all__ = ["ENVIRONMENTS", "AuxMainCodingEnv", "Environment", "FunctionEnvironment", "MatrixGameEnv", "Prompt", "StepResult"]
