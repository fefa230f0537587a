"""The MAGRPO joint tree rollout (trl_multiagent/rollout/joint_tree.py) and its credit (trainers/magrpo.py:
tree_credit) against hand-computed trees, with a scripted pool."""

import math
import statistics

import pytest
from transformers import GenerationConfig

from tests.fake_pool import ScriptedPool
from trl_multiagent.credit import STD_EPS, num_tree_generations
from trl_multiagent.environments import FunctionEnvironment, MatrixGameEnv
from trl_multiagent.rollout import JointTreeSampler
from trl_multiagent.trainers.magrpo import tree_credit

GEN = GenerationConfig(max_new_tokens=4)


def play(pool, env, tasks, num_samples, num_turns, joint_mode="aligned", gamma=1.0):
    """The sampler's rollout, then MAGRPO's credit (what the trainer's assign_credit does)."""
    exp = JointTreeSampler(num_samples=num_samples, num_turns=num_turns, joint_mode=joint_mode).rollout(
        pool, env, tasks, GEN)
    assert all(s.advantage == 0.0 for s in exp.samples) and all(j.advantage == 0.0 for j in exp.joint_actions)
    tree_credit(exp, num_samples, gamma)
    return exp


def ab_script(agent, prompt, k):
    return "AB"[k % 2]


def test_aligned_matrix_game_advantages_by_hand():
    # K=4, aligned: samples A,B,A,B for both agents -> joint actions AA, BB, AA, BB -> rewards 10, 0, 10, 0
    pool = ScriptedPool(["agent1", "agent2"], ab_script)
    exp = play(pool, MatrixGameEnv, [{}], num_samples=4, num_turns=1, joint_mode="aligned")
    assert [j.reward for j in exp.joint_actions] == [10.0, 0.0, 10.0, 0.0]
    a = 5 / (statistics.stdev([10, 0, 10, 0]) + STD_EPS)
    assert [j.advantage for j in exp.joint_actions] == pytest.approx([a, -a, a, -a])
    for s in exp.samples:  # every agent's response carries its joint action's advantage
        assert s.advantage == pytest.approx(a if s.generation.text == "A" else -a)
    assert len(exp.samples) == 8 and pool.calls == [("agent1", 1, 4), ("agent2", 1, 4)]


def test_released_code_advantage_mode_reaches_the_samples():
    # issue 61: the same tree as above (rewards 10, 0, 10, 0) with CoMLRL's advantage_mode="mean": R - mean = +-5,
    # where Eq. 1 (the default) divides by the std: +-5 / (5.7735 + 1e-4) = +-0.866
    pool = ScriptedPool(["agent1", "agent2"], ab_script)
    exp = JointTreeSampler(num_samples=4, num_turns=1).rollout(pool, MatrixGameEnv, [{}], GEN)
    tree_credit(exp, 4, 1.0, advantage_mode="mean")
    assert [j.advantage for j in exp.joint_actions] == pytest.approx([5.0, -5.0, 5.0, -5.0])
    assert sorted(s.advantage for s in exp.samples) == pytest.approx([-5.0] * 4 + [5.0] * 4)


def test_cross_matrix_game_credits_mean_over_joint_actions():
    pool = ScriptedPool(["agent1", "agent2"], ab_script)
    exp = play(pool, MatrixGameEnv, [{}], num_samples=2, num_turns=1, joint_mode="cross")
    assert [j.reward for j in exp.joint_actions] == [10.0, 7.0, 7.0, 0.0]
    s = math.sqrt((16 + 1 + 1 + 36) / 3) + STD_EPS
    credits = {(x.agent, x.generation.text): x.advantage for x in exp.samples}
    assert credits[("agent1", "A")] == pytest.approx(2.5 / s)
    assert credits[("agent1", "B")] == pytest.approx(-2.5 / s)
    assert credits[("agent2", "A")] == pytest.approx(2.5 / s)
    rewards = {(x.agent, x.generation.text): x.reward for x in exp.samples}
    assert rewards[("agent1", "A")] == pytest.approx(8.5) and rewards[("agent1", "B")] == pytest.approx(3.5)


def _two_turn_env(stop_on=None):
    """Reward: turn 0 -> 1 if agent1 said 'A'; turn 1 -> 2 or 4 by agent1's answer. Ends early on `stop_on`."""

    def reward(completions, turn):
        a = completions["agent1"]
        if turn == 0:
            return 1.0 if a == "A" else 0.0
        return {"A": 2.0, "B": 4.0}.get(a, 0.0)

    def transition(completions, turn):
        return {ag: f"turn {turn + 1} after {completions[ag]}" for ag in ("agent1", "agent2")}

    def done(completions, turn):
        return stop_on is not None and completions["agent1"] == stop_on

    return lambda: FunctionEnvironment(["agent1", "agent2"], {"agent1": lambda t: "go", "agent2": lambda t: "go"},
                                       reward, transition_fn=transition, done_fn=done, max_turns=2)


def test_two_turn_tree_returns_and_groups_by_hand():
    pool = ScriptedPool(["agent1", "agent2"], ab_script)
    exp = play(pool, _two_turn_env(), [{}], num_samples=2, num_turns=2, gamma=0.5)
    joints = exp.joint_actions
    # root: j0 (A, r=1) and j1 (B, r=0); each has two children with rewards 2 (A) and 4 (B)
    assert [j.reward for j in joints] == [1.0, 0.0, 2.0, 4.0, 2.0, 4.0]
    assert joints[0].children == [2, 3] and joints[1].children == [4, 5]
    assert [j.ret for j in joints[:2]] == pytest.approx([1 + 0.5 * 3, 0 + 0.5 * 3])
    # groups are the siblings at one node: the root pair, then each child node's pair
    assert [j.node for j in joints] == [0, 0, 1, 1, 2, 2]
    d = 0.5 / (statistics.stdev([2.5, 1.5]) + STD_EPS)
    assert joints[0].advantage == pytest.approx(d) and joints[1].advantage == pytest.approx(-d)
    assert {s.turn for s in exp.samples} == {0, 1}
    assert exp.stats["turns"] == 2.0


@pytest.mark.parametrize("n,k,h", [(2, 2, 1), (2, 2, 3), (3, 2, 2), (2, 3, 2)])
def test_generation_count_without_early_stop(n, k, h):
    agents = [f"a{i}" for i in range(n)]

    def env():
        return FunctionEnvironment(agents, {a: (lambda t: "x") for a in agents}, lambda completions: 0.0,
                                   transition_fn=lambda completions: {a: "y" for a in agents}, max_turns=h)

    pool = ScriptedPool(agents, lambda a, p, i: "x")
    exp = JointTreeSampler(num_samples=k, num_turns=h).rollout(pool, env, [{}], GEN)
    assert pool.num_generations == num_tree_generations(n, k, h) == n * k * (k**h - 1) // (k - 1)
    assert exp.stats["generated_samples"] == pool.num_generations
    # one generate call per agent per turn, covering every branch point of that turn
    assert len(pool.calls) == n * h


def test_early_stop_prunes_the_tree():
    pool = ScriptedPool(["agent1", "agent2"], ab_script)
    exp = JointTreeSampler(num_samples=2, num_turns=2).rollout(pool, _two_turn_env(stop_on="A"), [{}], GEN)
    # joint action A stops at turn 0; only the B branch expands: 2*2 + 2*2 = 8 < 12 generations
    assert pool.num_generations == 8 < num_tree_generations(2, 2, 2)
    assert joints_children(exp) == [[], [2, 3], [], []]


def joints_children(exp):
    return [j.children for j in exp.joint_actions]


def test_episodes_never_share_groups_and_generation_is_batched_across_episodes():
    pool = ScriptedPool(["agent1", "agent2"], ab_script)
    exp = JointTreeSampler(num_samples=2, num_turns=2).rollout(pool, _two_turn_env(), [{}, {}, {}], GEN)
    groups_per_episode = {}
    for s in exp.samples:
        groups_per_episode.setdefault(s.group, set()).add(s.episode)
    assert all(len(eps) == 1 for eps in groups_per_episode.values())
    # turn 0: 3 root nodes in one call per agent; turn 1: 6 nodes in one call per agent
    assert pool.calls == [("agent1", 3, 2), ("agent2", 3, 2), ("agent1", 6, 2), ("agent2", 6, 2)]
