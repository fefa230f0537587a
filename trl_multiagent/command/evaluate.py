"""``python -m trl_multiagent evaluate --team <output_dir>``: a saved team on held-out tasks of one's choosing.

    python -m trl_multiagent evaluate --team outputs/demo --eval_dataset_split my_problems.jsonl --group_by form

The team's run recorded its recipe in ``summary.json``; the evaluation reuses it (``--config`` names another recipe
file), so the environment, the turn budget and the decoding settings of the held-out evaluation
(``eval_max_new_tokens``, greedy or sampled, ``eval_num_samples``, the seed) are the training run's unless the
command line overrides a field (``--eval_max_new_tokens 64``, any recipe field, as ``train`` takes them). The
held-out tasks are those of the recipe's evaluation, or ``--eval_dataset_split``: a data file (every row of it,
unless ``--eval_num_problems`` says otherwise), a split of the recipe's hub dataset, or a generated split.

The methods, each paired with the others task by task (``--methods``, comma-separated; default: the recipe's
``eval_methods`` and the trained twin of every agent alone among them):

* ``team``: the saved team with its trained adapters ("after training"), and the untrained team: the same agents with
  every adapter off ("before training": a fresh LoRA adapter computes nothing, so the untrained team IS its bases);
* the recipe's baselines (``<agent>_alone``: each agent's base answering alone, ``no_exchange``, the coding
  baselines, ...), untrained, as the train command plays them before training;
* ``<agent>_alone_trained``: each agent with its trained adapter, playing alone (``alone_trained`` names all of them;
  :mod:`.alone`), after training. Training a team may make a member better alone, or only better in the exchange.

``--adapter POLICY=DIR`` (repeatable) takes one policy's trained adapter from another saved team: agents trained
apart, then put together (AT-GRPO's Table 4 ablation: each agent trained with its partner frozen, ``frozen_policies``,
then evaluated side by side). ``--adapter POLICY=SOURCE@DIR`` takes the adapter of the policy ``SOURCE`` of that team
instead; with ``--team``'s own folder as DIR, ``--adapter reasoner=tool@T --adapter tool=reasoner@T`` plays a team of
role-specific policies with the two policies swapped (Table 4's last row). The adapter must fit the policy (same base
model and LoRA shape); ``summary.json`` records where each came from (``adapters_from``).

Written to ``--output_dir`` (default ``<team>/eval-<held-out name>``) as the train command writes its results
(:func:`~trl_multiagent.evaluation.report.write_run_outputs`): ``summary.json`` (the ``evaluation`` section with
paired intervals, gains and the best baseline, the recipe as used, the command), ``report.md``,
``eval_per_task.jsonl`` (every method's values per task, and the team's per turn: ``turn1/team_correct``, ...) and
the texts. Held-out tasks that name their ``held_out_set`` are reported set by set, and ``--group_by COLUMN`` adds a
table per value of that column of the held-out rows (``groups`` in the summary).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from trl_multiagent.errors import (
    TRACEBACK_ENV,
    RecipeError,
    UserCodeError,
    fail_command,
    one_line,
    pre_training_errors,
)

logger = logging.getLogger(__name__)

#: The key of an evaluate command's ``summary.json`` that names the team it evaluated.
EVALUATED_TEAM = "evaluated_team"
#: What the two stages of this evaluation are, recorded in the summary and shown in the report.
STAGE_MEANING = {"before": "the untrained team: every adapter off (the bases; a fresh LoRA adapter computes nothing)",
                 "after": "the saved team: its trained adapters on"}


class AdaptersOff:
    """A pool that answers every generation request with the adapters off: the untrained team. The rest of the pool
    is the pool's own (an attribute it lacks is looked up there)."""

    def __init__(self, pool):
        self.pool = pool

    def adapters_are_identity(self) -> bool:
        return True  # on and off are one distribution here: the baselines share the team's draws, as before training

    def generate_many(self, requests, generation_config, max_batch_sequences=None, progress=None):
        off = [dataclasses.replace(r, use_adapter=False) for r in requests]
        more = {"progress": progress} if progress is not None else {}  # a pool without progress is served too
        return self.pool.generate_many(off, generation_config, max_batch_sequences=max_batch_sequences, **more)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise RecipeError(f"command line: {message}")


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter,
                     epilog="Any other recipe field overrides the saved recipe's as in `train` (--field value), e.g. "
                            "--eval_num_problems 40,\n--eval_max_new_tokens 64, --eval_temperature 0.7 "
                            "--eval_num_samples 4, --evaluator NAME.\n`python -m trl_multiagent train --help` lists "
                            "them all.")
    parser.add_argument("--team", required=True, metavar="DIR",
                        help="the output_dir of a training run (adapters/ and summary.json), or a checkpoint-N folder")
    parser.add_argument("--config", metavar="RECIPE.yaml", default=None,
                        help="the recipe to evaluate with (default: the one the run recorded in summary.json)")
    parser.add_argument("--eval_dataset_split", metavar="FILE_OR_SPLIT", default=None,
                        help="the held-out tasks: a .jsonl/.json/.csv/.parquet file (all its rows unless "
                             "--eval_num_problems\nsays otherwise), a split of the recipe's hub dataset, or "
                             "'generated' (default: the recipe's)")
    parser.add_argument("--methods", nargs="+", default=None, metavar="M",
                        help="comma-separated: team, the baselines (<agent>_alone, alone, no_exchange, ...), "
                             "<agent>_alone_trained,\nalone_trained (default: the recipe's eval_methods and the "
                             "trained twin of each agent alone)")
    parser.add_argument("--group_by", action="append", default=None, metavar="COLUMN",
                        help="a column of the held-out rows: one table per value of it (may be given several times)")
    parser.add_argument("--output_dir", default=None, metavar="DIR",
                        help="where the results go (default: <team>/eval-<name of the held-out tasks>)")
    parser.add_argument("--adapter", action="append", default=None, metavar="POLICY=[SOURCE@]DIR",
                        help="take POLICY's adapter from the saved team in DIR instead of --team's (may be given once "
                             "per policy):\nagents trained apart, evaluated together; SOURCE@: that team's adapter of "
                             "the policy SOURCE\n(policies swapped between roles)")
    return parser


def main(argv=None, prog: str = "python -m trl_multiagent evaluate") -> int:
    """The command (see the module docstring); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    if any(a in ("-h", "--help") for a in argv):
        parser.print_help()
        return 0
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    start = time.perf_counter()
    try:
        args, overrides = parser.parse_known_args(argv)
        if args.eval_dataset_split is not None:
            overrides += ["--eval_dataset_split", args.eval_dataset_split]
            if not any(a.split("=", 1)[0] == "--eval_num_problems" for a in overrides):
                overrides += ["--eval_num_problems", "0"]  # a held-out file of one's own: all of it
        job = plan(args, overrides, " ".join([prog, *argv]), prog)
        from trl_multiagent.command.saved_team import load_pool

        pool = load_pool(job["folder"], job["run"].config)
        for policy, folder in job["adapters_from"].items():
            if folder != str(job["folder"]):
                load_policy_adapter(pool, policy, folder)
    except pre_training_errors() as exc:
        return fail_command(prog, exc)
    try:
        stages = evaluate(job, pool)
    except UserCodeError as exc:
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return 1
    write(job, pool, stages, time.perf_counter() - start)
    return 0


def plan(args, overrides: list[str], command: str, prog: str = "evaluate") -> dict[str, Any]:
    """Everything but the model: the recipe, the held-out tasks, the evaluator, the methods and samples, the groups and
    the output directory (each problem one :class:`RecipeError`)."""
    from trl_multiagent.command.recipe import environment_factory
    from trl_multiagent.command.runner import Run
    from trl_multiagent.command.saved_team import check_team_fits, read_saved_recipe
    from trl_multiagent.evaluation.report import task_groups

    recipe, config, given, folder = read_saved_recipe(args.team, args.config, overrides, prog=prog)
    if recipe.evaluator == "none":
        raise RecipeError("the recipe says evaluator: none; pass --evaluator auto (or the evaluator's name)")
    asked = [m for item in (args.methods or []) for m in item.split(",") if m]
    recipe.eval_stages = ["before", "after"]
    run = Run(recipe, config, given, command)
    run.env_cls, run.env_factory, probe = environment_factory(recipe)
    check_team_fits(folder, probe.agents)
    run._plan_evaluation(probe)
    if run.evaluator is None:
        raise RecipeError(f"{run.env_cls.__name__} has no held-out tasks of its own: give them with "
                          "--eval_dataset_split FILE (and --evaluator NAME)")
    evaluator = run.evaluator
    methods = evaluator.resolve_methods(asked) if asked else \
        [*run.methods, *(t for t, m in evaluator.trained_alone.items() if m in run.methods)]
    known = [*evaluator.methods, *evaluator.trained_alone]
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise RecipeError(f"--methods: the {evaluator.name} evaluation has the methods {known}, not {unknown}")
    baseline_samples = min(recipe.eval_baseline_num_samples or run.num_samples, run.num_samples)
    run.method_samples = {m: run.num_samples if m == "team" else baseline_samples for m in methods}
    run.reuse_naive = False
    groups = {column: task_groups(run.tasks, column) for column in args.group_by or []}
    out = Path(args.output_dir) if args.output_dir else folder / f"eval-{_held_out_name(recipe)}"
    check_evaluation_dir(out, folder)
    adapters_from = adapter_sources(folder, args.adapter or [])
    return {"run": run, "folder": folder, "methods": methods, "groups": groups, "output_dir": out,
            "adapters_from": adapters_from}


def split_adapter_source(value: str) -> tuple[str | None, str]:
    """``"SOURCE@DIR"`` -> ``("SOURCE", "DIR")``; a plain ``"DIR"`` -> ``(None, "DIR")`` (a policy name holds no
    ``/``, so a folder with ``@`` in its own path is left whole)."""
    source, sep, rest = value.partition("@")
    if sep and source and rest and "/" not in source and os.sep not in source:
        return source, rest
    return None, value


def adapter_sources(folder: Path, given: list[str]) -> dict[str, str]:
    """Policy -> the saved team whose adapter it takes: ``folder`` unless ``--adapter POLICY=[SOURCE@]DIR`` names
    another (or another policy of it, ``"SOURCE@DIR"``), whose saved agent of that policy must fit (same base model
    and LoRA shape); each problem one :class:`RecipeError`."""
    from trl_multiagent.command.saved_team import TEAM_FILE, find_saved_team
    from trl_multiagent.command.warm_start import FITTING_FIELDS
    from trl_multiagent.team.pool import AgentSpec

    def policies(team: Path) -> dict[str, AgentSpec]:
        specs = [AgentSpec(**a) for a in json.loads((team / TEAM_FILE).read_text())["agents"]]
        return {s.policy: s for s in specs}

    mine = policies(folder)
    sources = dict.fromkeys(mine, str(folder))
    for item in given:
        policy, sep, path = item.partition("=")
        if not sep or not policy or not path:
            raise RecipeError(f"--adapter {item!r}: give POLICY=DIR, e.g. --adapter tool=outputs/tool_trained")
        if policy not in mine:
            raise RecipeError(f"--adapter {item!r}: the team has the policies {sorted(mine)}, not {policy!r}")
        source, path = split_adapter_source(path)
        other, _ = find_saved_team(path)
        theirs = policies(other).get(source or policy)
        if theirs is None:
            raise RecipeError(f"--adapter {item!r}: the team saved in {str(other)!r} has no policy "
                              f"{source or policy!r}")
        differ = [f for f in FITTING_FIELDS if f != "policy" and getattr(theirs, f) != getattr(mine[policy], f)]
        if differ:
            mine_name = f" {policy!r}" if source not in (None, policy) else ""
            raise RecipeError(f"--adapter {item!r}: its {source or policy!r} differs from the team's{mine_name} in "
                              f"{differ}")
        sources[policy] = str(other) if source in (None, policy) else f"{source}@{other}"
    return sources


def load_policy_adapter(pool, policy: str, folder: str) -> None:
    """Replace ``policy``'s adapter in ``pool`` by the one saved in ``folder`` (``"SOURCE@DIR"``: the adapter of the
    policy SOURCE saved in DIR), as checked by :func:`adapter_sources`."""
    source, directory = split_adapter_source(folder)
    pool.load_adapters(directory, only=[policy], source=source)
    logger.info("policy %s: the adapter of %s", policy, folder)


def _held_out_name(recipe) -> str:
    split = recipe.eval_dataset_split
    if not split:
        return "held_out"
    return Path(split).stem if Path(split).suffix else split.replace("/", "_")


def check_evaluation_dir(out: Path, folder: Path) -> None:
    """The results never land on a training run's: ``out`` may be new or an earlier evaluation's (replaced)."""
    if out.exists() and not out.is_dir():
        raise RecipeError(f"--output_dir {str(out)!r} is an existing file; choose another")
    if out.resolve() == folder.resolve() or (out / "adapters").exists() or (out / "run_status.json").exists():
        raise RecipeError(f"--output_dir {str(out)!r} holds a training run's results, which an evaluation must not "
                          "replace; choose another --output_dir")
    summary = out / "summary.json"
    if summary.is_file():
        try:
            earlier = json.loads(summary.read_text())
        except ValueError:
            earlier = {}
        if EVALUATED_TEAM not in earlier:
            raise RecipeError(f"--output_dir {str(out)!r} holds another summary.json; choose another --output_dir")
        logger.info("%s holds an earlier evaluation; it is replaced", out)
        summary.unlink()


def evaluate(job: dict[str, Any], pool) -> dict[str, Any]:
    """The untrained methods with the adapters off (stage ``before``), the trained team and trained agents alone with
    them on (``after``)."""
    run, methods = job["run"], job["methods"]
    trained = run.evaluator.trained_alone
    stages: dict[str, Any] = {}
    untrained = [m for m in methods if m not in trained]
    after = [m for m in methods if m == "team" or m in trained]
    if untrained:
        logger.info("Untrained (%s): %s", STAGE_MEANING["before"], ", ".join(untrained))
        stages["before"] = run.evaluate("before", untrained, pool=AdaptersOff(pool))
    if after:
        logger.info("Trained (%s): %s", STAGE_MEANING["after"], ", ".join(after))
        stages["after"] = run.evaluate("after", after, pool=pool)
    return stages


def write(job: dict[str, Any], pool, stages: dict[str, Any], wall_time_s: float) -> Path:
    """``summary.json``, ``report.md``, ``eval_per_task.jsonl`` and the texts, as the train command writes them."""
    from trl_multiagent.evaluation import evaluation_section, write_run_outputs
    from trl_multiagent.evaluation.report import log_evaluation, task_sets_of
    from trl_multiagent.runtime.provenance import machine_record

    run = job["run"]
    _, decoding = run.generation_config()
    metric = run._metric(next(iter(stages.values())).methods)
    section = evaluation_section(
        stages, metric, run.evaluator.name, run.num_samples, decoding, baselines=run.evaluator.baselines,
        num_resamples=run.recipe.eval_bootstrap_resamples, seed=run.config.seed,
        extra={"stage_meaning": {s: STAGE_MEANING[s] for s in stages},
               "num_samples_per_method": dict(run.method_samples)},
        task_sets=task_sets_of(run.tasks), tasks=run.tasks, groups=job["groups"])
    record = {"command": run.command, "wall_time_s": wall_time_s, EVALUATED_TEAM: str(job["folder"]),
              "recipe": dict(run.given), "machine": machine_record(pool),
              "adapters_from": job.get("adapters_from", {})}
    path = write_run_outputs(job["output_dir"], section, record, stages)
    log_evaluation(section, metric, before="untrained", after="trained")
    logger.info("Wrote %s, report.md and eval_per_task.jsonl in %s", path.name, path.parent)
    return path
