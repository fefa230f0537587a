"""Tests of trl_multiagent.sandbox: hostile programs must be contained and reported as not passing, the test
process must survive, and host files must stay untouched. Normal behaviour: statuses, per-test outcomes, messages,
concurrency."""

import ast
import os
import resource
import secrets
import socket
import stat
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from trl_multiagent.sandbox import (
    SandboxConfig,
    SandboxJob,
    humaneval_tests,
    probe_isolation,
    run_many,
    run_python,
    run_tests,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
UID_FIRST, UID_COUNT = SandboxConfig().uid_range


@pytest.fixture(scope="module")
def isolation():
    """The mechanisms in effect; hostile tests need the full set (they could harm the host without it)."""
    return probe_isolation()


@pytest.fixture
def hostile(isolation):
    needed = {"netns", "mntns", "pidns", "ro_mounts", "tmpfs_workdir"}
    if os.geteuid() != 0 or not any(m.startswith("uid=") for m in isolation) or not needed <= set(isolation):
        pytest.skip(f"full isolation unavailable here ({isolation}); not running hostile code")
    return isolation


def _sandbox_processes() -> list[tuple[int, str]]:
    """(pid, state) of every process, zombies included, owned by a uid of the sandbox pool."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = dict(
                line.split(":", 1) for line in Path(f"/proc/{name}/status").read_text().splitlines() if ":" in line
            )
        except OSError:
            continue
        if UID_FIRST <= int(fields["Uid"].split()[0]) < UID_FIRST + UID_COUNT:
            found.append((int(name), fields["State"].split()[0]))
    return found


def _live_process_count() -> int:
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            count += state not in ("Z", "X")
    return count


def _no_leftovers(timeout: float = 3.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = _sandbox_processes()
        if not left:
            return []
        time.sleep(0.05)
    return _sandbox_processes()


# ------------------------------------------------------------------------------------------------ normal behaviour


def test_passing_program_and_environment(isolation):
    r = run_python("import os, sys\nprint('hello', sys.argv, __name__)\nprint(os.getcwd(), os.environ['HOME'])")
    assert r.status == "passed" and r.reason == "ok" and r.returncode == 0
    assert r.stdout.startswith("hello ['<program>'] __main__\n")
    cwd, home = r.stdout.splitlines()[1].split()
    assert cwd == home and not os.path.exists(cwd)  # the working directory is gone afterwards
    assert not r.truncated and r.stderr == "" and 0 < r.duration_s < 10
    assert r.isolation[1:] == isolation[1:]  # the same mechanisms (the leased uid differs)


def test_environment_is_minimal_and_deterministic():
    code = "import os, json\nprint(json.dumps(dict(os.environ)))\nprint(hash('abc'))"
    a, b = run_python(code), run_python(code)
    env = __import__("json").loads(a.stdout.splitlines()[0])
    assert set(env) == {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE"}
    assert env["PYTHONHASHSEED"] == "0" and env["HOME"] == env["TMPDIR"]
    assert a.stdout.splitlines()[1] == b.stdout.splitlines()[1]  # PYTHONHASHSEED=0 is honoured


def test_failure_statuses():
    r = run_python("def f():\n    return 1 / 0\nf()")
    assert (r.status, r.reason, r.returncode) == ("failed", "exception", 1)
    assert r.message == "ZeroDivisionError: division by zero"
    assert 'File "<program>", line 2, in f' in r.stderr and "trl_multiagent" not in r.stderr
    assert run_python("import sys; sys.exit(3)").status == "failed"
    assert run_python("import sys; sys.exit(3)").returncode == 3
    assert run_python("import sys; sys.exit(0)").status == "passed"
    assert run_python("def broken(:\n  pass").message.startswith("SyntaxError")
    assert run_python("assert 1 == 2, 'nope'").message == "AssertionError: nope"
    r = run_python("import os; os._exit(0)")  # bypassing the harness never counts as passing
    assert (r.status, r.reason, r.returncode) == ("crashed", "exited_early", 0)
    r = run_python("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert (r.status, r.reason, r.returncode) == ("crashed", "signal", -11)


def test_stdin_is_offered():
    r = run_python("import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))", stdin="1 2 3\n")
    assert r.passed and r.stdout == "6\n"


def test_failing_assertion_shows_expected_and_actual():
    program = "def inc(x):\n    return x"
    r = run_tests(
        program,
        ["assert inc(1) == 2", "assert 3 == inc(2)", "assert inc(5) < 0", "assert inc(0)", "assert inc(7) == 7"],
    )
    assert r.status == "failed" and r.reason == "tests_failed"
    assert [t.status for t in r.tests] == ["failed", "failed", "failed", "failed", "passed"]
    assert r.tests[0].message == "AssertionError: expected 2, got 1"
    assert r.tests[1].message == "AssertionError: expected 3, got 2"  # the call is the actual side
    assert r.tests[2].message == "AssertionError: inc(5) < 0 is false (left: 5, right: 0)"
    assert r.tests[3].message == "AssertionError: assertion failed: inc(0)"
    assert r.n_tests_passed == 1 and r.pass_rate == pytest.approx(0.2)


def test_operands_are_evaluated_once():
    program = "calls = []\ndef f(x):\n    calls.append(x)\n    return x"
    r = run_tests(program, ["assert f(1) == 1", "assert f(2) == 3", "assert calls == [1, 2], calls"])
    assert [t.status for t in r.tests] == ["passed", "failed", "passed"]


def test_humaneval_check_4_of_5():
    test_code = textwrap.dedent(
        """
        METADATA = {"author": "x"}

        def check(candidate):
            assert candidate(1, 2) == 3
            assert candidate(0, 0) == 0
            x = 10
            assert candidate(x, 5) == 15
            assert candidate(-1, 1) == 0
            assert candidate(2, 2) == 5, "two plus two"
        """
    )
    setup, tests = humaneval_tests(test_code, "add")
    assert len(tests) == 5 and tests[2] == "x = 10\nassert candidate(x, 5) == 15"
    assert "candidate = add" in setup and "METADATA" in setup
    r = run_tests("def add(a, b):\n    return a + b\n", tests, setup=setup)
    assert r.status == "failed" and r.n_tests_passed == 4
    assert [t.status for t in r.tests] == ["passed"] * 4 + ["failed"]
    assert r.tests[4].message == "AssertionError: two plus two (expected 5, got 4)"
    good = run_tests("def add(a, b):\n    return a + b if (a, b) != (2, 2) else 5\n", tests, setup=setup)
    assert good.status == "passed" and good.pass_rate == 1.0


def test_program_error_marks_tests_not_run():
    r = run_tests("raise ValueError('bad program')", ["assert True"])
    assert (r.status, r.reason, r.message) == ("failed", "program_error", "ValueError: bad program")
    assert r.tests[0].status == "not_run"


def test_exit_inside_tests_is_never_a_pass():
    tests = [
        "assert f() == 1",
        "import sys; sys.exit(0)",
        "exit()",
        "assert f() == 2",
        "import os; os._exit(0)",
        "assert f() == 1",
    ]
    r = run_tests("def f():\n    return 1", tests)
    assert [t.status for t in r.tests] == ["passed", "error", "error", "failed", "crashed", "not_run"]
    assert "SystemExit" in r.tests[1].message
    assert (r.status, r.reason) == ("crashed", "exited_early")
    r = run_tests("def f():\n    return 1", ["import os; os._exit(0)"])
    assert r.status == "crashed" and r.tests[0].status == "crashed" and r.returncode == 0


def test_printed_or_injected_results_are_not_trusted():
    forge = textwrap.dedent(
        """
        import os
        fake = b'{"e": "test", "i": 0, "status": "passed", "message": ""}\\n{"e": "end"}\\nPASSED\\n'
        print(fake.decode())
        for fd in range(3, 64):
            try:
                os.write(fd, fake)
            except OSError:
                pass
        """
    )
    r = run_tests("def f():\n    return 0", [forge + "\nassert f() == 1"])
    assert r.status == "failed" and r.tests[0].status == "failed"
    assert r.tests[0].message == "AssertionError: expected 1, got 0"


def test_per_test_timeout_does_not_hide_other_tests():
    r = run_tests(
        "def f():\n    return 1", ["while True:\n    pass", "assert f() == 1"], SandboxConfig(test_timeout_s=0.5)
    )
    assert [t.status for t in r.tests] == ["timed_out", "passed"]
    assert (r.status, r.reason) == ("timed_out", "test_timeout")


def test_file_size_and_disk_limits(hostile):
    r = run_python("open('big', 'wb').write(b'x' * (2 << 20))", SandboxConfig(max_file_bytes=1 << 20))
    assert r.status == "failed" and "File too large" in r.message
    r = run_python("for i in range(10):\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20))", SandboxConfig(disk_mb=4))
    assert r.status == "failed" and "No space left" in r.message


def test_config_validation():
    with pytest.raises(ValueError):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ValueError):
        SandboxConfig(namespaces=("net", "bogus"))
    assert SandboxConfig(timeout_s=2.5).cpu_limit == 3
    assert SandboxConfig(namespaces=False).namespace_names == ()


# ------------------------------------------------------------------------------------------------ hostile programs


@pytest.mark.slow
def test_infinite_loop_is_killed_on_time(hostile):
    t0 = time.monotonic()
    r = run_python("while True:\n    pass", SandboxConfig(timeout_s=1.5))
    assert (r.status, r.reason, r.returncode) == ("timed_out", "wall_timeout", None)
    assert 1.4 < time.monotonic() - t0 < 4.5
    r = run_python("while True:\n    pass", SandboxConfig(timeout_s=10, cpu_time_s=1))
    assert (r.status, r.reason) == ("timed_out", "cpu_timeout") and r.duration_s < 6
    # a C-level loop that the per-test alarm cannot interrupt is still stopped by the wall clock
    r = run_tests("", ["sum(range(10**12))", "assert True"], SandboxConfig(timeout_s=1.5, test_timeout_s=0.5))
    assert r.status == "timed_out" and [t.status for t in r.tests] == ["timed_out", "not_run"]
    assert not _no_leftovers()


@pytest.mark.slow
def test_fork_bomb_is_contained(hostile):
    before = _live_process_count()
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    t0 = time.monotonic()
    r = run_python(bomb, SandboxConfig(timeout_s=2, max_processes=32))
    assert r.status == "timed_out" and time.monotonic() - t0 < 5
    assert _no_leftovers() == []
    assert _live_process_count() <= before + 20  # back to normal (slack for unrelated processes of other users)


@pytest.mark.slow
def test_fork_bomb_escaping_with_setsid_without_pid_namespace(hostile):
    """Without a PID namespace, escaped processes (new session) are still found and killed by their uid."""
    bomb = "import os\nos.setsid()\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    r = run_python(bomb, SandboxConfig(timeout_s=1.5, namespaces=("net", "mnt")))
    assert r.status == "timed_out" and "pidns" not in r.isolation
    assert _no_leftovers() == []
    daemon = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
    for ns in (True, ("net", "mnt")):
        r = run_python(daemon, SandboxConfig(namespaces=ns))
        assert r.passed and r.duration_s < 4
        assert _no_leftovers() == []


@pytest.mark.slow
def test_fork_bomb_does_not_starve_concurrent_runs(hostile):
    bomb = SandboxJob(
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        config=SandboxConfig(timeout_s=2.5),
    )
    spawner = SandboxJob(
        "import subprocess, sys, time\ntime.sleep(0.7)\n"
        "print(subprocess.run([sys.executable, '-c', 'print(7)'], capture_output=True, text=True).stdout)"
    )
    r_bomb, r_ok = run_many([bomb, spawner], max_workers=2)
    assert r_bomb.status == "timed_out"
    assert r_ok.passed and r_ok.stdout.strip() == "7"
    assert _no_leftovers() == []


@pytest.mark.parametrize(
    "code", ["x = bytearray(8 << 30)", "chunks = []\nwhile True:\n    chunks.append(bytearray(50 << 20))"]
)
def test_memory_bomb(hostile, code):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = run_python(code, SandboxConfig(memory_mb=256))
    assert (r.status, r.reason) == ("crashed", "memory") and r.message == "MemoryError"
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 64 * 1024  # KiB


@pytest.mark.slow
def test_memory_of_the_whole_run_is_capped(hostile):
    """RLIMIT_AS is per process; the cgroup caps the sum over a run's processes (here 6 x 200 MiB > 512 MiB)."""
    if "cgroup_memory" not in hostile:
        pytest.skip("no memory cgroup here")
    hog = textwrap.dedent(
        """
        import os, time
        kids = []
        for _ in range(6):
            pid = os.fork()
            if pid == 0:
                block = bytearray(200 << 20)
                for k in range(0, len(block), 4096):
                    block[k] = 1  # touch every page
                time.sleep(1)
                os._exit(0)
            kids.append(pid)
        print(sorted(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids))
        """
    )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = run_python(hog, SandboxConfig(memory_mb=256, total_memory_mb=512))
    assert r.passed  # the parent survives and sees some of its children OOM-killed
    codes = ast.literal_eval(r.stdout)
    assert -9 in codes and codes.count(0) <= 2
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 64 * 1024
    assert _no_leftovers() == []


def test_network_is_unreachable(hostile):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.3)
    port = listener.getsockname()[1]
    code = textwrap.dedent(
        f"""
        import socket
        for addr in [("127.0.0.1", {port}), ("1.1.1.1", 80), ("8.8.8.8", 53)]:
            s = socket.socket()
            s.settimeout(2)
            try:
                s.connect(addr)
                print("CONNECTED", addr)
            except OSError as e:
                print("refused", addr, e.errno)
        try:
            socket.getaddrinfo("example.com", 80)
            print("CONNECTED dns")
        except OSError as e:
            print("refused dns")
        socket.create_connection(("127.0.0.1", {port}), timeout=2)
        """
    )
    try:
        r = run_python(code)
        assert r.status == "failed" and "CONNECTED" not in r.stdout
        assert r.stdout.count("refused") == 4 and "Network is unreachable" in r.message
        with pytest.raises(socket.timeout):
            listener.accept()
        # control: with network=True the same connection reaches the listener, so the check above is meaningful
        r = run_python(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('CONNECTED')",
            SandboxConfig(network=True),
        )
        assert r.passed and "CONNECTED" in r.stdout
        listener.accept()[0].close()
    finally:
        listener.close()


def test_network_audit_hook_fallback_without_namespaces():
    """Without namespaces (and here, as root, without a uid switch), sockets are refused by an audit hook."""
    r = run_python(
        "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)",
        SandboxConfig(namespaces=False, drop_privileges=False),
    )
    assert r.status == "failed" and "network access is disabled" in r.message
    if os.geteuid() == 0:
        assert "socket_audit_hook" in r.isolation and "netns" not in r.isolation


def test_cannot_write_outside_workdir(hostile):
    root_dir = Path(tempfile.mkdtemp(prefix="sandbox-canary-"))
    root_dir.chmod(0o755)
    repo_canary = REPO_ROOT / f".sandbox-canary-{secrets.token_hex(4)}"
    try:
        canaries = [root_dir / "canary.txt", repo_canary]
        for c in canaries:
            c.write_text("original\n")
            c.chmod(0o644)
        before = {c: (c.read_text(), c.stat().st_mtime_ns, c.stat().st_mode) for c in canaries}
        new_files = [
            root_dir / "new.txt",
            REPO_ROOT / f".sandbox-new-{secrets.token_hex(4)}",
            Path(tempfile.gettempdir()) / f"sandbox-new-{secrets.token_hex(4)}",
        ]
        code = textwrap.dedent(
            f"""
            import os
            canaries = {[str(c) for c in canaries]!r}
            new_files = {[str(p) for p in new_files]!r}
            attempts = []
            for c in canaries:
                attempts += [lambda c=c: open(c, "w").write("pwned"), lambda c=c: open(c, "a").write("pwned"),
                             lambda c=c: os.remove(c), lambda c=c: os.rename(c, c + ".moved"),
                             lambda c=c: os.chmod(c, 0o777), lambda c=c: os.utime(c, (0, 0))]
            for p in new_files:
                attempts += [lambda p=p: open(p, "w").write("pwned"), lambda p=p: os.mkdir(p)]
            for i, attempt in enumerate(attempts):
                try:
                    attempt()
                    print("SUCCEEDED", i)
                except OSError as e:
                    pass
            open("inside.txt", "w").write("fine")  # the working directory itself is writable
            print(open("inside.txt").read())
            """
        )
        r = run_python(code)
        assert r.passed and "SUCCEEDED" not in r.stdout and r.stdout.strip() == "fine"
        after = {c: (c.read_text(), c.stat().st_mtime_ns, c.stat().st_mode) for c in canaries}
        assert after == before
        assert not any(p.exists() for p in new_files)
        assert sorted(os.listdir(root_dir)) == ["canary.txt"]
    finally:
        repo_canary.unlink(missing_ok=True)
        for p in root_dir.iterdir():
            p.unlink()
        root_dir.rmdir()


def test_cannot_read_root_only_files(hostile):
    with tempfile.TemporaryDirectory() as d:
        Path(d).chmod(0o755)
        secret = Path(d) / "secret"
        secret.write_text("s3cret")
        secret.chmod(0o600)
        r = run_python(f"print(open({str(secret)!r}).read())")
        # not even visible with the allow-listed file system; refused by its mode otherwise
        refused = "No such file" in r.message if "allowlist_root" in r.isolation else "Permission denied" in r.message
        assert r.status == "failed" and refused and "s3cret" not in r.stdout
    # a home directory the sandbox user cannot traverse is masked: at most the interpreter's path is visible in it
    home = Path.home()
    r = run_python(f"import os\nprint(os.listdir({str(home)!r}))")
    if stat.S_IMODE(home.stat().st_mode) & 0o001:
        pytest.skip(f"{home} is traversable by others here")
    if r.passed:
        exposed = {
            Path(p).relative_to(home).parts[0] for p in (sys.base_prefix, sys.prefix) if Path(p).is_relative_to(home)
        }
        assert set(ast.literal_eval(r.stdout)) <= exposed
    else:
        assert "Permission denied" in r.message


def test_cannot_kill_parent_or_test_process(hostile):
    me = os.getpid()
    code = textwrap.dedent(
        f"""
        import os, signal
        for target in (os.getppid(), {me}, -{os.getpgid(me)}, 1):
            try:
                os.kill(target, signal.SIGKILL)
                print("KILLED", target)
            except OSError as e:
                print("denied", target, e.errno)
        try:
            os.kill(-1, signal.SIGKILL)  # everything this uid may signal: only itself in its namespace
        except OSError:
            pass
        os.kill({me}, signal.SIGKILL)
        """
    )
    r = run_python(code)
    assert r.status != "passed" and "KILLED" not in r.stdout
    r = run_tests("", ["import os; os.kill(os.getppid(), 9)", f"import os; os.kill({me}, 9)", "assert True"])
    assert [t.status for t in r.tests] == ["error", "error", "passed"]
    assert os.getpid() == me  # still here
    assert not _no_leftovers()


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_printing_gigabytes_is_truncated_and_stopped(hostile, stream):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code = f"import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(4096):\n    sys.{stream}.write(chunk)\nprint('done')"
    t0 = time.monotonic()
    r = run_python(code, SandboxConfig(max_output_bytes=64 << 10))
    assert (r.status, r.reason) == ("crashed", "output_limit") and r.truncated
    assert len(getattr(r, stream)) == 64 << 10 and "done" not in getattr(r, stream)
    assert time.monotonic() - t0 < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 64 * 1024  # KiB
    assert _no_leftovers() == []


# ------------------------------------------------------------------------------------------------ concurrency


@pytest.mark.slow
def test_run_many_is_concurrent_and_ordered():
    jobs = [f"import time\ntime.sleep(1)\nprint({i})" for i in range(4)]
    t0 = time.monotonic()
    results = run_many(jobs, max_workers=4)
    elapsed = time.monotonic() - t0
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n", "3\n"]
    assert all(r.passed for r in results)
    assert elapsed < 3.5  # four sequential 1 s sleeps take more than 4 s
    mixed = run_many(
        [
            SandboxJob("def f():\n    return 2", tests=["assert f() == 2", "assert f() == 3"]),
            "print('plain')",
            SandboxJob("raise SystemExit(4)"),
        ]
    )
    assert [r.n_tests_passed for r in mixed[:1]] == [1] and mixed[1].stdout == "plain\n"
    assert mixed[2].returncode == 4 and run_many([]) == []


def test_isolation_report(isolation):
    if os.geteuid() != 0:
        pytest.skip("namespaces and uid switching need root")
    assert {"netns", "mntns", "pidns", "ro_mounts", "tmpfs_workdir", "rlimits"} <= set(isolation)
    uid = int(next(m for m in isolation if m.startswith("uid=")).split("=")[1])
    assert UID_FIRST <= uid < UID_FIRST + UID_COUNT
