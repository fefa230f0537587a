"""The judge: runs the setup and the tests of :func:`~trl_multiagent.sandbox.run_tests` and decides every verdict.

The judge is forked from the sandbox's init (no new interpreter), under a uid of its own, with its own limits. The
program under test never runs in it: names of the program that the tests use resolve to :class:`Proxy` objects, and
calling one sends ``(path, args, kwargs)`` as plain data over the call channel to the worker, which runs the call
and answers with a plain value (rebuilt here by :func:`~.channel.decode`), an exception (type name and message), or
nothing at all. The verdicts go to the host on the result pipe, which the worker never holds.

Each test runs under ``SIGALRM``; a worker that dies during a test makes it ``crashed``, one that does not answer
within the test's time and a grace period after it makes it ``timed_out``; the remaining tests are then not run.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import json
import os
import signal
import sys
import time
import types

from .channel import MESSAGE_LIMIT, Channel, NotPlain, WireError, decode, describe, emit, encode, short_repr

GRACE_S = 1.0  # how long a worker may take to answer after its test timed out before it counts as hung
_PLAIN = "only None, bool, int, float, complex, str, bytes and lists, tuples, dicts and sets of them cross over"
_EXCEPTIONS = {
    name: cls
    for name, cls in vars(builtins).items()
    if isinstance(cls, type) and issubclass(cls, Exception) and cls not in (StopIteration, StopAsyncIteration)
}


class TestTimeout(BaseException):
    """The test ran over its time (a BaseException, so ``except Exception`` in a test does not swallow it)."""

    __test__ = False


class BoundaryError(BaseException):
    """Something other than plain data came back from the program, or could not be sent to it."""


class WorkerGone(BaseException):
    """The program's process ended (or stopped answering) during the test."""


class ProgramExit(BaseException):
    """The program raised ``SystemExit`` during a call."""


class ProgramError(Exception):
    """An exception of the program whose type is not a builtin exception of the judge (its message names it)."""


def _program_exception(name, message) -> BaseException:
    if type(name) is not str or type(message) is not str:
        return BoundaryError("malformed reply from the program")
    exc = None
    cls = _EXCEPTIONS.get(name)
    if cls is not None:  # a builtin type, so that tests expecting e.g. ValueError still work
        try:
            exc = cls(message)
        except Exception:  # noqa: BLE001 - constructors with other signatures (UnicodeDecodeError)
            exc = None
    if exc is None:
        exc = ProgramError(message)
    exc.sandbox_text = f"{name}: {message}" if message else name
    return exc


# ---------------------------------------------------------------------------------------------------- the link


class Proxy:
    """A name (or ``name.attr...``) of the program; calling it runs the call in the worker."""

    __slots__ = ("_link", "_path")

    def __init__(self, link: Link, path: tuple[str, ...]) -> None:
        self._link, self._path = link, path

    def __call__(self, *args, **kwargs):
        return self._link.request("call", self._path, args, kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return Proxy(self._link, (*self._path, name))

    def __repr__(self) -> str:
        return f"<{'.'.join(self._path)} of the program>"


def _proxy_path(value):
    return value._path if type(value) is Proxy else None


def _mutable(encoded) -> bool:
    return type(encoded) is list and (encoded[0] in ("l", "d", "s") or any(_mutable(x) for x in encoded[1:]))


def _sync(old, new) -> None:
    """Update the container ``old`` in place to equal ``new`` (recursing into containers of the same kind)."""
    if type(old) is list:
        for k in range(min(len(old), len(new))):
            if type(old[k]) in (list, dict, set) and type(new[k]) is type(old[k]):
                _sync(old[k], new[k])
            elif type(old[k]) is not tuple or type(new[k]) is not tuple:
                old[k] = new[k]
        del old[len(new) :]
        old.extend(new[len(old) :])
    elif type(old) is dict:
        for key in [k for k in old if k not in new]:
            del old[key]
        for key, value in new.items():
            if key in old and type(old[key]) in (list, dict, set) and type(value) is type(old[key]):
                _sync(old[key], value)
            else:
                old[key] = value
    elif type(old) is set:
        old.clear()
        old.update(new)
    elif type(old) is tuple and len(old) == len(new):
        for a, b in zip(old, new):
            if type(a) in (list, dict, set, tuple) and type(b) is type(a):
                _sync(a, b)


class Link:
    """The judge's end of the call channel: one request at a time, each reply matched by its id."""

    def __init__(self, chan: Channel, test_timeout: float) -> None:
        self.chan = chan
        self.test_timeout = test_timeout
        self.deadline: float | None = None  # of the running test
        self.pending: int | None = None  # id of a request whose reply has not been read
        self.dead: str | None = None  # "died" or "hung"
        self._next = 0

    def wait_for(self, op: str):
        """The next message with this ``op`` (skipping anything else), ``None`` if the worker is gone."""
        while True:
            try:
                msg = self.chan.recv()
            except WireError:
                continue
            if msg is None:
                self.dead = "died"
                return None
            if msg.get("op") == op:
                return msg

    def request(self, op: str, path: tuple[str, ...], args=(), kwargs=None):
        if self.dead:
            raise WorkerGone("the program's process is no longer running")
        try:
            enc_args, enc_kwargs = encode(list(args), _proxy_path), encode(dict(kwargs or {}), _proxy_path)
        except NotPlain as exc:
            raise BoundaryError(f"cannot pass this to the program: {exc} ({_PLAIN})") from None
        self._next += 1
        ident = self._next
        left = self.test_timeout if self.deadline is None else self.deadline - time.monotonic()
        msg = {"op": op, "id": ident, "path": list(path), "args": enc_args, "kwargs": enc_kwargs, "t": left + 0.05}
        if op == "call" and _mutable([enc_args, enc_kwargs]):
            msg["wb"] = 1
        self.pending = ident
        try:
            self.chan.send(msg)
        except OSError:
            self.pending, self.dead = None, "died"
            raise WorkerGone("the program's process ended during this test") from None
        while True:
            try:
                reply = self.chan.recv()
            except WireError:
                continue
            if reply is None:
                self.pending, self.dead = None, "died"
                raise WorkerGone("the program's process ended during this test")
            if reply.get("id") == ident:
                self.pending = None
                return self._result(reply, args, kwargs or {})

    def _result(self, reply: dict, args, kwargs):
        if "ok" in reply:
            try:
                value = decode(reply["ok"])
                if "wb" in reply:
                    new_args, new_kwargs = decode(reply["wb"])
                    for old, new in zip(args, new_args):
                        _sync(old, new)
                    for key, old in kwargs.items():
                        _sync(old, new_kwargs.get(key))
            except (WireError, TypeError, ValueError, AttributeError) as exc:
                raise BoundaryError(f"malformed reply from the program ({exc})") from None
            return value
        if "raise" in reply and type(reply["raise"]) is list and len(reply["raise"]) == 2:
            raise _program_exception(*reply["raise"])
        if "timeout" in reply:
            raise TestTimeout(f"test exceeded {self.test_timeout:g}s")
        if "exit" in reply:
            code = str(reply["exit"])[:100]
            raise ProgramExit(f"SystemExit({code}) raised inside a test: exiting never counts as passing")
        if "notplain" in reply:
            raise BoundaryError(f"the program returned {str(reply['notplain'])[:500]} ({_PLAIN})")
        raise BoundaryError("malformed reply from the program")

    def resync(self) -> None:
        """After a test was interrupted mid-request: read (and drop) the late reply, or declare the worker hung."""
        deadline = time.monotonic() + GRACE_S
        if self.chan.partial:  # end the half-written request line, so that the worker can skip it
            try:
                _with_alarm(GRACE_S, lambda: self.chan.send_raw(b"\n"))
            except (TestTimeout, OSError):
                self.dead = "hung"
                return
        while self.pending is not None:
            try:
                msg = self.chan.recv(timeout=deadline - time.monotonic())
            except TimeoutError:
                self.dead = "hung"
                return
            except WireError:
                continue
            if msg is None:
                self.pending, self.dead = None, "died"
                return
            if msg.get("id") == self.pending:
                self.pending = None


def _with_alarm(seconds: float, fn):
    def on_alarm(signum, frame):
        raise TestTimeout(f"test exceeded {seconds:g}s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


# ---------------------------------------------------------------------------------------------------- assertions


_COMPARE_OPS = {
    "Eq": (lambda a, b: a == b, "=="),
    "NotEq": (lambda a, b: a != b, "!="),
    "Lt": (lambda a, b: a < b, "<"),
    "LtE": (lambda a, b: a <= b, "<="),
    "Gt": (lambda a, b: a > b, ">"),
    "GtE": (lambda a, b: a >= b, ">="),
    "Is": (lambda a, b: a is b, "is"),
    "IsNot": (lambda a, b: a is not b, "is not"),
    "In": (lambda a, b: a in b, "in"),
    "NotIn": (lambda a, b: a not in b, "not in"),
}


def _assert_compare(left, right, op: str, text: str, msg, actual_is_right: bool) -> None:
    """Runtime of a rewritten ``assert left OP right[, msg]``: each operand evaluated exactly once."""
    if _COMPARE_OPS[op][0](left, right):
        return
    if op == "Eq":
        actual, expected = (right, left) if actual_is_right else (left, right)
        detail = f"expected {short_repr(expected)}, got {short_repr(actual)}"
    else:
        detail = f"{text} is false (left: {short_repr(left)}, right: {short_repr(right)})"
    user = msg() if msg is not None else None
    raise AssertionError(detail if user is None else f"{user} ({detail})")


def _assert_truth(value, text: str, msg) -> None:
    if value:
        return
    user = msg() if msg is not None else None
    raise AssertionError(f"assertion failed: {text}" if user is None else user)


def _has_call(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) for n in ast.walk(node))


class _AssertRewriter(ast.NodeTransformer):
    """``assert a OP b, m`` -> ``__sandbox_compare__(a, b, "OP", "a OP b", lambda: m, ...)`` (same semantics)."""

    def __init__(self, source: str) -> None:
        self.source = source

    def visit_Assert(self, node: ast.Assert):
        self.generic_visit(node)
        test = node.test
        text = ast.get_source_segment(self.source, test) or ast.unparse(test)
        no_args = ast.arguments(
            posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[]
        )
        msg = ast.Lambda(args=no_args, body=node.msg) if node.msg is not None else ast.Constant(None)
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]).__name__ in _COMPARE_OPS:
            right = test.comparators[0]
            actual_is_right = _has_call(right) and not _has_call(test.left)
            op = ast.Constant(type(test.ops[0]).__name__)
            args = [test.left, right, op, ast.Constant(text), msg, ast.Constant(actual_is_right)]
            call = ast.Call(func=ast.Name("__sandbox_compare__", ast.Load()), args=args, keywords=[])
        else:
            args = [test, ast.Constant(text), msg]
            call = ast.Call(func=ast.Name("__sandbox_truth__", ast.Load()), args=args, keywords=[])
        return ast.copy_location(ast.Expr(call), node)


class _ValueRewriter(ast.NodeTransformer):
    """A read of a plain global of the program -> ``__sandbox_get__("name")`` (its value at that moment)."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name):
        if node.id in self.names and isinstance(node.ctx, ast.Load):
            get = ast.Name("__sandbox_get__", ast.Load())
            return ast.copy_location(ast.Call(func=get, args=[ast.Constant(node.id)], keywords=[]), node)
        return node


def _names(trees) -> tuple[set[str], set[str]]:
    """(every name the code mentions, the names it binds itself)."""
    used: set[str] = set()
    bound: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                used.add(node.id)
                if not isinstance(node.ctx, ast.Load):
                    bound.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, ast.alias):
                bound.add(node.asname or node.name.split(".")[0])
            elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
                bound.add(node.name)
    return used, bound


def _bind(ns: dict, kinds, link: Link) -> set[str]:
    """Bind the program's names that the tests use; returns the names read by value."""
    values = set()
    for name, kind in kinds.items() if type(kinds) is dict else ():
        if type(name) is not str or type(kind) is not list or not kind:
            continue
        if kind[0] == "v":
            values.add(name)
            continue
        ns[name] = Proxy(link, (name,))
        module = kind[1] if kind[0] == "m" and len(kind) == 2 and type(kind[1]) is str else ""
        if module.partition(".")[0] in sys.stdlib_module_names:  # the judge's own copy of a standard module
            try:
                ns[name] = importlib.import_module(module)
            except Exception:  # noqa: BLE001
                pass
    return values


def _compile(tree: ast.Module, source: str, filename: str, values: set[str], asserts: bool):
    if asserts:
        tree = _AssertRewriter(source).visit(tree)
    if values:
        tree = _ValueRewriter(values).visit(tree)
    return compile(ast.fix_missing_locations(tree), filename, "exec")


def _run_one_test(code, ns: dict, timeout: float, link: Link) -> tuple[str, str]:
    def on_alarm(signum, frame):
        raise TestTimeout(f"test exceeded {timeout:g}s")

    link.deadline = time.monotonic() + timeout
    try:
        try:
            signal.signal(signal.SIGALRM, on_alarm)
            signal.setitimer(signal.ITIMER_REAL, timeout)
            exec(code, ns)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            link.deadline = None
    except TestTimeout as exc:
        return "timed_out", describe(exc)
    except WorkerGone as exc:
        return "crashed", str(exc)
    except AssertionError as exc:
        return "failed", describe(exc)
    except SystemExit as exc:
        return "error", f"SystemExit({exc.code!r}) raised inside a test: exiting never counts as passing"
    except BaseException as exc:  # noqa: BLE001
        return "error", describe(exc)
    return "passed", ""


def _exec_setup(code, ns: dict) -> str:
    """Run the setup; ``""`` on success (``sys.exit(0)`` included), else the error."""
    try:
        exec(code, ns)
    except SystemExit as exc:
        return "" if exc.code is None or exc.code == 0 else f"SystemExit: {exc.code!r}"
    except BaseException as exc:  # noqa: BLE001
        return describe(exc)
    return ""


# ---------------------------------------------------------------------------------------------------- main


def _parse(source: str, filename: str):
    try:
        return ast.parse(source, filename)
    except SyntaxError as exc:
        return exc


def judge_main(in_fd: int, out_fd: int, res_fd: int, payload_fd: int) -> int:
    with os.fdopen(payload_fd, "rb") as f:
        job = json.loads(f.read())
    nonce, setup, tests = job["nonce"], job["setup"], job["tests"]

    def report(**record) -> None:
        emit(res_fd, dict(record, n=nonce))

    timeout = float(job["test_timeout_s"])
    link = Link(Channel(in_fd, out_fd), timeout)
    setup_tree = _parse(setup, "<setup>")
    trees = [_parse(src, f"<test {i}>") for i, src in enumerate(tests)]
    used, bound = _names(t for t in [setup_tree, *trees] if isinstance(t, ast.AST))
    wanted = sorted(n for n in used if n not in vars(builtins) and not n.startswith("__"))

    hello = link.wait_for("hello")
    if hello is None:
        report(e="end", worker="died")
        return 1
    report(e="hello", net_hook=hello.get("net_hook") is True)
    try:
        link.chan.send({"op": "names", "names": wanted})
    except OSError:  # the worker already ended
        link.dead = "died"
    ready = None if link.dead else link.wait_for("ready")
    if ready is None:
        report(e="end", worker="died")
        return 1
    if ready.get("ok") is not True:
        report(e="program", ok=False, message=str(ready.get("message", ""))[:MESSAGE_LIMIT])
        return _finish(link, report, 1)

    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module
    ns = module.__dict__
    values = _bind(ns, ready.get("names"), link) - bound
    if isinstance(setup_tree, SyntaxError):
        error = describe(setup_tree)
    else:
        error = _exec_setup(_compile(setup_tree, setup, "<setup>", values, asserts=False), ns)
    report(e="program", ok=not error, message=f"setup: {error}" if error else "")
    if error:
        return _finish(link, report, 1)
    ns["__sandbox_compare__"] = _assert_compare
    ns["__sandbox_truth__"] = _assert_truth
    ns["__sandbox_get__"] = lambda name: link.request("get", (name,))
    all_passed = True
    for i, (source, tree) in enumerate(zip(tests, trees)):
        if link.dead:
            break
        report(e="test_start", i=i)
        t0 = time.perf_counter()
        if isinstance(tree, SyntaxError):
            status, message = "error", describe(tree)
        else:
            status, message = _run_one_test(_compile(tree, source, f"<test {i}>", values, True), ns, timeout, link)
            if link.pending is not None or link.chan.partial:
                link.resync()
        report(e="test", i=i, status=status, message=message, t=round(time.perf_counter() - t0, 6))
        all_passed = all_passed and status == "passed"
    return _finish(link, report, 0 if all_passed else 1)


def _finish(link: Link, report, code: int) -> int:
    """Final report to the host, then (best effort, briefly) tell the worker to exit with ``code``."""
    report(e="end", worker=link.dead or "ok")
    if not link.dead:
        try:
            _with_alarm(GRACE_S, lambda: link.chan.send({"op": "bye", "code": code}))
        except (TestTimeout, OSError):
            pass
    return code
