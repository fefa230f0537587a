"""A recipe read into ``(RecipeArguments, trainer config)``: TRL's parsing, this library's checks.

Parsing is TRL's: :class:`RecipeParser` is a :class:`trl.TrlParser` (a ``transformers.HfArgumentParser``) over
:class:`~trl_multiagent.command.recipe.RecipeArguments` and the chosen trainer's config class, so ``--help`` lists every
field with its help text and default (the recipe's value where ``--config`` names one). The trainer, and so the
config class, is read first (``--trainer`` on the command line, else ``trainer:`` in the recipe, else ``magrpo``);
``--trainer X --help`` shows X's fields. As with TRL, the YAML file sets the values, the command line overrides
them, and an ``env:`` block in the file sets environment variables. Values are then checked with messages that
name the field and where it came from (``recipe.yaml: 'learning_rate' expects a number, got 'fast'``); an unknown
key gets the closest field names as suggestions.

Every error before training (a bad value, file, environment argument, team, dataset, output directory or resume
checkpoint; a model that is not available here) ends the command with ONE line ``<prog>: error: <message>`` on
stderr and exit code 2, without a traceback (set ``TRL_MULTIAGENT_TRACEBACK=1`` to see one). Nothing is written
before these checks pass, so no earlier result is touched. An error of user code during the run
(:class:`~trl_multiagent.errors.UserCodeError`) and a fault that ends a run (:class:`~trl_multiagent.errors.RunFault`:
too many non-finite updates in a row, a non-finite adapter about to be saved, a full disk) are one such line too, with
exit code 1. SIGINT and SIGTERM during training stop it after the step in progress (saving a checkpoint of it) with
one line ``<prog>: interrupted: ...`` that says how to resume, and exit code 130 / 143
(:mod:`~trl_multiagent.trainers.signals`).

The config classes extend TRL's ``GRPOConfig``, and importing them imports torch (10-20 s). ``--help`` and the errors
of the recipe file, the trainer's name, unknown keys, value types and the recipe's own fields are answered from
:mod:`~trl_multiagent.command.recipe_fields` (every trainer's parser actions and field types, in a file) without that
import, in a fraction of a second; the errors of the config's values (``num_generations: 0``), of the environment,
the team, the data, the output directory and the model need the classes and take the import.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import logging
import sys
from collections.abc import Sequence
from typing import Any

from trl_multiagent.command import recipe_fields
from trl_multiagent.command.recipe import (
    RecipeArguments,
    _fields,
    _hints,
    _trainer_registry,
    coerce_value,
    unknown_key_message,
)
from trl_multiagent.command.recipe_files import apply_env_block, parse_recipe_text, read_recipe_file
from trl_multiagent.command.trl_names import (
    RENAMED_TRAINERS,
    check_reward_funcs,
    move_reward_funcs,
    split_argv,
    translate,
)
from trl_multiagent.errors import RecipeError

DEFAULT_TRAINER = "magrpo"
PROG = "python -m trl_multiagent"
USAGE = "%(prog)s --config RECIPE.yaml [--field value ...]"
#: Set to 1 to get the traceback of an error before training.

_DESCRIPTION = """\
Train a team of LLM agents from a YAML recipe, evaluate it on held-out tasks before and after training, and write
summary.json, report.md and reward_curve.png to output_dir. Every field below can be set in the recipe file and
overridden on the command line: --field value (true/false for flags, JSON for mappings and lists, e.g.
--agents '[{"name": "aux"}, {"name": "main"}]'). An env: mapping in the recipe sets environment variables.
TRL's names are taken where they mean the same: model_name_or_path (model), dataset_name (dataset),
dataset_train_split (dataset_split), dataset_test_split (eval_dataset_split), dtype (model_dtype), and reward_funcs
(the environment's TRL reward functions: FunctionEnvironment's reward_funcs, TRLEnvironmentTeam's reward_fns).

output_dir is never overwritten silently: a directory that holds a finished or running run is refused. Resume it
(--resume_from_checkpoint <output_dir>/checkpoint-N, or true / last for the last complete one), choose another
--output_dir, or pass --overwrite_output_dir true to replace its results."""


class _RecipeParserBase:
    """What :class:`RecipeParser` and :class:`SnapshotParser` share: the defaults shown in the help, the one-line
    errors and the reading of a command line. Each sets ``trainer``, ``field_names`` and ``shown_defaults``."""

    trainer: str
    field_names: set[str]
    shown_defaults: dict[str, Any]

    def show_file_defaults(self, values: dict[str, Any]) -> None:
        """Show the recipe's values as the defaults in ``--help``."""
        self.shown_defaults.update({k: v for k, v in values.items() if k in self.field_names})

    def format_help(self) -> str:
        shown = []
        for action in self._actions:
            if action.dest in self.shown_defaults and action.option_strings[0].startswith(f"--{action.dest}"):
                shown.append(action)
                action.default = self.shown_defaults[action.dest]
        try:
            return super().format_help()
        finally:
            for action in shown:
                action.default = argparse.SUPPRESS

    def error(self, message: str):
        raise RecipeError(f"command line: {message}")

    def parse_command_line(self, argv: Sequence[str]) -> tuple[str | None, dict[str, Any]]:
        """``(recipe path, {field: raw value})`` of what the command line gives."""
        namespace, rest = self.parse_known_args(list(argv))
        if rest:
            token = next((t for t in rest if t.startswith("-")), rest[0])
            if token.startswith("--"):
                key = token[2:].split("=", 1)[0].replace("-", "_")
                raise RecipeError(unknown_key_message(key, self.field_names | {"config"}, "command line"))
            raise RecipeError(f"command line: unexpected argument {token!r} (options look like --field value)")
        values = vars(namespace)
        return values.pop("config", None), values


def _add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="RECIPE.yaml", default=argparse.SUPPRESS,
                        help="The recipe: a YAML mapping of the fields below (the command line overrides it).")


@functools.cache
def _recipe_parser_class() -> type:
    """:class:`RecipeParser`, defined on first use: it is a ``trl.TrlParser``, and importing TRL imports torch."""
    from trl import TrlParser

    class RecipeParser(_RecipeParserBase, TrlParser):
        """TRL's parser over the recipe fields and one trainer's config fields.

        Values are kept as given (strings from the command line, YAML values from the file) and checked by
        :func:`~trl_multiagent.command.recipe.coerce_value`, so that every message names the field and its source; argparse
        supplies the help, the flags' forms (``--bf16`` alone means true, ``--no_<flag>``) and the lists' ``nargs``.
        """

        def __init__(self, trainer: str = DEFAULT_TRAINER, prog: str = f"{PROG} train"):
            registry = _trainer_registry()
            if trainer not in registry:
                raise RecipeError(_unknown_trainer(trainer, registry))
            self.trainer = trainer
            self.config_class = registry[trainer][0]
            epilog = (f"Trainers: {', '.join(sorted(registry))}; `--trainer NAME --help` lists that trainer's config "
                      f"fields (shown here: {trainer}, {self.config_class.__name__}).")
            super().__init__([RecipeArguments, self.config_class], prog=prog, usage=USAGE, description=_DESCRIPTION,
                             epilog=epilog, allow_abbrev=False, formatter_class=_HelpFormatter)
            _add_config_argument(self)
            self.field_names = set(_fields(RecipeArguments)) | set(_fields(self.config_class))
            self.shown_defaults: dict[str, Any] = {}
            for action in self._actions:
                if action.dest in self.field_names:
                    self.shown_defaults.setdefault(action.dest, action.default)
                    action.type = None  # raw values: coerce_value checks them against the field's type
                    action.required = False
                    action.default = argparse.SUPPRESS  # only what the command line gives comes back from parsing
            self.shown_defaults["output_dir"] = "outputs/<environment>"

        def _add_dataclass_arguments(self, dtype) -> None:
            """One argument group per dataclass (the recipe's, then the trainer config's)."""
            title = getattr(dtype, "_argument_group_name", None) or \
                f"{self.trainer} trainer ({dtype.__name__}): how to train"
            group = self.add_argument_group(title)
            hints = _hints(dtype)
            for f in dataclasses.fields(dtype):
                if f.init:
                    f.type = hints[f.name]
                    self._parse_dataclass_field(group, f)

        @property
        def config_hints(self) -> dict[str, Any]:
            return _hints(self.config_class)

    RecipeParser.__module__, RecipeParser.__qualname__ = __name__, "RecipeParser"
    return RecipeParser


class SnapshotParser(_RecipeParserBase, argparse.ArgumentParser):
    """:class:`RecipeParser` rebuilt from :mod:`~trl_multiagent.command.recipe_fields`' file: the same actions in the same
    groups, so the same help and the same reading of a command line, without importing the config classes."""

    def __init__(self, trainer: str, snapshot: dict[str, Any], prog: str = f"{PROG} train"):
        if trainer not in snapshot["trainers"]:
            raise RecipeError(_unknown_trainer(trainer, snapshot["trainers"]))
        entry = snapshot["parsers"][trainer]
        super().__init__(prog=prog, usage=USAGE, description=_DESCRIPTION, epilog=entry["epilog"], allow_abbrev=False,
                         formatter_class=_HelpFormatter)
        recipe_fields.add_actions(self, snapshot, trainer)
        _add_config_argument(self)
        self.trainer = trainer
        self.field_names = set(entry["field_names"])
        self.shown_defaults = dict(entry["shown_defaults"])
        self.config_hints = recipe_fields.config_hints(snapshot, trainer)


def __getattr__(name: str):
    if name == "RecipeParser":
        return _recipe_parser_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=36, width=118)


def _unknown_trainer(name: Any, registry) -> str:
    close = difflib.get_close_matches(str(name), sorted(registry), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown trainer {name!r}; choose from {sorted(registry)}{hint}"


def _trainer_on_command_line(argv: Sequence[str]) -> str | None:
    for i, token in enumerate(argv):
        if token == "--trainer":
            return argv[i + 1] if i + 1 < len(argv) else None
        if token.startswith("--trainer="):
            return token.split("=", 1)[1]
    return None


def _current_trainer_name(argv: list[str], file_values: dict[str, Any], source: str
                          ) -> tuple[list[str], dict[str, Any]]:
    """``argv`` and the recipe's values with a trainer's earlier name (:data:`RENAMED_TRAINERS`) replaced by its
    current one, each replacement warned about once."""
    def renamed(name: Any, where: str) -> Any:
        if isinstance(name, str) and name in RENAMED_TRAINERS:
            logging.getLogger(__name__).warning("%s: trainer %r is now named %r; the recipe runs under the new name",
                                                where, name, RENAMED_TRAINERS[name])
            return RENAMED_TRAINERS[name]
        return name

    argv = list(argv)
    for i, token in enumerate(argv):
        if token == "--trainer" and i + 1 < len(argv):
            argv[i + 1] = renamed(argv[i + 1], "command line")
        elif token.startswith("--trainer="):
            argv[i] = "--trainer=" + renamed(token.split("=", 1)[1], "command line")
    if "trainer" in file_values:
        file_values = {**file_values, "trainer": renamed(file_values["trainer"], source)}
    return argv, file_values


def _config_on_command_line(argv: Sequence[str]) -> str | None:
    for i, token in enumerate(argv):
        if token == "--config":
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise RecipeError("command line: --config needs the path of a recipe file")
            return argv[i + 1]
        if token.startswith("--config="):
            return token.split("=", 1)[1]
    return None


def parse_recipe(argv: Sequence[str] | None = None, yaml_text: str | None = None, prog: str = f"{PROG} train"):
    """``(RecipeArguments, trainer config, the given values)`` from a command line (and/or a YAML text).

    ``-h``/``--help`` prints the help of the chosen trainer and exits. Nothing is loaded.

    While the config classes are not imported yet, the fields' file (:mod:`~trl_multiagent.command.recipe_fields`), where it
    is current, answers ``--help`` and finds the errors it can decide (the recipe file, the trainer, unknown keys,
    value types, the recipe fields' values) without importing them; the classes are imported to build the config,
    and every check runs again there, as it always did.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "trl_multiagent.trainers" not in sys.modules:
        snapshot = recipe_fields.current()
        if snapshot is not None:
            try:
                _parse(argv, yaml_text, prog, snapshot)
            except recipe_fields.Undecided:
                pass  # a value the file cannot decide: the classes will
            except RecipeError:
                raise
            except Exception:  # noqa: BLE001 - never the recipe's fault: the classes answer instead
                logging.getLogger(__name__).debug("the recipe fields' file failed; importing the classes",
                                                  exc_info=True)
    try:
        return _parse(argv, yaml_text, prog)
    finally:  # the classes are imported now (for help and errors too): a missing or stale snapshot is written
        if "trl_multiagent.trainers" in sys.modules:
            recipe_fields.refresh(_recipe_parser_class())


def _parse(argv: list[str], yaml_text: str | None, prog: str, snapshot: dict[str, Any] | None = None):
    """:func:`parse_recipe`'s steps. With ``snapshot``, the trainers and their fields come from the fields' file, the
    environment is left alone, and it stops before building the config (returns ``None``)."""
    trainers = snapshot["trainers"] if snapshot is not None else _trainer_registry()
    wants_help = any(t in ("-h", "--help") for t in argv)
    config_path = _config_on_command_line(argv)
    source, file_values = "command line", {}
    if config_path is not None:
        source = config_path
        try:
            file_values = read_recipe_file(config_path)
        except RecipeError:
            if not wants_help:
                raise
    elif yaml_text is not None:
        source = "recipe"
        file_values = parse_recipe_text(yaml_text, source)
    if file_values.get("command") == "train-verifier":
        raise RecipeError(f"{source} is a config of the train-verifier command (command: train-verifier), not a "
                          f"training recipe: run python -m trl_multiagent train-verifier --config {source}")
    argv, file_values = _current_trainer_name(argv, file_values, source)
    trainer = _trainer_on_command_line(argv) or file_values.get("trainer") or DEFAULT_TRAINER
    if not isinstance(trainer, str) or trainer not in trainers:
        raise RecipeError(f"{'command line' if _trainer_on_command_line(argv) else source}: "
                          f"{_unknown_trainer(trainer, trainers)}")
    parser = SnapshotParser(trainer, snapshot, prog) if snapshot is not None else \
        _recipe_parser_class()(trainer, prog=prog)
    if wants_help:
        parser.show_file_defaults(file_values)
        parser.print_help()
        parser.exit(0)
    apply_env_block(file_values, source, set_variables=snapshot is None)
    argv, trl_values = split_argv(argv)  # TRL's names (trl_names.py), taken out before argparse sees them
    _, cli_values = parser.parse_command_line(argv)
    file_values, file_funcs = translate(file_values, source)
    cli_values, cli_funcs = translate({**cli_values, **trl_values}, "command line")
    funcs_source = "command line" if cli_funcs is not None else source
    reward_funcs = check_reward_funcs(cli_funcs if cli_funcs is not None else file_funcs, funcs_source) \
        if cli_funcs is not None or file_funcs is not None else None
    hints = {**parser.config_hints, **_hints(RecipeArguments)}
    merged: dict[str, Any] = {}
    for origin, values in ((source, file_values), ("command line", cli_values)):
        for key, value in values.items():
            if key not in parser.field_names:
                raise RecipeError(unknown_key_message(key, parser.field_names, origin))
            merged[key] = coerce_value(key, value, hints.get(key, Any), origin)
    recipe_fields_ = _fields(RecipeArguments)
    merged["trainer"] = trainer
    try:
        recipe = RecipeArguments(**{k: v for k, v in merged.items() if k in recipe_fields_})
    except (ValueError, TypeError) as exc:
        raise RecipeError(f"{source}: {exc}") from exc
    if snapshot is not None:
        return None
    if reward_funcs is not None:  # TRL's reward_funcs: the environment's TRL reward functions
        move_reward_funcs(recipe, reward_funcs, funcs_source)
        merged["env_kwargs"] = recipe.env_kwargs
    config_kwargs = {k: v for k, v in merged.items() if k not in recipe_fields_}
    config_kwargs.setdefault("output_dir", f"outputs/{recipe.environment}")
    try:
        config = parser.config_class(**config_kwargs)
    except (ValueError, TypeError) as exc:
        raise RecipeError(f"{source}: {exc}") from exc
    return recipe, config, merged

def _usage(prog: str) -> str:
    return (f"usage: {prog} --config RECIPE.yaml [--field value ...]\n"
            f"       {prog} --help               (every field, with its help text)\n"
            f"       {prog} --trainer NAME --help (that trainer's fields)")


def load_recipe(argv: Sequence[str] | None = None, yaml_text: str | None = None):
    """Parse a recipe into ``(RecipeArguments, trainer config)``; nothing is loaded.

    Args:
        argv: command-line arguments (``--config file.yaml --key value ...``); ``None`` reads ``sys.argv``.
        yaml_text: recipe given as a YAML string instead of ``--config``.
    """
    recipe, config, _ = parse_recipe(argv, yaml_text=yaml_text)
    return recipe, config
