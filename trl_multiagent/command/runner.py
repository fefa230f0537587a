"""The recipe runner: build -> evaluate before -> train -> evaluate after -> write the results.

One :class:`Run` serves every trainer of the registry (it dispatches on ``trainer:``) and every recipe script:

1. :meth:`Run.prepare` checks everything that can be checked without a model: the environment and its arguments,
   the team, the training data, the held-out tasks and the evaluation plan (which evaluator, methods, samples).
2. :meth:`Run.build_trainer` constructs the trainer, which checks the config against the team, the output
   directory and a resume checkpoint, then loads the models.
3. :meth:`Run.execute` evaluates before training (when the recipe asks), trains, evaluates after training, and
   writes ``summary.json`` (the trainer's training summary plus ``evaluation``, the command, the wall time and the
   recipe as given), ``report.md``, ``reward_curve.png``, ``eval_per_task.jsonl`` and the team's texts,
   ``eval_texts_before.jsonl`` / ``eval_texts_after.jsonl``
   (:func:`~trl_multiagent.evaluation.report.write_run_outputs`, the one place that writes them).

Evaluation runs on the main process with its own seeded random state, restored afterwards, so evaluating or not
never changes what training does. ``max_steps: 0`` evaluates the untrained team (and the baselines) only.
"""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path
from typing import Any

from trl_multiagent.command import recipe as recipe_module
from trl_multiagent.command.datafiles import DATA_FILE_SUFFIXES, check_data_file
from trl_multiagent.command.recipe import (
    RecipeArguments,
    RecipeError,
    build_dataset,
    build_team,
    check_rows_fit,
    environment_factory,
    finish_distributed,
    held_out_tasks,
    pass_reward_weights,
)
from trl_multiagent.errors import TrainingInterrupted, one_line
from trl_multiagent.runtime.provenance import machine_record
from trl_multiagent.trainers.outputs import write_run_status

logger = logging.getLogger(__name__)


class Run:
    """One recipe run (see the module docstring). ``given`` holds the recipe's values as given (file and command
    line, checked), recorded in the summary; ``command`` is the command line as the user typed it."""

    def __init__(self, recipe: RecipeArguments, config, given: dict[str, Any] | None = None, command: str = ""):
        self.recipe, self.config, self.given, self.command = recipe, config, dict(given or {}), command
        self.start = time.perf_counter()
        self.trainer = None
        self.evaluator = None
        self.tasks: list = []
        self.stages_planned: list[str] = []
        self.stages: dict = {}

    # ------------------------------------------------------------------------------------------------ checks
    def prepare(self) -> None:
        """Every check that needs no model (each failure is a :class:`RecipeError` naming the problem)."""
        recipe, config = self.recipe, self.config
        pass_reward_weights(recipe, config)
        self.env_cls, self.env_factory, probe = environment_factory(recipe)
        self.specs = build_team(recipe, probe.agents)
        if Path(recipe.dataset).suffix in DATA_FILE_SUFFIXES:
            check_data_file(recipe.dataset)  # cheap, and the first thing wrong with a recipe naming a file
        if recipe.init_adapters:  # a warm start: the saved team fits this one (trl_multiagent/command/warm_start.py)
            from trl_multiagent.command.warm_start import check_init_adapters

            check_init_adapters(recipe.init_adapters, self.specs, config.resume_from_checkpoint)
        self._plan_evaluation(probe)  # a missing held-out split is reported before the training data load
        self.dataset = build_dataset(recipe, self.env_cls, config)
        check_rows_fit(probe, self.dataset, name=f"dataset {recipe.dataset!r}")

    @property
    def trains(self) -> bool:
        return self.config.max_steps != 0

    def _plan_evaluation(self, probe) -> None:
        from trl_multiagent.evaluation import evaluator_kind, make_evaluator

        recipe, config = self.recipe, self.config
        stages = [s for s in ("before", "after") if s in recipe.eval_stages and (s == "before" or self.trains)]
        if recipe.evaluator == "none" or not stages:
            return
        trainer_cls = self.trainer_class
        kind = recipe.evaluator
        if kind == "auto":
            kind = trainer_cls.default_evaluator or evaluator_kind(probe)
        no_held_out = recipe.dataset == "generated" and not hasattr(self.env_cls, "make_dataset")
        if no_held_out:
            if recipe.evaluator == "auto":
                logger.info("%s generates no held-out tasks: no evaluation (set evaluator and eval_dataset_split to "
                            "evaluate on a data file)", self.env_cls.__name__)
                return
        # agents act one after another only where the environment takes partial joint actions
        sequential = config.evaluation_agent_order == "sequential" and \
            getattr(probe, "supports_partial_actions", False)
        try:
            self.evaluator = make_evaluator(kind, self.env_factory, config.num_turns,
                                            "sequential" if sequential else "parallel")
        except (ValueError, TypeError, ImportError) as exc:
            raise RecipeError(f"evaluator {recipe.evaluator!r}: {exc}") from exc
        # aliases (the math team's single) become their methods and 'alone' every agent-alone baseline
        resolved = self.evaluator.resolve_methods(recipe.eval_methods)
        methods = [m for m in resolved if m in self.evaluator.methods]
        extra = [m for m in resolved if m not in self.evaluator.methods]
        if extra and "eval_methods" in self.given:
            asks_alone = any(m == "alone" or recipe_module.ALONE_METHOD.fullmatch(m) for m in extra)
            alone = f"; {type(probe).__name__} scores no agent alone (no score_alone), so it has no <agent>_alone" \
                if asks_alone and not self.evaluator.alone else ""
            raise RecipeError(f"eval_methods: the {self.evaluator.name} evaluation has the methods "
                              f"{list(self.evaluator.methods)}, not {extra}{alone}")
        if not methods:
            methods = ["team"]
        self.methods = methods
        a_file = Path(recipe.eval_dataset_split or "").suffix in DATA_FILE_SUFFIXES
        num = recipe.eval_num_problems or (None if a_file else self.evaluator.default_num_tasks)  # 0: all of a file
        self.tasks = list(held_out_tasks(recipe, config, num, generated=self.evaluator.own_held_out_split))
        if not self.tasks:
            raise RecipeError("the held-out split has no tasks to evaluate on")
        if hasattr(probe, "reset"):
            check_rows_fit(self.env_factory(), _AsDataset(self.tasks), name="held-out tasks")
        self.sampled = recipe.eval_temperature > 0 if recipe.eval_temperature is not None else \
            (self.evaluator.sampled or trainer_cls.evaluate_sampled)
        self.num_samples = recipe.eval_num_samples if self.sampled else 1
        self.stages_planned = stages
        self.reuse_naive = (recipe.eval_team_before_is_naive and self.evaluator.naive_is_untrained_team
                            and getattr(probe, "max_turns", 1) == 1 and not config.resume_from_checkpoint
                            and not recipe.init_adapters
                            and {"team", "naive"} <= set(methods))
        baseline_samples = min(recipe.eval_baseline_num_samples or self.num_samples, self.num_samples)
        self.method_samples = {m: self.num_samples if m == "team" or (m == "naive" and self.reuse_naive)
                               else baseline_samples for m in methods}

    def generation_config(self):
        from trl_multiagent.command.saved_team import eval_generation_config

        return eval_generation_config(self.recipe, self.config, self.sampled)

    # ------------------------------------------------------------------------------------------------ model
    @property
    def trainer_class(self) -> type:
        """The trainer class of ``trainer:``."""
        registry = recipe_module._trainer_registry()
        if self.recipe.trainer not in registry:
            raise RecipeError(f"unknown trainer {self.recipe.trainer!r}; choose from {sorted(registry)}")
        return registry[self.recipe.trainer][1]

    def build_trainer(self, callbacks=None):
        """The trainer of ``trainer:`` (it checks the output directory and a resume checkpoint before loading)."""
        self.trainer = self.trainer_class(self.specs, self.env_factory, args=self.config, train_dataset=self.dataset,
                                          callbacks=callbacks)
        self.trainer.launch_command = self.command  # the command a signal's run_status offers to resume with
        if self.recipe.init_adapters:
            from trl_multiagent.command.warm_start import load_init_adapters

            load_init_adapters(self.trainer, self.recipe.init_adapters)
        return self.trainer

    # ------------------------------------------------------------------------------------------------ run
    def evaluate(self, stage: str, methods, pool=None) -> Any:
        """Evaluate ``methods`` at ``stage`` with the trainer's pool (or ``pool``: the evaluate command's)."""
        from trl_multiagent.evaluation import EvalProgress, evaluate_team

        config = self.config
        generation, _ = self.generation_config()
        progress = EvalProgress(enabled=not config.disable_tqdm,
                                description="held-out eval")
        samples = {m: self.method_samples[m] for m in methods}
        logger.info("Evaluating %s on %d held-out tasks (%s); samples per task: %s", ", ".join(methods),
                    len(self.tasks), stage, ", ".join(f"{m} {n}" for m, n in samples.items()))
        pool = self.trainer.pool if pool is None else pool
        result = evaluate_team(pool, self.evaluator, self.tasks, methods, samples, generation,
                               stage=stage, seed=config.seed,
                               max_batch_sequences=self.recipe.eval_max_batch_sequences or None, progress=progress)
        for method, res in result.methods.items():
            metric = self._metric({method: res})
            logger.info("%s, %s: %s = %.4f", stage, method, metric, res.mean(metric))
        return result

    def _metric(self, results) -> str:
        wanted = self.recipe.eval_metric
        have = {m for r in results.values() for m in r.metrics}
        if wanted and wanted in have:
            return wanted
        if wanted:
            logger.warning("eval_metric %r is not among the evaluation's metrics %s; using the evaluator's own",
                           wanted, sorted(have))
        return self.evaluator.headline_metric(results)

    def execute(self) -> int:
        """Evaluate before, train, evaluate after, write the results; returns the exit code (0). A run that ends on an
        exception marks its output_dir ``failed`` (``run_status.json``, with the error) and re-raises it; one that a
        signal stopped is marked ``interrupted`` by the trainer."""
        try:
            return self._execute()
        except BaseException as exc:
            if self.trainer.accelerator.is_main_process and not isinstance(exc, TrainingInterrupted):
                write_run_status(self.config.output_dir, "failed", error=one_line(exc))
            raise

    def _execute(self) -> int:
        trainer, config = self.trainer, self.config
        is_main = trainer.accelerator.is_main_process
        if "before" in self.stages_planned and is_main:
            methods = [m for m in self.methods if not (self.reuse_naive and m == "team")]
            self.stages["before"] = self.evaluate("before", methods)
            if self.reuse_naive:
                team = copy.deepcopy(self.stages["before"].methods["naive"])
                team.method = "team"
                self.stages["before"].methods = {"team": team, **self.stages["before"].methods}
        if self.trains:
            trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
        if "after" in self.stages_planned and is_main and "team" in self.methods:
            self.stages["after"] = self.evaluate("after", ["team"])
        if is_main:
            self.write(trainer.generated_samples)
        backend = trainer.pool.generation_backend
        if backend is not None and config.use_vllm and config.vllm_mode == "server":
            backend.close()  # unload this run's adapter versions from the server
        finish_distributed()
        return 0

    def write(self, generated):
        """The run's outputs; ``generated``: the samples this process generated for training (the trainer's
        :class:`~trl_multiagent.trainers.completions.GeneratedSamples`), ``summary.json``'s ``generated_samples``."""
        from trl_multiagent.evaluation import evaluation_section, write_run_outputs
        from trl_multiagent.evaluation.report import log_evaluation, task_sets_of

        run: dict[str, Any] = {
            "command": self.command,
            "wall_time_s": time.perf_counter() - self.start,
            "recipe": {k: v for k, v in self.given.items()},
            "machine": machine_record(self.trainer.pool),
        }
        if generated.per_rollout:
            run["generated_samples"] = {"total": sum(generated.per_rollout), "rollouts": len(generated.per_rollout),
                                        "completion_tokens": generated.completion_tokens,
                                        "processes": self.trainer.accelerator.num_processes}
        section = None
        if self.stages:
            _, decoding = self.generation_config()
            first = next(iter(self.stages.values()))
            metric = self._metric(first.methods)
            section = evaluation_section(
                self.stages, metric, self.evaluator.name, self.num_samples, decoding,
                baselines=self.evaluator.baselines, num_resamples=self.recipe.eval_bootstrap_resamples,
                seed=self.config.seed, extra={"team_before_is_naive": bool(self.reuse_naive),
                                              "num_samples_per_method": dict(self.method_samples)},
                task_sets=task_sets_of(self.tasks), tasks=self.tasks)
            log_evaluation(section, metric)
        path = write_run_outputs(self.config.output_dir, section, run, self.stages)
        logger.info("Wrote %s, report.md and reward_curve.png in %s", path.name, path.parent)
        return path


class _AsDataset:
    """A list of rows with the two things :func:`check_rows_fit` reads of a dataset."""

    def __init__(self, rows: list):
        self.rows = rows
        self.column_names = list(rows[0]) if rows and isinstance(rows[0], dict) else []

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        return self.rows[i]
