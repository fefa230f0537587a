"""The evaluation package: the paired bootstrap by hand, one generation call per round for all methods, the
evaluators against the code they replace, and the summary / report / plot written in one place."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import GenerationConfig

from trl_multiagent.evaluation import (
    TEAM,
    EpisodeEvaluator,
    Evaluator,
    MethodOutput,
    MethodResult,
    PipelineEvaluator,
    StageResult,
    evaluate_team,
    evaluation_section,
    paired_bootstrap,
    write_run_outputs,
)
from trl_multiagent.metrics.stats import percentile_interval
from trl_multiagent.team.pool import Generation, GenerationRequest

GREEDY = GenerationConfig(max_new_tokens=4, do_sample=False)


class ManyPool:
    """A scripted pool with the team-level ``generate_many``; records every call (requests and adapter flags)."""

    def __init__(self, agents, script):
        self.agent_names, self.script, self.calls = list(agents), script, []

    def policy_of(self, agent):
        return agent

    def generate_many(self, requests, generation_config, max_batch_sequences=None):
        self.calls.append(list(requests))
        out = []
        for req in requests:
            texts = [self.script(req.agent, req.prompt, k, req.use_adapter) for k in range(req.num_samples)]
            out.append([Generation([0], [ord(c) for c in t] or [0], t) for t in texts])
        return out


# ------------------------------------------------------------------------------------------------ statistics
def test_paired_bootstrap_by_hand():
    # per-task differences after - before: [1, 0, -1, 2]; four resamples given explicitly, each one task four times
    after, before = [3.0, 5.0, 0.0, 2.0], [2.0, 5.0, 1.0, 0.0]
    rows = [[0, 0, 0, 0], [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]]
    out = paired_bootstrap(after, before, alpha=0.5, indices=rows)
    # resampled means 1, 0, -1, 2 -> sorted [-1, 0, 1, 2]; lo = m_(floor(4 * 0.25)) = m_1, hi = m_(ceil(4 * 0.75) - 1)
    assert out == {"mean": 0.5, "ci95": [0.0, 1.0], "num_tasks": 4}
    # two tasks, differences [0, 1]: the four equally likely resamples have means 0, 0.5, 0.5, 1
    two = paired_bootstrap([1.0, 3.0], [1.0, 2.0], alpha=0.5, indices=[[0, 0], [0, 1], [1, 0], [1, 1]])
    assert two["mean"] == 0.5 and two["ci95"] == [0.5, 0.5]
    assert percentile_interval([5, 1, 4, 2, 3], alpha=0.4) == (2.0, 4.0)  # floor(1) = 1 -> 2; ceil(4) - 1 = 3 -> 4


def test_pairing_removes_the_spread_between_tasks():
    before = [0.0, 0.9, 0.1, 0.8, 0.2, 0.7, 0.3, 0.6]  # easy and hard tasks
    after = [b + 0.1 for b in before]  # every task gains exactly 0.1
    paired = paired_bootstrap(after, before, num_resamples=2000)
    assert paired["mean"] == pytest.approx(0.1) and paired["ci95"] == pytest.approx([0.1, 0.1])
    unpaired_after, unpaired_before = paired_bootstrap(after), paired_bootstrap(before)
    assert unpaired_after["ci95"][0] < unpaired_before["ci95"][1]  # the intervals of the two means overlap
    again = paired_bootstrap([0.0, 1.0] * 20, num_resamples=500, seed=3)
    assert again == paired_bootstrap([0.0, 1.0] * 20, num_resamples=500, seed=3)  # seeded
    assert 0.25 < again["ci95"][0] < 0.5 < again["ci95"][1] < 0.75


def test_paired_bootstrap_edge_cases():
    out = paired_bootstrap([1.0, math.nan, 3.0], [0.0, 0.0, math.nan], indices=[[0]])
    assert out["num_tasks"] == 1 and out["mean"] == 1.0  # a task missing on either side leaves both
    assert math.isnan(paired_bootstrap([], None)["mean"])
    with pytest.raises(ValueError, match="same tasks"):
        paired_bootstrap([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="indices"):
        paired_bootstrap([1.0, 2.0], indices=[[0, 5]])


# ------------------------------------------------------------------------------------------------ the driver
class TwoRounds(Evaluator):
    """A toy evaluation: the team answers once; the baseline 'echo' answers, then answers again after reading its
    first answer. Score: the length of the last answer."""

    name = "toy"
    baselines = ("echo",)

    def program(self, method, tasks, num_samples):
        use_adapter = method == TEAM
        first = yield [GenerationRequest("solo", t["q"], num_samples, use_adapter) for t in tasks]
        if method == "echo":
            again = yield [GenerationRequest("solo", g.text + "?", 1, use_adapter) for gs in first for g in gs]
            first = [again[i * num_samples:(i + 1) * num_samples] for i in range(len(tasks))]
            first = [[g[0] for g in gs] for gs in first]
        return MethodOutput([[{"reward": float(len(g.text))} for g in gs] for gs in first])


def test_one_generation_call_per_round_for_all_methods():
    pool = ManyPool(["solo"], lambda agent, prompt, k, adapter: prompt + ("T" if adapter else "b") * (k + 1))
    tasks = [{"task_id": "x", "q": "aa"}, {"task_id": "y", "q": "bbbb"}]
    result = evaluate_team(pool, TwoRounds(), tasks, methods=[TEAM, "echo"], num_samples=2, generation_config=GREEDY)
    assert len(pool.calls) == 2 and result.generate_calls == 2  # rounds, not methods x tasks
    first, second = pool.calls
    assert {(r.use_adapter, r.num_samples) for r in first} == {(True, 2), (False, 2)} and len(first) == 4
    assert all(not r.use_adapter for r in second) and len(second) == 4
    assert result.generated_sequences == 8 + 4
    team, echo = result.methods[TEAM], result.methods["echo"]
    assert team.task_ids == ["x", "y"] and team.samples["reward"] == [[3.0, 4.0], [5.0, 6.0]]
    assert echo.per_task("reward") == [5.5, 7.5]  # "aab?" + "b" and "aabb?" + "b"; "bbbbb?b" and "bbbbbb?b"
    with pytest.raises(ValueError, match="methods"):
        evaluate_team(pool, TwoRounds(), tasks, methods=["naive"])


class SameFirstRound(Evaluator):
    """Two baselines that open with the same requests (as sequential and discussion open with naive's drafts): 'echo'
    scores its first answers, 'twice' answers again after reading its own."""

    name = "toy"
    baselines = ("echo", "twice")

    def program(self, method, tasks, num_samples):
        first = yield [GenerationRequest("solo", t["q"], num_samples, False) for t in tasks]
        if method == "twice":
            again = yield [GenerationRequest("solo", gs[0].text + "?", 1, False) for gs in first]
            first = [[a[0]] + gs[1:] for a, gs in zip(again, first)]
        return MethodOutput([[{"reward": float(len(g.text)), "last": float(g.completion_ids[-1])} for g in gs]
                             for gs in first])


def test_methods_with_the_same_first_round_share_its_draws():
    counter = iter(range(1000))
    pool = ManyPool(["solo"], lambda agent, prompt, k, adapter: prompt + chr(ord("a") + next(counter) % 26))
    tasks = [{"task_id": "x", "q": "aa"}, {"task_id": "y", "q": "aa"}]  # two equal tasks: independent draws
    result = evaluate_team(pool, SameFirstRound(), tasks, methods=["echo", "twice"], num_samples=2,
                           generation_config=GREEDY)
    first, second = pool.calls
    assert len(first) == 2 and [r.num_samples for r in first] == [2, 2]  # one copy of the round, not two
    assert result.generated_sequences == 4 + 2
    echo = [[chr(int(v)) for v in row] for row in result.methods["echo"].samples["last"]]
    assert echo == [["a", "b"], ["c", "d"]]  # the two equal tasks were drawn apart within the method
    # 'twice' revised exactly the drafts 'echo' is scored on: "aaa?" and "aac?" (+ a new letter)
    assert [r.prompt for r in second] == ["aaa?", "aac?"]
    assert result.methods["twice"].samples["reward"] == [[5.0, 3.0], [5.0, 3.0]]
    unshared = ManyPool(["solo"], lambda agent, prompt, k, adapter: prompt + "z")
    result = evaluate_team(unshared, SameFirstRound(), tasks, methods=["echo", "twice"], num_samples=2,
                           generation_config=GREEDY, share_draws=False)
    assert len(unshared.calls[0]) == 4 and result.generated_sequences == 8 + 2


def test_a_method_with_fewer_samples_revises_the_first_of_the_shared_drafts():
    counter = iter(range(1000))
    pool = ManyPool(["solo"], lambda agent, prompt, k, adapter: prompt + chr(ord("a") + next(counter) % 26))
    tasks = [{"task_id": "x", "q": "aa"}, {"task_id": "y", "q": "bb"}]
    result = evaluate_team(pool, SameFirstRound(), tasks, methods=["echo", "twice"],
                           num_samples={"echo": 3, "twice": 2}, generation_config=GREEDY)
    first, second = pool.calls
    assert [r.num_samples for r in first] == [3, 3]  # 'twice' drew nothing of its own in the first round
    assert result.generated_sequences == 6 + 2
    echo = [[chr(int(v)) for v in row] for row in result.methods["echo"].samples["last"]]
    assert echo == [["a", "b", "c"], ["d", "e", "f"]]
    # 'twice' revised the first of each task's drafts and kept the second: its 2 samples are echo's first 2
    assert [r.prompt for r in second] == ["aaa?", "bbd?"]
    assert result.methods["twice"].samples["reward"] == [[5.0, 3.0], [5.0, 3.0]]
    assert [len(v) for v in result.methods["twice"].samples["reward"]] == [2, 2]
    # a later method asking for MORE samples than the earlier draw cannot take it: it draws its own
    pool = ManyPool(["solo"], lambda agent, prompt, k, adapter: prompt + "z")
    result = evaluate_team(pool, SameFirstRound(), tasks, methods=["echo", "twice"],
                           num_samples={"echo": 1, "twice": 2}, generation_config=GREEDY)
    assert [r.num_samples for r in pool.calls[0]] == [1, 1, 2, 2]
    with pytest.raises(ValueError, match="no count for the method"):
        evaluate_team(pool, SameFirstRound(), tasks, methods=["echo", "twice"], num_samples={"echo": 1},
                      generation_config=GREEDY)
    with pytest.raises(ValueError, match="at least 1"):
        evaluate_team(pool, SameFirstRound(), tasks, methods=["echo"], num_samples={"echo": 0},
                      generation_config=GREEDY)


def test_evaluation_leaves_the_random_state_as_it_was():
    import random

    import torch

    random.seed(1)
    torch.manual_seed(1)
    pool = ManyPool(["solo"], lambda agent, prompt, k, adapter: "x")
    evaluate_team(pool, TwoRounds(), [{"q": "a"}], generation_config=GREEDY, seed=5)
    after_eval = (random.random(), torch.rand(1).item())
    random.seed(1)
    torch.manual_seed(1)
    assert after_eval == (random.random(), torch.rand(1).item())


# ------------------------------------------------------------------------------------------------ evaluators
def test_episodes_on_the_matrix_game():
    from trl_multiagent.environments import MatrixGameEnv

    pool = ManyPool(["agent1", "agent2"], lambda agent, prompt, k, adapter: "A" if agent == "agent1" else "B")
    evaluator = EpisodeEvaluator(MatrixGameEnv, num_turns=1)
    result = evaluate_team(pool, evaluator, [{"task_id": 0}, {"task_id": 1}], num_samples=3,
                           generation_config=GREEDY)
    team = result.methods[TEAM]
    env = MatrixGameEnv()
    env.reset({})
    expected = env.step({"agent1": "A", "agent2": "B"}).team_reward
    assert team.per_task("return") == [expected, expected] and len(pool.calls) == 1
    assert evaluator.headline_metric(result.methods) == "return"  # no success checker in this game
    assert team.details["turn1/team_reward"] == expected


def test_episode_baselines_play_one_turn_of_the_bases_with_only_their_agents():
    from trl_multiagent.environments import MathToolEnv

    task = {"task_id": "q", "question": "What is 7 / 2?", "answer": "7/2"}
    tool = "```python\nprint(7 / 2)\n```"

    def script(agent, prompt, k, adapter):  # the bases' reasoner is wrong; with the adapter it follows the tool
        if agent == "tool":
            return tool
        return "\\boxed{3.5}" if adapter and "3.5" in json.dumps(prompt) else "\\boxed{4}"

    pool = ManyPool(["reasoner", "tool"], script)
    evaluator = EpisodeEvaluator(MathToolEnv, num_turns=2)
    assert evaluator.baselines == ("reasoner_alone", "tool_alone", "no_exchange") and evaluator.methods[0] == TEAM
    result = evaluate_team(pool, evaluator, [task], methods=(TEAM, "single", "no_exchange"),
                           generation_config=GREEDY)
    assert list(result.methods) == [TEAM, "reasoner_alone", "no_exchange"]  # single: reasoner_alone's old name
    single, none, team = (result.methods[m] for m in ("reasoner_alone", "no_exchange", TEAM))
    # single: the reasoner alone, once, adapters off: 4 is wrong and no tool ran
    assert single.per_task("final/team_correct") == [0.0] and single.per_task("turns") == [1.0]
    assert single.per_task("final/tool_executes") == [0.0]
    # no_exchange: both answer once; the team's answer is the reasoner's (they disagree): wrong, the tool right
    assert none.per_task("final/team_correct") == [0.0] and none.per_task("final/tool_correct") == [1.0]
    assert none.per_task("turns") == [1.0]
    # the team: turn 2 shows the reasoner the program's 3.5, it revises and is corrected by the exchange
    assert team.per_task("final/team_correct") == [1.0] and team.per_task("final/reasoner_corrected") == [1.0]
    assert team.per_task("turns") == [2.0]
    requests = [(r.agent, r.use_adapter) for call in pool.calls for r in call]
    # the baselines: the reasoner's first prompt with adapters off is one request, its draw shared by both
    assert requests.count(("reasoner", False)) == 1 and requests.count(("tool", False)) == 1
    assert requests.count(("reasoner", True)) == 2 and requests.count(("tool", True)) == 2  # two team turns
    assert evaluator.expected_sequences("reasoner_alone", 3, 2) == 6
    assert evaluator.expected_sequences("no_exchange", 3, 2) == 12
    from trl_multiagent.environments import MatrixGameEnv
    from trl_multiagent.evaluation import play_episodes

    with pytest.raises(ValueError, match="partial joint actions"):  # one agent alone needs partial actions
        next(play_episodes(MatrixGameEnv, [{}], 1, 1, acting=["agent1"]))


def test_before_training_the_baselines_share_the_teams_draws():
    from trl_multiagent.environments import MathToolEnv

    class UntrainedPool(ManyPool):  # the adapters compute nothing yet: adapters on and off are one distribution
        def adapters_are_identity(self):
            return True

    task = {"task_id": "q", "question": "What is 7 / 2?", "answer": "7/2"}
    script = lambda agent, prompt, k, adapter: "```python\nprint(7 / 2)\n```" if agent == "tool" else "\\boxed{4}"  # noqa: E731
    pool = UntrainedPool(["reasoner", "tool"], script)
    result = evaluate_team(pool, EpisodeEvaluator(MathToolEnv, num_turns=2), [task],
                           methods=(TEAM, "single", "no_exchange"), generation_config=GREEDY)
    requests = [(r.agent, r.use_adapter) for call in pool.calls for r in call]
    assert ("reasoner", False) not in requests and ("tool", False) not in requests  # no draw of their own
    assert requests.count(("reasoner", True)) == 2 and requests.count(("tool", True)) == 2  # the team's two turns
    assert result.methods["no_exchange"].per_task("final/tool_correct") == [1.0]
    assert result.methods["reasoner_alone"].per_task("final/tool_executes") == [0.0]  # still the reasoner alone
    assert result.generated_sequences == 4


def sampler_single_pass(pool, env, tasks):
    """The pipeline sampler's one output per node and task (Fork-on-first with G = 1): the reference the pipeline
    evaluator is checked against."""
    from collections import defaultdict

    from trl_multiagent.rollout.pipeline import PipelineSampler

    result = PipelineSampler(num_samples=1, strategy="fork_on_first").run(pool, env, list(tasks), GREEDY)
    out = defaultdict(list)
    for traj in result.trajectories:
        out["reward"].append(traj.reward)
        for key, value in traj.info.items():
            out[key].append(value)
    for node in result.nodes:
        if node.is_agent:
            inputs = {name: result.nodes[i].output for name, i in node.inputs.items()}
            for key, value in env.output_stats(node.name, inputs, node.output).items():
                out[f"agent/{node.name}/{key}"].append(float(value))
    return {key: sum(vs) / len(vs) for key, vs in out.items()}


def test_pipeline_evaluator_agrees_with_a_single_sampler_pass():
    from tests.fake_pool import ScriptedPool
    from tests.test_mhgpo_rollout import ToyDag

    tasks = [{"id": 0, "bonus": 0.0}, {"id": 1, "bonus": 0.5}]
    script = lambda agent, prompt, k, *adapter: f"{agent}1" if "0" in str(prompt) else f"{agent}0"  # noqa: E731
    expected = sampler_single_pass(ScriptedPool(["a", "b", "c", "d"], script), ToyDag(), tasks)
    pool = ManyPool(["a", "b", "c", "d"], script)
    result = evaluate_team(pool, PipelineEvaluator(ToyDag), tasks, generation_config=GREEDY)
    team = result.methods[TEAM]
    assert len(pool.calls) == 4  # one call per agent stage of the graph, every question in it
    for key in ("reward", "answer_is_d0", "agent/a/length", "agent/d/length"):
        assert team.mean(key) == pytest.approx(expected[key]), key


def test_pipeline_evaluator_single_pass_per_question():
    from tests.test_mhgpo_rollout import TASKS, ToyDag, counting_pool

    pool = counting_pool()  # a pool with only the per-agent generate: served stage by stage
    team = evaluate_team(pool, PipelineEvaluator(ToyDag), TASKS, generation_config=GREEDY).methods[TEAM]
    assert pool.calls == [("a", 3, 1), ("b", 3, 1), ("c", 3, 1), ("d", 3, 1)]
    # every agent says <agent>0: only question 1's bonus of 1.0 scores; d0 is the answer everywhere
    assert team.mean("reward") == pytest.approx(1 / 3) and team.mean("answer_is_d0") == 1.0
    assert team.mean("agent/a/length") == 2.0 and len(team.per_task("reward")) == 3


def test_coding_evaluation_runs_every_method_in_two_generation_calls(tiny_text_model):
    from trl_multiagent.environments import AuxMainCodingEnv
    from trl_multiagent.evaluation import METHODS, CodingEvaluator
    from trl_multiagent.team.pool import AgentPool, AgentSpec

    pool = AgentPool([AgentSpec("aux", model=tiny_text_model, lora_r=4),
                      AgentSpec("main", model=tiny_text_model, lora_r=4)])
    calls = []
    generate_many = pool.generate_many

    def counting(requests, *args, **kwargs):
        calls.append(len(requests))
        return generate_many(requests, *args, **kwargs)

    pool.generate_many = counting
    problems = AuxMainCodingEnv.make_dataset(split="test", num_tasks=2)
    evaluator = CodingEvaluator(AuxMainCodingEnv, num_turns=1)
    config = GenerationConfig(max_new_tokens=3, do_sample=True)
    # untrained (every lora_B zero): adapters on and off are one distribution, so naive's drafts ARE the team's
    assert pool.adapters_are_identity()
    evaluate_team(pool, evaluator, list(problems), METHODS, num_samples=3, generation_config=config)
    assert calls == [2 * 2 + 2, 2 * 3 + 2 * 2 * 3]
    with torch.no_grad():  # a trained pool: the team's adapters change its answers
        next(p for n, p in pool.named_parameters() if "lora_B" in n and ".main." in n).add_(0.1)
    assert not pool.adapters_are_identity()
    calls.clear()
    result = evaluate_team(pool, evaluator, list(problems), METHODS, num_samples=3, generation_config=config)
    # round 1 (one request per problem and agent, 3 samples each): team (aux, main), single, naive (aux, main);
    # sequential's aux and discussion's first answers are naive's drafts; round 2: sequential's main and
    # discussion's revisions, one request per sample (each sees its own first answers)
    assert calls == [2 * 2 + 2 + 2 * 2, 2 * 3 + 2 * 2 * 3]
    for method, res in result.methods.items():
        assert [len(s) for s in res.samples["reward"]] == [3, 3], method
        assert {"pass@1", "acc@1", "coop@1"} <= set(res.samples)
        assert {"pass@3", "acc@3", "coop@3", "pass@1"} <= set(res.details)
    assert "tokens/aux" not in result.methods["single"].details and "tokens/aux" in result.methods["discussion"].details


# ------------------------------------------------------------------------------------------------ summary
def _result(method, values):
    return MethodResult(method, [f"t{i}" for i in range(len(values))], {"reward": [[v] for v in values],
                                                                          "other": [[1.0] for _ in values]})


def test_summary_report_and_plot(tmp_path):
    before = StageResult("before", {TEAM: _result(TEAM, [0.1, 0.5, 0.2, 0.6]),
                                    "naive": _result("naive", [0.2, 0.5, 0.2, 0.5]),
                                    "single": _result("single", [0.0, 0.1, 0.0, 0.1])}, 3.0, 24, 2)
    after = StageResult("after", {TEAM: _result(TEAM, [0.3, 0.7, 0.4, 0.8])}, 2.0, 8, 1)
    stages = {"before": before, "after": after}
    section = evaluation_section(stages, "reward", "coding", 1, {"do_sample": False, "max_new_tokens": 4},
                                 baselines=("single", "naive", "sequential"), num_resamples=500)
    team = section["methods"][TEAM]
    assert team["before"]["mean"] == pytest.approx(0.35) and team["after"]["mean"] == pytest.approx(0.55)
    assert team["gain"]["mean"] == pytest.approx(0.2) and team["gain"]["ci95"] == pytest.approx([0.2, 0.2])
    vs = team["gain_vs_best_baseline"]
    assert vs["baseline"] == "naive" and section["best_baseline"] == "naive"  # the highest mean before training
    assert vs["mean"] == pytest.approx(0.55 - 0.35) and vs["ci95"][0] > 0
    assert set(section["methods"]["naive"]) >= {"before", "metrics"} and "after" not in section["methods"]["naive"]
    assert section["baselines"] == ["single", "naive"] and section["task_ids"] == ["t0", "t1", "t2", "t3"]

    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"algorithm": "MAGRPO", "global_step": 3}))
    (out / "metrics.jsonl").write_text("\n".join(json.dumps({"step": s, "reward": 0.1 * s}) for s in (1, 2, 3)))
    write_run_outputs(out, section, {"command": "python -m trl_multiagent train --config x.yaml",
                                     "wall_time_s": 12.0}, stages)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithm"] == "MAGRPO" and summary["global_step"] == 3  # the trainer's summary stays
    assert summary["evaluation"]["methods"][TEAM]["gain_vs_best_baseline"]["baseline"] == "naive"
    report = (out / "report.md").read_text()
    assert "| team | 0.350 [" in report and "vs naive" in report and "naive concatenation (best baseline)" in report
    assert (out / "reward_curve.png").stat().st_size > 1000
    rows = [json.loads(line) for line in (out / "eval_per_task.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * 3 + 4 and {"stage", "method", "task_id", "reward", "other"} <= set(rows[0])


def test_held_out_sets_are_reported_separately_with_their_own_intervals(tmp_path):
    from trl_multiagent.evaluation.report import task_sets_of

    tasks = [{"task_id": f"t{i}", "held_out_set": s} for i, s in enumerate(["ops", "ops", "form", "form"])]
    sets = task_sets_of(tasks)
    assert sets == {"ops": [0, 1], "form": [2, 3]}
    assert task_sets_of([{"held_out_set": "ops"}] * 3) is None and task_sets_of([{"task_id": "a"}]) is None
    # team gains +0.2 on the "ops" tasks and nothing on the "form" tasks; "naive" is the better baseline on "ops",
    # "single" on "form"
    before = StageResult("before", {TEAM: _result(TEAM, [0.1, 0.5, 0.2, 0.6]),
                                    "naive": _result("naive", [0.4, 0.6, 0.0, 0.0]),
                                    "single": _result("single", [0.0, 0.0, 0.3, 0.3])}, 3.0, 24, 2)
    after = StageResult("after", {TEAM: _result(TEAM, [0.3, 0.7, 0.2, 0.6])}, 2.0, 8, 1)
    section = evaluation_section({"before": before, "after": after}, "reward", "episodes", 1, {"do_sample": False},
                                 baselines=("single", "naive"), num_resamples=200, task_sets=sets)
    assert section["methods"][TEAM]["gain"]["mean"] == pytest.approx(0.1)  # all four tasks together
    ops, form = section["held_out_sets"]["ops"], section["held_out_sets"]["form"]
    assert ops["held_out_tasks"] == 2 and form["held_out_tasks"] == 2
    assert ops["methods"][TEAM]["gain"]["mean"] == pytest.approx(0.2)
    assert ops["methods"][TEAM]["gain"]["ci95"] == pytest.approx([0.2, 0.2])
    assert form["methods"][TEAM]["gain"]["mean"] == pytest.approx(0.0)
    assert ops["best_baseline"] == "naive" and form["best_baseline"] == "single"
    # after training vs each set's own best baseline, before training: ops (0.3, 0.7) - (0.4, 0.6); form
    # (0.2, 0.6) - (0.3, 0.3)
    assert ops["methods"][TEAM]["gain_vs_best_baseline"]["mean"] == pytest.approx(0.0)
    assert form["methods"][TEAM]["gain_vs_best_baseline"]["mean"] == pytest.approx(0.1)
    out = tmp_path / "run"
    out.mkdir()
    write_run_outputs(out, section, {"command": "x", "wall_time_s": 1.0}, {"before": before, "after": after})
    report = (out / "report.md").read_text()
    assert "### Held-out set `ops` (2 tasks)" in report and "### Held-out set `form` (2 tasks)" in report
    assert "single agent (best baseline)" in report.split("`form`")[1]


def test_report_shows_five_exchanges_chosen_by_a_fixed_rule_side_by_side(tmp_path):
    from trl_multiagent.evaluation.report import exchange_examples

    def team(stage_word, values):
        result = _result(TEAM, values)
        result.texts = [{"task_id": f"t{i}", "sample": s, "turn": t, "agent": a, "text": f"{stage_word} {i}{s}{t}{a}",
                         "reward": v} for i, v in enumerate(values) for s in (0, 1) for t in (0, 1)
                        for a in ("reasoner", "tool")]
        return result

    before = StageResult("before", {TEAM: team("old", [0.0] * 10)})
    after = StageResult("after", {TEAM: team("new|x\ny", [1.0] * 10)})
    tasks = [{"task_id": f"t{i}", "question": f"q{i}?", "answer": str(i)} for i in range(10)]
    examples = exchange_examples({"before": before, "after": after}, tasks)
    assert [e["task_id"] for e in examples] == ["t0", "t2", "t4", "t6", "t8"]  # round(i * 10 / 5)
    first = examples[0]
    assert first["question"] == "q0?" and first["answer"] == "0"
    assert [(r["turn"], r["agent"]) for r in first["before"]] == [(0, "reasoner"), (0, "tool"), (1, "reasoner"),
                                                                   (1, "tool")]  # sample 0 only
    assert first["before"][0]["text"] == "old 000reasoner" and first["after"][3]["text"] == "new|x\ny 001tool"
    assert [e["task_id"] for e in exchange_examples({"before": before}, None, count=3)] == ["t0", "t3", "t7"]
    section = evaluation_section({"before": before, "after": after}, "reward", "episodes", 1, {}, tasks=tasks,
                                 num_resamples=50)
    out = tmp_path / "run"
    out.mkdir()
    write_run_outputs(out, section, {"command": "x"}, {"before": before, "after": after})
    report = (out / "report.md").read_text()
    assert "### 5 held-out tasks, the untrained and the trained team" in report and "q4? (answer: 4)" in report
    assert "| 2 | tool | old 401tool (reward 0.000) | new\\|x<br>y 401tool (reward 1.000) |" in report
