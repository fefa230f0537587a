"""Loading a user's objects: ``"module:name"`` and ``"path/to/file.py:name"`` specs, files loaded by path, recipe paths anchored to the recipe's folder, and calling a user's function with the keyword arguments it accepts."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
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

    Raises ``ImportError`` naming the spec: a module that is not on the Python path (with how to make it importable,
    PYTHONPATH, or to name its file instead), a missing file, a missing name (with the names the module or file
    defines), or a module or file whose own code fails (the last line of its traceback and the line of the file).
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
        module_example, file_example = _examples(what)
        raise ValueError(f"{what} {spec!r} must look like 'package.module:name' or 'path/to/file.py:name' (e.g. "
                         f"{module_example!r} or {file_example!r})")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any failure of the module's own code is reported as one ImportError
        raise ImportError(_module_error(spec, module_name, attr, what, exc)) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        where = f" ({module.__file__})" if getattr(module, "__file__", None) else ""
        raise ImportError(f"Cannot import {what} {spec!r}: module {module_name!r}{where} defines no {attr!r} (it "
                          f"defines: {', '.join(_defined_names(module)) or 'nothing callable'})") from None


def call_with_supported_kwargs(fn: Callable, **kwargs: Any) -> Any:
    """Call ``fn`` with the keyword arguments it declares (all of them if it takes ``**kwargs``)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(**kwargs)
    return fn(**{k: v for k, v in kwargs.items() if k in params})


#: Examples of each field's two forms for the error messages (the generic pair for other fields).
_EXAMPLES = {
    "environment": ("my_package.my_env:MyEnv", "envs/my_env.py:MyEnv"),
    "evaluator": ("my_package.my_eval:MyEvaluator", "evals/my_eval.py:MyEvaluator"),
    "reward_fn": ("my_package.rewards:my_reward", "rewards/writing.py:tldr_reward"),
    "dataset_transform": ("my_package.data:to_columns", "data/fix.py:to_columns"),
}


def _examples(what: str) -> tuple[str, str]:
    return _EXAMPLES.get(what, ("package.module:name", "path/to/file.py:name"))


def _defined_names(module: ModuleType) -> list[str]:
    return sorted(k for k, v in vars(module).items()
                  if not k.startswith("_") and callable(v) and getattr(v, "__module__", None) == module.__name__)


def _module_error(spec: str, module_name: str, attr: str, what: str, exc: BaseException) -> str:
    """Why ``module_name`` does not import, and for a module that is not on the Python path, how to make it
    importable (PYTHONPATH) or how to name its file instead."""
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    parts = module_name.split(".")
    if missing and missing != parts[0] and any(missing == ".".join(parts[:i]) for i in range(2, len(parts) + 1)):
        package = sys.modules.get(missing.rpartition(".")[0])
        where = f" ({Path(package.__file__).parent})" if getattr(package, "__file__", None) else ""
        return (f"Cannot import {what} {spec!r}: package {missing.rpartition('.')[0]!r}{where} has no module "
                f"{missing.rpartition('.')[2]!r}")
    if missing == parts[0]:
        file_form = f"{'/'.join(parts)}.py:{attr}"
        here = Path.cwd() / f"{'/'.join(parts)}.py"
        named = f"'{file_form}' (that file is in the current directory)" if here.is_file() else \
            f"'path/to/{file_form}'"
        return (f"Cannot import {what} {spec!r}: no module named {missing!r} on the Python path (sys.path). Make "
                f"it importable: put the folder that holds {parts[0]}{'/' if len(parts) > 1 else '.py'} on "
                f"PYTHONPATH (PYTHONPATH=path/to/that/folder python -m trl_multiagent train ..., or before "
                f"accelerate launch; `python -m` also looks in the current directory, a script such as "
                f"recipes/magrpo.py looks in its own folder instead), or name the file itself: {what}: {named}")
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_module_file(f.filename, parts)]
    line = f", line {frames[-1].lineno}" if frames else ""
    if isinstance(exc, SyntaxError) and exc.lineno:
        line = f", line {exc.lineno}"
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    where = f" ({Path(frames[-1].filename).name}{line})" if frames else ""
    return f"Cannot import {what} {spec!r}: module {module_name!r} fails to import{where}: {last}"


def _is_module_file(filename: str, parts: list[str]) -> bool:
    path = Path(filename)
    return path.stem == parts[-1] or (path.name == "__init__.py" and path.parent.name == parts[-1])


def _file_object(path: Path, name: str, spec: str, what: str) -> Any:
    module = load_file_module(path, what=f"{what} {spec!r}")
    try:
        return getattr(module, name)
    except AttributeError:
        raise ImportError(f"Cannot import {what} {spec!r}: {path} defines no {name!r} (it defines: "
                          f"{', '.join(_defined_names(module)) or 'nothing callable'})") from None


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


