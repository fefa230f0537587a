"""The error of a recipe that cannot be run as written, and how a command reports it (one clean line and exit code
2)."""

from __future__ import annotations

import os
import re
import sys


class RecipeError(ValueError):
    """A recipe (YAML file or command line) that cannot be run as written."""


#: Set to 1 to see the traceback of an error that the command line otherwise prints as one line.
TRACEBACK_ENV = "TRL_MULTIAGENT_TRACEBACK"


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line (its own text, or its type's name when it has none)."""
    text = str(exc) or type(exc).__name__
    return re.sub(r"\s*\n\s*", " ", text).strip()


def fail_command(prog: str, exc: BaseException) -> int:
    """End a command on an error found before any work: ``<prog>: error: <message>`` on stderr, exit code 2 (the
    traceback instead with ``TRL_MULTIAGENT_TRACEBACK=1``)."""
    if os.environ.get(TRACEBACK_ENV) == "1":
        raise exc
    print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
    return 2


def pre_training_errors() -> tuple[type[BaseException], ...]:
    """The exception types that mean "this command cannot run as given", reported by :func:`fail_command`.

    ``ModelNotFoundError`` is among them once its module is loaded (before, nothing can have raised it, and loading
    it would import torch)."""
    kinds: tuple[type[BaseException], ...] = (RecipeError, ValueError, TypeError, KeyError, ImportError, OSError)
    models = sys.modules.get("trl_multiagent.models.embedded")
    return kinds + ((models.ModelNotFoundError,) if models is not None else ())


class RunFault(RuntimeError):
    """A fault that ends a run while it trains, not caused by the recipe as written nor by user code: the command line
    prints it as ONE line ``<prog>: error: <message>`` with exit code 1, without a traceback (as a
    :class:`UserCodeError`), and the run's ``run_status.json`` says ``failed`` with the message."""

    #: The exit code of the command line, and the word before the message (``<prog>: error: ...``).
    exit_code: int = 1
    label: str = "error"


class DiskFullError(RunFault):
    """A write ran out of space (``ENOSPC``, a quota, or safetensors' and torch's own words for it): the message names
    what was written and where, the space it needs and the space left; what was written before is as it was
    (:mod:`trl_multiagent.runtime.atomic_files`)."""


class TrainingInterrupted(RunFault):
    """SIGINT or SIGTERM stopped training after the step in progress (:mod:`trl_multiagent.trainers.signals`): the
    command line prints the message as one line and exits ``128 + signal`` (130, 143), and ``run_status.json`` says
    ``interrupted`` with ``status_fields`` (the signal, the step, the checkpoint and the command that resumes)."""

    label = "interrupted"

    def __init__(self, message: str, signum: int, status_fields: dict):
        super().__init__(message)
        self.exit_code = 128 + int(signum)
        self.status_fields = dict(status_fields)


class NonFiniteUpdateError(RunFault):
    """Too many optimizer updates in a row had a NaN or infinite loss or gradient norm
    (``max_nonfinite_updates_in_a_row``; :mod:`trl_multiagent.trainers.update_guard`)."""


class NonFiniteAdapterError(RunFault):
    """An adapter (or critic) about to be saved holds a NaN or infinite value: nothing was written, the files saved
    before are left as they were (:func:`trl_multiagent.team.adapter_files.save_pool_adapters`)."""


class UserCodeError(RuntimeError):
    """User code (an environment's ``reset`` / ``step``, a reward function or a tool it calls) raised during a run.

    The message names where in the run it happened (the environment method, the task id, the turn, each acting agent
    and the start of its text) and the innermost frame of the user's own code, so that a failure is found without a
    30-frame traceback through the sampler. The original exception is the ``__cause__``.
    """


#: Task fields that name a task, in the order they are looked for.
TASK_ID_FIELDS = ("id", "task_id", "problem_id", "question_id", "idx", "index")


def task_label(task) -> str:
    """A short name of a dataset row for an error message: its id field, else the start of its first text field."""
    if not hasattr(task, "get"):
        return repr(task)[:60]
    for key in TASK_ID_FIELDS:
        if task.get(key) is not None:
            return f"{key}={task[key]!r}"
    for key, value in task.items():
        if isinstance(value, str):
            return f"{key}={_start(value)!r}"
    return repr(dict(task))[:60]


def _start(text: str, n: int = 60) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n] + "..."


def _library_dirs() -> tuple[str, ...]:
    """Directories of the Python standard library and installed third-party packages (not this library)."""
    import sysconfig

    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(sorted(os.path.realpath(d) + os.sep for d in dirs if d))


def user_frame(exc: BaseException) -> str:
    """``file:line in function: source`` of the innermost traceback frame outside the standard library and installed
    third-party packages (this library's own environments count as user code); the innermost frame when none is."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "no traceback"
    own = os.path.realpath(os.path.dirname(__file__)) + os.sep
    libraries = _library_dirs()
    outside = [f for f in frames if os.path.realpath(f.filename).startswith(own)
               or not os.path.realpath(f.filename).startswith(libraries)]
    frame = (outside or frames)[-1]
    where = os.path.relpath(frame.filename) if not os.path.relpath(frame.filename).startswith("..") else frame.filename
    source = f": {frame.line.strip()}" if frame.line else ""
    return f"{where}:{frame.lineno} in {frame.name}{source}"


def user_code_error(exc: BaseException, call: str, task=None, turn: int | None = None,
                    joint_action=None) -> UserCodeError:
    """The :class:`UserCodeError` of ``exc``, raised by ``call`` (e.g. ``"MyEnv.step"``) on ``task`` at ``turn`` for
    ``joint_action`` (``{agent: text}``)."""
    parts = [f"{call} raised {type(exc).__name__}: {one_line(exc)}"]
    where = []
    if task is not None:
        where.append(f"task {task_label(task)}")
    if turn is not None:
        where.append(f"turn {turn}")
    if joint_action:
        where.append("; ".join(f"agent {agent!r} wrote {_start(text)!r}" for agent, text in joint_action.items()))
    if where:
        parts.append("(" + ", ".join(where) + ")")
    parts.append(f"at {user_frame(exc)}")
    return UserCodeError(" ".join(parts))
