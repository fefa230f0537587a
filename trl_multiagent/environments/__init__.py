"""Environments (cooperative Dec-POMDPs) and the registry that recipes name them by.

May import: :mod:`trl_multiagent.generation` (requests), :mod:`trl_multiagent.models`, :mod:`trl_multiagent.metrics`,
:mod:`trl_multiagent.reward_blocks`, :mod:`trl_multiagent.sandbox`, :mod:`trl_multiagent.runtime`,
:mod:`trl_multiagent.errors`. ``tools`` is the one tool-calling layer of the agents (TRL-style tools run in the
sandbox).
"""

from trl_multiagent.environments.base import Environment, FunctionEnvironment, StepResult
from trl_multiagent.environments.coder_tester import CoderTesterEnv
from trl_multiagent.environments.coding import AuxMainCodingEnv
from trl_multiagent.environments.collab_game import CollaborationGameEnv
from trl_multiagent.environments.debate import DebateEnv, MathDebateEasyEnv, MathDebateEnv, NLIDebateEnv
from trl_multiagent.environments.games import PlanPathEnv, SokobanEnv, Sudoku9x9Env, SudokuEnv
from trl_multiagent.environments.math_split import MathToolSplitEnv
from trl_multiagent.environments.math_tool import MathToolEasyEnv, MathToolEnv, MathToolGeneralisationEnv
from trl_multiagent.environments.matrix_game import MatrixGameEnv
from trl_multiagent.environments.minecraft import HouseBuildEnv, StrBuildEnv
from trl_multiagent.environments.pipeline import PipelineEnvironment
from trl_multiagent.environments.search_qa import SearchQAEnv
from trl_multiagent.environments.trl_env import TRLEnvironmentTeam
from trl_multiagent.environments.writing import ArxivExpansionEnv, TLDREnv
from trl_multiagent.generation.requests import Prompt

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
    "math_tool_easy": MathToolEasyEnv,
    "math_tool_generalisation": MathToolGeneralisationEnv,
    "math_tool_split": MathToolSplitEnv,
    "math_debate": MathDebateEnv,
    "math_debate_easy": MathDebateEasyEnv,
    "nli_debate": NLIDebateEnv,
    "collaboration_game": CollaborationGameEnv,
    "search_qa": SearchQAEnv,
    "strbuild": StrBuildEnv,
    "housebuild": HouseBuildEnv,
    "tldr": TLDREnv,
    "arxiv_expansion": ArxivExpansionEnv,
}

__all__ = ["PipelineEnvironment", "SearchQAEnv", "ENVIRONMENTS", "AuxMainCodingEnv", "CoderTesterEnv", "CollaborationGameEnv", "DebateEnv", "MathDebateEasyEnv", "MathDebateEnv", "NLIDebateEnv", "Environment", "FunctionEnvironment", "MathToolEasyEnv", "MathToolEnv", "MathToolGeneralisationEnv", "MathToolSplitEnv", "MatrixGameEnv", "PlanPathEnv",
           "Prompt", "SokobanEnv", "TRLEnvironmentTeam", "StepResult", "Sudoku9x9Env", "SudokuEnv",
           "ArxivExpansionEnv", "HouseBuildEnv", "StrBuildEnv", "TLDREnv"]
