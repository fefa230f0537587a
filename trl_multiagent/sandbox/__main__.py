"""The script that the sandbox's own processes run (never imported by the caller).

``python -s -S -P <this file> _launch <spec>``: the launcher (root); ``python -s -P <this file> _program|_serve
<fds> <block_net>``: the worker, after ``execve``. The interpreter runs with ``-I``-like flags, so this directory is
not on ``sys.path`` and the package is not importable by name (importing ``trl_multiagent`` would also load torch).
The sibling modules are therefore loaded as the submodules of a bare package, ``_trl_sandbox``, whose ``__path__`` is
this directory: relative imports between them work, and ``__init__.py`` (the caller's API) is never executed.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = "_trl_sandbox"


def _module(name: str):
    if sys.path and os.path.realpath(sys.path[0] or os.curdir) == os.path.realpath(_HERE):
        del sys.path[0]  # Python 3.10 (no -P) puts the script's directory first
    if _PACKAGE not in sys.modules:
        package = type(sys)(_PACKAGE)
        package.__path__ = [_HERE]
        sys.modules[_PACKAGE] = package
    __import__(f"{_PACKAGE}.{name}")
    return sys.modules[f"{_PACKAGE}.{name}"]


if __name__ == "__main__":
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    if role == "_launch":
        _module("launcher").main(sys.argv)
    elif role in ("_program", "_serve"):
        _module("harness").main(sys.argv)
    else:
        sys.stderr.write("this file is run by trl_multiagent.sandbox; it has no command-line interface\n")
        sys.exit(2)
