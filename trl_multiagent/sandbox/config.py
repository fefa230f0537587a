"""Public data types of the sandbox: its configuration, its results and its errors."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

TEST_STATUSES = ("passed", "failed", "error", "timed_out", "crashed", "not_run")
NAMESPACES = ("net", "ipc", "uts", "mnt", "pid")


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
            forks, and, separately, of the judge. ``None``: ``timeout_s`` rounded up.
        memory_mb: address-space limit (``RLIMIT_AS``) per process (the judge's too); allocations beyond it raise
            ``MemoryError``.
            ``None`` disables it.
        total_memory_mb: memory cap of the whole run -- all its processes plus the pages of its tmpfs working
            directory -- enforced by a memory cgroup (v1 or v2) where one can be created (as root); the kernel
            OOM-kills inside the run when it is exceeded (status ``crashed``). ``RLIMIT_AS`` alone is per process, so
            without it a fork bomb of allocating processes could take ``max_processes * memory_mb``. ``None``:
            ``2 * memory_mb + disk_mb``; ``0`` disables it.
        max_processes: ``RLIMIT_NPROC`` of the sandbox uid: processes *and threads* (the worker itself counts); the
            judge's uid gets the same budget of its own.
        max_output_bytes: byte budget per stream (stdout, stderr). Going over it kills the run (status ``crashed``,
            reason ``output_limit``, ``truncated=True``); the host never buffers more than this.
        max_file_bytes: ``RLIMIT_FSIZE``: the largest file the code may write.
        max_open_files: ``RLIMIT_NOFILE``.
        disk_mb: size of the private tmpfs that serves as working directory (only with a mount namespace).
        shm_mb: size of the private tmpfs mounted on ``/dev/shm`` (only with a mount namespace).
        network: allow network access. ``False`` (default): a fresh network namespace without interfaces, or, where
            namespaces are unavailable, an audit hook that refuses sockets.
        test_timeout_s: per-test wall-clock limit in :func:`run_tests` (``SIGALRM`` in the judge, and in the worker
            for each call that the test makes).
        namespaces: which Linux namespaces to unshare (needs root / ``CAP_SYS_ADMIN``): ``True`` for all of
            ``net``, ``ipc``, ``uts``, ``mnt``, ``pid``; ``False`` for none; or a subset of those names. Each one
            that cannot be created is skipped with a logged warning (see :attr:`SandboxResult.isolation`).
        drop_privileges: when running as root, run the code under an unprivileged uid. Without it the code runs as
            root: no ``RLIMIT_NPROC`` enforcement and no file-permission protection. Keep it on.
        user: run the program under this fixed uid (and a gid of the same number) instead of a leased one (the judge
            of :func:`run_tests` still leases its own). Concurrent runs then share one ``RLIMIT_NPROC`` budget and
            can access each other's files, so the pool is preferred.
        uid_range: ``(first, count)`` of the uid pool leased to concurrent runs (no passwd entries are needed); a
            :func:`run_tests` run leases two, one for the program and one for its judge.
        allowed_packages: names of importable top-level packages (``"numpy"``) that the code may import besides the
            standard library. The sandbox's file system is an allow-list (with a mount namespace): the interpreter,
            its shared libraries, the standard library, these packages (each one's directory, ``<name>.libs`` and
            ``.dist-info``, located with ``importlib.util.find_spec`` in the caller) and the working directory; no
            other installed package, nor anything else of the host, is visible. Dependencies of a package are not
            added: list them too (``("pandas", "numpy", "dateutil", "pytz", "six")``).
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
    allowed_packages: tuple[str, ...] = ()

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
            unknown = set(self.namespaces) - set(NAMESPACES)
            if unknown:
                raise ValueError(f"unknown namespaces {sorted(unknown)}; choose from {NAMESPACES}")
        if isinstance(self.allowed_packages, str):
            raise ValueError("allowed_packages must be a sequence of package names, not one string")
        self.allowed_packages = tuple(self.allowed_packages)
        bad = [p for p in self.allowed_packages if not isinstance(p, str) or not p.isidentifier()]
        if bad:
            raise ValueError(f"allowed_packages must be top-level package names (like 'numpy'), got {bad}")
        if self.uid_range[1] < 1 or self.uid_range[0] < 1:
            raise ValueError("uid_range must be (first_uid >= 1, count >= 1)")

    @property
    def namespace_names(self) -> tuple[str, ...]:
        if self.namespaces is True:
            return NAMESPACES
        return () if self.namespaces is False else tuple(self.namespaces)

    @property
    def total_memory_limit_mb(self) -> int | None:
        if self.total_memory_mb is not None:
            return self.total_memory_mb or None
        return None if self.memory_mb is None else 2 * self.memory_mb + self.disk_mb

    @property
    def cpu_limit(self) -> int:
        return max(1, math.ceil(self.cpu_time_s if self.cpu_time_s is not None else self.timeout_s))


@dataclass
class TestOutcome:
    """The outcome of one test statement of :func:`run_tests`.

    ``status`` is one of ``passed``; ``failed`` (an ``AssertionError``); ``error`` (any other exception, including
    ``SystemExit`` raised inside the test, and a value that is not plain data coming back from the program);
    ``timed_out`` (over ``test_timeout_s``, or the run was killed for time while this test ran); ``crashed`` (the
    program's or the judge's process died while this test ran: ``os._exit``, a signal, the output limit);
    ``not_run`` (a process died before, or the program itself failed). The status is decided by the judge process,
    never by the process that runs the program.
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

    ``returncode`` is the worker's exit status (negative: killed by that signal; for :func:`run_tests`, the judge's
    when the judge ended without its final report), ``None`` when the run was killed from outside (wall-clock
    timeout, output limit). ``cpu_time_s`` is the CPU time of the worker plus, for tests, the judge. ``stdout``/``stderr`` hold at most ``max_output_bytes`` bytes
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
