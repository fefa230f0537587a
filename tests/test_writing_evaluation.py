"""The writing evaluation: every method's texts and scores against the reward computed by hand on the same texts,
the prompts each baseline shows its agents, and all five methods in two generation calls."""

from __future__ import annotations

import pytest
from transformers import GenerationConfig

from trl_multiagent.environments import TLDREnv
from trl_multiagent.evaluation import TEAM, WritingEvaluator, evaluate_team, evaluator_kind
from trl_multiagent.evaluation.writing import METHODS, split_single
from trl_multiagent.team.pool import Generation

tldr_reward = TLDREnv().reward_fn  # the environment's default: the reward rewards/writing.py:tldr_reward names

GREEDY = GenerationConfig(max_new_tokens=4, do_sample=False)


class ScriptedPool:
    """A pool with the team-level ``generate_many`` whose texts come from ``script``; records every call."""

    def __init__(self, script):
        self.script, self.calls = script, []

    def generate_many(self, requests, generation_config, max_batch_sequences=None):
        self.calls.append(list(requests))
        return [[Generation([0], [1], self.script(r.agent, r.prompt, r.use_adapter)) for _ in range(r.num_samples)]
                for r in requests]

SHORT = "My roommate skipped his share of the rent again this month."
LONG = ("First, my roommate skipped rent again. However, he promised to pay. Therefore I feel upset because the "
        "landlord called me twice about the missing money and overdue bills.")
REVISED_LONG = ("Moreover, the landlord called twice. In fact, the bills are overdue, the deposit is gone and rent "
                "was skipped for months.")
SEQ_LONG = ("Similarly, rent was skipped; consequently the landlord complained loudly about unpaid money, late fees "
            "and broken promises.")


def script(agent, prompt, adapter):
    if adapter:  # the team: its own texts, so team and naive differ
        return SHORT if agent == "summary" else LONG + " Indeed."
    if "Write both parts" in prompt:
        return f"Summary: {SHORT}\nElaboration: {LONG}"
    if "Revise your part" in prompt:
        return SHORT if agent == "summary" else REVISED_LONG
    if "The other writer has written" in prompt:
        return SEQ_LONG
    return SHORT if agent == "summary" else LONG


def test_every_method_scores_its_texts_with_the_environment_reward():
    tasks = TLDREnv.make_rows(3, seed=0, split="eval")
    pool = ScriptedPool(script)
    evaluator = WritingEvaluator(TLDREnv, num_turns=1)
    result = evaluate_team(pool, evaluator, tasks, methods=METHODS, num_samples=2, generation_config=GREEDY)
    assert result.generate_calls == 2 and len(pool.calls) == 2  # every method, task and sample: two rounds
    expected = {
        TEAM: tldr_reward(SHORT, LONG + " Indeed.").total,
        "single": tldr_reward(SHORT, LONG).total,
        "naive": tldr_reward(SHORT, LONG).total,
        "sequential": tldr_reward(SHORT, SEQ_LONG).total,
        "discussion": tldr_reward(SHORT, REVISED_LONG).total,
    }
    assert len(set(round(v, 9) for v in expected.values())) == 4 and expected["naive"] > 0  # texts tell them apart
    for method, value in expected.items():
        res = result.methods[method]
        assert res.samples["reward"] == [[pytest.approx(value)] * 2] * 3, method
        parts = tldr_reward(SHORT, {TEAM: LONG + " Indeed.", "sequential": SEQ_LONG,
                                    "discussion": REVISED_LONG}.get(method, LONG))
        assert res.per_task("coherence") == [pytest.approx(parts.levels["coherence"])] * 3
    team_requests = [r for r in pool.calls[0] if r.use_adapter]
    assert len(team_requests) == 2 * 3  # two agents x three tasks, two samples each
    assert all(r.num_samples == 2 for r in team_requests)
    assert all(not r.use_adapter for r in pool.calls[1])  # the second round: baselines only (bases, adapters off)


def test_baseline_prompts_show_what_each_method_allows():
    tasks = TLDREnv.make_rows(2, seed=1, split="eval")
    pool = ScriptedPool(script)
    evaluate_team(pool, WritingEvaluator(TLDREnv), tasks, methods=["sequential", "discussion"], num_samples=1,
                  generation_config=GREEDY)
    second_round = pool.calls[1]
    sequential = [r for r in second_round if "The other writer has written" in r.prompt]
    assert [r.agent for r in sequential] == ["elaboration"] * 2
    assert all(SHORT in r.prompt and tasks[i]["prompt"] in r.prompt for i, r in enumerate(sequential))
    revisions = [r for r in second_round if "Revise your part" in r.prompt]
    assert sorted(r.agent for r in revisions) == ["elaboration", "elaboration", "summary", "summary"]
    for r in revisions:  # each sees its own first answer and the other's
        assert SHORT in r.prompt and LONG in r.prompt


def test_single_agent_response_is_split_into_two_parts():
    assert split_single("Summary: a b.\nElaboration: c d. e f.", "Summary", "Elaboration") == ("a b.", "c d. e f.")
    assert split_single("**Summary**: a b.\n\n**elaboration**: c", "Summary", "Elaboration") == ("a b.", "c")
    assert split_single("a b c.\n\nd e f. g", "Summary", "Elaboration") == ("a b c.", "d e f. g")
    assert split_single("Summary: a b c. d e f. g", "Summary", "Elaboration") == ("a b c.", "d e f. g")
    assert split_single("a b c d", "Summary", "Elaboration") == ("a b c d", "")


def test_auto_picks_the_writing_evaluator_and_rejects_other_environments():
    from trl_multiagent.environments.matrix_game import MatrixGameEnv

    assert evaluator_kind(TLDREnv()) == "writing"
    with pytest.raises(ValueError, match="two-writer"):
        WritingEvaluator(MatrixGameEnv)
