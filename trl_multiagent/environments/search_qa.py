"""The multi-agent search system of MHGPO: Rewriter -> retriever -> Reranker -> Answerer, on two-hop questions.

Paper: "Heterogeneous Group-Based Reinforcement Learning for LLM-based Multi-Agent Systems" (MHGPO), Sec.
"Multi-Agent LLM Search System", Figure 1, Appendix B (prompts, agent-specific rewards).

The pipeline (a :class:`~trl_multiagent.environments.pipeline.PipelineEnvironment`)::

    rewriter --> retriever (tool) --> reranker --> answerer
                       \\________________________/^

- **Rewriter**: question -> sub-queries, written ``### query 1; query 2 ###`` (lines or a numbered list also parse);
- **retriever** (a tool, not trained): the top ``top_k`` passages of the question's corpus for each sub-query, merged
  rank by rank without duplicates, at most ``max_candidates``; pluggable (:class:`Retriever`), BM25 by default
  (:class:`BM25Retriever`, the ``bm25s`` package);
- **Reranker**: reads the candidates, answers with the numbers of the useful ones, most useful first;
- **Answerer**: reads the question and the selected passages (at most ``max_selected``), answers with a short span.

The shared reward is the token F1 of the answer (the paper's reward); the agent-specific rewards are the paper's
format penalties: the Rewriter when it writes no sub-query or more than ``max_queries``, the Reranker for a
duplicate, out-of-range or missing document number, the Answerer for an answer longer than ``max_answer_words``
words. Logged per trajectory: ``acc`` (normalized containment), ``em``, ``f1``, and whether the gold passages were
retrieved / selected; per agent (the paper's Figure 8): ``num_queries``, ``num_selected``, ``answer_words``.

Data. Offline, :meth:`SearchQAEnv.make_dataset` generates two-hop questions over a procedurally generated knowledge
base of invented entities (no world knowledge helps), each with its own small corpus, as in HotpotQA's distractor
setting: the two gold passages (entity -> bridge entity, bridge entity -> answer), a one-hop distractor that gives a
wrong answer of the right type for the question's first entity, and "bridge-like" distractors (other entities of the
bridge's kind, each with a wrong answer). So the exact answer needs both hops. Train and eval splits use separate
random streams. With a hub, :func:`from_hotpotqa`, :func:`from_2wikimultihopqa` and :func:`from_musique` map the
datasets' rows to the same columns (``dataset_transform`` in a recipe).
"""

from __future__ import annotations

import abc
import json
import logging
import random
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from trl_multiagent.environments.base import merge_weights
from trl_multiagent.environments.checks import need_int, need_tasks, need_weights
from trl_multiagent.environments.pipeline import PipelineEnvironment
from trl_multiagent.metrics.qa import qa_scores, token_f1
from trl_multiagent.runtime.user_code import import_object

REWRITER, RETRIEVER, RERANKER, ANSWERER = "rewriter", "retriever", "reranker", "answerer"

#: The format penalties of the paper's Appendix B ("Agent-specific Rewards").
DEFAULT_PENALTIES = {REWRITER: -0.5, RERANKER: -0.5, ANSWERER: -1.0}

REWRITER_PROMPT = (
    "You turn a question into short search queries for a search engine, one query per fact that has to be looked "
    "up. Write the queries on one line between ### marks, separated by semicolons, for example: "
    "### first query; second query ###\n"
    "Question: {question}"
)
RERANKER_PROMPT = (
    "Question: {question}\n"
    "Candidate documents:\n{documents}\n"
    "Which documents help to answer the question? Reply only with their numbers, most useful first, separated by "
    "commas, for example: 2, 0"
)
ANSWERER_PROMPT = (
    "Documents:\n{documents}\n"
    "Question: {question}\n"
    "Answer with the exact name only, in a few words, not a sentence."
)


# ----------------------------------------------------------------------------------------------------- retrievers
class Retriever(abc.ABC):
    """A search engine over one question's corpus (a list of ``{"title", "text"}`` passages)."""

    @abc.abstractmethod
    def search(self, queries: Sequence[str], passages: Sequence[Mapping[str, str]], k: int) -> list[list[int]]:
        """For each query, the indices of at most ``k`` passages that match it, best first (none for a query that
        matches nothing)."""


class BM25Retriever(Retriever):
    """BM25 (Okapi) over the passages' ``title`` and ``text``, by the ``bm25s`` package, with English stop words
    removed. Indices are cached per corpus (the G branches of a question search the same one)."""

    def __init__(self, cache_size: int = 4096):
        try:
            import bm25s
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise ImportError("BM25Retriever needs the 'bm25s' package (pip install 'bm25s>=0.3,<0.4')") from exc
        # bm25s sets its own logger to DEBUG when imported, which logs a line per index built; keep it to warnings
        logging.getLogger("bm25s").setLevel(logging.WARNING)
        self._bm25s = bm25s
        self._cache: OrderedDict[tuple, Any] = OrderedDict()
        self._cache_size = cache_size

    def _index(self, passages: Sequence[Mapping[str, str]]):
        key = tuple((str(p["title"]), str(p["text"])) for p in passages)
        index = self._cache.get(key)
        if index is None:
            bm25s = self._bm25s
            tokens = bm25s.tokenize([f"{t}. {x}" for t, x in key], stopwords="en", show_progress=False)
            index = bm25s.BM25()
            index.index(tokens, show_progress=False)
            self._cache[key] = index
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return index

    def search(self, queries: Sequence[str], passages: Sequence[Mapping[str, str]], k: int) -> list[list[int]]:
        if not passages or not queries:
            return [[] for _ in queries]
        index = self._index(passages)
        k = min(k, len(passages))
        out = []
        for query in queries:
            tokens = self._bm25s.tokenize([query], stopwords="en", show_progress=False, return_ids=False)
            if not tokens[0]:
                out.append([])
                continue
            docs, scores = index.retrieve(tokens, k=k, show_progress=False)
            out.append([int(d) for d, s in zip(docs[0], scores[0]) if s > 0])
        return out


def make_retriever(spec: str | Retriever) -> Retriever:
    """``"bm25"``, an import path ``"package.module:Class"`` (built without arguments), or a :class:`Retriever`."""
    if isinstance(spec, Retriever):
        return spec
    if spec == "bm25":
        return BM25Retriever()
    if isinstance(spec, str) and ":" in spec:
        cls = import_object(spec, "retriever")
        retriever = cls()
        if not isinstance(retriever, Retriever):
            raise TypeError(f"retriever {spec!r} must be a Retriever subclass, got {type(retriever).__name__}")
        return retriever
    raise ValueError(f"Unknown retriever {spec!r}: use 'bm25', 'package.module:Class' or a Retriever instance")


# ----------------------------------------------------------------------------------------------------- parsing
_ITEM_PREFIX = re.compile(r"^\s*(?:[-*\u2022]+|\d+[.):]|q\d+[.):]?|query\s*\d*\s*[.):])\s*", re.IGNORECASE)


def parse_queries(text: str) -> list[str]:
    """The Rewriter's sub-queries: the part between the first two ``###`` (or after a single one, or the whole text),
    split on semicolons and line breaks, list markers removed, empty and repeated ones dropped."""
    parts = text.split("###")
    body = parts[1] if len(parts) >= 2 else text
    queries: list[str] = []
    for piece in re.split(r"[;\n]", body):
        query = _ITEM_PREFIX.sub("", piece).strip().strip("\"'")
        if query and query.lower() not in (q.lower() for q in queries):
            queries.append(query)
    return queries


def parse_selection(text: str, num_candidates: int) -> tuple[list[int], bool]:
    """The Reranker's document numbers in order (first occurrences within range) and whether the output was
    well-formed: at least one number, none repeated, none out of range."""
    numbers = [int(x) for x in re.findall(r"\d+", text)]
    chosen: list[int] = []
    for n in numbers:
        if 0 <= n < num_candidates and n not in chosen:
            chosen.append(n)
    ok = bool(numbers) and len(set(numbers)) == len(numbers) and all(0 <= n < num_candidates for n in numbers)
    return chosen, ok


def extract_answer(text: str) -> str:
    """The Answerer's answer: its first non-empty line, with an ``Answer:`` prefix removed."""
    for line in text.splitlines():
        line = line.strip()
        if line:
            return re.sub(r"^(final\s+)?answer\s*[:\-]\s*", "", line, flags=re.IGNORECASE).strip()
    return ""


# ----------------------------------------------------------------------------------------------------- environment
class SearchQAEnv(PipelineEnvironment):
    """MHGPO's three-agent search system over one question's corpus (see the module docstring).

    Args:
        retriever: ``"bm25"`` (default), ``"package.module:Class"`` or a :class:`Retriever`.
        top_k: passages retrieved per sub-query.
        max_queries: sub-queries used (more are a format error of the Rewriter and are cut).
        max_candidates: candidates shown to the Reranker.
        max_selected: passages given to the Answerer (the first ones the Reranker names).
        max_answer_words: an answer longer than this is penalised.
        penalties: the format penalties by agent (defaults: Rewriter -0.5, Reranker -0.5, Answerer -1.0).
    """

    agents = (REWRITER, RERANKER, ANSWERER)
    tools = (RETRIEVER,)
    edges = ((REWRITER, RETRIEVER), (RETRIEVER, RERANKER), (RETRIEVER, ANSWERER), (RERANKER, ANSWERER))
    required_columns = ("question", "answer", "passages")

    def __init__(self, retriever: str | Retriever = "bm25", top_k: int = 3, max_queries: int = 4,
                 max_candidates: int = 6, max_selected: int = 3, max_answer_words: int = 10,
                 penalties: Mapping[str, float] | None = None):
        for name, value in (("top_k", top_k), ("max_queries", max_queries), ("max_candidates", max_candidates),
                            ("max_selected", max_selected), ("max_answer_words", max_answer_words)):
            need_int(name, value, minimum=1)
        need_weights("penalties", penalties)
        self.retriever = make_retriever(retriever)
        self.top_k, self.max_queries, self.max_candidates = int(top_k), int(max_queries), int(max_candidates)
        self.max_selected, self.max_answer_words = int(max_selected), int(max_answer_words)
        self.penalties = merge_weights(penalties, DEFAULT_PENALTIES, "penalties")

    # ---- the pipeline
    def prompt(self, agent: str, task: Mapping[str, Any], inputs: Mapping[str, str]) -> str:
        question = task["question"]
        if agent == REWRITER:
            return REWRITER_PROMPT.format(question=question)
        candidates = json.loads(inputs[RETRIEVER])
        if agent == RERANKER:
            return RERANKER_PROMPT.format(question=question, documents=self._render(task, candidates))
        if agent == ANSWERER:
            chosen = self.selected(inputs[RERANKER], candidates)
            return ANSWERER_PROMPT.format(question=question, documents=self._render(task, chosen))
        raise ValueError(f"{type(self).__name__} has no agent {agent!r}")

    def run_tool(self, tool: str, task: Mapping[str, Any], inputs: Mapping[str, str]) -> str:
        if tool != RETRIEVER:
            raise ValueError(f"{type(self).__name__} has no tool {tool!r}")
        queries = parse_queries(inputs[REWRITER])[: self.max_queries]
        ranked = self.retriever.search(queries, list(task["passages"]), self.top_k)
        merged: list[int] = []
        for rank in range(self.top_k):  # interleave the queries' results rank by rank
            for hits in ranked:
                if rank < len(hits) and hits[rank] not in merged and len(merged) < self.max_candidates:
                    merged.append(hits[rank])
        return json.dumps(merged)

    def selected(self, reranker_output: str, candidates: Sequence[int]) -> list[int]:
        """The passage indices the Answerer reads: the candidates the Reranker named, in its order."""
        chosen, _ = parse_selection(reranker_output, len(candidates))
        return [candidates[i] for i in chosen[: self.max_selected]]

    @staticmethod
    def _render(task: Mapping[str, Any], indices: Sequence[int]) -> str:
        passages = task["passages"]
        if not indices:
            return "(no documents)"
        return "\n".join(f"[{i}] {passages[p]['title']}: {passages[p]['text']}" for i, p in enumerate(indices))

    # ---- rewards and metrics
    @staticmethod
    def golds(task: Mapping[str, Any]) -> list[str]:
        answers = task.get("answers")
        return list(answers) if answers else [task["answer"]]

    def final_reward(self, task: Mapping[str, Any], outputs: Mapping[str, str]) -> float:
        """The token F1 of the answer (the paper's reward)."""
        return token_f1(extract_answer(outputs[ANSWERER]), self.golds(task))

    def format_reward(self, agent: str, task: Mapping[str, Any], inputs: Mapping[str, str], output: str) -> float:
        if agent == REWRITER:
            n = len(parse_queries(output))
            return self.penalties[REWRITER] if n == 0 or n > self.max_queries else 0.0
        if agent == RERANKER:  # numbers must index the candidates it was shown
            _, ok = parse_selection(output, len(json.loads(inputs[RETRIEVER])))
            return 0.0 if ok else self.penalties[RERANKER]
        if agent == ANSWERER:
            words = len(extract_answer(output).split())
            return self.penalties[ANSWERER] if words > self.max_answer_words else 0.0
        raise ValueError(f"{type(self).__name__} has no agent {agent!r}")

    def metrics(self, task: Mapping[str, Any], outputs: Mapping[str, str]) -> dict[str, float]:
        scores = qa_scores(extract_answer(outputs[ANSWERER]), self.golds(task))
        gold = set(task.get("gold_titles") or [])
        if gold:
            candidates = json.loads(outputs[RETRIEVER])
            titles = {task["passages"][p]["title"] for p in candidates}
            chosen = {task["passages"][p]["title"] for p in self.selected(outputs[RERANKER], candidates)}
            scores["gold_retrieved"] = len(gold & titles) / len(gold)
            scores["gold_selected"] = len(gold & chosen) / len(gold)
        return scores

    def output_stats(self, agent: str, inputs: Mapping[str, str], output: str) -> dict[str, float]:
        """MHGPO Figure 8: sub-queries written, documents selected (valid numbers), answer length in words."""
        if agent == REWRITER:
            return {"num_queries": float(len(parse_queries(output)))}
        if agent == RERANKER:
            return {"num_selected": float(len(parse_selection(output, len(json.loads(inputs[RETRIEVER])))[0]))}
        if agent == ANSWERER:
            return {"answer_words": float(len(extract_answer(output).split()))}
        return {}

    # ---- data
    @classmethod
    def make_dataset(cls, num_tasks: int = 256, seed: int = 0, split: str = "train", num_bridge_distractors: int = 2,
                     num_random_distractors: int = 1):
        """``num_tasks`` generated two-hop questions (columns ``question``, ``answer``, ``answers``, ``passages``,
        ``gold_titles``, ``qtype``); ``split`` ``"train"`` or ``"eval"`` draws from separate random streams."""
        from datasets import Dataset

        need_tasks(num_tasks)
        need_int("num_bridge_distractors", num_bridge_distractors, minimum=0)
        need_int("num_random_distractors", num_random_distractors, minimum=0)
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        rows = generate_questions(num_tasks, seed=seed, split=split, num_bridge_distractors=num_bridge_distractors,
                                  num_random_distractors=num_random_distractors)
        return Dataset.from_list(rows)


# ----------------------------------------------------------------------------------------------------- knowledge base
_ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "r", "s", "st", "t", "tr", "v",
           "z", "sh", "th", "kl"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou", "ei"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "m", "x", "nd"]
_ADJECTIVES = ["Silent", "Crimson", "Hollow", "Golden", "Broken", "Distant", "Hidden", "Iron", "Pale", "Restless",
               "Frozen", "Velvet", "Burning", "Quiet", "Endless"]
_NOUNS = ["Harbor", "Orchard", "Lantern", "Meridian", "Tide", "Garden", "Signal", "Mirror", "Canyon", "River",
          "Compass", "Summit", "Archive", "Echo", "Horizon"]
_INDUSTRIES = ["shipping", "software", "mining", "textile", "aviation", "robotics", "pharmaceutical", "food"]


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)).title()


def _names(rng: random.Random):
    return {
        "person": lambda: f"{_word(rng, 2)} {_word(rng, 2)}",
        "city": lambda: _word(rng, 2) + rng.choice(["port", "ford", "ton", "burg", "vale", "haven", "wick"]),
        "country": lambda: _word(rng, 2) + rng.choice(["ia", "land", "stan", "ora", "mark"]),
        "company": lambda: _word(rng, 2) + rng.choice([" Corp", " Industries", " Labs", " Works"]),
        "film": lambda: f"The {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)} of {_word(rng, 2)}",
        "band": lambda: f"The {_word(rng, 2)}s",
        "university": lambda: f"University of {_word(rng, 2)}",
        "book": lambda: f"{rng.choice(_NOUNS)} of {_word(rng, 2)}",
        "song": lambda: f"{rng.choice(_ADJECTIVES)} {_word(rng, 2)}",
    }


#: Two-hop templates: subject -(hop 1)-> bridge -(hop 2)-> answer, plus a one-hop distractor that gives the subject
#: a wrong answer of the right type. Each passage template is keyed by the entity it is titled with.
_TEMPLATES = [
    {
        "qtype": "company_founder_birthplace",
        "types": ("company", "person", "city"),
        "question": "In which city was the founder of {s} born?",
        "hop1": "{s} is a {industry} company. The founder of {s} is {b}.",
        "hop2": "{b} is a company founder. {b} was born in {a}.",
        "one_hop": "{s} has its headquarters in the city of {x}.",
    },
    {
        "qtype": "film_director_country",
        "types": ("film", "person", "country"),
        "question": "Which country is the director of the film {s} a citizen of?",
        "hop1": "{s} is a film directed by {b}.",
        "hop2": "{b} is a film director. {b} is a citizen of {a}.",
        "one_hop": "The film {s} was shot on location in {x}.",
    },
    {
        "qtype": "book_author_university",
        "types": ("book", "person", "university"),
        "question": "At which university did the author of {s} study?",
        "hop1": "{s} is a novel written by {b}.",
        "hop2": "{b} is a novelist. {b} studied at the {a}.",
        "one_hop": "{s} was first presented at the {x}.",
    },
    {
        "qtype": "song_band_city",
        "types": ("song", "band", "city"),
        "question": "In which city was the band that recorded the song {s} formed?",
        "hop1": "{s} is a song recorded by the band {b}.",
        "hop2": "{b} is a rock band. {b} was formed in {a}.",
        "one_hop": "The song {s} was recorded in a studio in {x}.",
    },
]


def _fact(rng, names, template):
    s_type, b_type, a_type = template["types"]
    used: set[str] = set()

    def fresh(kind):
        while True:
            name = names[kind]()
            if name not in used:
                used.add(name)
                return name

    return {"s": fresh(s_type), "b": fresh(b_type), "a": fresh(a_type), "x": fresh(a_type),
            "industry": rng.choice(_INDUSTRIES)}, fresh


def generate_questions(num_tasks: int, seed: int = 0, split: str = "train", num_bridge_distractors: int = 2,
                       num_random_distractors: int = 1) -> list[dict[str, Any]]:
    """Two-hop questions over invented entities, each with its own corpus (see the module docstring)."""
    rng = random.Random(f"search_qa:{split}:{seed}")
    names = _names(rng)
    rows = []
    for i in range(num_tasks):
        template = _TEMPLATES[i % len(_TEMPLATES)] if i < len(_TEMPLATES) else rng.choice(_TEMPLATES)
        values, fresh = _fact(rng, names, template)
        s, b, a = values["s"], values["b"], values["a"]
        passages = [
            {"title": s, "text": template["hop1"].format(**values)},
            {"title": b, "text": template["hop2"].format(**values)},
            {"title": s, "text": template["one_hop"].format(**values)},
        ]
        s_type, b_type, a_type = template["types"]
        for _ in range(num_bridge_distractors):  # same kinds of facts about other entities: wrong answers
            other = {"s": fresh(s_type), "b": fresh(b_type), "a": fresh(a_type), "industry": rng.choice(_INDUSTRIES)}
            passages.append({"title": other["b"], "text": template["hop2"].format(**other)})
            passages.append({"title": other["s"], "text": template["hop1"].format(**other)})
        for _ in range(num_random_distractors):  # a fact from another template
            other_template = rng.choice([t for t in _TEMPLATES if t is not template])
            other, _ = _fact(rng, names, other_template)
            passages.append({"title": other["b"], "text": other_template["hop2"].format(**other)})
        rng.shuffle(passages)
        rows.append({"question": template["question"].format(s=s), "answer": a, "answers": [a],
                     "passages": passages, "gold_titles": [s, b], "qtype": template["qtype"]})
    return rows


# ----------------------------------------------------------------------------------------------------- hub datasets
def from_hotpotqa(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of ``hotpotqa/hotpot_qa`` (config ``distractor`` or ``fullwiki``) -> the columns of :class:`SearchQAEnv`.

    ``context`` is ``{"title": [...], "sentences": [[...], ...]}``; the gold titles are those of the supporting
    facts."""
    context = row["context"]
    passages = [{"title": t, "text": " ".join(s).strip()} for t, s in zip(context["title"], context["sentences"])]
    gold = list(dict.fromkeys(row.get("supporting_facts", {}).get("title", [])))
    return {"question": row["question"], "answer": row["answer"], "answers": [row["answer"]],
            "passages": passages, "gold_titles": gold}


def from_2wikimultihopqa(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of 2WikiMultihopQA -> the columns of :class:`SearchQAEnv`. ``context`` is either
    ``{"title": [...], "content": [[...], ...]}`` (the parquet copies on the hub) or the original list of
    ``[title, [sentences]]`` pairs."""
    context = row["context"]
    if isinstance(context, Mapping):
        pairs = list(zip(context["title"], context.get("content", context.get("sentences"))))
    else:
        pairs = [(c[0], c[1]) for c in context]
    passages = [{"title": t, "text": " ".join(s).strip()} for t, s in pairs]
    facts = row.get("supporting_facts") or {}
    gold = facts.get("title", []) if isinstance(facts, Mapping) else [f[0] for f in facts]
    return {"question": row["question"], "answer": row["answer"], "answers": [row["answer"]],
            "passages": passages, "gold_titles": list(dict.fromkeys(gold))}


def from_musique(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of MuSiQue (``paragraphs`` of ``{"title", "paragraph_text", "is_supporting"}``, ``answer``,
    ``answer_aliases``) -> the columns of :class:`SearchQAEnv`."""
    paragraphs = row["paragraphs"]
    passages = [{"title": p["title"], "text": p["paragraph_text"]} for p in paragraphs]
    gold = list(dict.fromkeys(p["title"] for p in paragraphs if p.get("is_supporting")))
    answers = [row["answer"], *(row.get("answer_aliases") or [])]
    return {"question": row["question"], "answer": row["answer"], "answers": answers, "passages": passages,
            "gold_titles": gold}
