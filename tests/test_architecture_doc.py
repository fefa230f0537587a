"""docs/architecture.md's "Where each algorithm lives" table works: every function it names exists in the file it
names (``file:function``, ``file:Class.method``), every test file exists and mentions that function, and every
config field is a field of some trainer config (or a recipe field). A newcomer following a row reaches real code."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "trl_multiagent"


def _table_rows() -> list[list[str]]:
    text = DOC.read_text()
    section = text.split("## Where each algorithm lives", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if line.startswith("| ") and len(cells) == 5 and cells[0] != "algorithm":
            rows.append(cells)
    return rows


ROWS = _table_rows()


def _defined_names(path: Path) -> set[str]:
    """Top-level functions and classes of a module, and ``Class.method`` for each method."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{item.name}" for item in node.body
                      if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return names


def _config_fields() -> set[str]:
    from trl_multiagent.command.recipe import RecipeArguments
    from trl_multiagent.command.verifier_recipe import VerifierTrainingConfig
    from trl_multiagent.trainers import TRAINERS

    fields = {f.name for f in dataclasses.fields(RecipeArguments)} | {f.name for f in dataclasses.fields(VerifierTrainingConfig)}
    for config_cls, _ in TRAINERS.values():
        fields |= {f.name for f in dataclasses.fields(config_cls)}
    return fields


def test_the_table_has_a_row_for_every_algorithm():
    algorithms = {row[0] for row in ROWS}
    assert {"MAGRPO", "AT-GRPO", "MHGPO", "CoLLM-CC/DC", "MAPoRL"} <= algorithms, algorithms


@pytest.mark.parametrize("row", ROWS, ids=[f"{r[0]} {r[1][:30]}" for r in ROWS])
def test_each_row_leads_to_real_functions_tests_and_fields(row):
    _, equation, functions, tests, fields = row
    named = re.findall(r"`([\w/]+\.py):([\w.]+)`", functions)
    # a bare name after a file:function in the same cell, e.g. "`credit/mhgpo.py:propagate_rewards`, `final_rewards`"
    assert named or "TRL's" in functions, (equation, functions)
    checked_names = []
    for file, name in named:
        path = PACKAGE / file
        assert path.is_file(), f"{file} (row {equation!r}) does not exist"
        assert name in _defined_names(path), f"{file} defines no {name} (row {equation!r})"
        checked_names.append(name.split(".")[-1])
    for bare in re.findall(r"(?<![:\w/.])(?<!TRL's )`(\w+)`", functions):  # TRL's own names are TRL's
        files = [PACKAGE / f for f, _ in named]
        assert any(bare in _defined_names(f) or any(n.endswith("." + bare) for n in _defined_names(f))
                   for f in files), f"{bare} is defined in none of {[str(f) for f in files]} (row {equation!r})"
    test_files = re.findall(r"`(tests/[\w/]+\.py)`", tests)
    assert test_files, (equation, tests)
    texts = []
    for test in test_files:
        path = ROOT / test
        assert path.is_file(), f"{test} (row {equation!r}) does not exist"
        texts.append(path.read_text())
    known = _config_fields()
    config_fields = [f for f in re.findall(r"`(\w+)`", fields) if f not in ("response", "grpo")]  # loss_type values
    for field in config_fields:
        assert field in known, f"config field {field!r} (row {equation!r}) is no field of a trainer or recipe config"
    # the tests named exercise the row: they call one of its functions or set one of its fields
    for name in checked_names:
        assert any(name in text or any(f in text for f in config_fields) for text in texts), \
            f"none of {test_files} mentions {name} or the fields {config_fields} (row {equation!r})"
