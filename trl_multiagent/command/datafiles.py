"""Checks of the local data files a recipe names (``dataset:`` or ``eval_dataset_split:``), before anything loads.

A file that does not exist, is empty, is not UTF-8, holds a malformed line (named by its number), has only a CSV
header, rows that are not objects, or a column whose values change type from one row to the next is reported as one
:class:`~trl_multiagent.command.recipe.RecipeError` naming the file and, where there is one, the line.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from trl_multiagent.errors import RecipeError

#: Suffixes of the local data files a recipe's ``dataset`` may name.
DATA_FILE_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet")


def _error(message: str):
    return RecipeError(message)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def check_data_file(path: str | Path) -> int:
    """Check a local data file (see the module docstring); returns its number of rows."""
    path = Path(path)
    if path.suffix not in DATA_FILE_SUFFIXES:
        raise _error(f"dataset file {path}: unsupported suffix {path.suffix!r}; use one of {DATA_FILE_SUFFIXES}")
    if not path.exists():
        raise _error(f"Dataset file {path} does not exist")
    if not path.is_file():
        raise _error(f"Dataset file {path} is not a file")
    if path.suffix == ".parquet":
        return _check_parquet(path)
    raw = path.read_bytes()
    if not raw.strip():
        raise _error(f"dataset file {path} is empty")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise _error(f"dataset file {path}, line {line}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    rows = _csv_rows(path, text) if path.suffix == ".csv" else _json_rows(path, text)
    _check_types(path, rows, line_numbers=path.suffix != ".json" or (_is_json_lines(text) and "\n" in text.strip()))
    return len(rows)


def _is_json_lines(text: str) -> bool:
    return not text.lstrip().startswith("[")


def _json_rows(path: Path, text: str) -> list[tuple[int, dict]]:
    """``(line number, row)`` of a JSON-lines file; a ``.json`` file may also hold one array of row objects or one
    mapping of columns (lists of equal length)."""
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            if not _is_json_lines(text) or "\n" not in text.strip():
                raise _error(f"dataset file {path}, line {exc.lineno}: not valid JSON ({exc.msg})") from exc
            data = None  # several lines: JSON lines, checked line by line below
        if isinstance(data, list):
            if not data:
                raise _error(f"dataset file {path} holds no rows (an empty array)")
            for i, row in enumerate(data):
                if not isinstance(row, dict):
                    raise _error(f"dataset file {path}: row {i} is {_kind(row)}, not an object of column values")
            return list(enumerate(data))
        if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
            lengths = {len(v) for v in data.values()}
            if len(lengths) != 1 or 0 in lengths:
                raise _error(f"dataset file {path}: a mapping of columns needs lists of one non-zero length, got "
                             f"lengths {sorted(lengths)}")
            columns = list(data)
            return [(i, {c: data[c][i] for c in columns}) for i in range(lengths.pop())]
        if isinstance(data, dict):
            return [(1, data)]  # one row
        if data is not None:
            raise _error(f"dataset file {path}: expected a JSON array of row objects, a mapping of columns or one "
                         f"object per line, got {_kind(data)}")
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _error(f"dataset file {path}, line {number}: not valid JSON ({exc.msg})") from exc
        if not isinstance(row, dict):
            raise _error(f"dataset file {path}, line {number}: expected one JSON object per line (a row), got "
                         f"{_kind(row)}")
        rows.append((number, row))
    if not rows:
        raise _error(f"dataset file {path} holds no rows")
    return rows


def _csv_rows(path: Path, text: str) -> list[tuple[int, dict]]:
    reader = csv.reader(io.StringIO(text))
    try:
        lines = [(reader.line_num, row) for row in reader]
    except csv.Error as exc:
        raise _error(f"dataset file {path}, line {reader.line_num}: malformed CSV ({exc})") from exc
    lines = [(n, row) for n, row in lines if any(cell.strip() for cell in row)]
    header_line, header = lines[0]
    if len(set(header)) != len(header) or not all(h.strip() for h in header):
        raise _error(f"dataset file {path}, line {header_line}: the header needs distinct, non-empty column names, "
                     f"got {header}")
    if len(lines) == 1:
        raise _error(f"dataset file {path} has only a header (columns {', '.join(header)}) and no rows")
    rows = []
    for number, row in lines[1:]:
        if len(row) != len(header):
            raise _error(f"dataset file {path}, line {number}: {len(row)} fields, but the header has {len(header)} "
                         f"({', '.join(header)})")
        rows.append((number, dict(zip(header, row))))
    return rows


def _check_types(path: Path, rows: list[tuple[int, dict]], line_numbers: bool) -> None:
    """Every column keeps one kind of value (nulls aside) across the rows."""
    where = "line" if line_numbers else "row"
    seen: dict[str, tuple[str, int]] = {}
    for number, row in rows:
        for column, value in row.items():
            kind = _kind(value)
            if kind == "null":
                continue
            first = seen.setdefault(column, (kind, number))
            if first[0] != kind:
                raise _error(f"dataset file {path}, {where} {number}: column {column!r} holds {kind}, but {where} "
                             f"{first[1]} holds {first[0]}; every row needs the same type in a column")


def _check_parquet(path: Path) -> int:
    try:
        import pyarrow.parquet as pq

        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a damaged file
        raise _error(f"dataset file {path} is not a readable Parquet file ({type(exc).__name__}: {exc})") from exc
    if table.num_rows == 0:
        raise _error(f"dataset file {path} holds no rows")
    return table.num_rows
