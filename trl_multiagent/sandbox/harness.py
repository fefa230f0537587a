"""The worker: the unprivileged process that runs the untrusted program (``python -s -P __main__.py _program|_serve``).

``_program`` (:func:`~trl_multiagent.sandbox.run_python`): runs the code as ``__main__`` and reports how it ended
as JSON records on a private pipe.

``_serve`` (:func:`~trl_multiagent.sandbox.run_tests`): runs the program, then serves the judge's requests on the
call channel -- ``call`` a function of the program with plain arguments, ``get`` a plain global -- until ``bye``.
It never sees the tests, the result pipe or the nonce, and it reports no verdict: whatever it answers is only ever
taken by the judge as plain data (see :mod:`.channel`).
"""

from __future__ import annotations

import builtins
import io
import json
import os
import signal
import sys
import traceback
import types

from .channel import Channel, NotPlain, WireError, decode, describe, emit, encode, short_repr

_HERE = os.path.dirname(os.path.abspath(__file__))


class CallTimeout(BaseException):
    """Raised inside a call by the per-call alarm (a BaseException, so ``except Exception`` does not swallow it)."""


def _print_user_traceback(exc: BaseException) -> None:
    tb = exc.__traceback__
    while tb is not None and os.path.dirname(tb.tb_frame.f_code.co_filename) == _HERE:
        tb = tb.tb_next
    try:
        traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
    except BaseException:  # noqa: BLE001
        pass


def _block_network(event: str, args) -> None:
    if event in (
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.sendmsg",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
    ):
        raise PermissionError(f"network access is disabled in this sandbox ({event})")
    if event == "socket.__new__" and len(args) > 1:
        import socket

        if args[1] in (socket.AF_INET, socket.AF_INET6, getattr(socket, "AF_PACKET", -1)):
            raise PermissionError("network access is disabled in this sandbox (socket)")


def _read_job(payload_fd: int) -> dict:
    chunks = []
    while True:
        chunk = os.read(payload_fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(payload_fd)
    return json.loads(b"".join(chunks))


def _prepare(job: dict, block_net: bool) -> dict:
    """The interpreter state the untrusted code starts from; returns the ``__main__`` namespace."""
    sys.path[:] = [p for p in sys.path if p not in ("", _HERE)]
    sys.path += [p for p in job.get("path", ()) if type(p) is str and p not in sys.path]  # allowed packages
    sys.argv = ["<program>"]
    if block_net:
        sys.addaudithook(_block_network)
    if job.get("stdin") is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(job["stdin"].encode()), encoding="utf-8")
    module = types.ModuleType("__main__")
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    return module.__dict__


# ---------------------------------------------------------------------------------------------------- run_python


def program_main(res_fd: int, payload_fd: int, block_net: bool) -> int:
    job = _read_job(payload_fd)
    new_fd = os.dup(res_fd)  # the result pipe moves to another descriptor number
    os.close(res_fd)
    nonce = job.pop("nonce")

    def report(**record) -> None:
        emit(new_fd, dict(record, n=nonce))

    report(e="hello", net_hook=block_net)
    ns = _prepare(job, block_net)
    try:
        exec(compile(job["code"], "<program>", "exec"), ns)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        report(e="end", outcome="exit", code=code)
        return code
    except BaseException as exc:  # noqa: BLE001
        report(e="end", outcome="exception", type=type(exc).__name__, message=describe(exc).partition(": ")[2])
        _print_user_traceback(exc)
        return 1
    report(e="end", outcome="ok", code=0)
    return 0


# ---------------------------------------------------------------------------------------------------- run_tests


class _Alarm:
    armed = False


def _on_alarm(signum, frame) -> None:
    if _Alarm.armed:  # a signal that arrives after the call returned is ignored
        _Alarm.armed = False
        raise CallTimeout


def _resolve(ns: dict, path) -> object:
    if not path or any(type(p) is not str for p in path):
        raise WireError("malformed path")
    if path[0] not in ns:
        raise NameError(f"name {path[0]!r} is not defined")
    obj = ns[path[0]]
    for attr in path[1:]:
        obj = getattr(obj, attr)
    return obj


def _kinds(ns: dict, names) -> dict:
    """How the judge should bind each requested name that the program defines: ``m`` (a module, by name),
    ``p`` (a proxy: callables and anything else reached through attributes), ``v`` (a value read on each use)."""
    out = {}
    for name in names if type(names) is list else ():
        if type(name) is not str or name not in ns:
            continue
        value = ns[name]
        if isinstance(value, types.ModuleType):
            out[name] = ["m", getattr(value, "__name__", "")]
        else:
            out[name] = ["p"] if callable(value) else ["v"]
    return out


def _serve_call(ns: dict, req: dict) -> dict:
    ident = req.get("id")
    try:
        limit = max(float(req.get("t", 1.0)), 0.001)
        target = _resolve(ns, req.get("path"))
        if req.get("op") == "call":
            args = decode(req.get("args"), lambda p: _resolve(ns, p))
            kwargs = decode(req.get("kwargs"), lambda p: _resolve(ns, p))
            if type(args) is not list or type(kwargs) is not dict:
                raise WireError("malformed call")
    except BaseException as exc:  # noqa: BLE001 - the name is missing, or a malformed request
        return {"id": ident, "raise": [type(exc).__name__, describe(exc).partition(": ")[2]]}
    signal.signal(signal.SIGALRM, _on_alarm)
    _Alarm.armed = True
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        try:
            if req.get("op") == "call":
                value = target(*args, **kwargs)
                reply = {"id": ident, "ok": encode(value)}
                if req.get("wb"):  # the arguments after the call, for the judge to update its own in place
                    reply["wb"] = encode([args, kwargs])
            else:
                reply = {"id": ident, "ok": encode(target)}
        finally:
            _Alarm.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    except CallTimeout:
        return {"id": ident, "timeout": True}
    except NotPlain as exc:
        return {"id": ident, "notplain": str(exc)}
    except SystemExit as exc:
        return {"id": ident, "exit": short_repr(exc.code)}
    except BaseException as exc:  # noqa: BLE001 - the program's own exception, reported as plain strings
        return {"id": ident, "raise": [type(exc).__name__, describe(exc).partition(": ")[2]]}
    return reply


def serve_main(in_fd: int, out_fd: int, payload_fd: int, block_net: bool) -> int:
    job = _read_job(payload_fd)
    for fd in (in_fd, out_fd):
        os.set_inheritable(fd, False)  # child processes of the program do not get the channel
    chan = Channel(in_fd, out_fd)
    chan.send({"op": "hello", "net_hook": block_net})
    ns = _prepare(job, block_net)
    exc = None
    try:
        exec(compile(job["code"], "<program>", "exec"), ns)
        ok, message = True, ""
    except SystemExit as stop:
        ok = stop.code is None or stop.code == 0
        message = "" if ok else f"SystemExit: {stop.code!r}"
    except BaseException as error:  # noqa: BLE001
        ok, message, exc = False, describe(error), error
    while True:
        try:
            req = chan.recv()
        except WireError:
            continue
        if req is None:
            return 1
        if req.get("op") == "names":
            break
    if not ok:
        chan.send({"op": "ready", "ok": False, "message": message})
        if exc is not None:
            _print_user_traceback(exc)
        return 1
    chan.send({"op": "ready", "ok": True, "names": _kinds(ns, req.get("names"))})
    while True:
        try:
            req = chan.recv()
            if req is None:
                return 1
            if req.get("op") == "bye":
                code = req.get("code")
                return code if type(code) is int else 1
            if req.get("op") in ("call", "get"):
                chan.send(_serve_call(ns, req))
        except (WireError, CallTimeout):
            continue


def main(argv: list[str]) -> None:
    role, fds, block_net = argv[1], [int(a) for a in argv[2:-1]], argv[-1] == "1"
    if role == "_program":
        code = program_main(*fds, block_net)
    else:
        try:
            code = serve_main(*fds, block_net)
        except BrokenPipeError:  # the judge is gone
            code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        pass
    if role == "_serve":
        os._exit(code)  # the judge has its results: do not wait for threads or atexit hooks left by the program
    sys.exit(code)  # a program: exit normally (non-daemon threads finish, atexit hooks run)
