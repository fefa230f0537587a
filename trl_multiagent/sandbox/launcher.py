"""The privileged half of a sandboxed run: the launcher, init and the set-up of the worker and the judge.

``host`` ──Popen──> ``launcher`` (root, ``python -s -S -P __main__.py _launch <spec>``) ──fork──> ``init``
──fork──> ``worker`` (exec: :mod:`.harness`) and, for tests, ──fork──> ``judge`` (no exec: :mod:`.judge`).

The launcher enters a memory cgroup, unshares namespaces and, in its own mount namespace, builds a new root that
holds only the allow-list of :mod:`.rootfs` (read-only) and a private tmpfs working directory, then enters it with
``pivot_root`` (where the root cannot be built: every host mount read-only, directories the sandbox uids cannot
traverse hidden, and a warning). init is PID 1 of the new PID namespace, mounts a private ``/proc`` (``hidepid=2``:
a sandbox uid sees only its own processes), starts the children, reaps them and reports their exit statuses on the
private meta pipe. Both children drop to their own unprivileged uid with ``PR_SET_NO_NEW_PRIVS`` and resource
limits, and keep only the descriptors that they need.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time

from .cgroups import enter_cgroup
from .channel import emit

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


def _setup_filesystem(libc, spec: dict, active: list[str], fs: list[str], warnings: list[str]) -> None:
    """The allow-listed root where it can be built; otherwise the host's mounts, read-only (with a warning)."""
    if spec.get("root") is not None:
        problem = build_root(libc, spec, active, fs, warnings)
        if problem is None:
            return
        warnings.append(
            f"allow-listed file system unavailable ({problem}); falling back to read-only host mounts: "
            "the program can read every host file that its uid may read"
        )
    else:
        warnings.append("no allow-listed file system requested: the program can read every host file its uid may read")
    _readonly_host(libc, spec, fs, warnings)


def _readonly_host(libc, spec: dict, fs: list[str], warnings: list[str]) -> None:
    """The fallback view: the host's own tree, every mount read-only, untraversable directories masked."""
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
            _mount(libc, "tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, _shm_options(spec))
            fs.append("private_shm")
        except OSError as exc:
            warnings.append(f"private /dev/shm: {exc.strerror}")
    # 4. the working directory: a size-limited tmpfs owned by the sandbox uid (nothing reaches the host's disk)
    _mount_workdir(libc, spec, spec["workdir"])
    fs.append("tmpfs_workdir")


def _shm_options(spec: dict) -> str:
    return f"size={spec['shm_mb']}m,mode=1777"


def _mount_workdir(libc, spec: dict, target: str) -> None:
    uid = spec["worker"]["uid"]
    owner = "" if uid is None else f",uid={uid},gid={uid}"
    options = f"size={spec['disk_mb']}m,nr_inodes=4096,mode=0700{owner}"
    _mount(libc, "tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, options)


# pivot_root(2) has no libc wrapper; its number per architecture (os.uname().machine)
_SYS_PIVOT_ROOT = {
    "x86_64": 155,
    "aarch64": 41,
    "arm64": 41,
    "riscv64": 41,
    "loongarch64": 41,
    "ppc64le": 203,
    "ppc64": 203,
    "s390x": 217,
    "i686": 217,
    "i386": 217,
    "armv7l": 218,
}
_MNT_DETACH = 2


def _makedirs(root: str, path: str) -> None:
    """Create ``root + path`` and its missing parents. Only ever called for parents that are directories of
    tmpfs mounts made here (the plan's paths are real paths: no symbolic link is followed on the host)."""
    os.makedirs(root + path, mode=0o755, exist_ok=True)


def _bind_ro(libc, source: str, target: str, nodev: bool = True) -> None:
    _mount(libc, source, target, None, _MS_BIND)  # not recursive: mounts below ``source`` stay hidden
    flags = os.statvfs(target).f_flag
    keep = (flags & _KEEP_MOUNT_FLAGS) | (_MS_RELATIME if flags & _ST_RELATIME else 0)
    extra = _MS_NODEV if nodev else 0
    _mount(libc, None, target, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | extra | keep)


def _passwd(spec: dict) -> tuple[str, str]:
    users = [("root", 0, "/")]
    if spec["worker"]["uid"] is not None:
        users.append(("sandbox", spec["worker"]["uid"], spec["workdir"]))
    if spec["judge"] and spec["judge"]["uid"] is not None:
        users.append(("judge", spec["judge"]["uid"], "/"))
    passwd = "".join(f"{n}:x:{u}:{u}:{n}:{h}:/usr/sbin/nologin\n" for n, u, h in users)
    group = "".join(f"{n}:x:{u}:\n" for n, u, _ in users)
    return passwd, group


def build_root(libc, spec: dict, active: list[str], fs: list[str], warnings: list[str]) -> str | None:
    """Build the sandbox's root from the allow-list (:mod:`.rootfs`) and enter it; returns why not, or ``None``.

    A small tmpfs, mounted on the run's host-side working directory (any empty directory would do), gets an empty
    directory or file for each allowed path, the host's path bind-mounted on it (not recursively) and made read-only
    at once; symbolic links are re-created; ``mask`` entries get an empty tmpfs. Then ``/etc/passwd`` and
    ``/etc/group`` (root and the run's uids only), ``/dev`` (four device nodes, ``fd``/``stdin``/... links, a private
    ``/dev/shm``), an empty ``/proc`` (init mounts its own), and the working directory (a tmpfs of ``disk_mb``) are
    added, everything but the working directory and ``/dev/shm`` becomes read-only, and ``pivot_root`` makes it the
    root of this mount namespace; the host's tree is detached from it. Until then nothing is written outside the
    tmpfs mounts made here (every bind is read-only before anything below it is created)."""
    root = spec["workdir"]
    try:
        _mount(libc, "tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,nr_inodes=2048,mode=0755")
    except OSError as exc:
        return f"tmpfs root: {exc.strerror}"
    writable = [root]  # tmpfs mounts made here, read-only at the end
    try:
        for kind, path, target in spec["root"]["entries"]:
            dest = root + path
            if kind == "link":
                _makedirs(root, os.path.dirname(path))
                os.symlink(target, dest)
            elif kind == "mask":
                _mount(libc, "tmpfs", dest, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k,nr_inodes=256,mode=0755")
                writable.append(dest)
            else:
                _makedirs(root, os.path.dirname(path))
                if kind == "dir":
                    os.mkdir(dest, 0o755)
                else:
                    os.close(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
                _bind_ro(libc, path, dest, nodev=kind != "dev")
        _makedirs(root, "/etc")
        for name, text in zip(("passwd", "group"), _passwd(spec)):
            if not os.path.lexists(f"{root}/etc/{name}"):
                with open(f"{root}/etc/{name}", "w") as f:
                    f.write(text)
        _makedirs(root, "/dev/shm")
        for name, target in (
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ):
            if not os.path.lexists(f"{root}/dev/{name}"):
                os.symlink(target, f"{root}/dev/{name}")
        _mount(libc, "tmpfs", f"{root}/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, _shm_options(spec))
        _makedirs(root, "/proc")
        if "pid" not in active:  # no PID namespace, so init mounts no /proc: the host's, as before
            _bind_ro(libc, "/proc", f"{root}/proc")
        _makedirs(root, spec["workdir"])
        _mount_workdir(libc, spec, root + spec["workdir"])
        for path in reversed(writable):
            _mount(libc, None, path, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    except OSError as exc:
        libc.umount2(os.fsencode(root), _MNT_DETACH)  # drops every mount made above
        return f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")
    how = _enter_root(libc, root)  # past this point a failure is a set-up error, not a fallback
    fs += ["allowlist_root", "ro_mounts", "private_shm", "tmpfs_workdir"]
    if how != "pivot_root":
        warnings.append(how)
    return None


def _enter_root(libc, root: str) -> str:
    """Make ``root`` this mount namespace's root: ``pivot_root``, detaching the host's tree; ``chroot`` where that
    is refused (e.g. a root file system that is not a mount point): the host's tree then stays mounted but out of
    reach of the unprivileged children."""
    import ctypes

    os.chdir(root)
    number = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is not None and libc.syscall(ctypes.c_long(number), b".", b".") == 0:
        _check(libc, libc.umount2(b".", _MNT_DETACH), "detach the host's root")
        os.chdir("/")
        return "pivot_root"
    err = ctypes.get_errno() if number is not None else 0
    os.chroot(".")
    os.chdir("/")
    return f"pivot_root: {os.strerror(err) if err else 'unknown architecture'}; the allow-listed root is a chroot"


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
                _setup_filesystem(libc, spec, active, fs, warnings)
    if "mnt" not in active:
        warnings.append(
            "no mount namespace: no allow-listed file system; the program can read every host file that its uid "
            "may read"
        )
    uid = spec["worker"]["uid"]
    if "tmpfs_workdir" not in fs and uid is not None:
        os.chown(spec["workdir"], uid, uid)
        os.chmod(spec["workdir"], 0o700)
    return active, fs, warnings


def launcher_main(spec: dict) -> None:
    meta = spec["meta"]
    os.umask(0o022)
    try:
        libc = _libc()
        _prctl(libc, _PR_SET_PDEATHSIG, signal.SIGKILL)  # die with the host thread that started us
        if os.getppid() != spec["host_pid"]:
            os._exit(70)
        cgroup_warning = enter_cgroup(spec["cgroup"]) if spec["cgroup"] else None
        active, fs, warnings = _isolate(spec)
        if cgroup_warning:
            warnings.append(cgroup_warning)
        elif spec["cgroup"]:
            fs.append("cgroup_memory")
    except BaseException as exc:  # noqa: BLE001 - report any set-up failure to the host
        emit(meta, {"e": "setup_error", "message": f"launcher: {exc!r}"})
        os._exit(70)
    launcher_pid = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            _init_main(spec, active, fs, warnings, libc, launcher_pid)
        finally:
            os._exit(70)
    _close(_run_fds(spec))
    _quiet_stdio()
    _, status = os.waitpid(pid, 0)
    os._exit(0 if os.waitstatus_to_exitcode(status) == 0 else 71)


def _run_fds(spec: dict) -> set[int]:
    """The run's descriptors that the host passed to the launcher."""
    fds = {spec["meta"], *spec["worker"]["keep"]}
    return fds | set(spec["judge"]["keep"]) if spec["judge"] else fds


def _close(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _close_fds_except(keep: set[int]) -> None:
    """Close every descriptor but stdio and ``keep`` (in a child of init: its ``/proc`` is the right one)."""
    _close([int(n) for n in os.listdir("/proc/self/fd") if int(n) > 2 and int(n) not in keep])


def _quiet_stdio() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _mount_proc(libc, fs: list[str]) -> None:
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    try:  # a sandbox uid sees only its own processes: the worker cannot even find the judge
        _mount(libc, "proc", "/proc", "proc", flags, "hidepid=2")
        fs.append("proc_hidepid")
    except OSError:
        _mount(libc, "proc", "/proc", "proc", flags)


def _init_main(spec: dict, active: list[str], fs: list[str], warnings: list[str], libc, launcher_pid: int) -> None:
    meta = spec["meta"]
    try:
        _prctl(libc, _PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != launcher_pid and "pid" not in active:
            os._exit(70)
        if "pid" in active and "mnt" in active:
            _mount_proc(libc, fs)
        if "pid" not in active:
            _prctl(libc, _PR_SET_CHILD_SUBREAPER, 1)  # orphans come to us (to be killed and reaped), not to host init
    except BaseException as exc:  # noqa: BLE001
        emit(meta, {"e": "setup_error", "message": f"init: {exc!r}"})
        os._exit(70)
    emit(meta, {"e": "ns", "active": active, "fs": fs, "warnings": warnings})
    init_pid = os.getpid()
    parent = 1 if "pid" in active else init_pid
    children = {}
    for role in ("worker", "judge") if spec["judge"] else ("worker",):
        pid = os.fork()
        if pid == 0:
            try:
                _drop_privileges(spec, spec[role], libc, parent)
                if role == "worker":
                    argv = list(spec["worker"]["argv"]) + ["0" if "net" in active or spec["network"] else "1"]
                    os.execve(argv[0], argv, spec["env"])
                _judge_run(spec)
            except BaseException as exc:  # noqa: BLE001
                emit(meta, {"e": "setup_error", "message": f"{role}: {exc!r}"})
            finally:
                os._exit(70)
        children[pid] = role
    _close(_run_fds(spec) - {meta})
    _quiet_stdio()
    ended = _reap(children)
    for role, (status, usage) in ended.items():
        record = {"e": "exit" if role == "worker" else "judge_exit", "status": status}
        emit(meta, dict(record, utime=usage.ru_utime, stime=usage.ru_stime, maxrss_kb=usage.ru_maxrss))
    if "pid" not in active:
        for role in children.values():
            if spec[role]["uid"] is not None:
                _kill_all_as(spec[role]["uid"])
        _reap_children(deadline=time.monotonic() + 2.0)
    os._exit(0)  # with a PID namespace, this kills every process left in it


def _reap(children: dict[int, str]) -> dict:
    """Reap every child (as PID 1, orphans too) until the worker and the judge have ended; a worker still running
    a second after its judge ended (it was told to exit) is killed."""
    ended: dict[str, tuple] = {}
    kill_at = None
    while len(ended) < len(children):
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG if kill_at is not None else 0)
        except ChildProcessError:
            break
        if pid == 0:
            if time.monotonic() < kill_at:
                time.sleep(0.005)
                continue
            os.kill(next(p for p, r in children.items() if r == "worker"), signal.SIGKILL)
            kill_at = None
            continue
        if pid in children:
            ended[children[pid]] = (status, usage)
            if children[pid] == "judge" and "worker" not in ended:
                kill_at = time.monotonic() + 1.0
    return ended


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


def _drop_privileges(spec: dict, role: dict, libc, parent: int) -> None:
    """In a fresh child of init: keep only ``role["keep"]`` (plus stdio and the meta pipe until exec), set the
    limits, switch to ``role["uid"]``, and check that init is still the parent."""
    os.set_inheritable(spec["meta"], False)  # stays open until exec (the judge closes it), to report failures
    _close_fds_except({spec["meta"], *role["keep"]})
    for fd in role["keep"]:
        os.set_inheritable(fd, True)
    os.chdir(role["cwd"])
    os.umask(0o077)
    rl = spec["rlimits"]
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (rl["fsize"], rl["fsize"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (rl["nofile"], rl["nofile"]))
    resource.setrlimit(resource.RLIMIT_NPROC, (rl["nproc"], rl["nproc"]))
    resource.setrlimit(resource.RLIMIT_CPU, (rl["cpu"], rl["cpu"] + 1))
    uid = role["uid"]
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # real, effective and saved ids; drops all capabilities
        if os.getuid() != uid or os.geteuid() != uid:
            raise OSError("setuid did not take effect")
    _prctl(libc, _PR_SET_NO_NEW_PRIVS, 1)
    _prctl(libc, _PR_SET_PDEATHSIG, signal.SIGKILL)  # (cleared by setuid, so set again)
    if os.getppid() != parent:
        os._exit(70)
    if rl["as"] is not None:
        resource.setrlimit(resource.RLIMIT_AS, (rl["as"], rl["as"]))


def _judge_run(spec: dict) -> None:
    """The judge: this (forked, already imported) interpreter, now unprivileged, runs :func:`.judge.judge_main`."""
    import site
    import traceback

    from .judge import judge_main

    site.setquit()  # exit() and quit(), as in a normal interpreter
    sys.path.extend(spec["judge"]["sitepath"])
    sys.argv = ["<tests>"]
    os.close(spec["meta"])
    try:
        code = judge_main(*spec["judge"]["args"])
    except BaseException:  # noqa: BLE001 - a bug of the judge: shown on stderr, and no final report
        traceback.print_exc()
        code = 70
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    os._exit(code)


def main(argv: list[str]) -> None:
    launcher_main(json.loads(argv[2]))
