"""MHGPO's pipeline sampler (trl_multiagent/rollout/pipeline.py) and its credit (trainers/mhgpo.py: pipeline_credit)
on hand-built trajectories, with a scripted pool.

The toy pipeline is a DAG with a tool:   a -> b -> d,   a -> t (tool) -> c -> d.
Every agent's output is ``<agent><n>``, n = how many times this agent already saw this exact prompt (so the G copies
of a fork agent, which share one prompt, answer x0, x1, ...). The final reward of a trajectory is
``bonus(question) + 1.0 [a said a1] + 0.5 [b said b1] + 0.25 [c said c1]``; agent c always pays a format penalty
of -0.1.
"""

import statistics
from collections import Counter, defaultdict

import pytest
from transformers import GenerationConfig

from tests.fake_pool import ScriptedPool
from trl_multiagent.credit import STD_EPS
from trl_multiagent.environments.pipeline import PipelineEnvironment, PipelineGraph
from trl_multiagent.rollout.pipeline import PipelineSampler, choose_fork_agents, default_fork_probabilities
from trl_multiagent.trainers.mhgpo import pipeline_credit

GEN = GenerationConfig(max_new_tokens=4)
G = 2


class ToyDag(PipelineEnvironment):
    agents = ("a", "b", "c", "d")
    tools = ("t",)
    edges = (("a", "b"), ("a", "t"), ("t", "c"), ("b", "d"), ("c", "d"))
    required_columns = ("id", "bonus")

    def prompt(self, agent, task, inputs):
        if agent == "a":
            return f"q{task['id']}"
        if agent == "b":
            return f"b{task['id']}|{inputs['a']}"
        if agent == "c":
            return f"c{task['id']}|{inputs['t']}"
        return f"d{task['id']}|{inputs['b']}|{inputs['c']}"

    def run_tool(self, tool, task, inputs):
        return inputs["a"].upper()

    def final_reward(self, task, outputs):
        return task["bonus"] + 1.0 * (outputs["a"] == "a1") + 0.5 * (outputs["b"] == "b1") \
            + 0.25 * (outputs["c"] == "c1")

    def format_reward(self, agent, task, inputs, output):
        return -0.1 if agent == "c" else 0.0

    def metrics(self, task, outputs):
        return {"answer_is_d0": float(outputs["d"] == "d0")}

    def output_stats(self, agent, inputs, output):
        return {"length": float(len(output))}


def counting_pool():
    seen = Counter()

    def script(agent, prompt, k):
        n = seen[(agent, prompt)]
        seen[(agent, prompt)] += 1
        return f"{agent}{n}"

    return ScriptedPool(list(ToyDag.agents), script, policies={a: "shared" for a in ToyDag.agents})


TASKS = [{"id": 0, "bonus": 0.0}, {"id": 1, "bonus": 1.0}, {"id": 2, "bonus": 0.0}]


def play(sampler, pool, tasks, forks=None, aggregate="mean"):
    """The sampler's rollout, then MHGPO's credit (what the trainer's assign_credit does)."""
    exp = sampler.rollout(pool, ToyDag, tasks, GEN, forks=forks)
    assert all(s.advantage == 0.0 and s.reward == 0.0 for s in exp.samples)
    pipeline_credit(exp, aggregate)
    return exp


def by_agent(samples):
    out = defaultdict(list)
    for s in samples:
        out[(s.episode, s.agent)].append(s)
    return out


def norm(*xs):
    """Eq. 5 by hand: (x - mean) / (sample std + eps)."""
    m, sd = statistics.mean(xs), statistics.stdev(xs)
    return [(x - m) / (sd + STD_EPS) for x in xs]


def test_graph_order_predecessors_and_descendants():
    g = ToyDag().graph()
    assert g.order == ("a", "b", "t", "c", "d") and g.agents == ("a", "b", "c", "d") and g.tools == ("t",)
    assert g.entry == "a" and g.sink == "d"
    assert g.predecessors["d"] == ("b", "c") and g.predecessors["c"] == ("t",)
    assert g.descendants["b"] == {"d"} and g.descendants["a"] == {"b", "t", "c", "d"}


@pytest.mark.parametrize("edges, message", [
    ((("a", "b"), ("b", "a")), "cycle"),
    ((("a", "b"), ("a", "c")), "exactly one final node"),
    ((("a", "x"),), "unknown node"),
    ((("a", "t"),), "must be an agent"),
])
def test_graph_validation(edges, message):
    agents = ("a", "b", "c") if message != "must be an agent" else ("a",)
    with pytest.raises(ValueError, match=message):
        PipelineGraph.build(agents, ("t",) if "agent" in message else (), edges)


def test_fork_on_first_counts_groups_and_advantages_by_hand():
    pool = counting_pool()
    exp = play(PipelineSampler(num_samples=G, strategy="fork_on_first"), pool, TASKS[:2])
    # one generate call per agent for every question and branch: 2 questions x G = 4 prompts each
    assert pool.calls == [("a", 4, 1), ("b", 4, 1), ("c", 4, 1), ("d", 4, 1)]
    groups = by_agent(exp.samples)
    assert {k: len(v) for k, v in groups.items()} == {(q, a): G for q in (0, 1) for a in "abcd"}
    for (q, agent), members in groups.items():
        assert {s.group for s in members} == {("question", q, agent)}
    # homogeneous at the fork (entry) agent, heterogeneous downstream: the Bs read different A outputs
    assert {tuple(s.generation.prompt_ids) for s in groups[(0, "a")]} == {(len("q0"),)}
    assert {s.generation.text for s in groups[(0, "a")]} == {"a0", "a1"}
    # branch 0 -> a0, b0, c0: reward bonus + 0; branch 1 -> a1, b0, c0: bonus + 1 (b and c are not forked again)
    assert [j.reward for j in exp.joint_actions] == pytest.approx([0.0, 1.0, 1.0, 2.0])
    for q, bonus in ((0, 0.0), (1, 1.0)):
        for agent in "abd":  # a chain: every agent's shared reward is its branch's final reward
            assert [s.reward for s in groups[(q, agent)]] == pytest.approx([bonus, bonus + 1.0])
        assert [s.ret for s in groups[(q, "c")]] == pytest.approx([bonus, bonus + 1.0])
        assert [s.reward for s in groups[(q, "c")]] == pytest.approx([bonus - 0.1, bonus + 0.9])
        for agent in "abcd":
            assert [s.advantage for s in groups[(q, agent)]] == pytest.approx(norm(0.0, 1.0))
    assert exp.stats["generated_samples"] == 16 and exp.stats["num_tool_calls"] == 4
    # both branches show d the same prompt "d<q>|b0|c0", so the scripted d answers d0 then d1
    assert exp.stats["reward"] == pytest.approx(1.0) and exp.stats["env/answer_is_d0"] == 0.5
    assert exp.stats["agent/c/format_reward"] == pytest.approx(-0.1)
    assert exp.stats["agent/a/similarity"] == 0.0 and exp.stats["agent/b/similarity"] == 1.0  # Figure 9 (F1)
    assert exp.stats["agent/a/length"] == 2.0


def test_round_robin_fork_at_b_propagates_through_the_dag_by_hand():
    pool = counting_pool()
    sampler = PipelineSampler(num_samples=G, strategy="round_robin")
    exp = play(sampler, pool, TASKS, forks=["a", "b", "b"])
    groups = by_agent(exp.samples)
    # question 0 forks at a (as FoF); questions 1 and 2 fork at b: a, t and c run once, b and d G times
    assert {k: len(v) for k, v in groups.items()} == {
        **{(0, a): G for a in "abcd"}, (1, "a"): 1, (1, "c"): 1, (1, "b"): G, (1, "d"): G,
        (2, "a"): 1, (2, "c"): 1, (2, "b"): G, (2, "d"): G}
    assert exp.stats["generated_samples"] == 8 + 2 * (1 + G + 1 + G) and exp.stats["num_tool_calls"] == G + 2
    # question 1 (bonus 1): branches b0 / b1 -> final rewards 1.0 / 1.5
    assert [s.reward for s in groups[(1, "d")]] == pytest.approx([1.0, 1.5])
    assert [s.reward for s in groups[(1, "b")]] == pytest.approx([1.0, 1.5])
    # c (one output, read by both d's): mean(1.0, 1.5) = 1.25, then its own -0.1 penalty
    assert groups[(1, "c")][0].ret == pytest.approx(1.25) and groups[(1, "c")][0].reward == pytest.approx(1.15)
    # a: its direct successors are b (two outputs) and, through the tool t, c (one output):
    # mean(1.0, 1.5, 1.25) = 1.25; c's penalty is added after propagation, so it does not reach a
    assert groups[(1, "a")][0].reward == pytest.approx(1.25)
    # question 2 (bonus 0): the same structure, 1 lower
    assert groups[(2, "a")][0].reward == pytest.approx(0.25) and groups[(2, "c")][0].reward == pytest.approx(0.15)
    # groups: homogeneous at the fork agent b, per question; a and c (before the fork) grouped ACROSS questions 1, 2
    assert {s.group for s in groups[(1, "b")]} == {("question", 1, "b")}
    assert groups[(1, "a")][0].group == groups[(2, "a")][0].group == ("fork", "b", "a")
    assert groups[(1, "c")][0].group == groups[(2, "c")][0].group == ("fork", "b", "c")
    assert {s.group for s in groups[(0, "a")]} == {("question", 0, "a")}  # question 0 forked at a: not in them
    # advantages: cross-question groups {1.25, 0.25} and {1.15, 0.15}; per-question groups {1.0, 1.5}, {0.0, 0.5}
    up, down = norm(1.25, 0.25)
    assert groups[(1, "a")][0].advantage == pytest.approx(up) and groups[(2, "a")][0].advantage == pytest.approx(down)
    assert groups[(1, "c")][0].advantage == pytest.approx(up) and groups[(2, "c")][0].advantage == pytest.approx(down)
    assert [s.advantage for s in groups[(2, "b")]] == pytest.approx(norm(0.0, 0.5))
    for q, (low, high) in ((1, (1.0, 1.5)), (2, (0.0, 0.5))):  # the fork agent b and its descendant d, per question
        for agent in "bd":
            assert [s.reward for s in groups[(q, agent)]] == pytest.approx([low, high])
            assert [s.advantage for s in groups[(q, agent)]] == pytest.approx(norm(low, high))
    # question 0 forked at a is FoF: a0 / a1 -> 0 / 1 for a, b, d; c pays its penalty; every group {x, x + 1}
    for agent, offset in (("a", 0.0), ("b", 0.0), ("c", -0.1), ("d", 0.0)):
        assert [s.reward for s in groups[(0, agent)]] == pytest.approx([offset, offset + 1.0])
        assert [s.advantage for s in groups[(0, agent)]] == pytest.approx(norm(0.0, 1.0))
    assert exp.stats["fork/a"] == pytest.approx(1 / 3) and exp.stats["fork/b"] == pytest.approx(2 / 3)


def test_round_robin_regroups_a_lone_fork_questions_singletons_as_algorithm_5():
    # issue 61: one question of the batch (question 2) forks at b; the other two fork at a. Question 2's a and c ran
    # once and nobody else forked at b: each is the only member of its group ("fork", "b", a / c). Algorithm 5
    # shuffles the singletons and cuts them into floor(2 / G) = 1 group of G = 2: a (reward 0.25: mean of b's 0.0 /
    # 0.5 and c's 0.25, as in the test above) and c (0.25 - 0.1 = 0.15) are compared with each other:
    # (0.25 - 0.2) / (stdev(0.25, 0.15) + 1e-4) = 0.05 / (0.0707 + 1e-4) = +0.706 and -0.706, not 0 and 0.
    import random

    exp = play(PipelineSampler(num_samples=G, strategy="round_robin", rng=random.Random(0)), counting_pool(), TASKS,
               forks=["a", "a", "b"])
    groups = by_agent(exp.samples)
    lone_a, lone_c = groups[(2, "a")][0], groups[(2, "c")][0]
    assert lone_a.group == lone_c.group == ("regrouped", 0)
    assert (lone_a.reward, lone_c.reward) == (pytest.approx(0.25), pytest.approx(0.15))
    assert [lone_a.advantage, lone_c.advantage] == pytest.approx(norm(0.25, 0.15))
    assert lone_a.advantage == pytest.approx(0.05 / (statistics.stdev([0.25, 0.15]) + STD_EPS))
    assert lone_a.advantage == pytest.approx(0.706, abs=1e-3)
    assert {s.group for s in groups[(0, "a")]} == {("question", 0, "a")}  # the other groups keep theirs
    assert exp.stats["rr/regrouped_singletons"] == 2 and exp.stats["rr/dropped_singletons"] == 0
    # the main text alone (regroup_singletons=False): two groups of one, advantage 0 each
    alone = play(PipelineSampler(num_samples=G, strategy="round_robin", regroup_singletons=False), counting_pool(),
                 TASKS, forks=["a", "a", "b"])
    groups = by_agent(alone.samples)
    assert groups[(2, "a")][0].group == ("fork", "b", "a") and groups[(2, "a")][0].advantage == 0.0
    assert groups[(2, "c")][0].advantage == 0.0


def test_round_robin_leaves_out_the_singletons_no_group_of_g_takes():
    # G = 3: the lone question's 2 singletons make floor(2 / 3) = 0 groups; Algorithm 5 returns only the groups, so
    # both are left out of training. Questions 0 and 1 fork at a: 4 agents x 3 samples each, all kept.
    exp = play(PipelineSampler(num_samples=3, strategy="round_robin"), counting_pool(), TASKS, forks=["a", "a", "b"])
    assert {(s.episode, s.agent) for s in exp.samples if s.episode == 2} == {(2, "b"), (2, "d")}
    assert len(exp.samples) == 2 * 4 * 3 + 2 * 3
    assert exp.stats["rr/dropped_singletons"] == 2 and exp.stats["rr/regrouped_singletons"] == 0


def test_regroup_singletons_by_hand():
    import random

    from trl_multiagent.credit.mhgpo import regroup_singletons

    # groups x (3 members), y (2), and 5 singletons s1..s5; G = 2: 2 new groups of 2, one singleton left out
    ids = ["x", "s1", "x", "y", "s2", "s3", "x", "y", "s4", "s5"]
    out = regroup_singletons(ids, 2, random.Random(0))
    assert [out[i] for i in (0, 2, 3, 6, 7)] == ["x", "x", "y", "x", "y"]
    singles = [out[i] for i in (1, 4, 5, 8, 9)]
    assert sorted(Counter(singles).items(), key=str) == sorted({("regrouped", 0): 2, ("regrouped", 1): 2,
                                                                None: 1}.items(), key=str)
    assert regroup_singletons(["a", "b"], 4) == [None, None]  # fewer singletons than G: no group
    assert regroup_singletons(["a", "a"], 4) == ["a", "a"]  # no singleton: unchanged


def test_round_robin_with_another_aggregation():
    # Aggr = min (Eq. 4): question 1 forked at b: c = min(1.0, 1.5) = 1.0 (then -0.1); a = min(1.0, 1.5, 1.0) = 1.0
    exp = play(PipelineSampler(num_samples=G, strategy="round_robin"), counting_pool(), TASKS, forks=["a", "b", "b"],
               aggregate="min")
    groups = by_agent(exp.samples)
    assert groups[(1, "c")][0].ret == pytest.approx(1.0) and groups[(1, "c")][0].reward == pytest.approx(0.9)
    assert groups[(1, "a")][0].reward == pytest.approx(1.0) and groups[(2, "a")][0].reward == pytest.approx(0.0)
    assert [s.reward for s in groups[(1, "b")]] == pytest.approx([1.0, 1.5])  # one consumer each: unchanged


def test_independent_sampling_keeps_one_homogeneous_group_per_agent():
    pool = counting_pool()
    exp = play(PipelineSampler(num_samples=G, strategy="independent"), pool, TASKS[:1])
    groups = by_agent(exp.samples)
    # n*G kept samples, one homogeneous group (same prompt) per agent
    assert {k: len(v) for k, v in groups.items()} == {(0, a): G for a in "abcd"}
    for (_, agent), members in groups.items():
        assert {s.group for s in members} == {("question", 0, agent)}
        assert len({tuple(s.generation.prompt_ids) for s in members}) == 1
    # generations: fork a: 4 agents x G = 8; fork b: a, c once, b, d G times = 6; fork c: a, b once, c, d G = 6;
    # fork d: a, b, c once, d G times = 5. One call per agent: a 2+1+1+1, b 2+2+1+1, c 2+1+2+1, d 2+2+2+2 prompts.
    assert exp.stats["generated_samples"] == 25
    assert pool.calls == [("a", 5, 1), ("b", 6, 1), ("c", 6, 1), ("d", 8, 1)]
    assert exp.stats["num_tool_calls"] == G + 1 + 1 + 1
    # fork at a: a0 / a1 -> rewards 0 / 1 (b and c then answer b0, c0 on both branches)
    assert [s.reward for s in groups[(0, "a")]] == pytest.approx([0.0, 1.0])
    assert [s.advantage for s in groups[(0, "a")]] == pytest.approx(norm(0.0, 1.0))
    # fork at b: b0 / b1 -> rewards 0 / 0.5; fork at c: c0 / c1 -> 0 / 0.25, then c's penalty
    assert [s.reward for s in groups[(0, "b")]] == pytest.approx([0.0, 0.5])
    assert [s.reward for s in groups[(0, "c")]] == pytest.approx([-0.1, 0.15])
    assert [s.advantage for s in groups[(0, "b")]] == pytest.approx(norm(0.0, 0.5))
    # fork at d: every d output reads the same b and c -> equal rewards -> advantage 0
    assert [s.advantage for s in groups[(0, "d")]] == pytest.approx([0.0, 0.0])
    assert [s.advantage for s in groups[(0, "c")]] == pytest.approx(norm(-0.1, 0.15))
    assert len(exp.joint_actions) == 4 * G  # every fork instance's G trajectories are scored


def test_round_robin_draws_fork_agents_with_the_given_probabilities():
    import random

    forks = choose_fork_agents(2000, ["x", "y", "z"], [0.7, 0.1, 0.2], random.Random(0))
    counts = Counter(forks)
    assert abs(counts["x"] / 2000 - 0.7) < 0.04 and abs(counts["y"] / 2000 - 0.1) < 0.03
    assert choose_fork_agents(5, ["x", "y"], [0.0, 1.0], random.Random(1)) == ["y"] * 5
    sampler = PipelineSampler(num_samples=G, strategy="round_robin", fork_probabilities={"b": 1.0},
                              rng=random.Random(0))
    assert sampler.fork_agents(ToyDag().graph(), 3) == ["b", "b", "b"]


class ThreeAgents(PipelineEnvironment):
    """The paper's shape: three agents in a chain with a tool between the first two (Rewriter -> search -> Reranker
    -> Answerer)."""

    agents = ("rewriter", "reranker", "answerer")
    tools = ("search",)
    edges = (("rewriter", "search"), ("search", "reranker"), ("reranker", "answerer"))

    def prompt(self, agent, task, inputs):
        return agent

    def run_tool(self, tool, task, inputs):
        return inputs["rewriter"]

    def final_reward(self, task, outputs):
        return 0.0


def test_round_robin_defaults_to_the_papers_fork_probabilities():
    # MHGPO, Sec. "Experiments & Discussion": "the round-robin probabilities for each agent are set to (0.7, 0.1, 0.2)"
    assert default_fork_probabilities(3) == pytest.approx([0.7, 0.1, 0.2])
    # other lengths keep the shares by position: 0.7 entry, 0.2 final, 0.1 over the agents in between
    assert default_fork_probabilities(4) == pytest.approx([0.7, 0.1 / 2, 0.1 / 2, 0.2])  # 0.7, 0.05, 0.05, 0.2
    assert default_fork_probabilities(2) == pytest.approx([0.7, 0.1 + 0.2])  # no agent in between: 0.7, 0.3
    assert default_fork_probabilities(1) == [1.0]
    for n in range(1, 7):
        assert sum(default_fork_probabilities(n)) == pytest.approx(1.0)
    # the sampler without fork_probabilities draws with them (the old default was uniform, 1/3 each)
    import random

    sampler = PipelineSampler(num_samples=G, strategy="round_robin", rng=random.Random(0))
    counts = Counter(sampler.fork_agents(ThreeAgents().graph(), 3000))
    assert abs(counts["rewriter"] / 3000 - 0.7) < 0.03 and abs(counts["reranker"] / 3000 - 0.1) < 0.02
    assert abs(counts["answerer"] / 3000 - 0.2) < 0.03
    counts = Counter(PipelineSampler(num_samples=G, strategy="round_robin", rng=random.Random(1)).fork_agents(
        ToyDag().graph(), 3000))  # a, b, c, d in topological order: 0.7, 0.05, 0.05, 0.2
    assert abs(counts["a"] / 3000 - 0.7) < 0.03 and abs(counts["d"] / 3000 - 0.2) < 0.03
    assert abs(counts["b"] / 3000 - 0.05) < 0.015 and abs(counts["c"] / 3000 - 0.05) < 0.015


def test_sampler_argument_errors():
    with pytest.raises(ValueError, match="Unknown sampling strategy"):
        PipelineSampler(num_samples=2, strategy="fof")
    with pytest.raises(ValueError, match="round_robin strategy only"):
        PipelineSampler(num_samples=2, strategy="fork_on_first", fork_probabilities={"a": 1.0})
    with pytest.raises(ValueError, match="sum to 1"):
        PipelineSampler(num_samples=2, strategy="round_robin", fork_probabilities={"a": 0.5, "b": 0.2})
    with pytest.raises(ValueError, match="not agents of the pipeline"):
        PipelineSampler(num_samples=2, strategy="round_robin").plan(ToyDag().graph(), 1, forks=["t"])

