"""Every trainer's recipe fields, kept in a cache file, so that ``--help`` and most recipe errors need no torch.

``python -m trl_multiagent train --help`` lists the fields of :class:`~trl_multiagent.command.recipe.RecipeArguments` and of
the trainer's config class, and checking a recipe's keys and values needs their names and types. The config classes
extend TRL's ``GRPOConfig`` (a transformers ``TrainingArguments``): importing them imports torch, transformers and
peft, 10 to 20 seconds. A snapshot in the user's cache (:func:`snapshot_path`: ``$TRL_MULTIAGENT_CACHE`` or
``~/.cache/trl_multiagent``, ``recipe_fields-py<X.Y>.json``) holds what the command line reads of them, per trainer: the argparse actions of :class:`~trl_multiagent.command.recipe_parser.RecipeParser` (option strings, nargs, choices, help
texts, the defaults ``--help`` shows) and the type of every config field. With it, :func:`trl_multiagent.command.cli.
parse_recipe` prints the help, and finds the errors of a recipe's file, keys, value types and recipe fields, before
importing anything heavy; only a recipe that passes those checks, or a value the file cannot decide (a strategy name
that is not one of its enum's values, a config field's range), imports the config classes, and the checks run again
there, unchanged.

The snapshot is used only when it matches this interpreter (Python's minor version, the installed ``trl`` and
``transformers``) and this package's sources that define the fields (:data:`SOURCES` and the files of every config
class), hash by hash; otherwise everything is imported as before (the same answers, only slower), and the command
line then writes a fresh snapshot (:func:`refresh`), so the next command is fast again: nothing to regenerate by hand
after a field, the command line or a version changes. ``make install`` writes it once (by asking for
``python -m trl_multiagent train --help``). ``tests/test_cli_startup.py`` checks that the snapshot's
answers are the classes' answers.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import hashlib
import importlib.metadata
import inspect
import json
import logging
import os
import sys
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parents[1]  # trl_multiagent/
#: The package's sources every snapshot depends on, besides the files of the config classes (found at generation).
SOURCES = ("cli.py", "recipe.py", "recipe_fields.py", "trainers/__init__.py")
#: The installed distributions whose classes the fields come from.
DISTRIBUTIONS = ("trl", "transformers")
#: The attributes of an argparse action that the command line reads.
ACTION_ATTRIBUTES = ("option_strings", "dest", "nargs", "const", "choices", "required", "help", "metavar")


class Undecided(BaseException):  # noqa: N818 - not an error: "the file cannot tell; ask the classes"
    """The snapshot cannot decide this value (a type it keeps only by name): the config classes must be imported.

    A ``BaseException``, so that no ``except Exception`` on the way (:func:`~trl_multiagent.command.recipe.coerce_value`
    turns a constructor's exception into a recipe error) takes it for the value's own error."""


# ------------------------------------------------------------------------------------------------------ reading
def fingerprint(files: Sequence[str]) -> dict[str, Any]:
    """What a snapshot must match: Python's minor version, the distributions' versions and the files' hashes."""
    versions = {}
    for name in DISTRIBUTIONS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    hashes = {}
    for relative in files:
        path = PACKAGE / relative
        hashes[relative] = hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else None
    return {"python": f"{sys.version_info[0]}.{sys.version_info[1]}", "distributions": versions, "sources": hashes}


def snapshot_path() -> Path:
    """Where the snapshot lives: the trl-multiagent cache, one file per Python minor version."""
    from trl_multiagent.runtime.process import cache_dir

    return cache_dir() / f"recipe_fields-py{sys.version_info[0]}.{sys.version_info[1]}.json"


def current() -> dict[str, Any] | None:
    """The snapshot, when it exists, reads and matches this interpreter and these sources; ``None`` otherwise."""
    try:
        snapshot = json.loads(snapshot_path().read_text())
        if snapshot.get("fingerprint") != fingerprint(snapshot["files"]):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return snapshot


def add_actions(parser: argparse.ArgumentParser, snapshot: dict[str, Any], trainer: str) -> None:
    """The field actions of ``trainer``'s parser, in their groups and order, as :class:`~trl_multiagent.command.cli.
    RecipeParser` has them (their defaults ``SUPPRESS``, their values raw: ``type`` None)."""
    for group in snapshot["parsers"][trainer]["groups"]:
        container = parser.add_argument_group(group["title"])
        for key in group["actions"]:
            spec = snapshot["actions"][key]
            cls = getattr(argparse, spec["class"])
            accepted = inspect.signature(cls.__init__).parameters
            kwargs = {k: spec[k] for k in ACTION_ATTRIBUTES if k in accepted and k not in ("option_strings", "dest")}
            action = container.add_argument(*spec["option_strings"], action=cls, dest=spec["dest"],
                                            default=argparse.SUPPRESS, **kwargs)
            for name in ACTION_ATTRIBUTES:
                setattr(action, name, spec[name])
            action.type, action.default = None, argparse.SUPPRESS


def config_hints(snapshot: dict[str, Any], trainer: str) -> dict[str, Any]:
    """The type of every field of ``trainer``'s config class, rebuilt (see :func:`encode_hint`)."""
    return {name: decode_hint(code) for name, code in snapshot["parsers"][trainer]["hints"].items()}


# ------------------------------------------------------------------------------------------------------ types
def encode_hint(hint: Any) -> Any:
    """A field's type as JSON, for :func:`~trl_multiagent.command.recipe.coerce_value`: the builtins, ``Any``, unions,
    literals and lists exactly; an enum by its name and values; any other class by its name only (a value that
    would be given to it cannot be decided from the file: :class:`Undecided`)."""
    if hint is typing.Any:
        return "Any"
    if isinstance(hint, str):
        return ["annotation", hint]
    if hint is type(None):
        return "None"
    if hint in (str, int, float, bool, dict, list):
        return hint.__name__
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return ["union", [encode_hint(a) for a in args]]
    if origin is typing.Literal:
        if not all(type(a) in (str, int, float, bool, type(None)) for a in args):
            return ["opaque", str(hint), False]
        return ["literal", list(args)]
    if origin in (list, dict) and type(hint) in (types.GenericAlias, type(typing.List[int])):  # noqa: UP006
        # list[X] and typing.List[X] differ in their names, which an error message may show
        return [origin.__name__, [encode_hint(a) for a in args], type(hint) is types.GenericAlias]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        values = [m.value for m in hint]
        if all(isinstance(v, str) for v in values):
            return ["enum", hint.__name__, values, issubclass(hint, str)]
    return ["opaque", getattr(hint, "__name__", str(hint)), isinstance(hint, type) and issubclass(hint, str)]


def decode_hint(code: Any) -> Any:
    if code == "Any":
        return typing.Any
    if code == "None":
        return type(None)
    if isinstance(code, str):
        return {"str": str, "int": int, "float": float, "bool": bool, "dict": dict, "list": list}[code]
    kind, *rest = code
    if kind == "annotation":
        return rest[0]
    if kind == "union":
        return typing.Union[tuple(decode_hint(a) for a in rest[0])]  # noqa: UP007 - built from a list
    if kind == "literal":
        return typing.Literal[tuple(rest[0])]
    if kind in ("list", "dict"):
        args, builtin = tuple(decode_hint(a) for a in rest[0]), rest[1]
        generic = {"list": list, "dict": dict}[kind] if builtin else \
            {"list": typing.List, "dict": typing.Dict}[kind]  # noqa: UP006 - typing's, as the class has it
        return generic[args if len(args) > 1 else args[0]]
    if kind == "enum":
        name, values, is_str = rest
        return (_UndecidedStrEnum if is_str else _UndecidedEnum)(name, [(f"V{i}", v) for i, v in enumerate(values)])
    name, is_str = rest
    return type(name, (str,) if is_str else (), {"__new__": _undecided})


def _undecided(cls, *args, **kwargs):
    raise Undecided(f"{cls.__name__}{args!r}")


class _UndecidedEnum(enum.Enum):
    """An enum whose unknown value cannot be decided here (the real one may say it differently)."""

    @classmethod
    def _missing_(cls, value):
        raise Undecided(f"{cls.__name__}({value!r})")


class _UndecidedStrEnum(str, enum.Enum):
    @classmethod
    def _missing_(cls, value):
        raise Undecided(f"{cls.__name__}({value!r})")


# ------------------------------------------------------------------------------------------------------ writing
def snapshot_of_parsers(parser_of: Callable[[str], argparse.ArgumentParser]) -> dict[str, Any]:
    """The snapshot of every trainer's parser, from the classes themselves (imports them all); ``parser_of(trainer)``
    builds a trainer's parser (:class:`~trl_multiagent.command.recipe_parser.RecipeParser`, passed in by the command line that owns
    it)."""
    from trl_multiagent.command.recipe import RecipeArguments, _hints, _trainer_registry

    registry = _trainer_registry()
    files = set(SOURCES)
    actions: dict[str, dict[str, Any]] = {}
    parsers = {}
    for trainer in sorted(registry):
        parser = parser_of(trainer)
        groups = []
        for group in parser._action_groups:
            mine = [a for a in group._group_actions if a.dest in parser.field_names]
            if not mine:
                continue
            keys = []
            for action in mine:
                if type(action).__module__ != "argparse" or action.type is not None or \
                        action.default is not argparse.SUPPRESS:
                    raise ValueError(f"{trainer}: the action of {action.option_strings} cannot be kept in a file")
                spec = {"class": type(action).__name__,
                        **{k: _plain(getattr(action, k)) for k in ACTION_ATTRIBUTES}}
                key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
                actions[key] = spec
                keys.append(key)
            groups.append({"title": group.title, "actions": keys})
        if [a for g in parser._action_groups for a in g._group_actions if a.dest not in parser.field_names
                and a.dest not in ("help", "config")]:
            raise ValueError(f"{trainer}: the parser has actions of no field")
        hints = _hints(parser.config_class)  # after the parser is built, as parse_recipe reads them
        parsers[trainer] = {
            "config_class": parser.config_class.__name__,
            "epilog": parser.epilog,
            "groups": groups,
            "field_names": sorted(parser.field_names),
            "shown_defaults": {k: _shown(v) for k, v in parser.shown_defaults.items()},
            "hints": {name: encode_hint(hints.get(name, typing.Any))
                      for name in (f.name for f in dataclasses.fields(parser.config_class) if f.init)},
        }
        for klass in (parser.config_class, RecipeArguments):
            for base in klass.__mro__:
                source = inspect.getsourcefile(base) if base.__module__.startswith("trl_multiagent") else None
                if source:
                    files.add(Path(source).resolve().relative_to(PACKAGE).as_posix())
    json.dumps(actions)  # every value must be JSON: fail here, not when the file is read
    files = sorted(files)
    return {"fingerprint": fingerprint(files), "files": files, "trainers": sorted(registry), "actions": actions,
            "parsers": parsers}


def _plain(value: Any) -> Any:
    """An action's attribute as JSON: a tuple or a view of keys (choices) as a list; argparse only iterates them and
    tests membership."""
    if isinstance(value, (tuple, type({}.keys()), type({}.values()))):
        return list(value)
    return value


def _shown(value: Any) -> str:
    """A default as ``--help`` prints it (argparse prints a named object's ``__name__``, anything else as ``str``)."""
    return value.__name__ if hasattr(value, "__name__") else str(value)


def write(parser_of: Callable[[str], argparse.ArgumentParser], path: Path | None = None) -> Path:
    """Write a fresh snapshot (atomically: a reader never sees half of one) to ``path`` (:func:`snapshot_path`)."""
    path = snapshot_path() if path is None else path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(snapshot_of_parsers(parser_of), indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


_refreshed = False


def refresh(parser_of: Callable[[str], argparse.ArgumentParser]) -> None:
    """Write a fresh snapshot where the current one is missing or stale (after the command line imported the config
    classes anyway). A cache that cannot be written only costs speed: it is logged, never raised."""
    global _refreshed
    if _refreshed:
        return
    _refreshed = True  # once per process: the sources do not change under a running command
    if current() is not None:
        return
    try:
        write(parser_of)
    except Exception as exc:  # noqa: BLE001 - an unwritable cache must not stop the command
        logging.getLogger(__name__).info("could not write the recipe fields' snapshot to %s (%s); --help and recipe "
                                         "errors stay slow", snapshot_path(), exc)

