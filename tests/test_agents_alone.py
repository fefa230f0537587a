"""Every member alone as a baseline (issue 60, item 1): an environment that says how to score one agent's answer
(``score_alone``) gets one ``<agent>_alone`` method per agent (and ``<agent>_alone_turns`` where the agent can play
a whole episode alone); the best baseline is the highest of ALL baselines before training, whatever agent's answer
they score. Scripted pools and hand-computed values; no model."""

from __future__ import annotations

import json

import pytest
from transformers import GenerationConfig

from trl_multiagent.command.recipe import ALONE_METHOD, RecipeArguments
from trl_multiagent.environments import (
    FunctionEnvironment,
    MathDebateEnv,
    MathToolEasyEnv,
    MathToolEnv,
    PlanPathEnv,
)
from trl_multiagent.environments.base import StepResult
from trl_multiagent.errors import UserCodeError
from trl_multiagent.evaluation import (
    TEAM,
    DebateEvaluator,
    EpisodeEvaluator,
    MethodResult,
    StageResult,
    evaluate_team,
    evaluation_section,
    write_run_outputs,
)
from trl_multiagent.evaluation.alone import alone_methods
from trl_multiagent.team.pool import Generation

GREEDY = GenerationConfig(max_new_tokens=4, do_sample=False)


class ScriptPool:
    """``generate_many`` from ``script(agent, prompt, use_adapter)``; records every request."""

    def __init__(self, script, identity=False):
        self.script, self.identity, self.requests = script, identity, []

    def adapters_are_identity(self):
        return self.identity

    def generate_many(self, requests, generation_config, max_batch_sequences=None):
        self.requests += list(requests)
        out = []
        for req in requests:
            text = self.script(req.agent, req.prompt, req.use_adapter)
            out.append([Generation([0], [1, 2, 3], text) for _ in range(req.num_samples)])
        return out


# ------------------------------------------------------------------------------------------------ the math team
MATH_TASKS = [{"task_id": "half", "question": "What is 7 / 2?", "answer": "7/2"},
              {"task_id": "sum", "question": "What is 2 + 2?", "answer": "5"}]  # the tool prints 4: wrong


def math_script(agent, prompt, adapter):
    if agent == "tool":
        return "```python\nprint(7 / 2)\n```" if "7 / 2" in json.dumps(prompt) else "```python\nprint(2 + 2)\n```"
    return "\\boxed{4}"  # the reasoner: wrong on the first task, wrong on the second (gold 5)


def test_tool_alone_scores_the_programs_printed_answer_as_the_teams():
    evaluator = EpisodeEvaluator(MathToolEnv, num_turns=2)
    assert evaluator.alone == {"reasoner_alone": ("reasoner", 1), "tool_alone": ("tool", 1)}
    assert evaluator.baselines == ("reasoner_alone", "tool_alone", "no_exchange")
    assert evaluator.resolve_methods([TEAM, "single", "alone", "no_exchange"]) == \
        [TEAM, "reasoner_alone", "tool_alone", "no_exchange"]  # single is reasoner_alone; alone is every agent
    pool = ScriptPool(math_script)
    result = evaluate_team(pool, evaluator, MATH_TASKS, methods=[TEAM, "alone", "no_exchange"],
                           generation_config=GREEDY)
    tool, reasoner, none = (result.methods[m] for m in ("tool_alone", "reasoner_alone", "no_exchange"))
    # tool alone: 3.5 equals 7/2 (right), 4 is not 5 (wrong); one turn; its program ran both times
    assert tool.per_task("final/team_correct") == [1.0, 0.0] and tool.per_task("return") == [1.0, 0.0]
    assert tool.per_task("turns") == [1.0, 1.0] and tool.per_task("final/tool_executes") == [1.0, 1.0]
    assert reasoner.per_task("final/team_correct") == [0.0, 0.0]
    # no exchange: the team's answer is the reasoner's, so the tool's right answer is lost
    assert none.per_task("final/team_correct") == [0.0, 0.0] and none.per_task("final/tool_correct") == [1.0, 0.0]
    assert [(r["task_id"], r["agent"], r["reward"]) for r in tool.texts] == [("half", "tool", 1.0), ("sum", "tool", 0.0)]
    # the bases answer (adapters off); tool_alone's draw is shared with no_exchange's tool: one request per task
    bases = [(r.agent, r.use_adapter) for r in pool.requests if not r.use_adapter]
    assert bases.count(("tool", False)) == 2 and bases.count(("reasoner", False)) == 2
    assert evaluator.expected_sequences("tool_alone", 3, 2) == 6


def test_before_training_agents_alone_are_the_teams_first_turn_draws():
    pool = ScriptPool(math_script, identity=True)  # B = 0: adapters on and off are one distribution
    result = evaluate_team(pool, EpisodeEvaluator(MathToolEnv, num_turns=2), MATH_TASKS,
                           methods=[TEAM, "reasoner_alone", "tool_alone"], generation_config=GREEDY)
    assert all(r.use_adapter for r in pool.requests)  # no draw of their own
    assert result.methods["tool_alone"].per_task("final/team_correct") == [1.0, 0.0]


def test_the_best_baseline_is_the_highest_of_all_including_an_agent_alone(tmp_path):
    def res(method, values):
        return MethodResult(method, [f"t{i}" for i in range(len(values))], {"final/team_correct": [[v] for v in values]})

    # 8 tasks: the reasoner alone 3/8, the tool alone 5/8, no exchange (the reasoner's answer) 3/8; the team 3/8
    # before training and 6/8 after
    before = StageResult("before", {
        TEAM: res(TEAM, [1, 0, 1, 0, 1, 0, 0, 0]),
        "reasoner_alone": res("reasoner_alone", [1, 0, 1, 0, 1, 0, 0, 0]),
        "tool_alone": res("tool_alone", [1, 1, 0, 1, 1, 1, 0, 0]),
        "no_exchange": res("no_exchange", [1, 0, 1, 0, 1, 0, 0, 0])})
    after = StageResult("after", {TEAM: res(TEAM, [1, 1, 1, 1, 1, 1, 0, 0])})
    stages = {"before": before, "after": after}
    section = evaluation_section(stages, "final/team_correct", "episodes", 1, {"do_sample": False},
                                 baselines=("reasoner_alone", "tool_alone", "no_exchange"), num_resamples=200)
    assert section["best_baseline"] == "tool_alone"
    assert section["baseline_means"] == {"reasoner_alone": 0.375, "tool_alone": 0.625, "no_exchange": 0.375}
    vs = section["methods"][TEAM]["gain_vs_best_baseline"]
    assert vs["baseline"] == "tool_alone" and vs["mean"] == pytest.approx(0.75 - 0.625)
    # the tool's own tasks are a subset of the team's after training: every paired difference is 0 or +1
    assert vs["ci95"][0] >= 0.0
    write_run_outputs(tmp_path, section, {"command": "x", "wall_time_s": 1.0}, stages)
    report = (tmp_path / "report.md").read_text()
    assert "| tool alone (best baseline) | 0.625 [" in report and "| reasoner alone | 0.375 [" in report
    assert "highest first: tool alone 0.625; reasoner alone 0.375; agents answer once, no exchange 0.375." in report
    summary = json.loads((tmp_path / "summary.json").read_text())["evaluation"]
    assert summary["baselines"] == ["reasoner_alone", "tool_alone", "no_exchange"]
    assert summary["methods"]["tool_alone"]["before"]["mean"] == pytest.approx(0.625)


# ------------------------------------------------------------------------------------------------ a user's own
def right_answer(completions, answer):
    return float(completions.get("writer") == answer)


def user_env(**kwargs):
    return FunctionEnvironment(agents=["writer", "checker"], prompt_fns={"writer": lambda t: f"Q {t['q']}",
                                                                         "checker": lambda t: f"Check {t['q']}"},
                               reward_fns=[right_answer], **kwargs)


class ScoredAlone(FunctionEnvironment):
    """A user's environment that says how to score its writer alone (the checker's answer is no answer)."""

    alone_agents = ("writer",)

    def __init__(self):
        super().__init__(agents=["writer", "checker"], prompt_fns={"writer": lambda t: f"Q {t['q']}",
                                                                   "checker": lambda t: f"Check {t['q']}"},
                         reward_fns=[right_answer])

    def score_alone(self, agent, response, task):
        return right_answer({agent: response}, task["answer"])  # a number: the team reward


def test_a_user_environment_with_score_alone_gets_its_agents_alone_one_without_gets_none():
    tasks = [{"task_id": "a", "q": "6*7", "answer": "42"}, {"task_id": "b", "q": "1+1", "answer": "2"}]
    pool = ScriptPool(lambda agent, prompt, adapter: "42" if agent == "writer" else "ok")
    evaluator = EpisodeEvaluator(ScoredAlone, num_turns=1)
    assert evaluator.baselines == ("writer_alone",)
    result = evaluate_team(pool, evaluator, tasks, methods=[TEAM, "alone"], num_samples=2, generation_config=GREEDY)
    alone = result.methods["writer_alone"]
    assert alone.per_task("return") == [1.0, 0.0] and [len(s) for s in alone.samples["return"]] == [2, 2]
    assert [r.prompt for r in pool.requests if not r.use_adapter] == ["Q 6*7", "Q 1+1"]  # the writer's own prompt

    plain = EpisodeEvaluator(user_env, num_turns=1)
    assert plain.baselines == () and plain.alone == {}
    assert plain.resolve_methods([TEAM, "alone"]) == [TEAM, "alone"]  # left for the caller to report
    with pytest.raises(ValueError, match="has the methods"):
        evaluate_team(pool, plain, tasks, methods=[TEAM, "writer_alone"])


def test_score_alone_errors_are_clear():
    class Broken(ScoredAlone):
        def score_alone(self, agent, response, task):
            return {"reward": 1.0}

    class Raises(ScoredAlone):
        def score_alone(self, agent, response, task):
            raise KeyError("gold")

    class Stranger(ScoredAlone):
        alone_agents = ("judge",)

    pool = ScriptPool(lambda agent, prompt, adapter: "42")
    task = [{"task_id": "a", "q": "6*7", "answer": "42"}]
    with pytest.raises(TypeError, match="must return a StepResult or a number"):
        evaluate_team(pool, EpisodeEvaluator(Broken, 1), task, methods=["writer_alone"])
    with pytest.raises(UserCodeError, match=r"Raises.score_alone raised KeyError.*agent 'writer' wrote '42'"):
        evaluate_team(pool, EpisodeEvaluator(Raises, 1), task, methods=["writer_alone"])
    with pytest.raises(ValueError, match=r"alone_agents names \['judge'\]"):
        EpisodeEvaluator(Stranger, 1)


def test_recipe_names_of_agents_alone():
    assert "alone" in RecipeArguments().eval_methods  # the default plays every agent alone the environment scores
    assert RecipeArguments(eval_methods=["team", "tool_alone", "plan_alone_turns"]).eval_methods[1] == "tool_alone"
    with pytest.raises(ValueError, match="unknown method 'tool_alon'"):
        RecipeArguments(eval_methods=["team", "tool_alon"])
    for env in (MathToolEnv(), PlanPathEnv(), ScoredAlone()):
        assert all(ALONE_METHOD.fullmatch(m) for m in alone_methods(env, 4))


# ------------------------------------------------------------------------------------------------ games, debate
PP_GRID = ["A..", ".#.", "..G"]  # start (0, 0), goal (2, 2): R R D D


def test_game_tool_alone_executes_its_proposal_and_the_plan_plays_alone_every_turn():
    env = PlanPathEnv(max_turns=2)
    task = {"grid": PP_GRID}
    solved = env.score_alone("tool", "```python\nprint('ACTIONS: R R D D')\n```", task)
    assert solved.info["success"] == 1.0 and solved.done and solved.info["partial"] == 1.0
    short = env.score_alone("tool", "```python\nprint('ACTIONS: R R')\n```", task)
    assert short.info["success"] == 0.0 and short.info["tool/valid_format"] == 1.0
    assert env.score_alone("plan", "ACTIONS: R R D D", task).info["success"] == 1.0
    assert alone_methods(env, 2) == {"tool_alone": ("tool", 1), "plan_alone": ("plan", 1),
                                     "plan_alone_turns": ("plan", 2)}
    assert "plan_alone_turns" not in alone_methods(env, 1)  # one turn: the one-turn method is the same

    def script(agent, prompt, adapter):  # the plan goes right at turn 1 and down at turn 2; the tool only right
        if agent == "tool":
            return "```python\nprint('ACTIONS: R R')\n```"
        return "ACTIONS: D D" if "Turn 2 of 2" in prompt else "ACTIONS: R R"

    evaluator = EpisodeEvaluator(lambda: PlanPathEnv(max_turns=2), num_turns=2)
    result = evaluate_team(ScriptPool(script), evaluator, [{"task_id": "g", "grid": PP_GRID}],
                           methods=["alone"], generation_config=GREEDY)
    assert list(result.methods) == ["tool_alone", "plan_alone", "plan_alone_turns"]
    assert result.methods["tool_alone"].per_task("success") == [0.0]
    assert result.methods["plan_alone"].per_task("success") == [0.0]  # R R alone stops short
    assert result.methods["plan_alone_turns"].per_task("success") == [1.0]  # then D D: the goal
    assert result.methods["plan_alone_turns"].per_task("turns") == [2.0]
    assert evaluator.expected_sequences("plan_alone_turns", 3, 1) == 6


def test_debate_agents_alone_are_each_debaters_base_answer():
    evaluator = DebateEvaluator(lambda: MathDebateEnv(num_agents=2, max_turns=2), num_turns=2)
    assert evaluator.baselines == ("agent1_alone", "agent2_alone")
    pool = ScriptPool(lambda agent, prompt, adapter: "\\boxed{4}" if agent == "agent1" else "\\boxed{5}")
    result = evaluate_team(pool, evaluator, [{"task_id": "q", "question": "2 + 2?", "answer": "4"}],
                           methods=[TEAM, "alone"], generation_config=GREEDY)
    assert result.methods["agent1_alone"].per_task("majority_accuracy") == [1.0]
    assert result.methods["agent2_alone"].per_task("majority_accuracy") == [0.0]
    assert result.methods[TEAM].per_task("majority_accuracy") == [0.5]  # a tie of 4 and 5: half right
    env = MathDebateEnv()
    assert env.score_alone("agent2", "no answer", {"question": "x", "answer": "4"}).info["answered"] == 0.0
    assert isinstance(env.score_alone("agent1", "\\boxed{4}", {"question": "x", "answer": "4"}), StepResult)


# ------------------------------------------------------------------------------------------------ the runner
def plan(tmp_path, *overrides):
    """The evaluation plan of the math team's recipe (no model is loaded)."""
    from tests.cli_harness import ROOT
    from trl_multiagent.command.cli import parse_recipe
    from trl_multiagent.command.runner import Run

    recipe, config, given = parse_recipe(["--config", str(ROOT / "recipes/configs/math_easy_at_grpo.yaml"),
                                          "--output_dir", str(tmp_path), "--eval_num_problems", "4", *overrides])
    run = Run(recipe, config, given)
    run.prepare()
    return run


def test_the_runner_plays_every_agent_alone_by_default_and_refuses_a_method_the_environment_lacks(tmp_path):
    from trl_multiagent.errors import RecipeError

    run = plan(tmp_path)  # the default list: single is reasoner_alone, alone adds the tool
    assert run.methods == [TEAM, "reasoner_alone", "no_exchange", "tool_alone"]
    assert run.method_samples == {m: 1 for m in run.methods}
    assert plan(tmp_path, "--eval_methods", "team", "single").methods == [TEAM, "reasoner_alone"]
    with pytest.raises(RecipeError, match=r"has the methods \['team', 'reasoner_alone', 'tool_alone', "
                                          r"'no_exchange'\], not \['coder_alone'\]"):
        plan(tmp_path, "--eval_methods", "team", "coder_alone")
    with pytest.raises(RecipeError, match=r"not \['alone'\]; NoAlone scores no agent alone"):
        plan(tmp_path, "--environment", f"{__file__}:NoAlone", "--eval_methods", "team", "alone")


class NoAlone(MathToolEasyEnv):
    """The easy math team without the agents-alone protocol."""

    score_alone = None
    episode_baselines = {}
