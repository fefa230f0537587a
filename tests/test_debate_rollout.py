"""The MAPoRL debate sampler, its reward credit (trainers/maporl.py: debate_rewards), environments and evaluation
against hand-built debates (scripted pool, no model)."""

import re

import pytest
from transformers import GenerationConfig

from tests.fake_pool import ScriptedPool
from trl_multiagent.credit.maporl import Incentives, PenaltySettings, fill_after_early_stop, verification_rewards
from trl_multiagent.environments import CollaborationGameEnv, MathDebateEnv, NLIDebateEnv
from trl_multiagent.environments.debate import anli_to_task, nli_problems
from trl_multiagent.evaluation import debate_metrics, evaluate_debate
from trl_multiagent.metrics.answers import parse_nli_label
from trl_multiagent.rollout import DebateSampler
from trl_multiagent.trainers.maporl import debate_rewards

GEN = GenerationConfig(max_new_tokens=8)
TASKS = [{"task_id": "q1", "question": "What is 2 + 3?", "answer": "5"},
         {"task_id": "q2", "question": "What is 1 + 4?", "answer": "5"}]
# q1: agent1 3 -> 5 -> 5, agent2 4 -> 4 -> 5 (agent2's second answer has a '.' after the box); q2: both 5 at once
SCRIPT = {("q1", "agent1"): ["t1 so \\boxed{3}", "t2 so \\boxed{5}", "t3 so \\boxed{5}"],
          ("q1", "agent2"): ["t1 so \\boxed{4}", "t2 so \\boxed{4}.", "t3 so \\boxed{5}"],
          ("q2", "agent1"): ["t1 so \\boxed{5}", "t2 so \\boxed{5}", "t3 so \\boxed{5}"],
          ("q2", "agent2"): ["t1 so \\boxed{5}", "t2 so \\boxed{5}", "t3 so \\boxed{5}"]}


class CharTokenizer:
    def decode(self, ids, **kwargs):
        return "".join(chr(i) for i in ids)


class DebatePool(ScriptedPool):
    def __init__(self, script=None):
        super().__init__(["agent1", "agent2"], self.answer)
        self.prompts = []
        self.answers = script or SCRIPT

    def answer(self, agent, prompt, k):
        self.prompts.append((agent, prompt))
        task = "q1" if "2 + 3" in prompt else "q2"
        previous = re.findall(r"Your previous answer:\nt(\d)", prompt)
        turn = int(previous[0]) if previous else 0
        return self.answers[(task, agent)][turn]

    def tokenizer_of(self, agent):
        return CharTokenizer()


def play(sampler, pool, env, reward_mode, gamma, incentives=None, penalty_value=-10.0):
    """The sampler's rollout, then MAPoRL's reward credit (what the trainer's assign_credit does before GAE)."""
    exp = sampler.rollout(pool, env, TASKS, GEN)
    assert all(s.reward == 0.0 for s in exp.samples)
    debate_rewards(exp, sampler.num_turns, reward_mode, gamma, incentives, penalty_value)
    return exp


def test_debate_turns_prompts_batching_and_early_stop():
    pool = DebatePool()
    debates = DebateSampler(num_turns=3).run(pool, MathDebateEnv, TASKS, GEN)
    # one generate call per agent and turn covering every live debate; q2 stops after agreeing at turn 1
    assert pool.calls == [("agent1", 2, 1), ("agent2", 2, 1), ("agent1", 1, 1), ("agent2", 1, 1),
                          ("agent1", 1, 1), ("agent2", 1, 1)]
    assert [d.turns_played for d in debates] == [3, 1]
    first = [p for a, p in pool.prompts if a == "agent1"]
    assert "previous round" not in first[0]  # turn 1: the question alone
    second = first[2]  # agent1's turn-2 prompt sees its own and agent2's turn-1 answers
    assert "Your previous answer:\nt1 so \\boxed{3}" in second and "Answer of agent2:\nt1 so \\boxed{4}" in second
    q1 = debates[0]
    assert [o.correct for o in q1.outcomes] == [[False, False], [True, False], [True, True]]
    assert [o.groups for o in q1.outcomes] == [[0, 1], [0, 1], [0, 0]]
    assert q1.team_rewards == [0.0, 0.5, 1.0]  # majority vote with the tie rule


def test_training_debates_play_every_turn():
    # issue 61: the authors train without early stop (consensus criterion 1.1); q2's agents agree at turn 1 and
    # still debate turns 2 and 3. The environment keeps its early stop for the evaluation.
    pool = DebatePool()
    debates = DebateSampler(num_turns=3, early_stop=False).run(pool, MathDebateEnv, TASKS, GEN)
    assert [d.turns_played for d in debates] == [3, 3]
    assert pool.calls == [("agent1", 2, 1), ("agent2", 2, 1)] * 3
    assert MathDebateEnv().early_stop is True


def test_early_stopped_debate_is_rewarded_over_its_played_turns():
    # issue 61: scores [1] and [0] (a learned verifier's) in a debate that stopped at turn 1 of 3, influence-aware
    # reward, gamma 0.3. The authors' score_rule truncates at the played turns: agent1 1 / 1 = 1.0, agent2 0.0.
    # Repeating the last answers over the 3 turns instead (the earlier fill) gave agent1
    # (1 + 0.3 * (1 + 0) / 2 + 0.09 * (1 + 0) / 2) / (1 + 0.3 + 0.09) = 1.195 / 1.39 = 0.8597.
    sampler = DebateSampler(num_turns=3, scorer=lambda questions, solutions: [1.0, 0.0])
    exp = sampler.rollout(DebatePool(), MathDebateEnv, TASKS[1:], GEN)
    assert {s.turn for s in exp.samples} == {0}  # both answered 5: the debate stopped after turn 1
    debate_rewards(exp, 3, "influence", 0.3)
    reward = {s.agent: s.reward for s in exp.samples}
    assert reward == {"agent1": pytest.approx(1.0), "agent2": pytest.approx(0.0)}
    filled = verification_rewards(fill_after_early_stop([[1.0], [0.0]], 3), "influence", 0.3)
    assert filled[0][0] == pytest.approx(1.195 / 1.39) and 1.195 / 1.39 == pytest.approx(0.8597, abs=1e-4)


def test_first_turn_answer_without_a_box_is_not_penalised():
    # issue 61: the authors' collaboration training exempts turn 1 from the missing-box penalty. agent1 answers
    # without a box at turns 1 and 2 (scores 0, 0), then 5 in a box (1); agent2 4, 5, 5 (0, 1, 1). Immediate
    # rewards with the box check alone: agent1 0 (exempt), -10, 1; with the exemption off: -10, -10, 1.
    script = {("q1", "agent1"): ["t1 so 3", "t2 so 5", "t3 so \\boxed{5}"],
              ("q1", "agent2"): ["t1 so \\boxed{4}", "t2 so \\boxed{5}", "t3 so \\boxed{5}"]}
    only_box = PenaltySettings(no_eos=False, min_tokens=0, repetition=False, post_boxed=False)
    sampler = DebateSampler(num_turns=3, penalties=only_box, early_stop=False)
    for exempt, expected in ((True, [0.0, -10.0, 1.0]), (False, [-10.0, -10.0, 1.0])):
        exp = sampler.rollout(DebatePool(script), MathDebateEnv, TASKS[:1], GEN)
        debate_rewards(exp, 3, "immediate", 0.3, first_turn_box_exempt=exempt)
        rows = sorted((s.turn, s.reward) for s in exp.samples if s.agent == "agent1")
        assert [r for _, r in rows] == pytest.approx(expected)
        assert sorted(s.reward for s in exp.samples if s.agent == "agent2") == pytest.approx([0.0, 1.0, 1.0])
        assert [s.penalties["no_boxed"] for s in sorted(exp.samples, key=lambda s: (s.agent, s.turn))][:3] == \
            [True, True, False]  # the check's own flags are kept as found


def test_rollout_rewards_mode_incentives_and_penalty_by_hand():
    sampler = DebateSampler(num_turns=3, penalties=PenaltySettings(no_eos=False, min_tokens=0, repetition=False))
    exp = play(sampler, DebatePool(), MathDebateEnv, "cumulative", 0.5,
               incentives=Incentives(alpha0=1, alpha1=2, beta0=4, beta1=8))
    reward = {(s.episode, s.agent, s.turn): s.reward for s in exp.samples}
    # q1 rule scores: agent1 0, 1, 1; agent2 0, 0, 1, and agent2's turn-2 answer (text after the box) is penalised:
    # its verifier score becomes -10 (App. G.2), so agent2's scores are 0, -10, 1. Cumulative rewards (App. F Eq. 1)
    # divided by D = 1.75, 1.5, 1: agent1 (0 + .5 + .25)/1.75 = 3/7, (1 + .5)/1.5 = 1, 1;
    # agent2 (0 - 5 + .25)/1.75 = -19/7, (-10 + .5)/1.5 = -19/3, 1.
    # Incentives (Tables 1-2): agent1 +1 (alpha0) +8 (beta1) at turn 2; agent2 +4 (beta0) at turn 1, +2 (alpha1) at 3.
    assert reward[(0, "agent1", 0)] == pytest.approx(3 / 7)
    assert reward[(0, "agent1", 1)] == pytest.approx(1 + 1 + 8)
    assert reward[(0, "agent1", 2)] == pytest.approx(1.0)
    assert reward[(0, "agent2", 0)] == pytest.approx(-19 / 7 + 4)  # the penalty reaches the earlier answer's sum
    assert reward[(0, "agent2", 1)] == pytest.approx(-19 / 3)
    assert reward[(0, "agent2", 2)] == pytest.approx(1.0 + 2)
    # q2 stopped at turn 1 with both right: the agreed answers stand for turns 2-3: (1 + .5 + .25) / 1.75 = 1
    assert reward[(1, "agent1", 0)] == reward[(1, "agent2", 0)] == pytest.approx(1.0)
    assert len(exp.samples) == 8
    flagged = [s for s in exp.samples if s.penalties.get("post_boxed")]
    assert [(s.episode, s.agent, s.turn) for s in flagged] == [(0, "agent2", 1)]
    assert flagged[0].score == 0.0  # the score as the verifier gave it; the reward used -10
    assert flagged[0].base_reward == pytest.approx(-19 / 3)
    assert exp.stats["penalty/post_boxed"] == pytest.approx(1 / 8)
    assert exp.stats["debate/turn1/majority_accuracy"] == pytest.approx(0.5)  # q1 0, q2 1
    assert exp.stats["debate/turn2/majority_accuracy"] == pytest.approx(0.75)  # q1 tie .5, q2 kept 1
    assert exp.stats["debate/turn3/majority_accuracy"] == pytest.approx(1.0)


def test_penalty_score_enters_every_influence_aware_reward():
    # issue 35 point 5, App. G.2: the penalised answer's VERIFIER SCORE is -10 and flows into the sums of Def. 1
    sampler = DebateSampler(num_turns=3, penalties=PenaltySettings(no_eos=False, min_tokens=0, repetition=False))
    exp = play(sampler, DebatePool(), MathDebateEnv, "influence", 0.5)
    reward = {(s.episode, s.agent, s.turn): s.reward for s in exp.samples}
    # q1 scores: agent1 0, 1, 1; agent2 0, -10 (penalised: text after the box), 1
    # team means: t1 0, t2 (1 - 10)/2 = -4.5, t3 1; D = 1.75, 1.5, 1
    # agent1: t1 (0 + .5*(-4.5) + .25*1) / 1.75 = -2/1.75 = -8/7; t2 (1 + .5*1) / 1.5 = 1; t3 1
    # agent2: t1 (0 - 2.25 + .25) / 1.75 = -8/7;                   t2 (-10 + .5*1) / 1.5 = -19/3; t3 1
    # The old reading (only agent2's turn-2 reward replaced by -10, the sums over the [0, 1] scores) gives, with
    # the same Def. 1: team means 0, .5, 1 -> agent1 and agent2 at t1 (0 + .25 + .25)/1.75 = 2/7, agent2 t2 -10
    # (and the old code, unnormalised team means from t on: .5 at t1, -10).
    assert reward[(0, "agent1", 0)] == pytest.approx(-8 / 7)
    assert reward[(0, "agent2", 0)] == pytest.approx(-8 / 7)
    assert reward[(0, "agent1", 1)] == pytest.approx(1.0)
    assert reward[(0, "agent2", 1)] == pytest.approx(-19 / 3)
    assert reward[(0, "agent1", 2)] == reward[(0, "agent2", 2)] == pytest.approx(1.0)
    # q2: both right at turn 1 and stopped: 1, 1, 1 for everyone -> (1 + .5 + .25) / 1.75 = 1
    assert reward[(1, "agent1", 0)] == reward[(1, "agent2", 0)] == pytest.approx(1.0)


def test_influence_mode_and_learned_scorer_replace_scores():
    calls = []

    def scorer(questions, solutions):
        calls.append(len(solutions))
        return [0.25 if "boxed{5}" in s else 0.0 for s in solutions]

    exp = play(DebateSampler(num_turns=3, scorer=scorer), DebatePool(), MathDebateEnv, "influence", 0.5)
    assert calls == [8]
    scores = {(s.episode, s.agent, s.turn): s.score for s in exp.samples}
    assert scores[(0, "agent1", 1)] == 0.25 and scores[(0, "agent2", 1)] == 0.0
    # q1 verifier scores: agent1 0, .25, .25; agent2 0, 0, .25; team means 0, .125, .25; D = 1.75, 1.5, 1
    reward = {(s.episode, s.agent, s.turn): s.reward for s in exp.samples}
    assert reward[(0, "agent1", 0)] == pytest.approx((0 + 0.5 * 0.125 + 0.25 * 0.25) / 1.75)
    assert reward[(0, "agent2", 0)] == pytest.approx((0 + 0.5 * 0.125 + 0.25 * 0.25) / 1.75)  # both scored 0 at t1
    assert reward[(0, "agent1", 1)] == pytest.approx((0.25 + 0.5 * 0.25) / 1.5)  # its own .25 at turn 2
    assert reward[(0, "agent2", 1)] == pytest.approx((0.0 + 0.5 * 0.25) / 1.5)  # its own 0 at turn 2
    assert {s.correct for s in exp.samples if s.episode == 1} == {True}  # correctness stays the gold check


def test_incentives_and_verifier_need_a_debate_env():
    pool = ScriptedPool(["agent1", "agent2"], lambda a, p, k: "A")
    exp = DebateSampler(num_turns=2).rollout(pool, CollaborationGameEnv, [{}], GEN)
    with pytest.raises(ValueError, match="not a DebateEnv"):
        debate_rewards(exp, 2, "influence", 0.3, incentives=Incentives(alpha0=1))
    with pytest.raises(ValueError, match="not a DebateEnv"):
        DebateSampler(num_turns=2, scorer=lambda q, s: [0.0] * len(s)).run(pool, CollaborationGameEnv, [{}], GEN)


def test_evaluation_per_turn_majority_transitions_and_agents_alone():
    metrics = debate_metrics(DebateSampler(num_turns=3).run(DebatePool(), MathDebateEnv, TASKS, GEN), 3)
    assert metrics["majority_accuracy"] == pytest.approx([0.5, 0.75, 1.0])
    assert metrics["agent_alone_accuracy"] == {"agent1": 0.5, "agent2": 0.5}
    assert metrics["agent_accuracy"]["agent2"] == pytest.approx([0.5, 0.5, 1.0])
    t12, t23 = metrics["transitions"]
    # turn 1 -> 2 over 4 (debate, agent) pairs: q1 agent1 W->R, agent2 W->W; q2 both R->R
    assert (t12["RR"], t12["RW"], t12["WR"], t12["WW"]) == (0.5, 0.0, 0.25, 0.25)
    assert t12["WRW"] == 0.25  # agent1's peer (agent2) was wrong at turn 1
    assert (t23["RR"], t23["WR"]) == (0.75, 0.25) and t23["WRR"] == 0.25
    assert metrics["agreed"] == 1.0 and metrics["turns_played"] == 2.0
    out = evaluate_debate(DebatePool(), MathDebateEnv, TASKS, num_turns=2, max_new_tokens=8)
    assert out["majority_accuracy"] == pytest.approx([0.5, 0.75]) and out["num_tasks"] == 2


def test_collaboration_game_rewards_by_hand():
    env = CollaborationGameEnv(num_turns=2, threshold=2, reward_collaborate=0.4, reward_independent=1.0, synergy=3.0)
    env.reset({"task_id": "x"})
    first = env.step({"agent1": "A", "agent2": "A"})  # both collaborate: r_C each, synergy reached for turn 2
    assert first.local_rewards == {"agent1": 0.4, "agent2": 0.4} and first.info["synergy"] == 1.0
    second = env.step({"agent1": "B", "agent2": "A"})
    assert second.local_rewards == {"agent1": 3.0, "agent2": 3.0} and second.done
    env.reset({"task_id": "x"})
    r = env.step({"agent1": "A", "agent2": "B"})
    assert r.local_rewards == {"agent1": 0.4, "agent2": 1.0} and not r.info["synergy"]
    assert env.step({"agent1": "?", "agent2": "B"}).local_rewards == {"agent1": 0.0, "agent2": 1.0}
    solo = CollaborationGameEnv(partner_collaborate_prob=1.0)
    assert solo.agents == ("agent1",)
    solo.reset({"task_id": "y"})
    assert solo.step({"agent1": "A"}).info["synergy"] == 1.0  # the fixed partner always collaborates here
    with pytest.raises(ValueError, match="reward_collaborate < reward_independent < synergy"):
        CollaborationGameEnv(reward_collaborate=2.0)


def test_nli_task_generation_labels_and_anli_rows():
    train, test = nli_problems(60, seed=0), nli_problems(30, seed=0, split="test")
    assert [r["answer"] for r in train[:3]] == ["entailment", "neutral", "contradiction"]
    assert not {(r["premise"], r["hypothesis"]) for r in train} & {(r["premise"], r["hypothesis"]) for r in test}
    assert parse_nli_label("\\text{Entailment}") == "entailment" and parse_nli_label("maybe") is None
    env = NLIDebateEnv(num_agents=3)
    env.reset(train[0])
    result = env.step({"agent1": "\\boxed{entailment}", "agent2": "\\boxed{neutral}", "agent3": "\\boxed{entailment}"})
    assert result.team_reward == 1.0 and result.local_rewards == {"agent1": 1.0, "agent2": 0.0, "agent3": 1.0}
    assert anli_to_task({"premise": "p", "hypothesis": "h", "label": 2})["answer"] == "contradiction"
    with pytest.raises(ValueError, match="at least two agents"):
        MathDebateEnv(num_agents=1)
