"""The tool+plan games (Plan-Path, Sudoku, Sokoban): generators, checkers, rewards, turn flow and the sandbox."""

import json

import pytest

from trl_multiagent.environments.games import (
    GAME_ENVIRONMENTS,
    PlanPathEnv,
    SokobanEnv,
    Sudoku9x9Env,
    SudokuEnv,
    masked_convex,
    parse_grid,
    parse_moves,
    solve_plan_path,
    solve_sokoban,
    solve_sudoku,
    split_of_encoding,
)
from trl_multiagent.environments.games import base as games_base
from trl_multiagent.environments.games.sokoban import Room, reverse_play
from trl_multiagent.environments.games.sudoku import conflicts, is_solution
from trl_multiagent.sandbox import SandboxResult


# --------------------------------------------------------------------------------------------------- helpers
class FakeSandbox:
    """Replaces the sandbox run of the tool's code: ``stdout_for(code) -> (status, stdout)``; counts calls."""

    def __init__(self, stdout_for):
        self.stdout_for = stdout_for
        self.programs = []

    def __call__(self, program, config, cache=True):
        self.programs.append(program)
        status, stdout = self.stdout_for(program)
        return SandboxResult(status=status, returncode=0 if status == "passed" else 1, stdout=stdout, stderr="",
                             truncated=False, duration_s=0.0, message="" if status == "passed" else "Boom")


@pytest.fixture
def fake_sandbox(monkeypatch):
    """Tool code ``print(<text>)`` 'prints' text; code containing ``fail`` fails after printing it."""

    def stdout_for(program):
        code = program.split("\n")[-2]  # the tool's single line, after the preamble
        text = code.removeprefix("print(").removesuffix(")").strip("'\"").replace("\\n", "\n")
        return ("failed" if "fail" in code else "passed"), text + "\n"

    fake = FakeSandbox(stdout_for)
    monkeypatch.setattr(games_base, "run_tool_program", fake)
    return fake


def tool(text: str) -> str:
    """A tool response whose code prints ``text``."""
    return f"```python\nprint({text!r})\n```"


def plan_copying_tool_output(prompt: str) -> str:
    """A scripted plan agent: repeats what the tool printed (its prompt shows the tool's output)."""
    start = prompt.index("Tool output (")
    body = prompt[prompt.index("\n", start) + 1:prompt.index("You are the plan agent")]
    return "I checked the tool's answer.\n" + body


PP_GRID = ["A..", ".#.", "..G"]  # start (0, 0), goal (2, 2), D = 4
SUDOKU_SOLUTION = [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]]
SUDOKU_PUZZLE = [[1, 0, 3, 4], [3, 4, 0, 2], [0, 1, 4, 3], [4, 3, 2, 0]]
SOKO_EASY = ["#####", "#@$.#", "#####"]
SOKO_CORNER = ["######", "#_$@_#", "#____#", "#___.#", "######"]


def grid_text(grid):
    return "\n".join(" ".join(str(v) for v in row) for row in grid)


# --------------------------------------------------------------------------------------------------- generators
@pytest.mark.parametrize("cls", [PlanPathEnv, SudokuEnv, SokobanEnv])
def test_train_and_eval_streams_do_not_overlap(cls):
    train = cls.make_rows(300, seed=0, split="train")
    train_other_seed = cls.make_rows(100, seed=1, split="train")
    evals = cls.make_rows(150, seed=0, split="eval")
    enc_train = {cls.encode(t) for t in train + train_other_seed}
    enc_eval = {cls.encode(t) for t in evals}
    assert len(enc_eval) == 150 and len({cls.encode(t) for t in train}) == 300  # no duplicates inside a dataset
    assert enc_train.isdisjoint(enc_eval)
    assert all(t["split"] == "eval" for t in evals) and all(t["split"] == "train" for t in train)
    # the streams are reproducible and seed-dependent
    assert cls.make_rows(5, seed=0, split="eval") == evals[:5]
    assert [t["task_id"] for t in train[:2]] == [f"{cls.game}/train/0/0", f"{cls.game}/train/0/1"]
    assert {cls.encode(t) for t in train[:100]} != {cls.encode(t) for t in train_other_seed}


def test_split_rule_for_plan_path_is_by_encoding():
    rows = PlanPathEnv.make_rows(50, seed=3, split="eval")
    assert all(split_of_encoding("plan_path", PlanPathEnv.encode(t)) == "eval" for t in rows)


def test_unique_sudoku_splits_by_solution_and_non_unique_by_puzzle():
    unique = SudokuEnv.make_rows(40, seed=0, split="eval")
    assert all(split_of_encoding("sudoku", "solution:4:" + "".join(str(v) for r in t["solution"] for v in r))
               == "eval" for t in unique)
    free = SudokuEnv.make_rows(40, seed=0, split="eval", unique=False)
    assert all(split_of_encoding("sudoku", SudokuEnv.encode(t)) == "eval" for t in free)
    train_free = SudokuEnv.make_rows(200, seed=0, split="train", unique=False)
    assert {SudokuEnv.encode(t) for t in free}.isdisjoint({SudokuEnv.encode(t) for t in train_free})


def test_plan_path_instances_are_solvable_and_checked():
    for task in PlanPathEnv.make_rows(60, seed=0, split="train") + PlanPathEnv.make_rows(20, seed=0, split="eval"):
        grid = task["grid"]
        assert 5 <= task["size"] <= 8 and len(grid) == task["size"] and all(len(r) == task["size"] for r in grid)
        assert "".join(grid).count("A") == 1 and "".join(grid).count("G") == 1
        path = solve_plan_path(grid)
        assert path is not None and len(path) == task["shortest_path_length"]
        env = PlanPathEnv(max_turns=1)
        env.reset(task)
        result = env.step({"plan": "ACTIONS: " + " ".join(path)})
        assert result.done and result.info["success"] == 1.0


def test_sudoku_instances_are_solvable_and_checked():
    rows = SudokuEnv.make_rows(40, seed=0, split="train") + Sudoku9x9Env.make_rows(3, seed=0, split="eval")
    assert {r["size"] for r in rows} == {4, 9}
    for task in rows:
        puzzle, solution = task["puzzle"], task["solution"]
        assert is_solution(puzzle, solution) and not conflicts(puzzle)
        assert task["holes"] == sum(v == 0 for r in puzzle for v in r) > 0
        assert solve_sudoku(puzzle, limit=2) == [solution]  # unique=True: exactly one solution
        env = SudokuEnv(max_turns=1)
        env.reset(task)
        result = env.step({"plan": "ANSWER:\n" + grid_text(solution)})
        assert result.info["success"] == 1.0 and result.done
    for task in SudokuEnv.make_rows(20, seed=0, split="train", unique=False):
        assert solve_sudoku(task["puzzle"]) and is_solution(task["puzzle"], task["solution"])


def test_sokoban_instances_are_solvable_and_checked():
    rows = SokobanEnv.make_rows(60, seed=0, split="train") + SokobanEnv.make_rows(20, seed=0, split="eval")
    assert {r["num_boxes"] for r in rows} == {1, 2}
    for task in rows:
        room = Room.parse(task["grid"])
        assert (room.rows, room.cols) == (6, 6) and not room.solved() and len(room.boxes) == task["num_boxes"]
        path = solve_sokoban(task["grid"])
        assert path is not None and len(path) == task["optimal_moves"] >= 3
        env = SokobanEnv(max_turns=1)
        env.reset(task)
        result = env.step({"plan": "ACTIONS: " + " ".join(path)})
        assert result.info["success"] == 1.0 and result.done


def test_sokoban_reverse_play_only_pulls():
    import random

    solved = Room.parse(["######", "#____#", "#_*__#", "#__@_#", "#____#", "######"])
    for seed in range(20):
        room = reverse_play(solved, 30, random.Random(seed))
        assert len(room.boxes) == 1 and room.walls == solved.walls and solve_sokoban(room) is not None


def test_make_dataset_returns_json_serializable_rows():
    for cls in (PlanPathEnv, SudokuEnv, SokobanEnv):
        data = cls.make_dataset(4, seed=0, split="eval")
        assert len(data) == 4
        cls.validate_dataset_columns(data.column_names)
        for row in data:
            json.dumps(row)
        assert list(data)[0] == cls.make_rows(1, seed=0, split="eval")[0]
    with pytest.raises(ValueError, match="split"):
        PlanPathEnv.make_dataset(2, split="test")
    with pytest.raises(ValueError, match="sizes"):
        SudokuEnv.make_dataset(2, sizes=(5,))


# --------------------------------------------------------------------------------------------------- checkers
def test_checkers_reject_wrong_solutions():
    pp = PlanPathEnv(max_turns=1)
    pp.reset({"grid": PP_GRID})
    assert pp.step({"plan": "ACTIONS: D R R D"}).info["success"] == 0.0  # second move hits the obstacle
    pp.reset({"grid": PP_GRID})
    assert pp.step({"plan": "ACTIONS: R R D D"}).info["success"] == 1.0

    wrong = [row[:] for row in SUDOKU_SOLUTION]
    wrong[0][0], wrong[0][1] = wrong[0][1], wrong[0][0]
    assert not is_solution(SUDOKU_PUZZLE, wrong) and is_solution(SUDOKU_PUZZLE, SUDOKU_SOLUTION)
    su = SudokuEnv(max_turns=1)
    su.reset({"puzzle": SUDOKU_PUZZLE})
    assert su.step({"plan": "ANSWER:\n" + grid_text(wrong)}).info["success"] == 0.0

    so = SokobanEnv(max_turns=1)
    so.reset({"grid": SOKO_CORNER})
    assert so.step({"plan": "ACTIONS: L"}).info["success"] == 0.0
    assert solve_sokoban(["#####", "#@$_#", "#.###", "#####"]) is None  # the box can only be pushed to a corner


def test_parsers_are_robust_to_junk():
    assert parse_moves("Let me think... ACTIONS: R, r, Down, [\"L\"] because it is short") == ["R", "R", "D", "L"]
    assert parse_moves("ACTIONS:\n  UUR\nmore text") == ["U", "U", "R"]
    assert parse_moves("first ACTIONS: U then ACTIONS: D D") == ["D", "D"]  # the last marker wins
    assert parse_moves("['R', 'D']\n", from_stdout=True) == ["R", "D"]
    for junk in ("", "no marker R R", "ACTIONS:", "ACTIONS: walk north", "ACTIONS: 1 2 3", None, 42, "\x00\ufffd"):
        assert parse_moves(junk) is None
    assert parse_moves("ACTIONS: " + "R " * 300) is None
    assert parse_grid("ANSWER: [[1,2],[3,4]] " + "1 2 3 4 " * 3, 4) is not None
    assert parse_grid("ANSWER: 1 2 3", 4) is None
    assert parse_grid("ANSWER: " + "5" * 16, 4) is None
    assert parse_grid("1234\n3412\n2143\n4321\n", 4, from_stdout=True) == SUDOKU_SOLUTION
    assert parse_grid("solved in 1 step\n1234\n3412\n2143\n4321\n", 4, from_stdout=True) is None


def test_masked_convex_combination():
    assert masked_convex({"a": (0.5, 1.0, True), "b": (0.5, 0.0, True)}) == 0.5
    assert masked_convex({"a": (0.5, 1.0, True), "b": (0.5, 0.0, False)}) == 1.0
    assert masked_convex({"a": (1.0, 1.0, False)}) == 0.0


# --------------------------------------------------------------------------------------------------- rewards
@pytest.mark.parametrize("answer, team, local", [
    ("ACTIONS: R R D D", 2.0, 1.0),               # (4 - 0) / 4 + 1; all four moves on a shortest path
    ("ACTIONS: D R U", 0.25, 0.45),               # stops at the obstacle: (4 - 3) / 4; .1 + .3 * 1/2 + .4 * 1/2
    ("ACTIONS: R L", 0.0, 0.6),                   # back to start: .1 + .3 + .4 * 1/2
    ("ACTIONS: L", 0.0, 0.1),                     # off the map: format only
    ("I would go right then down.", 0.0, 0.0),    # no ACTIONS line
])
def test_plan_path_shaped_plan_rewards(answer, team, local):
    env = PlanPathEnv(max_turns=2)
    env.reset({"grid": PP_GRID})
    result = env.step({"plan": answer})
    assert result.team_reward == pytest.approx(team)
    assert result.local_rewards == {"plan": pytest.approx(local)}
    assert result.info["reward/team"] == pytest.approx(team)
    assert result.info["valid_format"] == float("ACTIONS" in answer)


@pytest.mark.parametrize("answer, team, local", [
    ("ACTIONS: R R D D", 1.0, 1.0), ("ACTIONS: D R U", 0.0, 1.0), ("go right", 0.0, 0.0)])
def test_plan_path_outcome_rewards(answer, team, local):
    env = PlanPathEnv(reward_mode="outcome")
    env.reset({"grid": PP_GRID})
    result = env.step({"plan": answer})
    assert (result.team_reward, result.local_rewards["plan"]) == (team, local)


@pytest.mark.parametrize("text, status, local, team", [
    ("ACTIONS: R R D D", "passed", 1.0, 2.0),       # every component; counterfactual team reward of the proposal
    ("R L", "passed", 0.7, 0.0),                    # .1 ran + .2 parsed + .2 legal + .2 potential (no goal)
    ("ACTIONS: R R D D fail", "failed", 0.9, 2.0),  # printed a good proposal, then crashed: no 'ran'
    ("no idea", "passed", 0.1, 0.0),                # ran, printed nothing parsable
])
def test_plan_path_shaped_tool_rewards(fake_sandbox, text, status, local, team):
    env = PlanPathEnv()
    env.reset({"grid": PP_GRID})
    result = env.step({"tool": tool(text)})
    assert result.local_rewards == {"tool": pytest.approx(local)}
    assert result.team_reward == pytest.approx(team)
    assert result.info["tool/ran"] == float(status == "passed")
    assert result.info["partial"] == 1.0 and result.info["success"] == 0.0 and not result.done
    assert env.pos == (0, 0)  # a tool step never moves


def test_plan_path_outcome_tool_reward_is_format_only(fake_sandbox):
    env = PlanPathEnv(reward_mode="outcome")
    env.reset({"grid": PP_GRID})
    assert env.step({"tool": tool("ACTIONS: R L")}).local_rewards["tool"] == 1.0
    assert env.step({"tool": tool("ACTIONS: R R D D fail")}).local_rewards["tool"] == 0.0  # did not run cleanly
    assert env.step({"tool": tool("ACTIONS: R R D D")}).team_reward == 1.0  # the proposal would solve it


@pytest.mark.parametrize("grid, team, local", [
    (SUDOKU_SOLUTION, 1.0, 1.0),
    ([[1, 2, 3, 4], [3, 4, 0, 2], [0, 1, 4, 3], [4, 3, 2, 0]], 0.0, 0.65),  # 1 of 4 filled: .1+.2+.3+.2*1/4
    ([[0, 0, 3, 4], [3, 4, 0, 2], [0, 1, 4, 3], [4, 3, 2, 0]], 0.0, 0.4),   # erases a clue: .1 + .3 (valid)
    ([[1, 1, 3, 4], [3, 4, 0, 2], [0, 1, 4, 3], [4, 3, 2, 0]], 0.0, 0.3),   # repeats a 1: .1 + .2 (clues kept)
])
def test_sudoku_shaped_plan_rewards(grid, team, local):
    env = SudokuEnv(max_turns=3)
    env.reset({"puzzle": SUDOKU_PUZZLE})
    result = env.step({"plan": "Here it is.\nANSWER:\n" + grid_text(grid)})
    assert result.team_reward == team and result.local_rewards["plan"] == pytest.approx(local)
    accepted = local >= 0.65
    assert (env.grid == grid) == accepted
    assert result.info["plan/progress"] == pytest.approx({1.0: 1.0, 0.65: 0.25}.get(local, 0.0))


def test_sudoku_progress_is_relative_to_the_previous_grid():
    env = SudokuEnv(max_turns=3)
    env.reset({"puzzle": SUDOKU_PUZZLE})
    env.step({"plan": "ANSWER:\n" + grid_text([[1, 2, 3, 4], [3, 4, 0, 2], [0, 1, 4, 3], [4, 3, 2, 0]])})
    result = env.step({"plan": "ANSWER:\n" + grid_text([[1, 2, 3, 4], [3, 4, 1, 2], [0, 1, 4, 3], [4, 3, 2, 0]])})
    assert result.info["plan/progress"] == pytest.approx(1 / 3)
    assert "2 cells are still empty" in result.next_prompts["tool"]
    result = env.step({"plan": "ANSWER: 1 2"})  # junk
    assert result.local_rewards["plan"] == 0.0 and result.info["valid_format"] == 0.0 and result.done


def test_sudoku_tool_and_outcome_rewards(fake_sandbox):
    env = SudokuEnv()
    env.reset({"puzzle": SUDOKU_PUZZLE})
    flat = "".join(str(v) for row in SUDOKU_SOLUTION for v in row)
    result = env.step({"tool": tool(flat)})  # 16 digits without a marker: parsed
    assert result.local_rewards["tool"] == pytest.approx(1.0) and result.team_reward == 1.0
    result = env.step({"tool": tool("ANSWER: " + "1" * 16)})  # parsed, inconsistent: .1 + .2
    assert result.local_rewards["tool"] == pytest.approx(0.3) and result.team_reward == 0.0
    out = SudokuEnv(reward_mode="outcome")
    out.reset({"puzzle": SUDOKU_PUZZLE})
    result = out.step({"tool": tool("ANSWER: " + "1" * 16), "plan": "ANSWER:\n" + grid_text(SUDOKU_SOLUTION)})
    assert result.local_rewards == {"tool": 1.0, "plan": 1.0} and result.team_reward == 1.0 and result.done


@pytest.mark.parametrize("grid, answer, team, local", [
    (SOKO_EASY, "ACTIONS: R", 2.0, 1.0),           # 1/1 boxes on goal + success
    (SOKO_EASY, "ACTIONS: L R", 0.0, 0.6),         # stops at the wall, box unmoved: .2 + .4 * 0 + .4
    (SOKO_CORNER, "ACTIONS: L", 0.0, 0.6),         # box pushed into a corner: .2 + .4 + 0
    (SOKO_CORNER, "ACTIONS: D", 0.0, 1.0),         # a legal walk, nothing stuck
    (SOKO_CORNER, "push the box", 0.0, 0.0),
])
def test_sokoban_shaped_plan_rewards(grid, answer, team, local):
    env = SokobanEnv()
    env.reset({"grid": grid})
    result = env.step({"plan": answer})
    assert result.team_reward == pytest.approx(team) and result.local_rewards["plan"] == pytest.approx(local)


def test_sokoban_tool_rewards_and_two_box_team_reward(fake_sandbox):
    env = SokobanEnv()
    env.reset({"grid": SOKO_CORNER})
    result = env.step({"tool": tool("ACTIONS: L")})  # .1 ran + .1 parsed + .2 legal; deadlock, Psi -4 -> -5
    assert result.local_rewards["tool"] == pytest.approx(0.4)
    result = env.step({"tool": tool("ACTIONS: D")})  # walk only: Psi unchanged, no box on goal
    assert result.local_rewards["tool"] == pytest.approx(0.7)
    two = SokobanEnv()
    two.reset({"grid": ["######", "#@$_.#", "#_*__#", "######"]})
    result = two.step({"plan": "ACTIONS: R"})  # 1 of 2 boxes on goals
    assert result.team_reward == pytest.approx(0.5) and not result.done
    result = two.step({"plan": "ACTIONS: R"})
    assert result.team_reward == pytest.approx(2.0) and result.done and result.info["team/boxes_on_goal"] == 1.0


# --------------------------------------------------------------------------------------------------- turn flow
def test_sequential_partial_actions_tool_then_plan(fake_sandbox):
    env = PlanPathEnv(max_turns=2)
    prompts = env.reset({"grid": PP_GRID})
    assert set(prompts) == {"tool", "plan"} and "has not answered" in prompts["plan"]
    assert "ACTIONS:" in prompts["tool"] and "```python" in prompts["tool"]
    result = env.step({"tool": tool("ACTIONS: R R D")})
    assert not result.done and set(result.local_rewards) == {"tool"}
    assert "Tool output (passed):\nACTIONS: R R D" in result.next_prompts["plan"]
    assert "print('ACTIONS: R R D')" in result.next_prompts["plan"]
    assert "grid = ['A..', '.#.', '..G']" in fake_sandbox.programs[-1]  # the preamble defines the task
    result = env.step({"plan": plan_copying_tool_output(result.next_prompts["plan"])})
    assert set(result.local_rewards) == {"plan"} and not result.done and env.pos == (1, 2)
    assert result.info["partial"] == 0.0 and result.team_reward == pytest.approx(0.75)
    assert "Last turn: The tool's proposal parsed. 3 of 3 moves done" in result.next_prompts["tool"]
    assert "has not answered" in result.next_prompts["plan"]  # the new turn starts with the tool
    result = env.step({"tool": tool("ACTIONS: D")})
    result = env.step({"plan": plan_copying_tool_output(result.next_prompts["plan"])})
    assert result.done and result.info["success"] == 1.0 and result.next_prompts is None
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step({"plan": "ACTIONS: U"})


def test_parallel_joint_action(fake_sandbox):
    env = PlanPathEnv(max_turns=3)
    env.reset({"grid": PP_GRID})
    result = env.step({"tool": tool("ACTIONS: R R D D"), "plan": "ACTIONS: D D"})
    assert set(result.local_rewards) == {"tool", "plan"}
    assert result.local_rewards["tool"] == pytest.approx(1.0)
    assert result.team_reward == pytest.approx(0.5)  # the plan's answer is executed: (4 - 2) / 4
    assert env.pos == (2, 0) and result.info["valid_format"] == 1.0 and result.info["partial"] == 0.0
    assert {"tool/ran", "plan/sp_next", "team/distance_gain", "reward/tool", "reward/plan"} <= set(result.info)
    assert all(isinstance(v, float) for v in result.info.values())
    result = env.step({"tool": tool("garbage"), "plan": "ACTIONS: R R"})
    assert result.done and result.info["valid_format"] == 0.0 and result.info["success"] == 1.0


def test_bad_actions_and_outputs_never_raise(fake_sandbox):
    for cls, task in ((PlanPathEnv, {"grid": PP_GRID}), (SudokuEnv, {"puzzle": SUDOKU_PUZZLE}),
                      (SokobanEnv, {"grid": SOKO_CORNER})):
        env = cls(max_turns=50)
        env.reset(task)
        for junk in ("", "```python\n```", "ACTIONS:", "ANSWER:", "\x00\ufffd" * 50, "ACTIONS: " + "R" * 5000, None):
            result = env.step({"tool": junk, "plan": junk})
            assert result.local_rewards["plan"] == 0.0 and result.info["valid_format"] == 0.0
            assert result.local_rewards["tool"] <= 0.1
        with pytest.raises(ValueError, match="expects actions"):
            env.step({"coder": "x"})
        with pytest.raises(ValueError, match="expects actions"):
            env.step({})


def test_clone_is_independent(fake_sandbox):
    env = PlanPathEnv(max_turns=3)
    env.reset({"grid": PP_GRID})
    env.step({"tool": tool("ACTIONS: R R D D")})
    branch = env.clone()
    assert branch.step({"plan": "ACTIONS: R R D D"}).done
    assert env.pos == (0, 0) and not env.done and env.tool_report is not None and env.turn == 0
    result = env.step({"plan": "ACTIONS: D"})
    assert env.pos == (1, 0) and not result.done and branch.pos == (2, 2)
    soko = SokobanEnv()
    soko.reset({"grid": SOKO_EASY})
    other = soko.clone()
    other.step({"plan": "ACTIONS: R"})
    assert not soko.solved() and other.solved()
    sudoku = SudokuEnv()
    sudoku.reset({"puzzle": SUDOKU_PUZZLE})
    twin = sudoku.clone()
    twin.step({"plan": "ANSWER:\n" + grid_text(SUDOKU_SOLUTION)})
    assert sudoku.grid == SUDOKU_PUZZLE and twin.grid == SUDOKU_SOLUTION


def test_environment_protocol_attributes():
    assert set(GAME_ENVIRONMENTS) == {"plan_path", "sudoku", "sudoku_9x9", "sokoban"}
    for cls in GAME_ENVIRONMENTS.values():
        env = cls()
        assert env.agents == ("tool", "plan") and env.supports_partial_actions and env.concurrent_steps
        assert env.max_turns == 4 and cls.required_columns
    with pytest.raises(ValueError, match="reward_mode"):
        PlanPathEnv(reward_mode="dense")
    with pytest.raises(ValueError, match="max_turns"):
        SokobanEnv(max_turns=0)
    assert Sudoku9x9Env.make_rows(1, seed=0)[0]["size"] == 9


def test_at_grpo_rollout_sequential_and_parallel(fake_sandbox):
    """AgentTurnSampler drives the env with partial (sequential) and joint (parallel) actions."""
    from transformers import GenerationConfig

    from tests.fake_pool import ScriptedPool
    from trl_multiagent.rollout import AgentTurnSampler
    from trl_multiagent.trainers.at_grpo import agent_turn_credit

    def script(agent, prompt, k):
        if agent == "tool":
            return tool("ACTIONS: R R D D") if k == 0 else "I cannot write code."
        if "Tool output (" in prompt:
            return plan_copying_tool_output(prompt) if k == 1 else "ACTIONS: U"
        if k == 0:
            return "no answer"
        return "ACTIONS: R R" if "you at (0, 0)" in prompt else "ACTIONS: D D"  # parallel: no tool output

    for order, turns in (("sequential", 1), ("parallel", 2)):
        pool = ScriptedPool(["tool", "plan"], script)
        sampler = AgentTurnSampler(num_samples=2, num_turns=3, agent_order=order)
        exp = sampler.rollout(pool, lambda: PlanPathEnv(max_turns=3), [{"grid": PP_GRID}], GenerationConfig())
        agent_turn_credit(exp, sampler.alpha)  # the trainer's credit: Eq. 3 rewards
        best_tool = [s for s in exp.samples if s.agent == "tool" and s.turn == 0]
        assert best_tool[0].reward > best_tool[1].reward  # the solver's code beats prose
        assert exp.joint_actions[-1].done and exp.joint_actions[-1].info["success"] == 1.0
        assert max(j.turn for j in exp.joint_actions) + 1 == turns
        assert exp.stats["env/success"] > 0


def test_magrpo_tree_rollout_steps_clones_concurrently(fake_sandbox):
    """JointTreeSampler steps every joint action on a clone (from threads: concurrent_steps) with both actions."""
    from transformers import GenerationConfig

    from tests.fake_pool import ScriptedPool
    from trl_multiagent.rollout import JointTreeSampler

    def script(agent, prompt, k):
        if agent == "tool":
            return tool("ACTIONS: R R D D")
        return ["ACTIONS: R R D D", "ACTIONS: D", "nothing"][k]

    pool = ScriptedPool(["tool", "plan"], script)
    exp = JointTreeSampler(num_samples=3, num_turns=2).rollout(pool, lambda: PlanPathEnv(max_turns=2),
                                                               [{"grid": PP_GRID}], GenerationConfig())
    first = [j for j in exp.joint_actions if j.turn == 0]
    assert [j.reward for j in first] == pytest.approx([2.0, 0.25, 0.0])
    assert [j.done for j in first] == [True, False, False]
    assert len(exp.joint_actions) == 3 + 2 * 3  # the two unfinished branches expand once more
    assert all(j.local_rewards["tool"] == pytest.approx(1.0) for j in first)  # the proposal from the start


# --------------------------------------------------------------------------------------------------- real sandbox
BFS_TOOL = '''```python
from collections import deque
steps = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
prev = {pos: None}
queue = deque([pos])
while queue:
    cell = queue.popleft()
    for name, (dr, dc) in steps.items():
        r, c = cell[0] + dr, cell[1] + dc
        if 0 <= r < len(grid) and 0 <= c < len(grid[0]) and grid[r][c] != "#" and (r, c) not in prev:
            prev[(r, c)] = (cell, name)
            queue.append((r, c))
moves, cell = [], goal
while prev[cell] is not None:
    cell, name = prev[cell]
    moves.append(name)
print("ACTIONS: " + " ".join(reversed(moves)))
```'''

SUDOKU_TOOL = '''Here is a backtracking solver.
```python
n = len(grid)
b = int(n ** 0.5)
g = [row[:] for row in grid]
def ok(r, c, v):
    if v in g[r] or any(g[i][c] == v for i in range(n)):
        return False
    r0, c0 = r - r % b, c - c % b
    return all(g[r0 + i][c0 + j] != v for i in range(b) for j in range(b))
def solve():
    for r in range(n):
        for c in range(n):
            if g[r][c] == 0:
                for v in range(1, n + 1):
                    if ok(r, c, v):
                        g[r][c] = v
                        if solve():
                            return True
                        g[r][c] = 0
                return False
    return True
solve()
print("ANSWER:")
for row in g:
    print(" ".join(map(str, row)))
```'''

SOKOBAN_TOOL = '''```python
from collections import deque
walls = {(r, c) for r, row in enumerate(grid) for c, ch in enumerate(row) if ch == "#"}
goals = {(r, c) for r, row in enumerate(grid) for c, ch in enumerate(row) if ch in ".*+"}
boxes = frozenset((r, c) for r, row in enumerate(grid) for c, ch in enumerate(row) if ch in "$*")
me = next((r, c) for r, row in enumerate(grid) for c, ch in enumerate(row) if ch in "@+")
steps = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
start = (me, boxes)
prev = {start: None}
queue = deque([start])
while queue:
    state = queue.popleft()
    (pr, pc), bx = state
    if bx <= goals:
        break
    for name, (dr, dc) in steps.items():
        nxt = (pr + dr, pc + dc)
        if nxt in walls:
            continue
        nb = bx
        if nxt in bx:
            beyond = (nxt[0] + dr, nxt[1] + dc)
            if beyond in walls or beyond in bx:
                continue
            nb = (bx - {nxt}) | {beyond}
        key = (nxt, frozenset(nb))
        if key not in prev:
            prev[key] = (state, name)
            queue.append(key)
moves = []
while prev[state] is not None:
    state, name = prev[state]
    moves.append(name)
print("ACTIONS:", " ".join(reversed(moves)))
```'''


@pytest.mark.parametrize("cls, tool_code", [(PlanPathEnv, BFS_TOOL), (SudokuEnv, SUDOKU_TOOL),
                                            (SokobanEnv, SOKOBAN_TOOL)])
def test_scripted_episode_in_the_real_sandbox(cls, tool_code):
    """The tool's code is a correct solver run in the sandbox; the plan copies its output: solved in one turn."""
    task = cls.make_rows(1, seed=7, split="eval")[0]
    env = cls(max_turns=2, cache_tool_runs=False)
    env.reset(task)
    result = env.step({"tool": tool_code})
    assert result.info["tool/ran"] == 1.0 and result.info["tool/parsed"] == 1.0, env.tool_report
    assert result.local_rewards["tool"] == pytest.approx(1.0) and not result.done
    result = env.step({"plan": plan_copying_tool_output(result.next_prompts["plan"])})
    assert result.done and result.info["success"] == 1.0 and result.local_rewards["plan"] == pytest.approx(1.0)


def test_failing_tool_code_in_the_real_sandbox():
    env = PlanPathEnv(cache_tool_runs=False)
    env.reset({"grid": PP_GRID})
    result = env.step({"tool": "```python\nprint('ACTIONS: R')\nraise ValueError('nope')\n```"})
    assert env.tool_report.status == "failed" and "ValueError" in env.tool_report.message
    assert result.info["tool/ran"] == 0.0 and result.info["tool/parsed"] == 1.0
    assert "Error: ValueError: nope" in result.next_prompts["plan"]
