"""MAPoRL's credit (trl_multiagent/credit/maporl.py; GAE and whitening in credit/returns.py) and its debate metrics
(trl_multiagent/metrics/debate.py) against hand-computed values on small debates."""

import pytest

from trl_multiagent.credit.maporl import (
    Incentives,
    PenaltySettings,
    answer_penalties,
    best_response_threshold,
    collaboration_incentives,
    cumulative_rewards,
    discount_sums,
    fill_after_early_stop,
    first_turn_exempt,
    immediate_rewards,
    influence_aware_rewards,
    penalized_score,
    repeated_run,
    token_level_rewards,
    verification_rewards,
)
from trl_multiagent.credit.returns import gae, whiten, whiten_groups
from trl_multiagent.metrics.answers import text_after_boxed
from trl_multiagent.metrics.debate import majority_vote_accuracy, peer_majority, transition_fractions


def close(got, expected):
    """Equal shapes and approximately equal entries of two [agent][turn] matrices."""
    return [len(r) for r in got] == [len(r) for r in expected] and \
        [x for r in got for x in r] == pytest.approx([x for r in expected for x in r])


# A 2-agent, 3-turn debate: agent1 scores 0, 1, 1; agent2 scores 1, 0, 1.
SCORES = [[0.0, 1.0, 1.0], [1.0, 0.0, 1.0]]
GAMMA = 0.5


def test_immediate_reward_is_the_score():
    assert immediate_rewards(SCORES) == SCORES
    assert verification_rewards(SCORES, "immediate", GAMMA) == SCORES


def test_discount_sums_by_hand():
    # D_t = sum_{t'=t..T} gamma^(t'-t), three turns, gamma .5: t3 = 1, t2 = 1 + .5 = 1.5, t1 = 1 + .5 + .25 = 1.75
    assert discount_sums(3, GAMMA) == pytest.approx([1.75, 1.5, 1.0])
    assert discount_sums(2, 0.0) == [1.0, 1.0]  # 0^0 = 1: with gamma 0 the rewards are the immediate scores


def test_cumulative_reward_by_hand():
    # App. F Eq. 1 divided by D_t = 1.75, 1.5, 1 (the authors' trainer, rule_agent_share "individual"; issue 35):
    # agent1 (scores 0, 1, 1): t1 = (0 + .5*1 + .25*1) / 1.75 = .75 / 1.75 = 3/7, t2 = (1 + .5*1) / 1.5 = 1, t3 = 1
    # agent2 (scores 1, 0, 1): t1 = (1 + .5*0 + .25*1) / 1.75 = 1.25 / 1.75 = 5/7, t2 = (0 + .5*1) / 1.5 = 1/3, t3 = 1
    # (the old, unnormalised reading gave [[.75, 1.5, 1], [1.25, .5, 1]])
    expected = [[3 / 7, 1.0, 1.0], [5 / 7, 1 / 3, 1.0]]
    assert close(cumulative_rewards(SCORES, GAMMA), expected)
    assert close(verification_rewards(SCORES, "cumulative", GAMMA), expected)
    assert close(cumulative_rewards(SCORES, 0.0), SCORES)


def test_influence_aware_reward_by_hand():
    # Def. 1 (issue 35): R_{i,t} = [s_{i,t} + sum_{t'>t} gamma^(t'-t) mean_j s_{j,t'}] / sum_{t'=t..T} gamma^(t'-t)
    # team means per turn: t1 (0+1)/2 = .5, t2 (1+0)/2 = .5, t3 (1+1)/2 = 1; D = 1.75, 1.5, 1
    # agent1: t1 = (0 + .5*.5 + .25*1) / 1.75 = .5 / 1.75 = 2/7;  t2 = (1 + .5*1) / 1.5 = 1;    t3 = 1 / 1 = 1
    # agent2: t1 = (1 + .5*.5 + .25*1) / 1.75 = 1.5 / 1.75 = 6/7; t2 = (0 + .5*1) / 1.5 = 1/3;  t3 = 1
    # (the old reading, the team mean from turn t on and no division, gave 1.0 for every answer)
    expected = [[2 / 7, 1.0, 1.0], [6 / 7, 1 / 3, 1.0]]
    assert close(influence_aware_rewards(SCORES, GAMMA), expected)
    assert close(verification_rewards(SCORES, "influence", GAMMA), expected)
    # three agents, two turns, gamma .9: D = 1.9, 1; team mean at t2 = 1/3
    # t1: agent1 (1 + .9/3) / 1.9 = 1.3/1.9 = 13/19, agents 2 and 3 (0 + .3) / 1.9 = 3/19; t2: the own scores 0, 0, 1
    # (old: [[19/30, 1/3]] for all three)
    three = [[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]]
    assert close(influence_aware_rewards(three, 0.9), [[13 / 19, 0.0], [3 / 19, 0.0], [3 / 19, 1.0]])
    # the agent's own answer counts in full at its turn: raising agent1's first score from 0 to 1 raises ITS turn-1
    # reward by 1 / 1.75 (old: 1/2) and leaves agent2's unchanged (old: +1/2 as well)
    lifted = influence_aware_rewards([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]], GAMMA)
    before = influence_aware_rewards(SCORES, GAMMA)
    assert lifted[0][0] - before[0][0] == pytest.approx(1 / 1.75)
    assert lifted[1][0] == pytest.approx(before[1][0])


def test_reward_modes_reject_bad_input():
    with pytest.raises(ValueError, match="Unknown reward mode"):
        verification_rewards(SCORES, "final", GAMMA)
    with pytest.raises(ValueError, match="score per turn"):
        cumulative_rewards([[1.0, 0.0], [1.0]], GAMMA)


def test_early_stop_keeps_the_agreed_answers():
    assert fill_after_early_stop([[0.0, 1.0], [1.0, 1.0]], 3) == [[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    assert fill_after_early_stop([["5"], [None]], 2) == [["5", "5"], [None, None]]
    with pytest.raises(ValueError, match="more than num_turns"):
        fill_after_early_stop([[1, 2, 3]], 2)


def test_majority_vote_tie_rule():
    assert majority_vote_accuracy(["5", "5", "7"], [True, True, False]) == 1.0
    assert majority_vote_accuracy(["7", "7", "5"], [False, False, True]) == 0.0
    assert majority_vote_accuracy(["5", "7"], [True, False]) == 0.5  # tie of two: expected accuracy 1/2
    assert majority_vote_accuracy(["5", "7", "8"], [True, False, False]) == pytest.approx(1 / 3)
    assert majority_vote_accuracy(["7", "7", "5", "5"], [False, False, True, True]) == 0.5
    assert majority_vote_accuracy([None, "5"], [False, True]) == 1.0  # no answer, no vote
    assert majority_vote_accuracy([None, None], [False, False]) == 0.0
    assert peer_majority(["5", "7", "5"], [True, False, True], 0) == 0.5  # agent 1's peers: 7 vs 5
    assert peer_majority(["5", "7", "7"], [True, False, False], 0) == 0.0


# The incentive debate: agent1 W, R, R; agent2 W, W, R (answers 3/4, 5/4, 5/5; the gold answer is 5).
ANSWERS = [["3", "5", "5"], ["4", "4", "5"]]
CORRECT = [[False, True, True], [False, False, True]]


@pytest.mark.parametrize("name, expected", [
    # agent1 revises W->R at turn 2 while its peer (the majority) was wrong at turn 1: alpha0 on agent1's turn 2
    ("alpha0", [[0, 1, 0], [0, 0, 0]]),
    # agent2 revises W->R at turn 3 while its peer was right at turn 2: alpha1 on agent2's turn 3
    ("alpha1", [[0, 0, 0], [0, 0, 1]]),
    # agent2's wrong turn-1 answer precedes its peer's W->R (turn 1 -> 2): beta0 on agent2's turn 1
    ("beta0", [[0, 0, 0], [1, 0, 0]]),
    # agent1's right turn-2 answer precedes its peer's W->R (turn 2 -> 3): beta1 on agent1's turn 2
    ("beta1", [[0, 1, 0], [0, 0, 0]]),
])
def test_each_incentive_on_a_two_agent_three_turn_debate(name, expected):
    got = collaboration_incentives(ANSWERS, CORRECT, Incentives(**{name: 1.0}))
    assert close(got, expected)


def test_incentives_add_up():
    both = collaboration_incentives(ANSWERS, CORRECT, Incentives(alpha0=1, alpha1=2, beta0=4, beta1=8))
    assert close(both, [[0, 1 + 8, 0], [4, 0, 2]])


def test_right_to_wrong_rows_subtract_the_mirrored_incentive():
    # issue 61: the tables' R -> W rows ("-" in the paper's text, a minus before a lost symbol) as decided in
    # collaboration_incentives: Table 1, R -> W with the majority right at t: -alpha0, with it wrong: -alpha1;
    # Table 2, majority R -> W after the agent's right answer: -beta0, after its wrong answer: -beta1.
    inc = Incentives(alpha0=1, alpha1=2, beta0=4, beta1=8)
    # both agents right at turn 1, both wrong at turn 2 (and 3). Each agent: its own R -> W while its peer (the
    # majority) was right at t: -alpha0 = -1 on its turn-2 answer; its peer went R -> W after its right turn-1
    # answer: -beta0 = -4 on its turn-1 answer; turn 2 -> 3 is W -> W everywhere: nothing.
    worse = collaboration_incentives([["5", "3", "3"], ["5", "3", "3"]], [[True, False, False], [True, False, False]],
                                     inc)
    assert close(worse, [[-4, -1, 0], [-4, -1, 0]])
    # agent1 right then wrong while agent2 (its majority) is wrong both turns: agent1's R -> W with the majority
    # wrong at t: -alpha1 = -2 on its turn-2 answer; agent2's peer went R -> W after agent2's WRONG turn-1 answer:
    # -beta1 = -8 on agent2's turn-1 answer; agent1's peer stayed wrong and agent2 stayed wrong: nothing else.
    mixed = collaboration_incentives([["5", "3"], ["4", "4"]], [[True, False], [False, False]], inc)
    assert close(mixed, [[0, -2], [-8, 0]])
    # the earlier reading (R -> W rows give nothing) stays available
    off = Incentives(alpha0=1, alpha1=2, beta0=4, beta1=8, right_to_wrong=False)
    assert collaboration_incentives([["5", "3"], ["4", "4"]], [[True, False], [False, False]], off) == [[0, 0], [0, 0]]


def test_incentive_with_a_tied_majority_is_its_expectation():
    # three agents; at turn 1 agent3's peers tie (agent1 right "5", agent2 wrong "2"): majority right w.p. 1/2
    answers = [["5", "5"], ["2", "2"], ["3", "5"]]
    correct = [[True, True], [False, False], [False, True]]
    got = collaboration_incentives(answers, correct, Incentives(alpha0=2.0, alpha1=4.0))
    assert got[2] == pytest.approx([0.0, 0.5 * 2.0 + 0.5 * 4.0])
    assert got[0] == [0.0, 0.0] and got[1] == [0.0, 0.0]


def test_token_level_rewards_and_gae_by_hand():
    rewards = token_level_rewards([-1.0, -2.0], [-1.5, -1.0], score=2.0, kl_coef=0.1)
    assert rewards == pytest.approx([-0.05, 0.1 + 2.0])
    # gamma .9, lambda .8: deltas .4 (last), 0 + .9*.6 - .4 = .14, 0 + .9*.4 - .5 = -.14
    adv, ret = gae([0.0, 0.0, 1.0], [0.5, 0.4, 0.6], gamma=0.9, lam=0.8)
    a2 = 0.4
    a1 = 0.14 + 0.72 * a2
    a0 = -0.14 + 0.72 * a1
    assert adv == pytest.approx([a0, a1, a2])
    assert ret == pytest.approx([a0 + 0.5, a1 + 0.4, a2 + 0.6])
    # lambda = 1, gamma = 1, V = 0: every advantage is the sum of the rewards to go
    assert gae([1.0, 2.0, 3.0], [0.0, 0.0, 0.0], 1.0, 1.0)[0] == pytest.approx([6.0, 5.0, 3.0])


def test_whiten_by_hand():
    white = whiten([[1.0, 3.0], [5.0]])  # mean 3, unbiased std 2
    assert close(white, [[-1.0, 0.0], [1.0]])


def test_whiten_per_turn_and_agent_by_hand():
    # issue 61: one agent's turn-0 tokens at +0.5 and its turn-1 tokens at -0.5. The authors whiten every (turn,
    # agent) batch apart: each batch is constant, so it is only centred: 0 everywhere. Whitened together (per
    # policy): mean 0, unbiased variance 4 * 0.25 / 3 = 1/3, so +-0.5 / sqrt(1/3 + 1e-8) = +-0.8660.
    rows = [[0.5, 0.5], [-0.5, -0.5]]
    assert close(whiten_groups(rows, [(0, "a"), (1, "a")]), [[0.0, 0.0], [0.0, 0.0]])
    together = 0.5 / (1 / 3 + 1e-8) ** 0.5
    assert together == pytest.approx(0.8660, abs=1e-4)
    assert close(whiten_groups(rows, ["a", "a"]), [[together, together], [-together, -together]])
    assert close(whiten_groups(rows, ["a", "a"]), whiten(rows))
    # groups keep their rows' order: a second agent's turn-0 batch [1, 3] is whitened on its own (mean 2, std 1.414)
    mixed = whiten_groups([[1.0, 3.0], [0.5, 0.5], [9.0]], [(0, "b"), (0, "a"), (1, "a")])
    assert close(mixed, [[-(2 ** -0.5), 2 ** -0.5], [0.0, 0.0], [0.0]])


SETTINGS = PenaltySettings(min_tokens=5)
GOOD = list("some reasoning here then the box")


def test_penalty_no_boxed_answer():
    flags = answer_penalties("the answer is 5", GOOD, False, SETTINGS)
    assert flags["no_boxed"] and not flags["post_boxed"]
    assert not answer_penalties("so \\boxed{5}", GOOD, False, SETTINGS)["no_boxed"]


def test_penalty_no_eos():
    assert answer_penalties("so \\boxed{5}", GOOD, True, SETTINGS)["no_eos"]
    assert not answer_penalties("so \\boxed{5}", GOOD, False, SETTINGS)["no_eos"]


def test_penalty_too_short():
    assert answer_penalties("\\boxed{5}", ["\\boxed{5}"], False, SETTINGS)["short"]
    assert not answer_penalties("\\boxed{5}", GOOD, False, SETTINGS)["short"]
    assert "short" not in answer_penalties("\\boxed{5}", ["x"], False, PenaltySettings(min_tokens=0))


def test_penalty_repeated_token_runs_numbers_exempt():
    assert repeated_run(["the", " cat"] * 4)  # a 2-gram four times in a row: more than three
    assert not repeated_run(["the", " cat"] * 3)
    assert repeated_run(["a"] * 4) and not repeated_run(["a"] * 3)
    assert not repeated_run(["1"] * 8)  # numbers may repeat: 11111111
    assert not repeated_run(["0", ".", "0"] * 5)
    assert repeated_run(["x", "so", "so", "so", "so", "y"])
    assert not repeated_run(["a", "b", "c", "d", "e", "a", "b", "c", "d", "e"], max_repeats=1, max_ngram=4)
    assert repeated_run(["a", "b", "c", "d", "e", "a", "b", "c", "d", "e"], max_repeats=1, max_ngram=5)
    assert answer_penalties("\\boxed{5}", ["la"] * 6, False, SETTINGS)["repetition"]


def test_penalty_tokens_after_the_box():
    assert text_after_boxed("x \\boxed{\\frac{1}{2}} done") == " done"
    assert text_after_boxed("no box") is None
    assert answer_penalties("so \\boxed{5}.", GOOD, False, SETTINGS)["post_boxed"]
    assert answer_penalties("\\boxed{5} and more", GOOD, False, SETTINGS)["post_boxed"]
    assert not answer_penalties("so $\\boxed{5}$\n", GOOD, False, SETTINGS)["post_boxed"]
    assert not answer_penalties("\\[\\boxed{5}\\]", GOOD, False, SETTINGS)["post_boxed"]


def test_first_turn_is_exempt_from_the_box_penalty_only():
    # issue 61: the authors' collaboration training adds the box check only `if task_training or turn != 0`
    missing = {"no_boxed": True, "short": False}
    assert first_turn_exempt(missing, 0) == {"no_boxed": False, "short": False}
    assert first_turn_exempt(missing, 1) == missing  # later turns: penalised
    assert first_turn_exempt(missing, 0, exempt=False) == missing  # App. G.2's text: every turn
    assert first_turn_exempt({"no_boxed": False, "short": True}, 0) == {"no_boxed": False, "short": True}
    assert penalized_score(1.0, first_turn_exempt(missing, 0), -10.0) == 1.0
    assert penalized_score(1.0, first_turn_exempt(missing, 1), -10.0) == -10.0


def test_penalty_replaces_the_verifier_score_and_enters_the_sums():
    assert penalized_score(1.0, {"no_boxed": False, "short": False}, -10.0) == 1.0
    assert penalized_score(1.0, {"no_boxed": True, "short": False}, -10.0) == -10.0
    assert penalized_score(1.0, {}, -10.0) == 1.0
    # App. G.2: agent2's turn-2 answer of SCORES (score 0) is penalised: its SCORE becomes -10, then Def. 1 runs:
    # team means .5, (1 - 10)/2 = -4.5, 1; D = 1.75, 1.5, 1
    # agent1: t1 = (0 + .5*(-4.5) + .25*1) / 1.75 = -2 / 1.75 = -8/7; t2 = (1 + .5) / 1.5 = 1; t3 = 1
    # agent2: t1 = (1 - 2.25 + .25) / 1.75 = -1 / 1.75 = -4/7;      t2 = (-10 + .5) / 1.5 = -19/3; t3 = 1
    # (the old reading replaced only that answer's final reward by -10 and left the others' sums: 2/7 and 6/7 at t1)
    penalised = [[penalized_score(s, {"no_boxed": (i, t) == (1, 1)}, -10.0) for t, s in enumerate(row)]
                 for i, row in enumerate(SCORES)]
    assert penalised == [[0.0, 1.0, 1.0], [1.0, -10.0, 1.0]]
    assert close(influence_aware_rewards(penalised, GAMMA), [[-8 / 7, 1.0, 1.0], [-4 / 7, -19 / 3, 1.0]])
    assert PenaltySettings(no_boxed=False, no_eos=False, min_tokens=0, repetition=False, post_boxed=False).enabled == ()


def test_transition_fractions_by_hand():
    # debate 1: agent1 W->R, agent2 W->W (both wrong at t1 with different answers);
    # debate 2: agent1 R->W, agent2 R->R
    correct = [[[False, True], [False, False]], [[True, False], [True, True]]]
    answers = [[["3", "5"], ["4", "4"]], [["5", "2"], ["5", "5"]]]
    (t1,) = transition_fractions(correct, answers)
    assert (t1["RR"], t1["RW"], t1["WR"], t1["WW"]) == (0.25, 0.25, 0.25, 0.25)
    # W->R of debate 1 agent1: its peer (agent2) was wrong at t1 -> "WRW"; R->W of debate 2 agent1: peer right -> "RWR"
    assert (t1["WRW"], t1["WRR"], t1["RWR"], t1["RWW"]) == (0.25, 0.0, 0.25, 0.0)


def test_observation_one_threshold():
    assert best_response_threshold(0.4, 1.0, 3.0) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="r_C < r_I < R"):
        best_response_threshold(1.0, 0.5, 3.0)
