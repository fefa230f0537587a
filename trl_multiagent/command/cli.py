"""The command line: ``python -m trl_multiagent train --config recipe.yaml [--field value ...]`` and the commands
beside it (``evaluate``, ``train-single``, ``train-verifier``, ``push``; :data:`COMMANDS`). Reading a recipe, with
its one-line errors before anything loads, is :mod:`trl_multiagent.command.recipe_parser`'s.
"""

from __future__ import annotations

import difflib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from trl_multiagent.command.recipe_parser import PROG, _usage, load_recipe, parse_recipe  # noqa: F401 (re-exported)
from trl_multiagent.errors import (
    TRACEBACK_ENV,
    RecipeError,
    RunFault,
    UserCodeError,
    fail_command,
    one_line,
    pre_training_errors,
)

logger = logging.getLogger(__name__)


def __getattr__(name: str):
    if name == "RecipeParser":  # built on first use: it is a trl.TrlParser, and importing TRL imports torch
        from trl_multiagent.command.recipe_parser import RecipeParser

        return RecipeParser
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# ------------------------------------------------------------------------------------------------------ commands


def _launcher(script: str | None) -> str:
    """How this process was started, for the record in ``summary.json``."""
    if "ACCELERATE_DYNAMO_BACKEND" in os.environ or "ACCELERATE_MIXED_PRECISION" in os.environ:
        launcher = "accelerate launch"
    elif "TORCHELASTIC_RUN_ID" in os.environ:
        launcher = "torchrun"
    else:
        launcher = "python"
    target = script if script else "-m trl_multiagent train"
    return f"{launcher} {target}"




def train_command(argv: Sequence[str], prog: str = f"{PROG} train", script: str | None = None,
                  expect: dict[str, str] | None = None) -> int:
    """Parse, build, evaluate before, train, evaluate after, write the results; returns the exit code.

    ``expect`` (e.g. ``{"trainer": "mhgpo"}``) holds recipe values a recipe script insists on.
    """
    argv = list(argv)
    if not argv:
        print(_usage(prog), file=sys.stderr)
        print(f"{prog}: error: no recipe given: pass --config RECIPE.yaml (and --field value overrides)",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        recipe, config, given = parse_recipe(argv, prog=prog)
        for key, wanted in (expect or {}).items():
            if getattr(recipe, key) != wanted:
                raise RecipeError(f"{script or prog} runs {key} {wanted!r}, the recipe names {getattr(recipe, key)!r}"
                                  f"; use `{PROG} train` for any recipe")
        from trl_multiagent.command.runner import Run

        command = " ".join([_launcher(script), *argv])
        run = Run(recipe, config, given, command=command)
        run.prepare()
        run.build_trainer()
    except pre_training_errors() as exc:
        return fail_command(prog, exc)
    try:
        return run.execute()
    except (UserCodeError, RunFault) as exc:  # the run's status says failed, with this message
        # user code: the message names the task, turn, agents and frame; a fault of the run (non-finite updates or
        # adapters): what went wrong where, and the way on
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        fault = isinstance(exc, RunFault)  # a signal: "interrupted", 128 + its number
        print(f"{prog}: {exc.label if fault else 'error'}: {one_line(exc)}", file=sys.stderr)
        return exc.exit_code if fault else 1


def run_recipe_script(argv: Sequence[str] | None, script: str, expect: dict[str, str] | None = None) -> int:
    """The body of every ``recipes/<name>.py``: :func:`train_command` under the script's name."""
    argv = sys.argv[1:] if argv is None else list(argv)
    name = os.path.relpath(script) if Path(script).is_absolute() else script
    if name.startswith(".."):
        name = Path(script).name
    return train_command(argv, prog=name, script=name, expect=expect)


COMMANDS = {"train": "train a team from a recipe (evaluating it before and after, as the recipe says)",
            "evaluate": "evaluate a saved team (trained and untrained, each agent alone) on any held-out tasks with "
                        "its recipe's settings (trl_multiagent/command/evaluate.py)",
            "train-verifier": "sample, balance and train MAPoRL's learned verifier (App. E), save it and evaluate it "
                              "on held-out solutions (trl_multiagent/command/train_verifier.py)",
            "train-single": "train each agent of a finished team run alone with TRL's GRPOTrainer on the team's "
                            "budget and compare it with the team on the held-out tasks, paired by task "
                            "(trl_multiagent/command/train_single.py)",
            "push": "send a saved team (its model card, adapters and results) to the Hugging Face Hub "
                    "(trl_multiagent/command/hub.py)"}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trl_multiagent <command> ...``"""
    argv = list(sys.argv[1:] if argv is None else argv)
    listing = "\n".join(f"  {name:14s} {text}" for name, text in COMMANDS.items())
    top = (f"usage: {PROG} <command> [--config RECIPE.yaml] [--field value ...]\n\ncommands:\n{listing}\n\n"
           f"`{PROG} train --help` lists every field of a recipe; `{PROG} train-verifier --help` every field of a "
           f"verifier recipe; `{PROG} evaluate --help` the options of an evaluation of a saved team.")
    if not argv:
        print(top, file=sys.stderr)
        print(f"{PROG}: error: no command given", file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(top)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "train":
        return train_command(rest, prog=f"{PROG} train")
    if command == "train-verifier":
        from trl_multiagent.command.train_verifier import train_verifier_command

        return train_verifier_command(rest, prog=f"{PROG} train-verifier")
    if command == "train-single":
        from trl_multiagent.command.train_single import main as train_single

        return train_single(rest, prog=f"{PROG} train-single")
    if command == "evaluate":
        from trl_multiagent.command.evaluate import main as evaluate_saved_team

        return evaluate_saved_team(rest, prog=f"{PROG} evaluate")
    if command == "push":
        from trl_multiagent.command.hub import main as push

        return push(rest, prog=f"{PROG} push")
    close = difflib.get_close_matches(command, sorted(COMMANDS), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    hint += " (recipe options follow the command: train --config RECIPE.yaml)" if command.startswith("-") else ""
    print(top, file=sys.stderr)
    print(f"{PROG}: error: unknown command {command!r}{hint}", file=sys.stderr)
    return 2


def console_main() -> int:
    """The ``trl-multiagent`` console script (pyproject.toml ``[project.scripts]``): :func:`main`, with messages under
    that name; the same commands as ``python -m trl_multiagent``."""
    global PROG
    PROG = "trl-multiagent"
    return main()
