"""Run untrusted, model-generated Python in a separate, locked-down process.

The code is never executed in the caller's process. Each run goes through three processes:

``host`` (the caller) ──Popen──> ``launcher`` (root, this file run as a script) ──fork──> ``init`` ──fork──> ``worker``

* The **launcher** unshares new namespaces (network, mount, PID, IPC, UTS; each one is optional and is reported in
  :attr:`SandboxResult.isolation`), makes every mount read-only *in its own mount namespace*, mounts a small private
  tmpfs as the working directory, hides directories the sandbox user cannot traverse (e.g. ``/root``) except for the
  Python installation, and forks ``init``.
* **init** is PID 1 of the new PID namespace: it mounts a private ``/proc``, forks the worker, reaps it and reports
  its exit status on a private pipe. When init exits, the kernel kills every process left in the namespace (fork
  bombs, daemonised children). init dies with the launcher (``PR_SET_PDEATHSIG``), and the launcher dies with the
  host thread that started it.
* The **worker** drops to a dedicated unprivileged uid/gid (a fresh one per concurrent run, leased from a pool with
  ``flock`` so that ``RLIMIT_NPROC`` is per run and runs cannot touch each other's files), sets
  ``PR_SET_NO_NEW_PRIVS``, resource limits (CPU time, address space, processes, file size, open files, no core
  dumps), a minimal environment, and execs the *same* interpreter (``sys.executable -s -P``, i.e. ``-I`` without
  ``-E``, so that the fixed ``PYTHONHASHSEED=0`` of the minimal environment applies) on this file's test harness.

The harness reads the job (code, tests, a random nonce) from an anonymous memfd, reports results as JSON lines on a
private pipe (never parsed from stdout), then runs the untrusted code.

Threat model
------------
The sandbox protects the **host**: the untrusted code cannot write outside its working directory, reach the network,
signal host processes, exhaust processes, memory, disk or the caller's memory (output is read with a byte budget),
or outlive its time budget. The *result channel*, however, lives in the same process as the untrusted code. The
harness makes accidental or naive cheating fail -- ``sys.exit(0)``/``os._exit(0)`` inside a test, printing
``PASSED``, killing the harness -- but a deliberately malicious program can inspect its own interpreter (frames,
``gc``, the nonce, the pipe) and forge its own test results. Do not treat per-test outcomes as adversarially robust;
treat them as robust against reward hacking by accident or by simple tricks.

Without root (or without ``CAP_SYS_ADMIN``) the namespaces and the uid switch are unavailable: the run then relies on
resource limits, a process group kill and a Python audit hook that refuses sockets, which is much weaker (see
``docs/sandbox.md``).
"""

from __future__ import annotations

import ast
import builtins
import io
import json
import logging
import os
import resource
import signal
import sys
import time
import traceback
import types
from dataclasses import dataclass, field

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

logger = logging.getLogger(__name__)

_THIS_FILE = os.path.abspath(__file__)

STATUSES = ("passed", "failed", "timed_out", "crashed")
_NAMESPACES = ("net", "ipc", "uts", "mnt", "pid")
TEST_STATUSES = ("passed", "failed", "error", "timed_out", "crashed", "not_run")

# Linux constants (stable ABI values).
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWNET = 0x40000000
_CLONE_NEWPID = 0x20000000
_MS_RDONLY = 0x1
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_NOEXEC = 0x8
_MS_REMOUNT = 0x20
_MS_NOATIME = 0x400
_MS_NODIRATIME = 0x800
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 0x40000
_MS_RELATIME = 0x200000
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36
# statvfs f_flag bits have the same values as these MS_* flags (ST_RELATIME does not: it is 0x1000 = MS_BIND).
_KEEP_MOUNT_FLAGS = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_NOATIME | _MS_NODIRATIME
_ST_RELATIME = 0x1000

_RESULT_PIPE_LIMIT = 8 << 20
_META_PIPE_LIMIT = 1 << 20
_MESSAGE_LIMIT = 2000
_REPR_LIMIT = 300


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (a host/configuration problem, never the untrusted code's fault)."""


# ---------------------------------------------------------------------------------------------------------------
# Public data types
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class SandboxConfig:
    """Limits and isolation settings for one sandboxed run.

    Attributes:
        timeout_s: wall-clock budget of the whole run (program plus all tests), counted from the moment the
            sandboxed interpreter is up. The process tree is SIGKILLed when it is exceeded.
        startup_timeout_s: extra wall-clock allowance for setting up the sandbox and starting the interpreter
            (normally ~0.1 s, more on a loaded machine); no untrusted code runs during it.
        cpu_time_s: CPU-time limit (``RLIMIT_CPU``, whole seconds, rounded up) of the worker and of every process it
            forks. ``None``: ``timeout_s`` rounded up.
        memory_mb: address-space limit (``RLIMIT_AS``) per process; allocations beyond it raise ``MemoryError``.
            ``None`` disables it.
        total_memory_mb: memory cap of the whole run -- all its processes plus the pages of its tmpfs working
            directory -- enforced by a memory cgroup (v1 or v2) where one can be created (as root); the kernel
            OOM-kills inside the run when it is exceeded (status ``crashed``). ``RLIMIT_AS`` alone is per process, so
            without it a fork bomb of allocating processes could take ``max_processes * memory_mb``. ``None``:
            ``2 * memory_mb + disk_mb``; ``0`` disables it.
        max_processes: ``RLIMIT_NPROC`` of the sandbox uid: processes *and threads* (the worker itself counts).
        max_output_bytes: byte budget per stream (stdout, stderr). Going over it kills the run (status ``crashed``,
            reason ``output_limit``, ``truncated=True``); the host never buffers more than this.
        max_file_bytes: ``RLIMIT_FSIZE``: the largest file the code may write.
        max_open_files: ``RLIMIT_NOFILE``.
        disk_mb: size of the private tmpfs that serves as working directory (only with a mount namespace).
        shm_mb: size of the private tmpfs mounted on ``/dev/shm`` (only with a mount namespace).
        network: allow network access. ``False`` (default): a fresh network namespace without interfaces, or, where
            namespaces are unavailable, an audit hook that refuses sockets.
        test_timeout_s: per-test wall-clock limit in :func:`run_tests` (``SIGALRM`` in the harness).
        namespaces: which Linux namespaces to unshare (needs root / ``CAP_SYS_ADMIN``): ``True`` for all of
            ``net``, ``ipc``, ``uts``, ``mnt``, ``pid``; ``False`` for none; or a subset of those names. Each one
            that cannot be created is skipped with a logged warning (see :attr:`SandboxResult.isolation`).
        drop_privileges: when running as root, run the code under an unprivileged uid. Without it the code runs as
            root: no ``RLIMIT_NPROC`` enforcement and no file-permission protection. Keep it on.
        user: run under this fixed uid (and a gid of the same number) instead of a leased one. Concurrent runs then
            share one ``RLIMIT_NPROC`` budget and can access each other's files, so the pool is preferred.
        uid_range: ``(first, count)`` of the uid pool leased to concurrent runs (no passwd entries are needed).
        env: extra environment variables for the code.
        base_dir: where the (host-side) working directories are created; ``None``: the system temp dir.
    """

    timeout_s: float = 10.0
    startup_timeout_s: float = 10.0
    cpu_time_s: float | None = None
    memory_mb: int | None = 512
    total_memory_mb: int | None = None
    max_processes: int = 64
    max_output_bytes: int = 1 << 20
    max_file_bytes: int = 16 << 20
    max_open_files: int = 256
    disk_mb: int = 64
    shm_mb: int = 8
    network: bool = False
    test_timeout_s: float = 3.0
    namespaces: bool | tuple[str, ...] = True
    drop_privileges: bool = True
    user: int | None = None
    uid_range: tuple[int, int] = (1_900_000_000, 1024)
    env: dict[str, str] = field(default_factory=dict)
    base_dir: str | None = None

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.startup_timeout_s <= 0:
            raise ValueError("timeout_s and startup_timeout_s must be > 0")
        if self.cpu_time_s is not None and self.cpu_time_s <= 0:
            raise ValueError("cpu_time_s must be > 0")
        if self.memory_mb is not None and self.memory_mb < 32:
            raise ValueError("memory_mb must be >= 32 (the interpreter needs it to start)")
        if self.max_processes < 1 or self.max_output_bytes < 1 or self.max_file_bytes < 0:
            raise ValueError("max_processes and max_output_bytes must be >= 1, max_file_bytes >= 0")
        if self.test_timeout_s <= 0:
            raise ValueError("test_timeout_s must be > 0")
        if not isinstance(self.namespaces, bool):
            self.namespaces = tuple(self.namespaces)
            unknown = set(self.namespaces) - set(_NAMESPACES)
            if unknown:
                raise ValueError(f"unknown namespaces {sorted(unknown)}; choose from {_NAMESPACES}")
        if self.uid_range[1] < 1 or self.uid_range[0] < 1:
            raise ValueError("uid_range must be (first_uid >= 1, count >= 1)")

    @property
    def namespace_names(self) -> tuple[str, ...]:
        if self.namespaces is True:
            return _NAMESPACES
        return () if self.namespaces is False else tuple(self.namespaces)

    @property
    def total_memory_limit_mb(self) -> int | None:
        if self.total_memory_mb is not None:
            return self.total_memory_mb or None
        return None if self.memory_mb is None else 2 * self.memory_mb + self.disk_mb

    @property
    def cpu_limit(self) -> int:
        import math

        return max(1, math.ceil(self.cpu_time_s if self.cpu_time_s is not None else self.timeout_s))


@dataclass
class TestOutcome:
    """The outcome of one test statement of :func:`run_tests`.

    ``status`` is one of ``passed``; ``failed`` (an ``AssertionError``); ``error`` (any other exception, including
    ``SystemExit`` raised inside the test); ``timed_out`` (over ``test_timeout_s``, or the run was killed for time
    while this test ran); ``crashed`` (the process died while this test ran: ``os._exit``, a signal, the output
    limit); ``not_run`` (the process died before, or the program itself failed).
    """

    __test__ = False  # not a pytest class

    index: int
    source: str
    status: str
    message: str = ""
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass
class SandboxResult:
    """The outcome of a sandboxed run.

    ``status``:

    * ``passed``: the code ran to its end (or called ``sys.exit(0)``/``sys.exit()``), the process exited 0 and, for
      :func:`run_tests`, every test passed.
    * ``failed``: the code finished abnormally *in Python*: an uncaught exception (``AssertionError`` included),
      ``sys.exit(n)`` with ``n != 0``, a syntax error, or (tests) at least one test failed or errored.
    * ``timed_out``: the wall-clock budget, the CPU-time limit (``SIGXCPU``) or, for tests, a per-test timeout was
      exceeded.
    * ``crashed``: the process died without the harness's final report: killed by a signal (segfault, ``abort``,
      the OOM killer), an uncaught ``MemoryError`` (memory cap), the output limit, or ``os._exit()`` -- even
      ``os._exit(0)``: bypassing the harness never counts as passing.

    ``reason`` refines it: ``ok``, ``exception``, ``exit_code``, ``program_error``, ``tests_failed``,
    ``wall_timeout``, ``cpu_timeout``, ``test_timeout``, ``signal``, ``memory``, ``output_limit``, ``exited_early``.

    ``returncode`` is the worker's exit status (negative: killed by that signal), ``None`` when the run was killed
    from outside (wall-clock timeout, output limit). ``stdout``/``stderr`` hold at most ``max_output_bytes`` bytes
    each (decoded as UTF-8 with replacement); ``truncated`` tells whether anything was cut. ``message`` is the
    uncaught exception of the program (``"ZeroDivisionError: division by zero"``), if any. ``isolation`` lists the
    mechanisms that were actually in effect.
    """

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    truncated: bool
    duration_s: float
    reason: str = ""
    message: str = ""
    tests: list[TestOutcome] = field(default_factory=list)
    cpu_time_s: float | None = None
    isolation: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def n_tests_passed(self) -> int:
        return sum(t.passed for t in self.tests)

    @property
    def pass_rate(self) -> float:
        """Fraction of tests passed (for :func:`run_tests`); 1.0/0.0 from ``passed`` for :func:`run_python`."""
        if not self.tests:
            return 1.0 if self.passed else 0.0
        return self.n_tests_passed / len(self.tests)


@dataclass
class SandboxJob:
    """One job of :func:`run_many`: ``run_python(program)`` when ``tests`` is ``None``, else ``run_tests``."""

    program: str
    tests: list[str] | None = None
    setup: str = ""
    stdin: str | None = None
    config: SandboxConfig | None = None


# ---------------------------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------------------------


def run_python(code: str, config: SandboxConfig | None = None, *, stdin: str | None = None) -> SandboxResult:
    """Run ``code`` as the ``__main__`` module of a sandboxed interpreter; see :class:`SandboxResult` for statuses.

    ``stdin`` (text) is offered as ``sys.stdin``; by default the program reads an empty stream.
    """
    return _execute({"mode": "program", "code": code, "stdin": stdin}, config or SandboxConfig(), n_tests=0)


def run_tests(
    program: str,
    tests: list[str],
    config: SandboxConfig | None = None,
    *,
    setup: str = "",
    stdin: str | None = None,
) -> SandboxResult:
    """Run ``program`` once, then ``setup``, then every test statement separately, in the program's namespace.

    Each test is Python source (``"assert candidate(1) == 2"``, or several statements). Tests run one after the
    other in one process, each under ``config.test_timeout_s``; a failing, erroring or timed-out test does not stop
    the next. Plain ``assert a OP b`` statements are rewritten so that their failure message shows the values, e.g.
    ``"AssertionError: expected 2, got 1"`` (the side that is a call is taken as the actual value). Exiting the
    process from a test (``sys.exit``, ``os._exit``) never counts as passing. ``result.tests`` holds the per-test
    outcomes; the overall status is ``passed`` only if all tests passed (see :class:`SandboxResult`).
    """
    tests = [str(t) for t in tests]
    payload = {"mode": "tests", "code": program, "setup": setup, "tests": tests, "stdin": stdin}
    return _execute(payload, config or SandboxConfig(), n_tests=len(tests))


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


def humaneval_tests(test_code: str, entry_point: str) -> tuple[str, list[str]]:
    """Split a HumanEval-style ``def check(candidate): ...`` into ``(setup, tests)`` for :func:`run_tests`.

    ``setup`` holds the module-level statements of ``test_code`` other than ``check`` (imports, ``METADATA``,
    helpers) and binds ``candidate = <entry_point>``. Every statement of ``check``'s body that contains an
    ``assert`` becomes one test; statements without an assert (assignments, imports, helper functions) are
    prepended to the next test so that order is preserved (trailing ones are appended to the last test).
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


# ---------------------------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------------------------

_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


def _interpreter_paths() -> list[str]:
    """Directories the worker must be able to read to run this interpreter and this file."""
    paths = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(sys.executable),
        os.path.dirname(os.path.realpath(sys.executable)),
        os.path.dirname(_THIS_FILE),
    }
    try:
        import site

        paths.update(site.getsitepackages())
    except Exception:  # noqa: BLE001 - site may be stripped down
        pass
    return sorted({os.path.realpath(p) for p in paths if p and os.path.isdir(p)})


class _UidLease:
    """A uid reserved for one run: an exclusive ``flock`` on ``<tmp>/trl-multiagent-sandbox-uids/<uid>.lock``.

    ``flock`` locks belong to open file descriptions, so they exclude threads of this process and other processes
    alike, and are released if the holder dies.
    """

    def __init__(self, first: int, count: int) -> None:
        import fcntl
        import random
        import tempfile

        lock_dir = os.path.join(tempfile.gettempdir(), "trl-multiagent-sandbox-uids")
        try:
            os.mkdir(lock_dir, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(lock_dir)
        import stat

        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise SandboxError(
                f"{lock_dir} must be a directory owned by uid {os.geteuid()} and not group/world-writable"
            )
        start = random.randrange(count)
        for k in range(count):
            uid = first + (start + k) % count
            fd = os.open(os.path.join(lock_dir, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid = uid
            self._fd = fd
            return
        raise SandboxError(f"all {count} sandbox uids starting at {first} are in use")

    def release(self) -> None:
        os.close(self._fd)  # closing the only descriptor drops the flock


def _processes_of_uid(uid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f if b":" in line)
            if fields[b"State"].split()[0] not in (b"Z", b"X") and int(fields[b"Uid"].split()[0]) == uid:
                pids.append(int(name))
        except (OSError, ValueError, IndexError, KeyError):
            continue
    return pids


def _sweep_uid(uid: int, patience_s: float = 10.0) -> None:
    """SIGKILL every process of ``uid`` (``kill(-1)`` as that uid: a fork cannot race a pending SIGKILL), and wait
    until they are gone (dying processes can take a while on a loaded machine)."""
    import shutil
    import subprocess

    kill = shutil.which("kill", path="/usr/bin:/bin")
    deadline = time.monotonic() + patience_s
    pause = 0.005
    while True:
        pids = _processes_of_uid(uid)
        if not pids:
            return
        if time.monotonic() > deadline:
            logger.error("sandbox uid %d still has processes %s after %.0fs of SIGKILL", uid, pids, patience_s)
            return
        if kill is None:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        else:
            subprocess.run(
                [kill, "-KILL", "-1"],
                user=uid,
                group=uid,
                extra_groups=[],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=10,
                check=False,
                cwd="/",
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError as exc:  # should not happen: the launcher runs as the caller's user
        logger.error("could not kill sandbox process group %d: %s", pid, exc)


def _terminate(proc, uid: int | None) -> None:
    """Kill a run: first every process of its uid (so that init can reap them and exit), then the process group."""
    if uid is not None:
        _sweep_uid(uid)
        try:
            proc.wait(timeout=1.0)
            return
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired
            pass
    _kill_group(proc.pid)


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


def _execute(payload: dict, cfg: SandboxConfig, n_tests: int) -> SandboxResult:
    import secrets
    import shutil
    import subprocess
    import tempfile

    nonce = secrets.token_hex(16)
    clean = False  # True once the run ended normally inside a PID namespace (nothing can be left over)
    payload = dict(payload, nonce=nonce, test_timeout_s=cfg.test_timeout_s)
    privileged = os.geteuid() == 0
    lease: _UidLease | None = None
    uid: int | None = None
    if privileged and cfg.drop_privileges:
        if cfg.user is not None:
            uid = cfg.user
        else:
            lease = _UidLease(*cfg.uid_range)
            uid = lease.uid
    elif privileged:
        _warn_once("sandbox: drop_privileges=False while running as root: untrusted code runs as root")
    workdir = None
    fds: list[int] = []
    proc = None
    try:
        workdir = tempfile.mkdtemp(prefix="trl-sandbox-", dir=cfg.base_dir)
        payload_fd = _payload_fd(json.dumps(payload).encode())
        fds.append(payload_fd)
        meta_r, meta_w = os.pipe()
        res_r, res_w = os.pipe()
        fds += [meta_r, meta_w, res_r, res_w]
        worker_argv = [sys.executable, "-s"]
        if sys.version_info >= (3, 11):
            worker_argv.append("-P")  # do not put this file's directory on sys.path
        worker_argv += [_THIS_FILE, "_harness", str(res_w), str(payload_fd)]
        mem = None if cfg.memory_mb is None else cfg.memory_mb << 20
        spec = {
            "host_pid": os.getpid(),
            "uid": uid,
            "namespaces": list(cfg.namespace_names) if privileged else [],
            "network": cfg.network,
            "workdir": workdir,
            "disk_mb": cfg.disk_mb,
            "shm_mb": cfg.shm_mb,
            "cgroup": (
                {"name": os.path.basename(workdir), "bytes": cfg.total_memory_limit_mb << 20}
                if privileged and cfg.total_memory_limit_mb
                else None
            ),
            "expose": _interpreter_paths() + [os.path.realpath(workdir)] if uid is not None else [],
            "rlimits": {
                "cpu": cfg.cpu_limit,
                "as": mem,
                "nproc": cfg.max_processes,
                "fsize": cfg.max_file_bytes,
                "nofile": cfg.max_open_files,
            },
            "fds": {"meta": meta_w, "res": res_w, "payload": payload_fd},
            "argv": worker_argv,
            "env": _worker_env(cfg, workdir),
        }
        start = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", _THIS_FILE, "_launch", json.dumps(spec)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(payload_fd, meta_w, res_w),
            start_new_session=True,
            close_fds=True,
            cwd="/",
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
        )
        for fd in (payload_fd, meta_w, res_w):
            os.close(fd)
            fds.remove(fd)
        raw = _communicate(proc, meta_r, res_r, cfg, start, uid)
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
        return _build_result(raw, meta, records, payload, cfg, n_tests, duration, uid)
    finally:
        if proc is not None:
            if proc.poll() is None:
                _kill_group(proc.pid)
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            if uid is not None and not clean:
                _sweep_uid(uid)  # without a PID namespace, escaped descendants are only found by their uid
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        if workdir is not None:
            if privileged:
                _remove_cgroup(os.path.basename(workdir))
            shutil.rmtree(workdir, ignore_errors=True)
        if lease is not None:
            lease.release()


def _communicate(proc, meta_r: int, res_r: int, cfg: SandboxConfig, start: float, uid: int | None) -> dict:
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
    # until the harness's first record (written before any untrusted code runs), allow for the start-up
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
        _terminate(proc, uid)
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


def _build_result(raw, meta, records, payload, cfg, n_tests, duration, uid) -> SandboxResult:
    isolation: list[str] = []
    for m in meta:
        if m.get("e") == "ns":
            isolation += [f"{name}ns" for name in m.get("active", ())]
            isolation += m.get("fs", [])
            for w in m.get("warnings", ()):
                _warn_once(f"sandbox isolation degraded: {w}")
    if uid is not None:
        isolation.insert(0, f"uid={uid}")
    isolation.append("rlimits")
    if any(r.get("e") == "hello" and r.get("net_hook") for r in records):
        isolation.append("socket_audit_hook")

    exit_rec = next((m for m in meta if m.get("e") == "exit"), None)
    returncode = cpu = None
    if exit_rec is not None:
        returncode = os.waitstatus_to_exitcode(exit_rec["status"])
        cpu = float(exit_rec.get("utime", 0.0)) + float(exit_rec.get("stime", 0.0))
    end = next((r for r in records if r.get("e") == "end"), None)

    status, reason = None, None
    killed = raw["killed"]
    if killed == "wall_timeout":
        status, reason = "timed_out", "wall_timeout"
    elif killed == "output_limit":
        status, reason = "crashed", "output_limit"
    elif killed == "protocol_overflow":
        status, reason = "crashed", "exited_early"
    elif returncode is not None and returncode < 0:
        sig = -returncode
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu is not None and cpu >= cfg.cpu_limit - 0.05):
            status, reason = "timed_out", "cpu_timeout"
        else:
            status, reason = "crashed", "signal"
    elif end is None:
        status, reason = "crashed", "exited_early"

    message = ""
    tests: list[TestOutcome] = []
    if payload["mode"] == "program":
        if end is not None and end.get("outcome") == "exception":
            message = f"{end.get('type')}: {end.get('message')}" if end.get("message") else str(end.get("type"))
        if status is None:
            if end.get("outcome") == "exception":
                status, reason = ("crashed", "memory") if end.get("type") == "MemoryError" else ("failed", "exception")
            elif end.get("code", 0) != 0 or returncode != 0:
                status, reason = "failed", "exit_code"
            else:
                status, reason = "passed", "ok"
    else:
        prog = next((r for r in records if r.get("e") == "program"), None)
        if prog is not None and not prog.get("ok"):
            message = prog.get("message", "")
        done = {r["i"]: r for r in records if r.get("e") == "test" and isinstance(r.get("i"), int)}
        started = [r["i"] for r in records if r.get("e") == "test_start" and isinstance(r.get("i"), int)]
        running = started[-1] if started and started[-1] not in done else None
        for i, src in enumerate(payload["tests"]):
            if i in done:
                r = done[i]
                t_status = r.get("status") if r.get("status") in TEST_STATUSES else "error"
                tests.append(TestOutcome(i, src, t_status, str(r.get("message", "")), float(r.get("t", 0.0))))
            elif i == running:
                died = "timed_out" if status == "timed_out" else "crashed"
                tests.append(TestOutcome(i, src, died, f"the process ended during this test ({reason or 'exit'})"))
            else:
                why = "the program failed" if prog is not None and not prog.get("ok") else "the process ended earlier"
                tests.append(TestOutcome(i, src, "not_run", why))
        if status is None:
            if prog is None or not prog.get("ok"):
                status, reason = "failed", "program_error"
            elif all(t.passed for t in tests):
                status, reason = ("passed", "ok") if returncode == 0 else ("failed", "exit_code")
            elif any(t.status == "timed_out" for t in tests):
                status, reason = "timed_out", "test_timeout"
            else:
                status, reason = "failed", "tests_failed"
    assert n_tests == len(tests)
    result = SandboxResult(
        status=status,
        returncode=returncode,
        stdout=bytes(raw["out"]).decode("utf-8", errors="replace"),
        stderr=bytes(raw["err"]).decode("utf-8", errors="replace"),
        truncated=bool(raw["truncated"]),
        duration_s=duration,
        reason=reason,
        message=message,
        tests=tests,
        cpu_time_s=cpu,
        isolation=tuple(isolation),
    )
    logger.debug("sandbox run: %s (%s) in %.3fs, isolation=%s", status, reason, duration, ",".join(isolation))
    return result


# ---------------------------------------------------------------------------------------------------------------
# Launcher and init (root, inside the new namespaces). Only called when this file runs as a script.
# ---------------------------------------------------------------------------------------------------------------


def _emit(fd: int, record: dict) -> None:
    data = (json.dumps(record) + "\n").encode()
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.unshare.argtypes = [ctypes.c_int]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return libc


def _check(libc, ret: int, what: str) -> None:
    if ret != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(libc, source, target, fstype, flags: int, data=None) -> None:
    enc = [None if s is None else os.fsencode(s) for s in (source, target, fstype, data)]
    _check(libc, libc.mount(enc[0], enc[1], enc[2], flags, enc[3]), f"mount {target}")


def _prctl(libc, option: int, arg: int) -> None:
    _check(libc, libc.prctl(option, arg, 0, 0, 0), f"prctl({option})")


def _mount_points() -> list[str]:
    import re

    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4:
                points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def _remount_ro(libc, path: str) -> None:
    flags = os.statvfs(path).f_flag
    keep = (flags & _KEEP_MOUNT_FLAGS) | (_MS_RELATIME if flags & _ST_RELATIME else 0)
    _mount(libc, None, path, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | keep)


def _first_blocked_ancestor(path: str) -> str | None:
    """The topmost proper ancestor of ``path`` that "others" cannot traverse (no ``o+x``)."""
    parts = path.strip("/").split("/")
    for k in range(len(parts)):
        p = "/" + "/".join(parts[:k])
        if not os.stat(p).st_mode & 0o001:
            return p
    return None


def _setup_filesystem(libc, spec: dict, fs: list[str], warnings: list[str]) -> None:
    # 1. every mount read-only (per-mount flags of this namespace's copies: the host is unaffected)
    failed = []
    for point in _mount_points():
        try:
            _remount_ro(libc, point)
        except OSError as exc:
            failed.append(f"{point} ({exc.strerror})")
    if failed:
        warnings.append("could not remount read-only: " + ", ".join(failed))
    else:
        fs.append("ro_mounts")
    # 2. hide directories the sandbox uid cannot traverse (e.g. /root) behind an empty tmpfs, re-exposing only the
    #    interpreter's directories (read-only)
    blocked: dict[str, list[str]] = {}
    for path in spec["expose"]:
        anc = _first_blocked_ancestor(path)
        if anc is not None:
            blocked.setdefault(anc, []).append(path)
    for anc, paths in sorted(blocked.items()):
        paths = [p for p in paths if not any(q != p and p.startswith(q.rstrip("/") + "/") for q in paths)]
        handles = [(p, os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)) for p in paths]
        try:
            _mount(libc, "tmpfs", anc, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k,mode=0755")
            for p, h in handles:
                os.makedirs(p, mode=0o755, exist_ok=True)
                _mount(libc, f"/proc/self/fd/{h}", p, None, _MS_BIND | _MS_REC)
                _remount_ro(libc, p)
            _remount_ro(libc, anc)
        finally:
            for _, h in handles:
                os.close(h)
        fs.append(f"masked:{anc}")
    # 3. a private /dev/shm (the host's is read-only now)
    if os.path.isdir("/dev/shm"):
        try:
            _mount(
                libc,
                "tmpfs",
                "/dev/shm",
                "tmpfs",
                _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                f"size={spec['shm_mb']}m,mode=1777",
            )
            fs.append("private_shm")
        except OSError as exc:
            warnings.append(f"private /dev/shm: {exc.strerror}")
    # 4. the working directory: a size-limited tmpfs owned by the sandbox uid (nothing reaches the host's disk)
    uid = spec["uid"]
    owner = "" if uid is None else f",uid={uid},gid={uid}"
    _mount(
        libc,
        "tmpfs",
        spec["workdir"],
        "tmpfs",
        _MS_NOSUID | _MS_NODEV,
        f"size={spec['disk_mb']}m,nr_inodes=4096,mode=0700{owner}",
    )
    fs.append("tmpfs_workdir")


def _isolate(spec: dict) -> tuple[list[str], list[str], list[str]]:
    """Unshare namespaces and prepare the filesystem view. Returns (active namespaces, fs steps, warnings)."""
    active: list[str] = []
    fs: list[str] = []
    warnings: list[str] = []
    if spec["namespaces"]:
        import ctypes

        libc = _libc()
        flags = {
            "net": _CLONE_NEWNET,
            "ipc": _CLONE_NEWIPC,
            "uts": _CLONE_NEWUTS,
            "mnt": _CLONE_NEWNS,
            "pid": _CLONE_NEWPID,
        }
        wanted = [(n, flags[n]) for n in flags if n in spec["namespaces"] and not (n == "net" and spec["network"])]
        for name, flag in wanted:
            if libc.unshare(flag) == 0:
                active.append(name)
            else:
                warnings.append(f"unshare({name}): {os.strerror(ctypes.get_errno())}")
        if "mnt" in active:
            try:
                _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)  # never propagate anything to the host
            except OSError as exc:
                warnings.append(f"cannot make mounts private ({exc.strerror}); no filesystem isolation")
                active.remove("mnt")
            else:
                _setup_filesystem(libc, spec, fs, warnings)
    if "tmpfs_workdir" not in fs and spec["uid"] is not None:
        os.chown(spec["workdir"], spec["uid"], spec["uid"])
        os.chmod(spec["workdir"], 0o700)
    return active, fs, warnings


_CGROUP_V2 = "/sys/fs/cgroup"
_CGROUP_V1_MEMORY = "/sys/fs/cgroup/memory"
_CGROUP_DIR = "trl-multiagent-sandbox"


def _cgroup_paths(name: str) -> list[str]:
    return [os.path.join(root, _CGROUP_DIR, name) for root in (_CGROUP_V2, _CGROUP_V1_MEMORY)]


def _write_file(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _enter_cgroup(cg: dict) -> str | None:
    """Create a memory cgroup capped at ``cg["bytes"]`` and move this process into it (children inherit it).

    Returns a warning instead of raising when cgroups are unavailable (read-only cgroupfs in a container, ...)."""
    limit = str(cg["bytes"])
    try:
        if os.path.exists(os.path.join(_CGROUP_V2, "cgroup.controllers")):  # unified hierarchy
            with open(os.path.join(_CGROUP_V2, "cgroup.subtree_control")) as f:
                if "memory" not in f.read().split():
                    return "memory cgroup: the memory controller is not enabled at the cgroup v2 root"
            base = os.path.join(_CGROUP_V2, _CGROUP_DIR)
            os.makedirs(base, exist_ok=True)
            _write_file(os.path.join(base, "cgroup.subtree_control"), "+memory")
            path = os.path.join(base, cg["name"])
            os.mkdir(path)
            _write_file(os.path.join(path, "memory.max"), limit)
            if os.path.exists(os.path.join(path, "memory.swap.max")):
                _write_file(os.path.join(path, "memory.swap.max"), "0")
        elif os.path.isdir(_CGROUP_V1_MEMORY):
            path = os.path.join(_CGROUP_V1_MEMORY, _CGROUP_DIR, cg["name"])
            os.makedirs(path)
            _write_file(os.path.join(path, "memory.limit_in_bytes"), limit)
            if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                _write_file(os.path.join(path, "memory.memsw.limit_in_bytes"), limit)
        else:
            return "memory cgroup: no cgroup filesystem found"
        _write_file(os.path.join(path, "cgroup.procs"), str(os.getpid()))
    except OSError as exc:
        return f"memory cgroup: {exc}"
    return None


def _remove_cgroup(name: str, patience_s: float = 5.0) -> None:
    """Remove the run's cgroup (possible once its last process has exited)."""
    for path in _cgroup_paths(name):
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


def _launcher_main(spec: dict) -> None:
    meta = spec["fds"]["meta"]
    os.umask(0o022)
    try:
        libc = _libc()
        _prctl(libc, _PR_SET_PDEATHSIG, signal.SIGKILL)  # die with the host thread that started us
        if os.getppid() != spec["host_pid"]:
            os._exit(70)
        cgroup_warning = _enter_cgroup(spec["cgroup"]) if spec["cgroup"] else None
        active, fs, warnings = _isolate(spec)
        if cgroup_warning:
            warnings.append(cgroup_warning)
        elif spec["cgroup"]:
            fs.append("cgroup_memory")
    except BaseException as exc:  # noqa: BLE001 - report any set-up failure to the host
        _emit(meta, {"e": "setup_error", "message": f"launcher: {exc!r}"})
        os._exit(70)
    _emit(meta, {"e": "ns", "active": active, "fs": fs, "warnings": warnings})
    launcher_pid = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            _init_main(spec, active, libc, launcher_pid)
        finally:
            os._exit(70)
    for fd in (spec["fds"]["res"], spec["fds"]["payload"], meta):
        os.close(fd)
    _quiet_stdio()
    _, status = os.waitpid(pid, 0)
    os._exit(0 if os.waitstatus_to_exitcode(status) == 0 else 71)


def _quiet_stdio() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _init_main(spec: dict, active: list[str], libc, launcher_pid: int) -> None:
    meta = spec["fds"]["meta"]
    try:
        _prctl(libc, _PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != launcher_pid and "pid" not in active:
            os._exit(70)
        if "pid" in active and "mnt" in active:
            _mount(libc, "proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        if "pid" not in active:
            _prctl(libc, _PR_SET_CHILD_SUBREAPER, 1)  # orphans come to us (to be killed and reaped), not to host init
    except BaseException as exc:  # noqa: BLE001
        _emit(meta, {"e": "setup_error", "message": f"init: {exc!r}"})
        os._exit(70)
    init_pid = os.getpid()
    wpid = os.fork()
    if wpid == 0:
        try:
            _worker_exec(spec, active, libc, init_pid)
        finally:
            os._exit(70)
    os.close(spec["fds"]["res"])
    os.close(spec["fds"]["payload"])
    _quiet_stdio()
    while True:  # as PID 1 we also reap orphans
        try:
            pid, status, usage = os.wait4(-1, 0)
        except ChildProcessError:
            os._exit(72)
        if pid == wpid:
            break
    _emit(
        meta,
        {
            "e": "exit",
            "status": status,
            "utime": usage.ru_utime,
            "stime": usage.ru_stime,
            "maxrss_kb": usage.ru_maxrss,
        },
    )
    if "pid" not in active:
        if spec["uid"] is not None:
            _kill_all_as(spec["uid"])
        _reap_children(deadline=time.monotonic() + 2.0)
    os._exit(0)  # with a PID namespace, this kills every process left in it


def _reap_children(deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.01)


def _kill_all_as(uid: int) -> None:
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _worker_exec(spec: dict, active: list[str], libc, init_pid: int) -> None:
    fds = spec["fds"]
    try:
        os.set_inheritable(fds["meta"], False)  # stays open until exec, to report failures
        keep = {0, 1, 2, fds["res"], fds["payload"], fds["meta"]}
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        os.set_inheritable(fds["res"], True)
        os.set_inheritable(fds["payload"], True)
        os.chdir(spec["workdir"])
        os.umask(0o077)
        rl = spec["rlimits"]
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (rl["fsize"], rl["fsize"]))
        resource.setrlimit(resource.RLIMIT_NOFILE, (rl["nofile"], rl["nofile"]))
        resource.setrlimit(resource.RLIMIT_NPROC, (rl["nproc"], rl["nproc"]))
        resource.setrlimit(resource.RLIMIT_CPU, (rl["cpu"], rl["cpu"] + 1))
        uid = spec["uid"]
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)  # real, effective and saved ids; drops all capabilities
            if os.getuid() != uid or os.geteuid() != uid:
                raise OSError("setuid did not take effect")
        _prctl(libc, _PR_SET_NO_NEW_PRIVS, 1)
        _prctl(libc, _PR_SET_PDEATHSIG, signal.SIGKILL)  # (cleared by setuid, so set again)
        if os.getppid() != (1 if "pid" in active else init_pid):
            os._exit(70)
        if rl["as"] is not None:
            resource.setrlimit(resource.RLIMIT_AS, (rl["as"], rl["as"]))
        argv = list(spec["argv"]) + ["0" if "net" in active or spec["network"] else "1"]
        os.execve(argv[0], argv, spec["env"])
    except BaseException as exc:  # noqa: BLE001
        _emit(fds["meta"], {"e": "setup_error", "message": f"worker: {exc!r}"})
        os._exit(70)


# ---------------------------------------------------------------------------------------------------------------
# Harness (the worker process: unprivileged, runs the untrusted code)
# ---------------------------------------------------------------------------------------------------------------


class TestTimeout(BaseException):
    """Raised inside a test by the per-test alarm (a BaseException, so ``except Exception`` does not swallow it)."""

    __test__ = False


def _safe_repr(value) -> str:
    try:
        text = repr(value)
    except BaseException as exc:  # noqa: BLE001
        text = f"<repr failed: {type(exc).__name__}>"
    return text if len(text) <= _REPR_LIMIT else text[: _REPR_LIMIT - 3] + "..."


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001
        text = ""
    name = type(exc).__name__
    msg = f"{name}: {text}" if text else name
    return msg if len(msg) <= _MESSAGE_LIMIT else msg[: _MESSAGE_LIMIT - 3] + "..."


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
        detail = f"expected {_safe_repr(expected)}, got {_safe_repr(actual)}"
    else:
        detail = f"{text} is false (left: {_safe_repr(left)}, right: {_safe_repr(right)})"
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
            call = ast.Call(
                func=ast.Name("__sandbox_compare__", ast.Load()),
                args=[
                    test.left,
                    right,
                    ast.Constant(type(test.ops[0]).__name__),
                    ast.Constant(text),
                    msg,
                    ast.Constant(actual_is_right),
                ],
                keywords=[],
            )
        else:
            call = ast.Call(
                func=ast.Name("__sandbox_truth__", ast.Load()), args=[test, ast.Constant(text), msg], keywords=[]
            )
        return ast.copy_location(ast.Expr(call), node)


class _Reporter:
    def __init__(self, fd: int, nonce: str) -> None:
        self.fd = fd
        self.nonce = nonce

    def __call__(self, **record) -> None:
        record["n"] = self.nonce
        _emit(self.fd, record)


def _print_user_traceback(exc: BaseException) -> None:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == _THIS_FILE:
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


def _exec_stage(source: str, filename: str, ns: dict) -> tuple[bool, str, BaseException | None]:
    """Run a program/setup stage. ``sys.exit(0)``/``sys.exit()`` counts as success."""
    try:
        exec(compile(source, filename, "exec"), ns)
    except SystemExit as exc:
        if exc.code is None or exc.code == 0:
            return True, "", None
        return False, f"SystemExit: {exc.code!r}", exc
    except BaseException as exc:  # noqa: BLE001
        return False, _describe(exc), exc
    return True, "", None


def _run_one_test(index: int, source: str, ns: dict, timeout: float) -> tuple[str, str]:
    try:
        tree = ast.fix_missing_locations(_AssertRewriter(source).visit(ast.parse(source, f"<test {index}>")))
        code = compile(tree, f"<test {index}>", "exec")
    except SyntaxError as exc:
        return "error", _describe(exc)

    def on_alarm(signum, frame):
        raise TestTimeout(f"test exceeded {timeout:g}s")

    try:
        try:
            signal.signal(signal.SIGALRM, on_alarm)
            signal.setitimer(signal.ITIMER_REAL, timeout)
            exec(code, ns)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except TestTimeout as exc:
        return "timed_out", _describe(exc)
    except AssertionError as exc:
        return "failed", _describe(exc)
    except SystemExit as exc:
        return "error", f"SystemExit({exc.code!r}) raised inside a test: exiting never counts as passing"
    except BaseException as exc:  # noqa: BLE001
        return "error", _describe(exc)
    return "passed", ""


def _harness_main(argv: list[str]) -> tuple[int, str]:
    res_fd, payload_fd, block_net = int(argv[2]), int(argv[3]), argv[4] == "1"
    chunks = []
    while True:
        chunk = os.read(payload_fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(payload_fd)
    job = json.loads(b"".join(chunks))
    # the result pipe moves to another descriptor number (this only stops naive guessing: see the threat model)
    new_fd = os.dup(res_fd)
    os.close(res_fd)
    report = _Reporter(new_fd, job.pop("nonce"))
    script_dir = os.path.dirname(_THIS_FILE)
    sys.path[:] = [p for p in sys.path if p not in ("", script_dir)]
    sys.argv = ["<program>"]
    report(e="hello", net_hook=block_net)
    if block_net:
        sys.addaudithook(_block_network)
    if job.get("stdin") is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(job["stdin"].encode()), encoding="utf-8")
    module = types.ModuleType("__main__")
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    ns = module.__dict__

    if job["mode"] == "program":
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
            return code, "program"
        except BaseException as exc:  # noqa: BLE001
            report(e="end", outcome="exception", type=type(exc).__name__, message=_describe(exc).partition(": ")[2])
            _print_user_traceback(exc)
            return 1, "program"
        report(e="end", outcome="ok", code=0)
        return 0, "program"

    ok, message, exc = _exec_stage(job["code"], "<program>", ns)
    if ok and job.get("setup"):
        ok, message, exc = _exec_stage(job["setup"], "<setup>", ns)
        message = f"setup: {message}" if message else message
    report(e="program", ok=ok, message=message)
    if not ok:
        if exc is not None:
            _print_user_traceback(exc)
        report(e="end")
        return 1, "tests"
    ns["__sandbox_compare__"] = _assert_compare
    ns["__sandbox_truth__"] = _assert_truth
    timeout = float(job["test_timeout_s"])
    all_passed = True
    for i, source in enumerate(job["tests"]):
        report(e="test_start", i=i)
        t0 = time.perf_counter()
        status, message = _run_one_test(i, source, ns, timeout)
        report(e="test", i=i, status=status, message=message, t=round(time.perf_counter() - t0, 6))
        all_passed = all_passed and status == "passed"
    report(e="end")
    return (0 if all_passed else 1), "tests"


def _main(argv: list[str]) -> None:
    role = argv[1] if len(argv) > 1 else ""
    if role == "_launch":
        _launcher_main(json.loads(argv[2]))
    elif role == "_harness":
        code, mode = _harness_main(argv)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
        if mode == "tests":
            os._exit(code)  # all results are in: do not wait for threads or atexit hooks left by the tests
        sys.exit(code)  # a program: exit normally (non-daemon threads finish, atexit hooks run)
    else:
        sys.stderr.write("this file is run by trl_multiagent.sandbox; it has no command-line interface\n")
        sys.exit(2)


if __name__ == "__main__":
    _main(sys.argv)
