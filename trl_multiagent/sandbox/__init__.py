"""Run untrusted, model-generated Python in separate, locked-down processes, and score it where it cannot reach.

``run_python`` runs a program in a *worker*; ``run_tests`` runs the program in a worker and its tests in a separate
*judge* process (another uid, its own limits) that reaches the program's functions only through a call channel
carrying plain data, and alone decides and reports the verdicts. See ``docs/sandbox.md`` for the process tree and the
threat model.

Modules: :mod:`.config` (public data types), :mod:`.api` (entry points), :mod:`.host` (the caller's side of a run),
:mod:`.rootfs` (the allow-list of the sandbox's file system), :mod:`.launcher` (namespaces, mounts, the new root,
init, privilege dropping), :mod:`.cgroups` (the run's memory cgroup), :mod:`.harness` (the worker), :mod:`.judge` (the judge), :mod:`.channel` (wire
formats); ``__main__.py`` is the script that the sandbox's own processes run.

May import: nothing of the library (its processes load it under another package name: its imports are relative).
"""

from .api import humaneval_tests, probe_isolation, run_many, run_python, run_tests
from .config import SandboxConfig, SandboxError, SandboxJob, SandboxResult, TestOutcome

__all__ = [
    "SandboxConfig",
    "SandboxError",
    "SandboxJob",
    "SandboxResult",
    "TestOutcome",
    "humaneval_tests",
    "probe_isolation",
    "run_many",
    "run_python",
    "run_tests",
]
