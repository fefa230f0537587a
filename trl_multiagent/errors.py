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
    """The exception types that mean "this command cannot run as given", reported by :func:`fail_command`."""
    from .models import ModelNotFoundError

    return (RecipeError, ValueError, TypeError, KeyError, ImportError, OSError, ModelNotFoundError)
