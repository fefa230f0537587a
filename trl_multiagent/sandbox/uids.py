"""Sandbox uids: a pool leased to concurrent runs, and the clean-up of every process left under a uid."""

from __future__ import annotations

import logging
import os
import signal
import time

from .config import SandboxError

logger = logging.getLogger("trl_multiagent.sandbox")


class UidLease:
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


def sweep_uid(uid: int, patience_s: float = 10.0) -> None:
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
