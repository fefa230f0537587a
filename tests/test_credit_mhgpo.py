"""MHGPO's credit functions (trl_multiagent/credit/mhgpo.py), the QA metrics and the intra-group similarity
(trl_multiagent/metrics/), against hand-computed values."""

import math
import statistics

import pytest

from trl_multiagent.credit import STD_EPS
from trl_multiagent.credit.mhgpo import (
    agent_loss_weights,
    final_rewards,
    heterogeneous_group_advantages,
    propagate_rewards,
)
from trl_multiagent.metrics.qa import accuracy, exact_match, normalize_answer, qa_scores, token_f1
from trl_multiagent.metrics.similarity import intra_group_similarity

# A small DAG of outputs (indices in topological order):
#   0: Rewriter (one output)  -> consumed by 1, 2 (two forked Reranker outputs) and 3 (a side agent, one output)
#   3: side agent             -> consumed by both Answerer outputs 4 and 5
#   1 -> 4, 2 -> 5            (one Answerer output per Reranker branch)
CONSUMERS = [[1, 2, 3], [4], [5], [4, 5], [], []]
TERMINAL = {4: 1.0, 5: 0.0}


def test_propagation_mean_on_a_dag_by_hand():
    # 4 = 1, 5 = 0; 1 = mean(4) = 1; 2 = mean(5) = 0; 3 = mean(4, 5) = 0.5; 0 = mean(1, 2, 3) = 0.5
    assert propagate_rewards(CONSUMERS, TERMINAL) == pytest.approx([0.5, 1.0, 0.0, 0.5, 1.0, 0.0])


def test_propagation_other_aggregations():
    # max: 3 = 1, 0 = max(1, 0, 1) = 1; min: 3 = 0, 0 = min(1, 0, 0) = 0
    assert propagate_rewards(CONSUMERS, TERMINAL, "max") == pytest.approx([1.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    assert propagate_rewards(CONSUMERS, TERMINAL, "min") == pytest.approx([0.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    # a callable aggregation: the sum of the consumers' rewards; 3 = 1, 0 = 1 + 0 + 1 = 2
    assert propagate_rewards(CONSUMERS, TERMINAL, sum) == pytest.approx([2.0, 1.0, 0.0, 1.0, 1.0, 0.0])


def test_propagation_rejects_malformed_graphs():
    with pytest.raises(ValueError, match="must come after"):
        propagate_rewards([[0], []], {1: 1.0})
    with pytest.raises(ValueError, match="no consumer and no terminal reward"):
        propagate_rewards([[1], [], []], {1: 1.0})
    with pytest.raises(ValueError, match="only final outputs"):
        propagate_rewards([[1], []], {0: 1.0, 1: 1.0})
    with pytest.raises(ValueError, match="Unknown reward aggregation"):
        propagate_rewards([[]], {0: 1.0}, "median")


def test_agent_specific_reward_is_added_after_propagation():
    shared = propagate_rewards(CONSUMERS, TERMINAL)
    specific = [-0.5, 0.0, 0.0, 0.0, 0.0, -1.0]  # a format penalty on output 0 and on output 5
    assert final_rewards(shared, specific) == pytest.approx([0.0, 1.0, 0.0, 0.5, 1.0, -1.0])
    # output 5's penalty did not reach its producers 2 and 3: they keep their shared rewards
    assert final_rewards(shared, specific)[2:4] == pytest.approx(shared[2:4])


def test_heterogeneous_group_advantages_by_hand():
    rewards = [1.0, 0.0, 0.5, 0.25, 0.7]
    groups = [("question", 0, "answerer"), ("question", 0, "answerer"), ("fork", "reranker", "rewriter"),
              ("fork", "reranker", "rewriter"), ("question", 1, "answerer")]
    adv, stats = heterogeneous_group_advantages(rewards, groups)
    a1 = 0.5 / (statistics.stdev([1.0, 0.0]) + STD_EPS)
    a2 = 0.125 / (statistics.stdev([0.5, 0.25]) + STD_EPS)
    assert adv == pytest.approx([a1, -a1, a2, -a2, 0.0])  # a group of one has advantage 0
    assert stats["num_groups"] == 3.0


def test_agent_loss_weights_eq6_by_hand():
    # question 0 (FoF-like): agents a and b with 2 samples each; question 1 (RR, fork at b): a has 1 sample, b has 2
    agents = ["a", "a", "b", "b", "a", "b", "b"]
    questions = [0, 0, 0, 0, 1, 1, 1]
    w = agent_loss_weights(agents, questions)
    # 1 / (Q * n_q * G_kq): Q = 2 questions, n_q = 2 agents; G = 2 or 1
    assert w == pytest.approx([1 / 8, 1 / 8, 1 / 8, 1 / 8, 1 / 4, 1 / 8, 1 / 8])
    assert sum(w) == pytest.approx(1.0)
    assert agent_loss_weights([], []) == []


def test_intra_group_similarity_figure9_by_hand():
    texts = ["red car", "red car", "red bus", "blue", "green", "alone"]
    groups = [1, 1, 1, 2, 2, 3]
    # group 1: F1 pairs (1, 0.5, 0.5) -> 2/3; group 2: 0; group 3 has one member and is skipped
    assert intra_group_similarity(texts, groups) == pytest.approx((2 / 3 + 0.0) / 2)
    assert math.isnan(intra_group_similarity(["x"], [0]))


def test_qa_metrics_by_hand():
    assert normalize_answer("  The Velport! ") == "velport"
    assert exact_match("the velport.", "Velport") == 1.0 and exact_match("born in Velport", "Velport") == 0.0
    assert accuracy("He was born in Velport.", "Velport") == 1.0
    assert accuracy("Velportshire", "Velport") == 0.0  # containment is by whole words
    # "born in velport" vs "velport": precision 1/3, recall 1 -> F1 = 0.5
    assert token_f1("born in Velport", "Velport") == pytest.approx(0.5)
    assert token_f1("University of Stevou", ["Stevou University", "Stevou"]) == pytest.approx(0.8)  # best alias
    assert token_f1("", "Velport") == 0.0
    assert qa_scores("Velport", ["Velport"]) == {"acc": 1.0, "em": 1.0, "f1": 1.0}
