"""MAPoRL's learned verifier: a language model with a linear head and a sigmoid (App. E).

Paper: MAPoRL (Park et al., arXiv 2502.18439), App. E ("Verifier Models Structure", E.1 "Training Procedure", E.3).

The verifier reads a question and a solution and outputs, at every solution token, the probability that the
solution is correct: ``sigmoid(w^T z_k + b)`` with ``z_k`` the backbone's last hidden state at token k. It is built
from the project's value-head machinery: an :class:`~trl_multiagent.team.pool.AgentPool` holding one agent
(``verifier``, whose LoRA adapter fine-tunes the backbone) and one critic sharing that adapter (``verifier_head``:
the linear head). Saving and loading are the pool's (``adapters/verifier``, ``adapters/verifier_head``,
``team.json``) plus ``verifier.json``.

Training (E.1): balanced correct and incorrect sampled solutions per question (:func:`balance_solutions`, which can
fill a missing class with a reference solution or one with a trivial error, as the paper did), labels 1 / 0 on the
solution's tokens, binary cross-entropy at the token level over the LATTER HALF of each solution's tokens (E.1: "in
practice, focusing on the latter half of the generated solution tokens yielded better results"; E.3: this beat
training on the final answer only). :func:`train_verifier` runs it. The score of a solution is the verifier's output
at its last token (:meth:`LearnedVerifier.score`), the debate's ``s(q, y)`` when the trainer's ``verifier`` names the
saved directory. ``python -m trl_multiagent train-verifier --config RECIPE.yaml``
(:mod:`trl_multiagent.command.train_verifier`) runs the whole pipeline: sample, balance, train, save, evaluate on held-out
solutions.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig

from trl_multiagent.environments.stepping import reset_env
from trl_multiagent.generation.padding import pad_token_id, right_pad
from trl_multiagent.team.critics import CriticSpec
from trl_multiagent.team.pool import AgentPool, AgentSpec

logger = logging.getLogger(__name__)

AGENT = "verifier"
HEAD = "verifier_head"
FORMAT = "trl-multiagent-verifier/1"
#: How a question and a solution are laid out for the verifier.
INPUT_TEMPLATE = "Question:\n{question}\n\nSolution:\n"


@dataclass
class VerifierExample:
    """One labelled solution: the question text, the solution text and whether the solution is correct."""

    question: str
    solution: str
    correct: bool


class LearnedVerifier:
    """An LM + linear head + sigmoid scoring solutions (App. E); see the module docstring.

    Args:
        model: the backbone (hub id, local path or embedded short name; ``None``: the embedded default). App. E.3:
            train it on solutions sampled from the same base as the debaters.
        quantization: ``None`` or ``"4bit"`` (the paper's verifier is quantized).
        lora_r, lora_alpha: the backbone adapter's LoRA settings.
        dtype: weights dtype of a full-precision backbone.
        pool: an already built pool holding the ``verifier`` agent and the ``verifier_head`` critic (used by
            :meth:`load`).
    """

    def __init__(self, model: str | None = None, quantization: str | None = None, lora_r: int = 16,
                 lora_alpha: int = 32, dtype: str = "auto", pool: AgentPool | None = None):
        if pool is None:
            spec = AgentSpec(AGENT, model=model, quantization=quantization, lora_r=lora_r, lora_alpha=lora_alpha,
                             use_chat_template=False)
            pool = AgentPool([spec], dtype=dtype, critics=[CriticSpec(HEAD, agent=AGENT, share_adapter=True)])
        elif AGENT not in pool.specs or HEAD not in pool.critics:
            raise ValueError(f"a verifier pool needs the agent {AGENT!r} and the critic {HEAD!r}")
        self.pool = pool
        self.tokenizer = pool.tokenizer_of(AGENT)

    # ------------------------------------------------------------------------------------------- inputs
    def encode(self, question: str, solution: str) -> tuple[list[int], int]:
        """Token ids of the question part followed by the solution, and the index of the first solution token."""
        prefix = self.tokenizer(INPUT_TEMPLATE.format(question=question.strip()))["input_ids"]
        body = self.tokenizer(solution, add_special_tokens=False)["input_ids"] or [self.tokenizer.eos_token_id]
        return prefix + body, len(prefix)

    def _batch(self, rows: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        # right padding: real tokens keep positions 0..len-1
        return right_pad(rows, pad_token_id(self.tokenizer), device=next(self.pool.parameters()).device)

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` head outputs before the sigmoid, one per token."""
        return self.pool.values(HEAD, input_ids, attention_mask)

    @torch.no_grad()
    def score(self, questions: Sequence[str], solutions: Sequence[str], batch_size: int = 8,
              progress: Callable[[int], None] | None = None) -> list[float]:
        """``s(q, y)`` in [0, 1] for every (question, solution): the sigmoid of the head at the solution's last token.
        ``progress(rows)`` is called after every batch."""
        if len(questions) != len(solutions):
            raise ValueError(f"{len(questions)} questions but {len(solutions)} solutions")
        was_training = self.pool.training
        self.pool.eval()
        out: list[float] = []
        try:
            for i in range(0, len(questions), batch_size):
                rows = [self.encode(q, s)[0] for q, s in zip(questions[i:i + batch_size], solutions[i:i + batch_size])]
                ids, mask = self._batch(rows)
                logits = self.logits(ids, mask)
                last = torch.tensor([len(r) - 1 for r in rows], device=logits.device)
                out.extend(torch.sigmoid(logits.gather(1, last.view(-1, 1)).squeeze(1)).tolist())
                if progress is not None:
                    progress(len(rows))
        finally:
            self.pool.train(was_training)
        return out

    def loss(self, examples: Sequence[VerifierExample], latter_fraction: float = 0.5) -> torch.Tensor:
        """Token-level binary cross-entropy (App. E.1) over the last ``latter_fraction`` of each solution's tokens
        (at least one token), label 1 for a correct solution and 0 for an incorrect one; mean over those tokens."""
        encoded = [self.encode(e.question, e.solution) for e in examples]
        ids, mask = self._batch([r for r, _ in encoded])
        logits = self.logits(ids, mask)
        weights = torch.zeros_like(logits)
        labels = torch.zeros_like(logits)
        for i, ((row, start), example) in enumerate(zip(encoded, examples)):
            n = len(row) - start
            first = start + n - max(1, math.ceil(n * latter_fraction))
            weights[i, first:len(row)] = 1.0
            labels[i, :] = float(example.correct)
        per_token = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="none")
        return (per_token * weights).sum() / weights.sum()

    # ------------------------------------------------------------------------------------------- save / load
    def save(self, directory: str | Path) -> None:
        """Write the adapter, the head and ``verifier.json`` to ``directory``."""
        directory = Path(directory)
        self.pool.save_adapters(directory)
        (directory / "verifier.json").write_text(json.dumps({"format": FORMAT, "input_template": INPUT_TEMPLATE}))

    @staticmethod
    def check_saved(directory: str | Path) -> None:
        """Raise one clear error unless ``directory`` holds a saved verifier (checked before any model loads)."""
        path = Path(directory)
        marker = path / "verifier.json"
        if not marker.is_file() or not (path / "adapters" / "team.json").is_file():
            raise FileNotFoundError(f"{directory} is not a saved learned verifier (no verifier.json / "
                                    "adapters/team.json); train one with `python -m trl_multiagent train-verifier "
                                    "--config RECIPE.yaml` (docs/trainers/maporl.md), or use verifier: rule")
        if json.loads(marker.read_text()).get("format") != FORMAT:
            raise ValueError(f"{marker} is not a {FORMAT} file")

    @classmethod
    def load(cls, directory: str | Path, dtype: str = "auto") -> LearnedVerifier:
        """Rebuild a verifier saved by :meth:`save`."""
        cls.check_saved(directory)
        return cls(pool=AgentPool.from_pretrained(directory, dtype=dtype))


# --------------------------------------------------------------------------------------------------- data
def balance_solutions(records: Sequence[Mapping[str, Any]], per_class: int, seed: int = 0,
                      make_correct: Callable[[Mapping[str, Any]], str] | None = None,
                      make_incorrect: Callable[[Mapping[str, Any], random.Random], str] | None = None
                      ) -> list[VerifierExample]:
    """Balanced verifier data (App. E.1): per question, ``per_class`` correct and ``per_class`` incorrect solutions.

    ``records`` are sampled solutions: mappings with ``question_id``, ``question``, ``solution``, ``correct``. A
    question with more than ``per_class`` of a class keeps a random ``per_class`` of them; a class with fewer is
    filled with ``make_correct(record)`` (a reference solution) / ``make_incorrect(record, rng)`` (a solution with a
    trivial error) when given, else the question keeps only ``min(#correct, #incorrect)`` of each class so the data
    stay balanced. Questions come out in first-seen order, correct before incorrect.
    """
    if per_class < 1:
        raise ValueError(f"per_class must be at least 1, got {per_class}")
    rng = random.Random(seed)
    by_question: dict[Any, list[Mapping[str, Any]]] = {}
    for record in records:
        by_question.setdefault(record["question_id"], []).append(record)
    out: list[VerifierExample] = []
    for rows in by_question.values():
        question = str(rows[0]["question"])
        right = [str(r["solution"]) for r in rows if r["correct"]]
        wrong = [str(r["solution"]) for r in rows if not r["correct"]]
        right = rng.sample(right, min(per_class, len(right)))
        wrong = rng.sample(wrong, min(per_class, len(wrong)))
        if make_correct is not None:
            right += [make_correct(rows[0]) for _ in range(per_class - len(right))]
        if make_incorrect is not None:
            wrong += [make_incorrect(rows[0], rng) for _ in range(per_class - len(wrong))]
        keep = min(len(right), len(wrong))
        out += [VerifierExample(question, s, True) for s in right[:keep]]
        out += [VerifierExample(question, s, False) for s in wrong[:keep]]
    return out


def boxed_reference_solution(record: Mapping[str, Any]) -> str:
    """A minimal correct solution for a task with a gold ``answer`` (the fill-in of App. E.1)."""
    return f"The final answer is \\boxed{{{record['answer']}}}."


def boxed_wrong_solution(record: Mapping[str, Any], rng: random.Random) -> str:
    """A solution with a trivial error for a numeric gold ``answer``: the answer moved by a small non-zero amount."""
    try:
        value = float(str(record["answer"]).replace(",", ""))
    except ValueError as exc:
        raise ValueError(f"boxed_wrong_solution needs a numeric answer, got {record['answer']!r}") from exc
    wrong = value + rng.choice([-2, -1, 1, 2]) * (1 if value == int(value) else 0.5)
    text = str(int(wrong)) if wrong == int(wrong) else str(wrong)
    return f"The final answer is \\boxed{{{text}}}."


def collect_solutions(pool: AgentPool, agent: str, env_factory: Callable, tasks: Sequence[Mapping[str, Any]],
                      num_samples: int, generation_config: GenerationConfig,
                      max_batch_sequences: int | None = 32,
                      progress: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """Sample ``num_samples`` first-turn solutions of ``agent`` per task and label them with the debate environment's
    gold check. Returns records for :func:`balance_solutions` (``question_id``, ``question``, ``solution``,
    ``correct``, ``answered``: whether the environment extracts an answer from it, ``truncated``: cut at the length
    limit, ``answer``). ``progress(num_sequences)`` is called as generation goes (the pool's ``generate_many``)."""
    from trl_multiagent.generation import GenerationRequest

    envs = [env_factory() for _ in tasks]
    prompts = [reset_env(env, task)[agent] for env, task in zip(envs, tasks)]
    gens = pool.generate_many([GenerationRequest(agent, p, num_samples) for p in prompts], generation_config,
                              max_batch_sequences=max_batch_sequences, progress=progress)
    records = []
    for q, (env, task, group) in enumerate(zip(envs, tasks, gens)):
        for g in group:
            records.append({"question_id": task.get("task_id", q), "question": env.question, "solution": g.text,
                            "correct": env.is_correct(g.text), "answered": env.extract_answer(g.text) is not None,
                            "truncated": g.truncated, "answer": task.get("answer")})
    return records


def num_training_steps(num_examples: int, batch_size: int, epochs: int) -> int:
    """Optimizer steps of :func:`train_verifier`: ``epochs * ceil(num_examples / batch_size)``."""
    return epochs * math.ceil(num_examples / batch_size)


def train_verifier(verifier: LearnedVerifier, examples: Sequence[VerifierExample], epochs: int = 1,
                   learning_rate: float = 1e-4, batch_size: int = 8, latter_fraction: float = 0.5,
                   seed: int = 0, progress: Callable[[int, float], None] | None = None) -> list[float]:
    """Fit the verifier with AdamW on the token-level BCE of :meth:`LearnedVerifier.loss`; returns the loss of every
    optimizer step (:func:`num_training_steps` of them). ``progress(steps_done, loss)`` is called after every step."""
    if not examples:
        raise ValueError("train_verifier needs at least one example")
    params = verifier.pool.policy_parameters(AGENT) + verifier.pool.critic_parameters(HEAD)
    optimizer = torch.optim.AdamW(params, lr=learning_rate)
    rng = random.Random(seed)
    order = list(range(len(examples)))
    history: list[float] = []
    verifier.pool.train()
    for epoch in range(epochs):
        rng.shuffle(order)
        for i in range(0, len(order), batch_size):
            batch = [examples[j] for j in order[i:i + batch_size]]
            loss = verifier.loss(batch, latter_fraction)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            history.append(loss.item())
            if progress is not None:
                progress(len(history), history[-1])
        logger.info("verifier epoch %d: mean loss %.4f", epoch + 1,
                    sum(history[-math.ceil(len(order) / batch_size):]) / math.ceil(len(order) / batch_size))
    return history
