"""Reading a recipe file (YAML) into a mapping of fields to values, for every command that takes ``--config``
(``train``, ``train-verifier``): one clear :class:`~trl_multiagent.errors.RecipeError` for a file that is missing,
not UTF-8, not YAML, not a mapping, or that sets one key twice; and TRL's ``env:`` block."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from trl_multiagent.errors import RecipeError
from trl_multiagent.runtime.user_code import anchor_file_specs


def read_recipe_file(path: str | Path) -> dict[str, Any]:
    """The recipe file as a mapping; one clear error if it is missing, not UTF-8, not YAML, not a mapping, or sets a
    key twice.

    Its ``"path/to/file.py:name"`` values are looked up from the current directory, the recipe's folder and the
    repository root (:func:`~trl_multiagent.runtime.user_code.anchor_file_specs`)."""
    path = Path(path)
    if not path.exists():
        raise RecipeError(f"Recipe file {path} does not exist")
    if not path.is_file():
        raise RecipeError(f"Recipe file {path} is not a file")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise RecipeError(f"{path}: not UTF-8 text (line {line}: {exc.reason} at byte {exc.start}); save the recipe "
                          "as UTF-8") from exc
    values = parse_recipe_text(text, str(path))
    try:
        return anchor_file_specs(values, path)
    except FileNotFoundError as exc:
        raise RecipeError(f"{path}: {exc}") from exc


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that sets one key twice (plain YAML keeps the last value silently)."""


def _mapping_without_repeats(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            repeated = key in seen
        except TypeError:  # an unhashable key: the constructor below reports it
            continue
        if repeated:
            raise yaml.constructor.ConstructorError(
                None, None, f"the key {key!r} is set twice (lines {seen[key] + 1} and {key_node.start_mark.line + 1}); "
                f"keep one", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_repeats)


def parse_recipe_text(text: str, source: str) -> dict[str, Any]:
    """A recipe's YAML text (from ``source``, named in errors) as a mapping of field names to values."""
    try:
        loaded = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise RecipeError(f"{source}: not valid YAML{where}: {problem}") from exc
    if loaded is None:
        raise RecipeError(f"{source}: the recipe is empty; it is a YAML mapping of fields to values")
    if not isinstance(loaded, dict):
        raise RecipeError(f"{source}: a recipe is a YAML mapping of fields to values, got {type(loaded).__name__}")
    bad = [k for k in loaded if not isinstance(k, str)]
    if bad:
        raise RecipeError(f"{source}: every key must be a field name, got {bad[0]!r}")
    return loaded


def apply_env_block(values: dict[str, Any], source: str, set_variables: bool = True) -> None:
    """TRL's ``env:`` block: a mapping of environment variables set before anything else (removed from values;
    ``set_variables=False`` only checks it)."""
    env = values.pop("env", None)
    if env is None:
        return
    if not isinstance(env, dict) or not all(isinstance(v, (str, int, float, bool)) for v in env.values()):
        raise RecipeError(f"{source}: 'env' must be a mapping of environment variables to plain values")
    if not set_variables:
        return
    for key, value in env.items():
        os.environ[str(key)] = str(value)
