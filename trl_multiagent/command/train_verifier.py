"""``python -m trl_multiagent train-verifier --config RECIPE.yaml``: MAPoRL's learned verifier, from sampled solutions
to a saved, evaluated verifier (App. E).

Paper: MAPoRL (Park et al., arXiv 2502.18439), App. E.1 (training data and loss), E.2 (the verifier's accuracy),
E.3 (train the verifier on solutions of the same base model).

What one run does (:class:`VerifierRun`), in order:

1. **Checks** (:meth:`VerifierRun.prepare`), before any model loads: the config's values
   (:class:`VerifierTrainingConfig`), the environment (a debate environment: its questions and its gold check), the
   agent, the training questions (the dataset's TRAIN split only), the held-out questions (the environment's
   generated held-out split, or ``eval_split`` of a hub or file dataset) and that no held-out question is a training
   question, that the models are here, and that ``output_dir`` can be written and holds no earlier results (unless
   ``overwrite``). Each failure is one :class:`~trl_multiagent.errors.RecipeError` naming the field.
2. **Sampling** (:func:`~trl_multiagent.verifier.learned.collect_solutions`): the sampling model (``model``, the debaters'
   base) answers every training and every held-out question ``num_samples`` times with the debate's first-turn
   prompt; the environment's gold check (the rule verifier) labels every solution. With ``require_answer`` a
   solution from which the environment extracts no answer is dropped (App. E.1: "we excluded outputs that did not
   adhere to the required formatting").
3. **Balancing** (:func:`~trl_multiagent.verifier.learned.balance_solutions`): per training question ``per_class`` correct
   and ``per_class`` incorrect solutions; a class with fewer is filled with a reference solution / one with a
   trivial error when ``fill_missing`` (as the paper did), else the question keeps ``min(#correct, #incorrect)`` of
   each. The held-out solutions are balanced the same way, never filled in, at most ``eval_per_class`` per class.
4. **Training** (:func:`~trl_multiagent.verifier.learned.train_verifier`): token-level binary cross-entropy over the latter
   half of each solution, with a progress bar; then :meth:`~trl_multiagent.verifier.learned.LearnedVerifier.save` writes the
   verifier to ``output_dir``, which the debate trainer's ``verifier:`` then names.
5. **Evaluation** on the balanced held-out solutions: accuracy at ``eval_threshold`` and ROC AUC
   (:mod:`trl_multiagent.metrics.classification`, 95% bootstrap intervals over held-out questions) of the learned
   verifier, next to the rule verifier (the environment's exact / Math-Verify match of the gold answer, what
   ``verifier: rule`` scores in the debate) on the same solutions. The labels are that gold check, so the rule
   verifier scores 1 by construction: it is the ceiling, reading the gold answer that the learned verifier never
   sees. The learned verifier's fit on its own training data is reported too.
6. **Results** in ``output_dir``: the verifier (``verifier.json``, ``adapters/``), ``summary.json``, ``report.md``,
   ``solutions.jsonl`` (every sampled solution with its label) and ``held_out_scores.jsonl`` (every balanced
   held-out solution with both verifiers' scores).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import json
import logging
import math
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from trl_multiagent.command.verifier_recipe import (
    OUTPUT_FILES,
    PROG,
    VerifierDataError,
    VerifierTrainingConfig,
    _numeric,
    check_output_dir,
    parse_config,
)
from trl_multiagent.environments.stepping import reset_env
from trl_multiagent.errors import RecipeError, RunFault, fail_command, pre_training_errors
from trl_multiagent.metrics.classification import accuracy_at_threshold, question_bootstrap, roc_auc
from trl_multiagent.runtime.provenance import machine_record

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------- the run
class VerifierRun:
    """One ``train-verifier`` run (see the module docstring). ``given`` holds the values as given (recorded in the
    summary) and ``command`` the command line."""

    def __init__(self, config: VerifierTrainingConfig, given: Mapping[str, Any] | None = None, command: str = ""):
        self.config, self.given, self.command = config, dict(given or {}), command
        self.start = time.perf_counter()
        self.timings: dict[str, float] = {}

    # ----------------------------------------------------------------------------------------- checks
    def prepare(self) -> None:
        """Every check that needs no model (each failure is a :class:`RecipeError` naming the problem)."""
        from trl_multiagent.command.datafiles import DATA_FILE_SUFFIXES
        from trl_multiagent.command.recipe import (
            RecipeArguments,
            build_dataset,
            check_rows_fit,
            environment_factory,
            held_out_tasks,
        )
        from trl_multiagent.environments.debate import DebateEnv
        from trl_multiagent.models.loading import _check_config_loads, resolve_model

        c = self.config
        if c.dataset == "generated" and c.eval_split not in (None, "generated"):
            raise RecipeError(f"eval_split {c.eval_split!r}: a generated dataset is evaluated on the environment's "
                              "generated held-out split; leave eval_split empty (or 'generated')")
        if c.dataset != "generated" and not c.eval_split:
            raise RecipeError(f"dataset {c.dataset!r} needs eval_split: the held-out split of a hub dataset ('test', "
                              "'validation'), another data file for a file dataset, or 'generated' for the "
                              "environment's generated held-out questions")
        if Path(c.dataset).suffix in DATA_FILE_SUFFIXES and c.eval_split != "generated" and \
                Path(str(c.eval_split)).suffix not in DATA_FILE_SUFFIXES:
            raise RecipeError(f"dataset {c.dataset!r} is a file: eval_split must be another data file "
                              f"({', '.join(DATA_FILE_SUFFIXES)}) or 'generated', got {c.eval_split!r}")
        try:
            recipe = RecipeArguments(environment=c.environment, env_kwargs=c.env_kwargs, dataset=c.dataset,
                                     dataset_split=c.dataset_split, dataset_config=c.dataset_config,
                                     dataset_transform=c.dataset_transform, eval_dataset_split=c.eval_split,
                                     num_tasks=c.num_questions)
        except ValueError as exc:
            raise RecipeError(str(exc)) from exc
        self.env_cls, self.env_factory, probe = environment_factory(recipe)
        if not isinstance(probe, DebateEnv):
            raise RecipeError(f"environment {c.environment!r} ({type(probe).__name__}) is not a debate environment "
                              "(DebateEnv): the verifier is trained on its questions and its gold check")
        self.agent = c.agent or probe.agents[0]
        if self.agent not in probe.agents:
            raise RecipeError(f"agent {c.agent!r} is not a role of {type(probe).__name__}: {list(probe.agents)}")
        settings = SimpleNamespace(seed=c.seed)
        data = build_dataset(recipe, self.env_cls, settings)
        check_rows_fit(probe, data, name=f"dataset {c.dataset!r}")
        if len(data) < c.num_questions:
            raise RecipeError(f"dataset {c.dataset!r} has {len(data)} rows in its training split, num_questions asks "
                              f"for {c.num_questions}; lower num_questions")
        self.train_tasks = [dict(data[i]) for i in range(c.num_questions)]
        held = held_out_tasks(recipe, settings, c.eval_num_questions)  # a hub or file dataset needs eval_split
        if len(held) < c.eval_num_questions:
            raise RecipeError(f"the held-out split has {len(held)} questions, eval_num_questions asks for "
                              f"{c.eval_num_questions}; lower eval_num_questions")
        check_rows_fit(self.env_factory(), held, name="held-out questions")
        self.held_out_tasks = [dict(held[i]) for i in range(len(held))]
        train_questions = {self._question(t) for t in self.train_tasks}
        shared = [q for q in (self._question(t) for t in self.held_out_tasks) if q in train_questions]
        if shared:
            raise RecipeError(f"{len(shared)} held-out question(s) are also training questions (e.g. "
                              f"{shared[0][:80]!r}); the held-out split must hold questions never used for training")
        if c.fill_missing:
            for i, task in enumerate(self.train_tasks):
                if not _numeric(task.get("answer")):
                    raise RecipeError(f"fill_missing needs numeric gold answers (the incorrect fill-in moves the "
                                      f"answer a little); training question {i} has answer {task.get('answer')!r}")
        for name, value in (("model", c.model), ("verifier_model", c.verifier_model or c.model)):
            resolved = resolve_model(value)
            _check_config_loads(str(value), resolved)
            logger.debug("%s: %s", name, resolved)
        check_output_dir(c.output_dir, c.overwrite)

    def _question(self, task: Mapping[str, Any]) -> str:
        env = self.env_factory()
        reset_env(env, task)
        return env.question

    # ----------------------------------------------------------------------------------------- progress
    @contextlib.contextmanager
    def stage(self, label: str, total: int, unit: str, status: bool = False) -> Iterator[Callable[..., None]]:
        """A rich bar for one stage (or a log line at its start and end with ``disable_progress``); yields
        ``advance(n, status=None)``."""
        start = time.perf_counter()
        logger.info("%s: %d %s", label, total, unit)
        if self.config.disable_progress:
            yield lambda n, status=None: None
        else:
            from rich.progress import TextColumn

            from trl_multiagent.runtime.process import progress_bar

            extra = (TextColumn("{task.fields[status]}"),) if status else ()
            with progress_bar("{task.description}", unit, *extra, transient=False) as bar:
                task = bar.add_task(label, total=max(1, total), status="")

                def advance(n: int, status: str | None = None) -> None:
                    bar.advance(task, n)
                    if status is not None:
                        bar.update(task, status=status)

                yield advance
                bar.update(task, completed=max(1, total))
        self.timings[label] = time.perf_counter() - start
        logger.info("%s done in %.0f s", label, self.timings[label])

    # ----------------------------------------------------------------------------------------- steps
    def sample(self) -> None:
        """Sample and label the training and held-out solutions with the sampling model, then free it."""
        import torch
        from transformers import GenerationConfig, set_seed

        from trl_multiagent.runtime.memory import release_freed_memory
        from trl_multiagent.team.pool import AgentPool, AgentSpec
        from trl_multiagent.verifier.learned import collect_solutions

        c = self.config
        set_seed(c.seed)
        pool = AgentPool([AgentSpec(self.agent, model=c.model, quantization=c.quantization)], dtype=c.model_dtype)
        generation = GenerationConfig(do_sample=True, temperature=c.temperature, top_p=c.top_p,
                                      max_new_tokens=c.max_new_tokens)
        bound = c.max_batch_sequences or None
        self.records: dict[str, list[dict[str, Any]]] = {}
        for split, tasks in (("train", self.train_tasks), ("held_out", self.held_out_tasks)):
            label = f"sampling {split.replace('_', '-')} solutions"
            with self.stage(label, len(tasks) * c.num_samples, "seqs") as advance, torch.no_grad():
                self.records[split] = collect_solutions(pool, self.agent, self.env_factory, tasks, c.num_samples,
                                                        generation, max_batch_sequences=bound, progress=advance)
        del pool
        gc.collect()
        release_freed_memory()

    def _kept(self, split: str) -> list[dict[str, Any]]:
        records = self.records[split]
        return [r for r in records if r["answered"]] if self.config.require_answer else list(records)

    def balance(self) -> None:
        """Balanced training examples (with fill-ins when ``fill_missing``) and balanced held-out solutions."""
        from trl_multiagent.verifier.learned import balance_solutions, boxed_reference_solution, boxed_wrong_solution

        c = self.config
        fill = {"make_correct": boxed_reference_solution, "make_incorrect": boxed_wrong_solution} \
            if c.fill_missing else {}
        train = self._kept("train")
        self.examples = balance_solutions(train, c.per_class, seed=c.seed, **fill)
        sampled = {(str(r["question"]), str(r["solution"])) for r in train}
        self.filled = sum((e.question, e.solution) not in sampled for e in self.examples)
        if not self.examples:
            raise VerifierDataError(
                f"no training question has both a correct and an incorrect solution among its {c.num_samples} "
                f"samples ({sum(r['correct'] for r in train)} of {len(train)} kept solutions correct); raise "
                "num_samples or num_questions, or set fill_missing: true")
        held = balance_solutions(self._kept("held_out"), c.eval_per_class, seed=c.seed)
        self.held_out: list[list] = []
        for example in held:  # balance_solutions keeps each question's solutions together
            if self.held_out and self.held_out[-1][0].question == example.question:
                self.held_out[-1].append(example)
            else:
                self.held_out.append([example])
        if not self.held_out:
            kept = self._kept("held_out")
            raise VerifierDataError(
                f"no held-out question has both a correct and an incorrect solution ({sum(r['correct'] for r in kept)} "
                f"of {len(kept)} kept solutions correct): nothing balanced to evaluate on; raise eval_num_questions "
                "or num_samples")
        logger.info("training data: %d examples (%d filled in) from %d questions; held-out: %d solutions from %d "
                    "questions", len(self.examples), self.filled, len({e.question for e in self.examples}),
                    sum(len(g) for g in self.held_out), len(self.held_out))

    def train(self) -> None:
        """Build, train and save the verifier."""
        from transformers import set_seed

        from trl_multiagent.verifier.learned import LearnedVerifier, num_training_steps, train_verifier

        c = self.config
        set_seed(c.seed)  # the adapter's and the head's init
        self.verifier = LearnedVerifier(model=c.verifier_model or c.model, quantization=c.verifier_quantization,
                                        lora_r=c.lora_r, lora_alpha=c.lora_alpha, dtype=c.model_dtype)
        total = num_training_steps(len(self.examples), c.batch_size, c.epochs)
        with self.stage("training verifier", total, "steps", status=True) as advance:
            self.history = train_verifier(self.verifier, self.examples, epochs=c.epochs,
                                          learning_rate=c.learning_rate, batch_size=c.batch_size,
                                          latter_fraction=c.latter_fraction, seed=c.seed,
                                          progress=lambda step, loss: advance(1, f"loss {loss:.3f}"))
        self.verifier.save(c.output_dir)
        logger.info("Saved the verifier to %s", c.output_dir)

    def evaluate(self) -> None:
        """Both verifiers' scores on the balanced held-out solutions (and the learned one's on its training data)."""
        c = self.config
        flat = [e for group in self.held_out for e in group]
        with self.stage("scoring held-out solutions", len(flat), "seqs") as advance:
            learned = self.verifier.score([e.question for e in flat], [e.solution for e in flat],
                                          batch_size=c.score_batch_size, progress=advance)
        with self.stage("scoring training solutions", len(self.examples), "seqs") as advance:
            self.train_scores = self.verifier.score([e.question for e in self.examples],
                                                    [e.solution for e in self.examples],
                                                    batch_size=c.score_batch_size, progress=advance)
        envs = {}
        for task in self.held_out_tasks:
            env = self.env_factory()
            reset_env(env, task)
            envs[env.question] = env
        rule = [float(envs[e.question].is_correct(e.solution)) for e in flat]  # the debate's verifier: rule
        self.scores = {"learned": learned, "rule": rule}

    # ----------------------------------------------------------------------------------------- results
    def metrics(self) -> dict[str, Any]:
        """Accuracy at the threshold and AUC of each verifier on the held-out solutions, with bootstrap intervals
        over questions; mean scores per class; the learned verifier's fit on its training data."""
        c = self.config
        sizes = [len(g) for g in self.held_out]
        labels = [[e.correct for e in g] for g in self.held_out]
        accuracy = functools.partial(accuracy_at_threshold, threshold=c.eval_threshold)
        out: dict[str, Any] = {}
        for name, flat in self.scores.items():
            grouped, i = [], 0
            for n in sizes:
                grouped.append(flat[i:i + n])
                i += n
            labels_flat = [y for g in labels for y in g]
            out[name] = {
                "accuracy": question_bootstrap(accuracy, grouped, labels, c.eval_bootstrap_resamples, seed=c.seed),
                "auc": question_bootstrap(roc_auc, grouped, labels, c.eval_bootstrap_resamples, seed=c.seed),
                "mean_score_correct": _mean([s for s, y in zip(flat, labels_flat) if y]),
                "mean_score_incorrect": _mean([s for s, y in zip(flat, labels_flat) if not y]),
            }
        train_labels = [e.correct for e in self.examples]
        out["learned_on_training_data"] = {
            "accuracy": accuracy(self.train_scores, train_labels), "auc": roc_auc(self.train_scores, train_labels)}
        return out

    def data_summary(self) -> dict[str, Any]:
        c = self.config

        def split_stats(split: str) -> dict[str, Any]:
            records = self.records[split]
            kept = self._kept(split)
            return {"questions": len({r["question_id"] for r in records}), "sampled": len(records),
                    "answered": sum(r["answered"] for r in records), "truncated": sum(r["truncated"] for r in records),
                    "correct": sum(r["correct"] for r in records), "kept": len(kept),
                    "kept_correct": sum(r["correct"] for r in kept)}

        train = split_stats("train")
        train.update(balanced=len(self.examples), balanced_correct=sum(e.correct for e in self.examples),
                     balanced_questions=len({e.question for e in self.examples}), filled_in=self.filled,
                     per_class=c.per_class)
        held = split_stats("held_out")
        held.update(balanced=sum(len(g) for g in self.held_out),
                    balanced_correct=sum(e.correct for g in self.held_out for e in g),
                    balanced_questions=len(self.held_out), per_class=c.eval_per_class,
                    split=c.eval_split or "generated held-out split")
        return {"train": train, "held_out": held}

    def write(self) -> Path:
        """``summary.json``, ``report.md``, ``solutions.jsonl`` and ``held_out_scores.jsonl`` in ``output_dir``."""

        c = self.config
        out = Path(c.output_dir)
        steps_per_epoch = math.ceil(len(self.examples) / c.batch_size)
        epoch_means = [_mean(self.history[i:i + steps_per_epoch]) for i in range(0, len(self.history),
                                                                                  steps_per_epoch)]
        summary = {
            "command": self.command,
            "wall_time_s": time.perf_counter() - self.start,
            "stage_seconds": {k: round(v, 1) for k, v in self.timings.items()},
            "machine": machine_record(),
            "verifier_dir": str(out),
            "sampling_agent": self.agent,
            "data": self.data_summary(),
            "training": {"steps": len(self.history), "epochs": c.epochs, "loss_first_step": self.history[0],
                         "loss_last_step": self.history[-1], "epoch_mean_loss": epoch_means,
                         "loss_per_step": self.history},
            "held_out": self.metrics(),
            "config": dataclasses.asdict(c),
            "given": self.given,
        }
        self.summary = summary
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (out / "report.md").write_text(render_report(summary))
        with (out / "solutions.jsonl").open("w") as fh:
            for split, records in self.records.items():
                for r in records:
                    fh.write(json.dumps({"split": split, **r}) + "\n")
        flat = [e for g in self.held_out for e in g]
        with (out / "held_out_scores.jsonl").open("w") as fh:
            for e, learned, rule in zip(flat, self.scores["learned"], self.scores["rule"]):
                fh.write(json.dumps({"question": e.question, "solution": e.solution, "correct": e.correct,
                                     "learned": learned, "rule": rule}) + "\n")
        return out / "summary.json"

    def clear_earlier_results(self) -> None:
        """With ``overwrite``: remove the files an earlier run wrote (only :data:`OUTPUT_FILES`)."""
        out = Path(self.config.output_dir)
        for name in OUTPUT_FILES:
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()

    def execute(self) -> Path:
        """Sample, balance, train, save, evaluate, write; returns the path of ``summary.json``."""
        from trl_multiagent.runtime.process import configure_threads

        threads = configure_threads(self.config.num_threads)
        if threads:
            logger.info("torch uses %d CPU threads (num_threads)", threads)
        self.clear_earlier_results()
        self.sample()
        self.balance()
        self.train()
        self.evaluate()
        path = self.write()
        learned, rule = self.summary["held_out"]["learned"], self.summary["held_out"]["rule"]
        logger.info("held-out: learned verifier accuracy %.3f, AUC %.3f; rule verifier accuracy %.3f, AUC %.3f",
                    learned["accuracy"]["mean"], learned["auc"]["mean"], rule["accuracy"]["mean"],
                    rule["auc"]["mean"])
        logger.info("Wrote %s and report.md in %s", path.name, path.parent)
        return path


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _interval(entry: Mapping[str, Any]) -> str:
    lo, hi = entry["ci95"]
    return f"{entry['mean']:.3f} [{lo:.3f}, {hi:.3f}]"


def render_report(summary: Mapping[str, Any]) -> str:
    """``report.md`` of a run: the data, the training loss and the held-out table."""
    from trl_multiagent.models.loading import DEFAULT_MODEL

    c, data, held, training = summary["config"], summary["data"], summary["held_out"], summary["training"]
    train, test = data["train"], data["held_out"]
    lines = [
        "# Learned verifier (MAPoRL App. E): held-out evaluation",
        "",
        f"Command: `{summary['command']}`",
        "",
        f"Sampling: {train['questions']} training questions and {test['questions']} held-out questions "
        f"({test['split']}; none used in training) of `{c['environment']}`, {c['num_samples']} solutions each from "
        f"`{c['model'] or DEFAULT_MODEL}` at temperature {c['temperature']} (at most {c['max_new_tokens']} "
        f"tokens), labelled by the environment's gold check. Training: {train['correct']} of {train['sampled']} "
        f"solutions correct, {train['kept']} kept ({'answered only' if c['require_answer'] else 'all'}); "
        f"held-out: {test['correct']} of {test['sampled']} correct, {test['kept']} kept.",
        "",
        f"Balanced training data: {train['balanced']} solutions ({train['balanced_correct']} correct) from "
        f"{train['balanced_questions']} questions, at most {train['per_class']} per class and question, "
        f"{train['filled_in']} filled in. Balanced held-out solutions: {test['balanced']} "
        f"({test['balanced_correct']} correct) from {test['balanced_questions']} questions, at most "
        f"{test['per_class']} per class and question, none filled in.",
        "",
        f"Training: {training['steps']} steps ({training['epochs']} epochs, batch {c['batch_size']}, learning rate "
        f"{c['learning_rate']}); mean loss per epoch "
        f"{', '.join(f'{x:.3f}' for x in training['epoch_mean_loss'])}.",
        "",
        f"| verifier (held-out) | accuracy at {c['eval_threshold']} [95% CI] | AUC [95% CI] | mean score, correct "
        "| mean score, incorrect |",
        "|---|---|---|---|---|",
    ]
    names = {"learned": "learned (this run)", "rule": "rule (gold-answer check, what `verifier: rule` scores)"}
    for key, name in names.items():
        m = held[key]
        lines.append(f"| {name} | {_interval(m['accuracy'])} | {_interval(m['auc'])} | "
                     f"{m['mean_score_correct']:.3f} | {m['mean_score_incorrect']:.3f} |")
    lines.append("| chance (balanced data) | 0.500 | 0.500 | | |")
    fit = held["learned_on_training_data"]
    lines += [
        "",
        "The labels are the rule verifier's own check (it reads the gold answer), so the rule verifier scores 1 by "
        "construction: it is the ceiling. The learned verifier reads only the question and the solution. Intervals: "
        f"percentile bootstrap over held-out questions ({c['eval_bootstrap_resamples']} resamples). On its own "
        f"training data the learned verifier has accuracy {fit['accuracy']:.3f} and AUC {fit['auc']:.3f}.",
        "",
        f"Use it in a debate: `verifier: {summary['verifier_dir']}` (e.g. "
        "`recipes/configs/math_easy_debate_learned_verifier.yaml`).",
        "",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------- command
def train_verifier_command(argv: Sequence[str], prog: str = PROG) -> int:
    """Parse and check (exit code 2 and one error line on a mistake, before any model loads), then run; returns
    the exit code (1 when the sampled solutions cannot make balanced data)."""

    argv = list(argv)
    if not argv:
        print(f"usage: {prog} --config RECIPE.yaml [--field value ...]\n       {prog} --help", file=sys.stderr)
        print(f"{prog}: error: no recipe given: pass --config RECIPE.yaml (and --field value overrides)",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        config, given = parse_config(argv, prog)
        run = VerifierRun(config, given, command=" ".join([PROG, *argv]))
        run.prepare()
    except pre_training_errors() as exc:
        return fail_command(prog, exc)
    try:
        run.execute()
    except (VerifierDataError, RunFault) as exc:  # RunFault: e.g. a non-finite verifier, not saved
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    return 0
