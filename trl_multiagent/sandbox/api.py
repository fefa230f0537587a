"""The public entry points of the sandbox."""

from __future__ import annotations

import ast
import os

from .config import SandboxConfig, SandboxJob, SandboxResult
from .host import execute


def run_python(code: str, config: SandboxConfig | None = None, *, stdin: str | None = None) -> SandboxResult:
    """Run ``code`` as the ``__main__`` module of a sandboxed interpreter; see :class:`SandboxResult` for statuses.

    ``stdin`` (text) is offered as ``sys.stdin``; by default the program reads an empty stream.
    """
    return execute({"code": code, "stdin": stdin}, config or SandboxConfig(), tests=None)


def run_tests(
    program: str,
    tests: list[str],
    config: SandboxConfig | None = None,
    *,
    setup: str = "",
    stdin: str | None = None,
) -> SandboxResult:
    """Run ``program`` once, then ``setup``, then every test statement separately; see :class:`SandboxResult`.

    Each test is Python source (``"assert candidate(1) == 2"``, or several statements). The program runs in the
    worker; ``setup`` and the tests run in a separate judge process, where the program's names that they use
    (functions, plain globals, modules) stand for the program's objects: a call runs in the worker, and only plain
    data (``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes`` and lists, tuples, dicts and sets
    of them, by exact type) comes back; anything else makes that test an ``error``. Tests run one after the other,
    each under ``config.test_timeout_s``; a failing, erroring or timed-out test does not stop the next. Plain
    ``assert a OP b`` statements are rewritten so that their failure message shows the values, e.g.
    ``"AssertionError: expected 2, got 1"`` (the side that is a call is taken as the actual value). Exiting
    (``sys.exit``, ``os._exit``) never counts as passing. ``result.tests`` holds the per-test outcomes, all decided
    by the judge; the overall status is ``passed`` only if all tests passed.
    """
    spec = {"setup": setup, "tests": [str(t) for t in tests]}
    return execute({"code": program, "stdin": stdin}, config or SandboxConfig(), tests=spec)


def run_many(jobs, max_workers: int | None = None) -> list[SandboxResult]:
    """Run several sandboxes concurrently (threads that each drive a sandbox process); results in input order.

    ``jobs``: :class:`SandboxJob` objects or plain program strings (run with the default config). ``max_workers``
    defaults to ``os.cpu_count()``. Each concurrent run gets its own uid, so one fork bomb cannot starve the others
    of processes.
    """
    from concurrent.futures import ThreadPoolExecutor

    jobs = [SandboxJob(program=j) if isinstance(j, str) else j for j in jobs]
    if not jobs:
        return []
    workers = max(1, min(len(jobs), max_workers or os.cpu_count() or 1))

    def one(job: SandboxJob) -> SandboxResult:
        if job.tests is None:
            return run_python(job.program, job.config, stdin=job.stdin)
        return run_tests(job.program, job.tests, job.config, setup=job.setup, stdin=job.stdin)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox") as pool:
        return list(pool.map(one, jobs))


def humaneval_tests(test_code: str, entry_point: str, prompt: str | None = None) -> tuple[str, list[str]]:
    """Split a HumanEval-style ``def check(candidate): ...`` into ``(setup, tests)`` for :func:`run_tests`.

    ``setup`` holds the module-level statements of ``test_code`` other than ``check`` (imports, ``METADATA``,
    helpers) and binds ``candidate = <entry_point>``. Every statement of ``check``'s body that contains an
    ``assert`` becomes one test; statements without an assert (assignments, imports, helper functions) are
    prepended to the next test so that order is preserved (trailing ones are appended to the last test).

    ``prompt``: the problem's prompt. Its imports and the functions it defines (other than ``entry_point``) that the
    tests call -- ``poly`` in HumanEval/32, ``encode_cyclic`` in /38 -- then go into ``setup``, so the tests use
    these trusted definitions rather than whatever the program under test defines under those names.
    """
    tree = ast.parse(test_code)
    setup_parts: list[str] = []
    check = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "check":
            check = node
        else:
            setup_parts.append(ast.get_source_segment(test_code, node) or ast.unparse(node))
    if check is None:
        raise ValueError("test_code has no `def check(...)`")
    if prompt:
        setup_parts[:0] = _prompt_helpers(prompt, entry_point, check)
    arg = check.args.args[0].arg if check.args.args else "candidate"
    setup_parts.append(f"{arg} = {entry_point}")
    tests: list[str] = []
    pending: list[str] = []
    for node in check.body:
        src = ast.unparse(node)
        has_assert = not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and any(
            isinstance(n, ast.Assert) for n in ast.walk(node)
        )
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue  # docstring
        if has_assert:
            tests.append("\n".join([*pending, src]))
            pending = []
        else:
            pending.append(src)
    if pending:
        if tests:
            tests[-1] = "\n".join([tests[-1], *pending])
        else:
            setup_parts.extend(pending)
    return "\n".join(setup_parts), tests


def probe_isolation(config: SandboxConfig | None = None) -> tuple[str, ...]:
    """Run a trivial program and return the isolation mechanisms that are in effect on this machine."""
    result = run_python("pass", config)
    return result.isolation


def _prompt_helpers(prompt: str, entry_point: str, check: ast.FunctionDef) -> list[str]:
    """The prompt's imports and its definitions that ``check`` uses (none at all if it uses no definition)."""
    try:
        tree = ast.parse(prompt)
    except SyntaxError:
        return []
    used = {n.id for n in ast.walk(check) if isinstance(n, ast.Name)}
    imports = [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    helpers = [
        ast.unparse(n)
        for n in tree.body
        if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name != entry_point and n.name in used
    ]
    return imports + helpers if helpers else []
