"""The multi-agent search environment of MHGPO (trl_multiagent/environments/search_qa.py): generated two-hop data,
BM25 retrieval, parsing, format penalties, metrics, and the whole pipeline with scripted agents."""

import json
import re

import pytest
from transformers import GenerationConfig

from tests.fake_pool import ScriptedPool
from trl_multiagent.environments import ENVIRONMENTS
from trl_multiagent.environments.search_qa import (
    BM25Retriever,
    Retriever,
    SearchQAEnv,
    extract_answer,
    from_2wikimultihopqa,
    from_hotpotqa,
    from_musique,
    generate_questions,
    make_retriever,
    parse_queries,
    parse_selection,
)
from trl_multiagent.evaluation import TEAM, PipelineEvaluator, evaluate_team
from trl_multiagent.rollout.pipeline import PipelineSampler
from trl_multiagent.trainers.mhgpo import pipeline_credit

GEN = GenerationConfig(max_new_tokens=8)


def test_generated_questions_need_both_hops():
    rows = generate_questions(40, seed=3)
    assert generate_questions(40, seed=3) == rows  # deterministic
    held_out = generate_questions(40, seed=3, split="eval")
    assert not {r["question"] for r in rows} & {r["question"] for r in held_out}  # separate streams
    assert len({r["qtype"] for r in rows}) == 4
    for row in rows:
        subject, bridge = row["gold_titles"]
        texts = [f"{p['title']} {p['text']}" for p in row["passages"]]
        assert subject in row["question"] and bridge not in row["question"] and row["answer"] not in row["question"]
        # exactly one passage states the answer, and it is about the bridge entity, not the question's subject
        with_answer = [t for t in texts if row["answer"] in t]
        assert len(with_answer) == 1 and bridge in with_answer[0] and subject not in with_answer[0]
        # the subject's passages name the bridge (hop 1) and a wrong answer of the same kind (the one-hop distractor)
        assert any(bridge in t for t in texts if t.startswith(subject))
        assert len(row["passages"]) == 8


def test_bm25_retrieves_by_entity_and_skips_queries_that_match_nothing():
    row = generate_questions(1, seed=0)[0]
    subject, bridge = row["gold_titles"]
    hits = BM25Retriever().search([subject, bridge, "zzzz qqqq", ""], row["passages"], k=2)
    assert all(row["passages"][i]["title"] == subject for i in hits[0])  # both of the subject's passages
    assert row["passages"][hits[1][0]]["title"] == bridge
    assert hits[2] == [] and hits[3] == []


def test_parsing_of_agent_outputs():
    assert parse_queries("### founder of X; born where ###") == ["founder of X", "born where"]
    assert parse_queries("1. founder of X\n2. founder of X\n- where born") == ["founder of X", "where born"]
    assert parse_queries("###   ###") == []
    assert parse_selection("2, 0", 4) == ([2, 0], True)
    assert parse_selection("1, 1, 7", 4) == ([1], False)  # a duplicate and an out-of-range number
    assert parse_selection("none", 4) == ([], False)
    assert extract_answer("\nAnswer: Velport\nbecause ...") == "Velport"


def _env_with_candidates(n):
    return {"retriever": json.dumps(list(range(n)))}


def test_format_penalties_of_appendix_b():
    env = SearchQAEnv()
    task = generate_questions(1)[0]
    assert env.format_reward("rewriter", task, {}, "### a; b ###") == 0.0
    assert env.format_reward("rewriter", task, {}, "nothing useful ### ###") == -0.5
    assert env.format_reward("rewriter", task, {}, "### a; b; c; d; e ###") == -0.5  # more than max_queries = 4
    assert env.format_reward("reranker", task, _env_with_candidates(3), "2, 0") == 0.0
    assert env.format_reward("reranker", task, _env_with_candidates(3), "2, 2") == -0.5
    assert env.format_reward("reranker", task, _env_with_candidates(3), "3") == -0.5  # only 3 candidates
    assert env.format_reward("answerer", task, {}, "Velport") == 0.0
    assert env.format_reward("answerer", task, {}, " ".join(["word"] * 11)) == -1.0
    with pytest.raises(ValueError, match="unknown components"):
        SearchQAEnv(penalties={"critic": -1.0})


def oracle_pool(rows, wrong_answer=False):
    """Scripted agents that know the gold passages (to check the plumbing): the Rewriter searches for the two gold
    entities, the Reranker names the gold candidates, the Answerer answers (or gives the one-hop distractor)."""
    by_question = {r["question"]: r for r in rows}

    def find(prompt):
        return next(r for q, r in by_question.items() if q in prompt)

    def script(agent, prompt, k):
        row = find(prompt)
        if agent == "rewriter":
            return "### {}; {} ###".format(*row["gold_titles"])
        if agent == "reranker":
            lines = re.findall(r"^\[(\d+)\] ([^:]+):", prompt, flags=re.MULTILINE)
            picks = [i for i, title in lines if title in row["gold_titles"]]
            return ", ".join(picks)
        if wrong_answer:
            subject = row["gold_titles"][0]
            one_hop = next(p["text"] for p in row["passages"] if p["title"] == subject
                           and row["gold_titles"][1] not in p["text"])
            return one_hop.rstrip(".").split()[-1]
        return row["answer"]

    return ScriptedPool(list(SearchQAEnv.agents), script, policies={a: "shared" for a in SearchQAEnv.agents})


def test_pipeline_with_oracle_agents_scores_full_marks():
    rows = generate_questions(8, seed=1)
    exp = PipelineSampler(num_samples=2, strategy="fork_on_first").rollout(oracle_pool(rows), SearchQAEnv, rows, GEN)
    pipeline_credit(exp)  # the trainer's credit: Eq. 4 propagation, Eq. 5 groups
    assert exp.stats["env/em"] == 1.0 and exp.stats["env/f1"] == 1.0 and exp.stats["env/acc"] == 1.0
    assert exp.stats["env/gold_retrieved"] == 1.0 and exp.stats["env/gold_selected"] == 1.0
    assert exp.stats["agent/rewriter/num_queries"] == 2.0 and exp.stats["agent/reranker/num_selected"] >= 2.0
    assert exp.stats["agent/answerer/answer_words"] == pytest.approx(
        sum(len(r["answer"].split()) for r in rows) / len(rows))  # "Velport" or "University of Stevou"
    assert all(s.reward == 1.0 for s in exp.samples)  # no format penalty, F1 = 1 propagated to every agent
    wrong = evaluate_team(oracle_pool(rows, wrong_answer=True), PipelineEvaluator(SearchQAEnv), rows,
                          generation_config=GEN).methods[TEAM]
    assert wrong.mean("em") == 0.0 and wrong.mean("f1") == 0.0  # the one-hop distractor's answer is wrong


def test_pluggable_retriever():
    class FirstTwo(Retriever):
        def search(self, queries, passages, k):
            return [[0, 1] for _ in queries]

    env = SearchQAEnv(retriever=FirstTwo(), top_k=2)
    task = generate_questions(1)[0]
    assert json.loads(env.run_tool("retriever", task, {"rewriter": "### x; y ###"})) == [0, 1]
    assert isinstance(make_retriever("bm25"), BM25Retriever)
    with pytest.raises(ValueError, match="Unknown retriever"):
        make_retriever("dense")
    assert ENVIRONMENTS["search_qa"] is SearchQAEnv


def test_hub_rows_map_to_the_environment_columns():
    hotpot = {"question": "Q?", "answer": "Paris", "context": {"title": ["A", "B"], "sentences": [["x ", "y"], ["z"]]},
              "supporting_facts": {"title": ["B", "B"], "sent_id": [0, 1]}}
    row = from_hotpotqa(hotpot)
    assert row["passages"] == [{"title": "A", "text": "x  y"}, {"title": "B", "text": "z"}]
    assert row["gold_titles"] == ["B"] and row["answers"] == ["Paris"]
    wiki = {"question": "Q?", "answer": "1990", "context": [["A", ["s1", "s2"]]], "supporting_facts": [["A", 0]]}
    assert from_2wikimultihopqa(wiki)["passages"] == [{"title": "A", "text": "s1 s2"}]
    assert from_2wikimultihopqa(wiki)["gold_titles"] == ["A"]
    musique = {"question": "Q?", "answer": "Rome", "answer_aliases": ["Roma"],
               "paragraphs": [{"title": "T", "paragraph_text": "p", "is_supporting": True},
                              {"title": "U", "paragraph_text": "q", "is_supporting": False}]}
    row = from_musique(musique)
    assert row["answers"] == ["Rome", "Roma"] and row["gold_titles"] == ["T"] and len(row["passages"]) == 2
