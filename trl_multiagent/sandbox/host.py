"""The caller's side of a sandboxed run: uid leases, the launcher process, reading its pipes, building the result.

Nothing from the untrusted code runs here: the host only reads byte-limited pipes and parses JSON records.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time

from .cgroups import cgroup_paths
from .config import TEST_STATUSES, SandboxConfig, SandboxError, SandboxResult, TestOutcome
from .rootfs import root_plan
from .uids import UidLease, sweep_uid

logger = logging.getLogger("trl_multiagent.sandbox")

_HERE = os.path.dirname(os.path.abspath(__file__))
_BOOT = os.path.join(_HERE, "__main__.py")
# -s -S -P: -I without -E (the environment is given in full, and its PYTHONHASHSEED=0 must apply)
_FLAGS = ["-s", "-P"] if sys.version_info >= (3, 11) else ["-s"]
_RESULT_PIPE_LIMIT = 8 << 20
_META_PIPE_LIMIT = 1 << 20

_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


def _site_paths() -> list[str]:
    try:
        import site

        return site.getsitepackages()
    except Exception:  # noqa: BLE001 - site may be stripped down
        return []


def _interpreter_paths() -> list[str]:
    """Directories the worker and the judge must be able to read to run this interpreter and this package."""
    paths = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(sys.executable),
        os.path.dirname(os.path.realpath(sys.executable)),
        _HERE,
        *_site_paths(),
    }
    return sorted({os.path.realpath(p) for p in paths if p and os.path.isdir(p)})


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError as exc:  # should not happen: the launcher runs as the caller's user
        logger.error("could not kill sandbox process group %d: %s", pid, exc)


def _terminate(proc, uids: list[int]) -> None:
    """Kill a run: first every process of its uids (so that init can reap them and exit), then the process group."""
    if uids:
        for uid in uids:
            sweep_uid(uid)
        try:
            proc.wait(timeout=1.0)
            return
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired
            pass
    _kill_group(proc.pid)


_bytecode_checked = False


def _ensure_bytecode() -> None:
    """Compile this package's modules (once per process) into world-readable ``__pycache__`` files, so that the
    launcher, the worker and the judge, which never write bytecode themselves, start without compiling anything. A
    read-only installation is left as it is (it then was compiled when installed)."""
    global _bytecode_checked
    if _bytecode_checked:
        return
    _bytecode_checked = True
    import importlib.util
    import py_compile

    for name in sorted(os.listdir(_HERE)):
        if not name.endswith(".py"):
            continue
        source = os.path.join(_HERE, name)
        cached = importlib.util.cache_from_source(source)
        try:
            st = os.stat(source)
            with open(cached, "rb") as f:
                header = f.read(16)
            fresh = (
                header[:4] == importlib.util.MAGIC_NUMBER
                and int.from_bytes(header[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
                and int.from_bytes(header[12:16], "little") == st.st_size & 0xFFFFFFFF
                and os.stat(cached).st_mode & 0o004
            )
        except OSError:
            fresh = False
        if not fresh:
            try:
                py_compile.compile(source, cfile=cached, doraise=True)
                os.chmod(cached, 0o644)
            except (OSError, py_compile.PyCompileError):
                pass


def _payload_fd(data: bytes) -> int:
    try:
        fd = os.memfd_create("trl-sandbox-job", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        import tempfile

        fd = os.dup(tempfile.TemporaryFile().fileno())  # unlinked file; the TemporaryFile object closes its own fd
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _worker_env(cfg: SandboxConfig, workdir: str) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.update({str(k): str(v) for k, v in cfg.env.items()})
    return env


def _remove_cgroup(name: str, patience_s: float = 5.0) -> None:
    """Remove the run's cgroup (possible once its last process has exited)."""
    for path in cgroup_paths(name):
        if not os.path.isdir(path):
            continue
        deadline = time.monotonic() + patience_s
        while True:
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    logger.warning("could not remove sandbox cgroup %s: %s", path, exc)
                    break
                time.sleep(0.02)


def execute(job: dict, cfg: SandboxConfig, tests: dict | None) -> SandboxResult:
    """Run ``job`` (``code``, ``stdin``) in a sandbox; with ``tests`` (``setup``, ``tests``), under a judge."""
    import secrets
    import shutil
    import subprocess
    import tempfile

    _ensure_bytecode()
    nonce = secrets.token_hex(16)
    clean = False  # True once the run ended normally inside a PID namespace (nothing can be left over)
    privileged = os.geteuid() == 0
    namespaces = list(cfg.namespace_names) if privileged else []
    root = root_plan(cfg.allowed_packages) if "mnt" in namespaces else None  # the allow-listed file system
    for note in root["notes"] if root else ():
        _warn_once(f"sandbox file system: {note}")
    job = dict(job, path=root["paths"] if root else [])  # where the allowed packages are, for sys.path
    leases: list[UidLease] = []
    uid = judge_uid = None
    if privileged and cfg.drop_privileges:
        if cfg.user is not None:
            uid = cfg.user
        else:
            leases.append(UidLease(*cfg.uid_range))
            uid = leases[-1].uid
        if tests is not None:
            leases.append(UidLease(*cfg.uid_range))
            judge_uid = leases[-1].uid
    elif privileged:
        _warn_once("sandbox: drop_privileges=False while running as root: untrusted code runs as root")
    uids = [u for u in (uid, judge_uid) if u is not None]
    workdir = None
    fds: list[int] = []  # every descriptor still to close here
    child_fds: list[int] = []  # the launcher's (closed here as soon as it has started)
    proc = None

    def pipe() -> tuple[int, int]:
        r, w = os.pipe()
        fds.extend((r, w))
        return r, w

    def payload(data: dict) -> int:
        fd = _payload_fd(json.dumps(data).encode())
        fds.append(fd)
        return fd

    try:
        workdir = tempfile.mkdtemp(prefix="trl-sandbox-", dir=cfg.base_dir)
        meta_r, meta_w = pipe()
        res_r, res_w = pipe()
        argv = [sys.executable, *_FLAGS, _BOOT]
        if tests is None:
            worker_payload = payload(dict(job, nonce=nonce))
            worker = {"keep": [res_w, worker_payload], "argv": [*argv, "_program", str(res_w), str(worker_payload)]}
            judge = None
            child_fds += [meta_w, res_w, worker_payload]
        else:
            worker_payload = payload(job)
            judge_payload = payload(dict(tests, nonce=nonce, test_timeout_s=cfg.test_timeout_s))
            to_worker_r, to_worker_w = pipe()
            to_judge_r, to_judge_w = pipe()
            worker = {
                "keep": [to_worker_r, to_judge_w, worker_payload],
                "argv": [*argv, "_serve", str(to_worker_r), str(to_judge_w), str(worker_payload)],
            }
            judge = {
                "uid": judge_uid,
                "cwd": "/",
                "keep": [to_judge_r, to_worker_w, res_w, judge_payload],
                "args": [to_judge_r, to_worker_w, res_w, judge_payload],
                "sitepath": [p for p in _site_paths() if os.path.isdir(p)] + job["path"],
            }
            child_fds += [
                meta_w,
                res_w,
                worker_payload,
                judge_payload,
                to_worker_r,
                to_worker_w,
                to_judge_r,
                to_judge_w,
            ]
        worker.update(uid=uid, cwd=workdir)
        mem = None if cfg.memory_mb is None else cfg.memory_mb << 20
        spec = {
            "host_pid": os.getpid(),
            "namespaces": namespaces,
            "root": root,
            "network": cfg.network,
            "workdir": workdir,
            "disk_mb": cfg.disk_mb,
            "shm_mb": cfg.shm_mb,
            "cgroup": (
                {"name": os.path.basename(workdir), "bytes": cfg.total_memory_limit_mb << 20}
                if privileged and cfg.total_memory_limit_mb
                else None
            ),
            "expose": _interpreter_paths() + [os.path.realpath(workdir)] if uids else [],
            "rlimits": {
                "cpu": cfg.cpu_limit,
                "as": mem,
                "nproc": cfg.max_processes,
                "fsize": cfg.max_file_bytes,
                "nofile": cfg.max_open_files,
            },
            "meta": meta_w,
            "worker": worker,
            "judge": judge,
            "env": _worker_env(cfg, workdir),
        }
        start = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-S", *_FLAGS, _BOOT, "_launch", json.dumps(spec)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=child_fds,
            start_new_session=True,
            close_fds=True,
            cwd="/",
            env={
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "LANG": "C.UTF-8",
                "PYTHONHASHSEED": "0",
                "PYTHONDONTWRITEBYTECODE": "1",
            },
        )
        for fd in child_fds:
            os.close(fd)
            fds.remove(fd)
        raw = _communicate(proc, meta_r, res_r, cfg, start, uids)
        duration = time.monotonic() - start
        meta = _parse_lines(raw["meta"], nonce=None)
        pid_ns = any("pid" in m.get("active", ()) for m in meta if m.get("e") == "ns")
        clean = pid_ns and not raw["killed"]
        for m in meta:
            if m.get("e") == "setup_error":
                raise SandboxError(f"sandbox setup failed: {m.get('message')}")
        records = _parse_lines(raw["res"], nonce=nonce)
        if not raw["killed"] and not any(r.get("e") == "hello" for r in records):
            err = raw["err"][-2000:].decode(errors="replace")
            raise SandboxError(
                f"the sandboxed interpreter did not start (launcher exit {proc.returncode}, meta {meta}): {err}"
            )
        isolation = _isolation(meta, records, uid, judge_uid)
        if tests is None:
            result = _program_result(raw, meta, records, cfg)
        else:
            result = _tests_result(raw, meta, records, tests["tests"], cfg)
        result.duration_s, result.isolation = duration, isolation
        logger.debug(
            "sandbox run: %s (%s) in %.3fs, isolation=%s", result.status, result.reason, duration, ",".join(isolation)
        )
        return result
    finally:
        if proc is not None:
            if proc.poll() is None:
                _kill_group(proc.pid)
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            if not clean:
                for u in uids:
                    sweep_uid(u)  # without a PID namespace, escaped descendants are only found by their uid
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        if workdir is not None:
            if privileged:
                _remove_cgroup(os.path.basename(workdir))
            shutil.rmtree(workdir, ignore_errors=True)
        for lease in leases:
            lease.release()


def _communicate(proc, meta_r: int, res_r: int, cfg: SandboxConfig, start: float, uids: list[int]) -> dict:
    """Read all four pipes with byte budgets until EOF, the deadline, or a budget is exceeded."""
    import selectors

    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    names = {out_fd: "out", err_fd: "err", res_r: "res", meta_r: "meta"}
    limits = {
        "out": cfg.max_output_bytes,
        "err": cfg.max_output_bytes,
        "res": _RESULT_PIPE_LIMIT,
        "meta": _META_PIPE_LIMIT,
    }
    bufs = {name: bytearray() for name in names.values()}
    raw = {"killed": None, "truncated": False}
    # until the first record (written before any untrusted code runs), allow for the start-up
    deadline = start + cfg.startup_timeout_s + cfg.timeout_s
    started = False
    meta_eof_at = None
    with selectors.DefaultSelector() as sel:
        for fd in names:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                raw["killed"] = "wall_timeout"
                break
            if meta_eof_at is not None and now - meta_eof_at > 2.0:
                # launcher and init are gone but something still holds stdout/stderr (no PID namespace)
                raw["killed"] = "leftover"
                break
            wait = deadline - now if meta_eof_at is None else min(deadline - now, meta_eof_at + 2.0 - now)
            for key, _ in sel.select(timeout=max(wait, 0.001)):
                fd = key.fd
                name = names[fd]
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    if name == "meta":
                        meta_eof_at = time.monotonic()
                    continue
                if name == "res" and not started:
                    started = True
                    deadline = time.monotonic() + cfg.timeout_s
                buf, limit = bufs[name], limits[name]
                room = limit - len(buf)
                buf += chunk[: max(room, 0)]
                if len(chunk) > room:
                    raw["killed"] = "output_limit" if name in ("out", "err") else "protocol_overflow"
                    raw["truncated"] = name in ("out", "err")
                    break
            if raw["killed"]:
                break
    if raw["killed"]:
        _terminate(proc, uids)
    proc.wait()
    raw.update(bufs)
    return raw


def _parse_lines(data: bytes, nonce: str | None) -> list[dict]:
    records = []
    for line in bytes(data).split(b"\n"):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        if nonce is not None and rec.pop("n", None) != nonce:
            continue
        records.append(rec)
    return records


def _isolation(meta: list[dict], records: list[dict], uid: int | None, judge_uid: int | None) -> tuple[str, ...]:
    isolation: list[str] = []
    for m in meta:
        if m.get("e") == "ns":
            isolation += [f"{name}ns" for name in m.get("active", ())]
            isolation += m.get("fs", [])
            for w in m.get("warnings", ()):
                _warn_once(f"sandbox isolation degraded: {w}")
    if judge_uid is not None:
        isolation.insert(0, f"judge_uid={judge_uid}")
    if uid is not None:
        isolation.insert(0, f"uid={uid}")
    isolation.append("rlimits")
    if any(r.get("e") == "hello" and r.get("net_hook") for r in records):
        isolation.append("socket_audit_hook")
    return tuple(isolation)


def _exit_of(meta: list[dict], kind: str) -> tuple[int | None, float | None]:
    """(exit code, CPU seconds) of the worker (``exit``) or the judge (``judge_exit``), as init reported them."""
    rec = next((m for m in meta if m.get("e") == kind), None)
    if rec is None:
        return None, None
    return os.waitstatus_to_exitcode(rec["status"]), float(rec.get("utime", 0.0)) + float(rec.get("stime", 0.0))


def _killed_status(raw: dict) -> tuple[str | None, str | None]:
    return {
        "wall_timeout": ("timed_out", "wall_timeout"),
        "output_limit": ("crashed", "output_limit"),
        "protocol_overflow": ("crashed", "exited_early"),
    }.get(raw["killed"], (None, None))


def _death(returncode: int | None, cpu: float | None, cfg: SandboxConfig) -> tuple[str, str]:
    """The status of a process that ended without its final report."""
    if returncode is not None and returncode < 0:
        sig = -returncode
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu is not None and cpu >= cfg.cpu_limit - 0.05):
            return "timed_out", "cpu_timeout"
        return "crashed", "signal"
    return "crashed", "exited_early"


def _result(raw: dict, status: str, reason: str, returncode, message: str, tests, cpu) -> SandboxResult:
    return SandboxResult(
        status=status,
        returncode=returncode,
        stdout=bytes(raw["out"]).decode("utf-8", errors="replace"),
        stderr=bytes(raw["err"]).decode("utf-8", errors="replace"),
        truncated=bool(raw["truncated"]),
        duration_s=0.0,
        reason=reason,
        message=message,
        tests=tests,
        cpu_time_s=cpu,
    )


def _program_result(raw: dict, meta: list[dict], records: list[dict], cfg: SandboxConfig) -> SandboxResult:
    returncode, cpu = _exit_of(meta, "exit")
    end = next((r for r in records if r.get("e") == "end"), None)
    status, reason = _killed_status(raw)
    if status is None and returncode is not None and returncode < 0:
        status, reason = _death(returncode, cpu, cfg)
    elif status is None and end is None:
        status, reason = "crashed", "exited_early"
    message = ""
    if end is not None and end.get("outcome") == "exception":
        message = f"{end.get('type')}: {end.get('message')}" if end.get("message") else str(end.get("type"))
    if status is None:
        if end.get("outcome") == "exception":
            status, reason = ("crashed", "memory") if end.get("type") == "MemoryError" else ("failed", "exception")
        elif end.get("code", 0) != 0 or returncode != 0:
            status, reason = "failed", "exit_code"
        else:
            status, reason = "passed", "ok"
    return _result(raw, status, reason, returncode, message, [], cpu)


def _tests_result(raw: dict, meta: list[dict], records: list[dict], sources: list[str], cfg) -> SandboxResult:
    """Per-test outcomes come from the judge's records only; the worker's exit only refines the run's status."""
    returncode, worker_cpu = _exit_of(meta, "exit")
    judge_code, judge_cpu = _exit_of(meta, "judge_exit")
    end = next((r for r in records if r.get("e") == "end"), None)
    status, reason = _killed_status(raw)
    if status is None and end is None:  # the judge died: the test it was running is lost
        returncode = judge_code
        status, reason = _death(judge_code, judge_cpu, cfg)
    elif status is None and end.get("worker") == "died":
        status, reason = _death(returncode, worker_cpu, cfg)
    elif status is None and end.get("worker") == "hung":
        status, reason = "timed_out", "test_timeout"
    prog = next((r for r in records if r.get("e") == "program"), None)
    program_ok = prog is not None and prog.get("ok") is True
    message = "" if prog is None or program_ok else str(prog.get("message", ""))
    done = {r["i"]: r for r in records if r.get("e") == "test" and isinstance(r.get("i"), int)}
    started = [r["i"] for r in records if r.get("e") == "test_start" and isinstance(r.get("i"), int)]
    running = started[-1] if started and started[-1] not in done else None
    tests: list[TestOutcome] = []
    for i, src in enumerate(sources):
        if i in done:
            r = done[i]
            t_status = r.get("status") if r.get("status") in TEST_STATUSES else "error"
            tests.append(TestOutcome(i, src, t_status, str(r.get("message", "")), float(r.get("t", 0.0))))
        elif i == running:
            died = "timed_out" if status == "timed_out" else "crashed"
            tests.append(TestOutcome(i, src, died, f"the process ended during this test ({reason or 'exit'})"))
        else:
            why = "the program failed" if prog is not None and not program_ok else "the process ended earlier"
            tests.append(TestOutcome(i, src, "not_run", why))
    if status is None:
        if not program_ok:
            status, reason = "failed", "program_error"
        elif all(t.passed for t in tests):
            status, reason = ("passed", "ok") if returncode == 0 else ("failed", "exit_code")
        elif any(t.status == "timed_out" for t in tests):
            status, reason = "timed_out", "test_timeout"
        else:
            status, reason = "failed", "tests_failed"
    cpu = None if worker_cpu is None and judge_cpu is None else (worker_cpu or 0.0) + (judge_cpu or 0.0)
    return _result(raw, status, reason, returncode, message, tests, cpu)
