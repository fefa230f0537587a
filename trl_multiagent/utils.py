"""Small helpers shared across the package."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
import threading
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

#: ``"path/to/file.py:name"``: a Python file (loaded by its path) and a name in it; the colon before the name is the
#: last one of the string.
_FILE_SPEC = re.compile(r"^(?P<path>.+\.py):(?P<name>[A-Za-z_]\w*)$")
_FILE_MODULES: dict[Path, ModuleType] = {}
_FILE_LOCK = threading.RLock()


def import_object(spec: str | Callable, what: str = "object") -> Any:
    """The object a spec names; a callable passes through unchanged.

    * ``"package.module:name"``: ``name`` of an importable module.
    * ``"path/to/file.py:name"``: ``name`` of a Python file, loaded by its path (a relative path from the current
      directory; a recipe file's values are made findable from its folder first, see :func:`anchor_file_specs`).
      The file is loaded once per process, as a module of its own with a name no other file gets; it is not put on
      ``sys.path``, so it imports installed packages (``trl_multiagent`` among them), not the files beside it.

    Raises ``ImportError`` naming the spec: a missing module or file, a missing name (with the names the file
    defines), or a file whose own code fails (the last line of its traceback and the line of the file).
    """
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"{what} must be 'package.module:name', 'path/to/file.py:name' or a callable, got {spec!r}")
    match = _FILE_SPEC.match(spec)
    if match is not None:
        return _file_object(Path(match["path"]), match["name"], spec, what)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{what} {spec!r} must look like 'package.module:name' or 'path/to/file.py:name'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ImportError(
            f"Cannot import {what} {spec!r}: {exc}. Name an importable module (e.g. "
            "'trl_multiagent.environments.coding:LLMAdvisor'), a Python file (e.g. 'rewards/writing.py:tldr_reward') "
            "or pass a callable."
        ) from exc


def _file_object(path: Path, name: str, spec: str, what: str) -> Any:
    module = load_file_module(path, what=f"{what} {spec!r}")
    try:
        return getattr(module, name)
    except AttributeError:
        defined = sorted(k for k, v in vars(module).items()
                         if not k.startswith("_") and callable(v) and getattr(v, "__module__", None) == module.__name__)
        raise ImportError(f"Cannot import {what} {spec!r}: {path} defines no {name!r} (it defines: "
                          f"{', '.join(defined) or 'nothing callable'})") from None


def load_file_module(path: str | Path, what: str = "file") -> ModuleType:
    """The Python file at ``path`` (relative: from the current directory) as a module, loaded once per process."""
    path = Path(path).expanduser()
    resolved = (path if path.is_absolute() else Path.cwd() / path).resolve()
    with _FILE_LOCK:
        if resolved in _FILE_MODULES:
            return _FILE_MODULES[resolved]
        if not resolved.is_file():
            raise ImportError(f"Cannot import {what}: no file {path} (looked for {resolved})")
        digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:12]
        stem = re.sub(r"\W", "_", resolved.stem)
        module_name = f"_trl_multiagent_file_{stem}_{digest}"
        loader_spec = importlib.util.spec_from_file_location(module_name, resolved)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module  # dataclasses and pickling look a module up by name
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == resolved]
            line = f", line {frames[-1].lineno}" if frames else ""
            if isinstance(exc, SyntaxError) and exc.lineno:
                line = f", line {exc.lineno}"
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            raise ImportError(f"Cannot import {what}: {path} fails to import ({resolved.name}{line}: {last})") from exc
        _FILE_MODULES[resolved] = module
        return module


def repository_root(start: str | Path) -> Path | None:
    """The nearest folder at or above ``start`` that holds ``pyproject.toml`` or ``.git`` (``None`` if none)."""
    start = Path(start).resolve()
    for folder in (start, *start.parents):
        if (folder / "pyproject.toml").is_file() or (folder / ".git").exists():
            return folder
    return None


def anchor_file_specs(values: Any, recipe_file: str | Path) -> Any:
    """``values`` of a recipe file with each relative ``"path/to/file.py:name"`` made findable wherever the run starts.

    A relative path is looked up, in order, from the current directory (as every other path of a recipe, e.g. a
    dataset file), from the recipe file's folder, then from the root of the repository that holds the recipe
    (the nearest folder above it with ``pyproject.toml`` or ``.git``). The first folder where the file exists wins;
    a path found only from the recipe's folder or the repository root is rewritten as an absolute path. A path found
    nowhere raises ``FileNotFoundError`` naming the folders searched. Strings nested in mappings and lists
    (``env_kwargs``) are visited too; everything else is returned as it is.
    """
    recipe_folder = Path(recipe_file).resolve().parent
    folders = _unique([Path.cwd(), recipe_folder, repository_root(recipe_folder)])

    def anchor(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: anchor(v) for k, v in value.items()}
        if isinstance(value, list):
            return [anchor(v) for v in value]
        match = _FILE_SPEC.match(value) if isinstance(value, str) else None
        if match is None or Path(match["path"]).expanduser().is_absolute():
            return value
        relative = Path(match["path"])
        for folder in folders:
            if (folder / relative).is_file():
                return value if folder == folders[0] else f"{(folder / relative).resolve()}:{match['name']}"
        raise FileNotFoundError(f"{value!r}: no file {relative} in {', '.join(str(f) for f in folders)} (the current "
                                "directory, the recipe's folder and its repository root)")

    return anchor(values)


def _unique(folders: Iterable[Path | None]) -> list[Path]:
    out: list[Path] = []
    for folder in folders:
        if folder is not None and folder.resolve() not in out:
            out.append(folder.resolve())
    return out


def release_freed_memory() -> None:
    """Return freed heap memory to the OS (glibc ``malloc_trim``) on CPU.

    Between policies the update frees large activation buffers while small, long-lived tensors (each policy's
    gradients and optimizer state, created lazily) land between them; glibc then keeps the freed space, and the
    resident memory of a team grows with its number of policies although the live tensors do not. Trimming after
    each policy's backward pass keeps a team on one shared base close to one agent's footprint (``make bench``).
    It is an action, not a setting: no allocator behaviour changes for the rest of the process.
    """
    import torch

    if torch.cuda.is_available():
        return
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _libc():
    import ctypes
    import ctypes.util
    import platform

    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _malloc_trim():
    libc = _libc()
    return getattr(libc, "malloc_trim", None) if libc is not None else None


def total_memory(device) -> int:
    """Bytes of memory ``device`` has in all (a fixed property of the machine, unlike the memory free at a given moment)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    import psutil

    return int(psutil.virtual_memory().total)


def progress_bar(label: str, unit: str, *extra_columns, **kwargs):
    """A rich ``Progress`` with the project's columns: ``label`` in bold, a bar, done/total ``unit``, elapsed time
    and time left, then ``extra_columns`` (e.g. a status text)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn(f"[bold]{label}"), BarColumn(bar_width=24), MofNCompleteColumn(), TextColumn(unit),
                    TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(), *extra_columns, **kwargs)
