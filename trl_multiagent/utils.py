"""Small helpers shared across the package."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
import threading
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

#: The quantizations an agent's base model may have: none (full precision) or 4-bit (QLoRA). Kept here, with no
#: import of torch, for the checks of a recipe (:mod:`trl_multiagent.agents` re-exports it).
QUANTIZATIONS = (None, "4bit")

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


#: glibc's ``mallopt`` parameters (``<malloc.h>``).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Blocks from this size on get their own mapping when the process keeps freed memory (:func:`keep_freed_cpu_memory`):
#: larger than any tensor of a step of the project's models, smaller than a model's weights loaded in one piece.
#: glibc's manual gives 32 MiB as the ceiling on 64-bit systems (the Debian glibc 2.36 of the project's machine takes
#: 1 GiB); where 1 GiB is refused, the ceiling is set.
KEEP_FREED_MMAP_THRESHOLD = 1 << 30
MMAP_THRESHOLD_CEILING = 32 << 20
#: The environment variables by which a user sets glibc's trim and mmap thresholds themselves (then left alone).
ALLOCATOR_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")
#: What :func:`keep_freed_cpu_memory` did in this process (:func:`cpu_allocator_record` reports it).
_ALLOCATOR = {"keeps_freed": False, "note": "glibc's defaults"}


def keep_freed_cpu_memory() -> bool:
    """Make this process keep the CPU memory it frees for its next allocations (glibc): no trimming of the heap's top
    (``M_TRIM_THRESHOLD`` -1) and blocks up to :data:`KEEP_FREED_MMAP_THRESHOLD` served from the heap rather than from
    mappings of their own (``M_MMAP_THRESHOLD``); :func:`release_freed_memory` then trims nothing either. Returns
    whether it did; it does nothing (False) on CUDA, without glibc, and when the user set any of
    :data:`ALLOCATOR_ENV`.

    A training step allocates and frees the same large tensors at every step (logits, activations, caches). With
    glibc's defaults, blocks above a dynamic threshold (at most 32 MiB) are mapped and unmapped, the heap's free top is
    given back, and the trainer trimmed the heap after the rollout and after each policy's update: every page was
    then faulted in and zeroed again by the kernel at its next use: in a 5-step run of the main job 6.4 million page
    faults and 16-17 s of system time, against 1.9 million and 8 s kept (``docs/results/step_profile/README.md``,
    "Page faults"). The cost: resident memory stays at its peak, and where several policies update one after
    another, the small tensors each creates between freed buffers make the heap grow (the trims kept that from
    resident memory). It is process-wide and stays set."""
    import torch

    if _ALLOCATOR["keeps_freed"]:
        return True
    if torch.cuda.is_available():
        return False
    user = [k for k in ALLOCATOR_ENV if k in os.environ and (k != "GLIBC_TUNABLES" or "malloc" in os.environ[k])]
    if user:
        _ALLOCATOR["note"] = f"set by the user's environment ({', '.join(user)})"
        return False
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    threshold = next((t for t in (KEEP_FREED_MMAP_THRESHOLD, MMAP_THRESHOLD_CEILING)
                      if libc.mallopt(_M_MMAP_THRESHOLD, t)), None)
    if threshold is None or not libc.mallopt(_M_TRIM_THRESHOLD, -1):
        raise RuntimeError("glibc's mallopt refused the mmap or trim threshold (cpu_keep_freed_memory); set it false")
    _ALLOCATOR.update(keeps_freed=True, note=f"keeps freed memory (mallopt: no trimming, mmap threshold {threshold})")
    return True


def cpu_allocator_record() -> str:
    """How this process's CPU allocator was set: glibc's defaults, kept freed memory, or the user's environment."""
    return _ALLOCATOR["note"]


def release_freed_memory() -> None:
    """Return freed heap memory to the OS (glibc ``malloc_trim``) on CPU, unless this process keeps its freed memory
    (:func:`keep_freed_cpu_memory`, the trainers' ``cpu_keep_freed_memory``).

    Between policies the update frees large activation buffers while small, long-lived tensors (the optimizer's
    state, created lazily; the gradients too, but for :func:`gradients_in_one_block`) land between them; glibc then
    keeps the freed space, and the resident memory of a team grows with its number of policies although the live
    tensors do not. Trimming after each policy's backward pass keeps a team on one shared base close to one agent's
    footprint (``make bench``), at the price of faulting those pages in again at the next step.
    """
    import torch

    if torch.cuda.is_available() or _ALLOCATOR["keeps_freed"]:
        return
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def gradients_in_one_block(params: Iterable) -> int:
    """Give each parameter of ``params`` that requires a gradient and has none a zero gradient, all of them views of
    one new buffer; returns how many parameters got one.

    The backward pass then adds into these views in place, where it would otherwise allocate each parameter's first
    gradient at the moment it is computed, amid the activations being freed. A LoRA adapter has a few hundred small
    parameters; a team updates its policies one after another, and each policy's scattered gradients, live until the
    optimizer's step, pin the freed activations' memory between them, so that glibc's heap, and the resident memory,
    grow with every policy of the step (``benchmarks/memory_phases.py``; ``docs/results/memory_ab/README.md``). One
    block per policy, allocated before its backward pass, leaves the space the pass frees in one piece. Values are
    those of the usual first gradient (zero plus the gradient, exactly); an optimizer's ``zero_grad`` (set to
    ``None``) frees the block.

    Only for parameters the caller's backward passes will reach: a parameter that gets a zero gradient this way
    but none from the backward is stepped by an optimizer as if its gradient were zero (Adam's moments then still
    move it), where ``None`` would skip it."""
    import torch

    missing = [p for p in params if p.requires_grad and p.grad is None]
    if not missing:
        return 0
    groups: dict[tuple, list] = {}
    for p in missing:
        groups.setdefault((p.dtype, p.device), []).append(p)
    for (dtype, device), group in groups.items():
        block = torch.zeros(sum(p.numel() for p in group), dtype=dtype, device=device)
        offset = 0
        for p in group:
            p.grad = block[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
    return len(missing)


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


def cache_dir() -> Path:
    """Root of the trl-multiagent cache: ``$TRL_MULTIAGENT_CACHE`` if set, else ``~/.cache/trl_multiagent``.

    The directory is not created here (the embedded models and the recipe fields' snapshot create what they need).
    """
    env = os.environ.get("TRL_MULTIAGENT_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "trl_multiagent"


def configure_threads(num_threads: int | None) -> int | None:
    """Set torch's CPU threads: ``num_threads``, or (None) the CPUs this process may run on divided among the
    processes of this machine (``LOCAL_WORLD_SIZE``). Returns the number set; ``None`` when it leaves them as they are:
    on CUDA, and when the user set ``OMP_NUM_THREADS`` themselves (``accelerate launch`` sets it to 1 on its own,
    which is not taken as the user's choice)."""
    import torch

    if num_threads is None:
        launched_by_accelerate = any(k.startswith("ACCELERATE_") for k in os.environ)
        if torch.cuda.is_available() or ("OMP_NUM_THREADS" in os.environ and not launched_by_accelerate):
            return None
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cpus = os.cpu_count() or 1
        num_threads = max(1, cpus // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    torch.set_num_threads(num_threads)
    return num_threads
