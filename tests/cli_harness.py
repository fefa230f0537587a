"""Run command lines as separate processes, fast: one "zygote" process imports the package once, then forks a fresh
child per command (its own pid, stdout, stderr and exit code, as a new process would have), so that dozens of
error cases cost milliseconds each instead of the seconds torch, transformers and TRL take to import.

The child runs the command as Python would: ``python -m trl_multiagent ...`` through ``runpy.run_module`` and
``python recipes/x.py ...`` through ``runpy.run_path``, with ``sys.argv`` set and the folders of a ``PYTHONPATH``
given in the command's ``env`` on ``sys.path``; an uncaught exception prints its traceback to stderr and exits 1,
``SystemExit`` exits with its code. :meth:`CommandRunner.start` returns while the command runs, with its process id
(to send it a signal); :meth:`Started.wait` collects it.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ZYGOTE = r"""
import json, os, runpy, sys, traceback
sys.path.insert(0, os.getcwd())
import trl_multiagent.command.cli, trl_multiagent.command.runner, trl_multiagent.evaluation  # the slow imports, done once
import trl_multiagent.trainers
print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            sys.stdout.flush(); sys.stderr.flush()
            os.dup2(out, 1); os.dup2(err, 2)
            os.environ.update(req["env"])
            os.chdir(req["cwd"])
            # as a new interpreter would: the folders of a PYTHONPATH given to this command go on sys.path
            sys.path[:0] = [os.path.abspath(p) for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
            sys.argv = [req["target"], *req["args"]]
            try:
                if req["target"].endswith(".py"):
                    runpy.run_path(req["target"], run_name="__main__")
                else:
                    runpy.run_module(req["target"], run_name="__main__", alter_sys=True)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if not isinstance(exc.code, (int, type(None))):
                    print(exc.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
                code = 1
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(code)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
"""


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@dataclass
class Started:
    """A command :meth:`CommandRunner.start` started: its process id, and :meth:`wait` for its :class:`Result`."""

    runner: CommandRunner
    args: list
    pid: int
    out: Path
    err: Path

    def wait(self) -> Result:
        reply = json.loads(self.runner._reply(self.args, self.err))
        return Result(reply["rc"], self.out.read_text(), self.err.read_text())


class CommandRunner:
    """``runner(args, script=None)``: run ``python -m trl_multiagent *args`` (or ``python <script> *args``)."""

    def __init__(self, env: dict[str, str] | None = None, timeout: float = 120):
        self.env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1",
                        TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", **(env or {}))
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), self.env.get("PYTHONPATH")) if p)
        self.env.pop(  # a traceback switch of a developer's shell would change what the tests see
            "TRL_MULTIAGENT_TRACEBACK", None)
        self.timeout = timeout
        self.dir = tempfile.mkdtemp(prefix="cli-harness-")
        self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE], cwd=ROOT, env=self.env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the command runner did not start: {line!r}")
        self.count = 0

    def __call__(self, args, script: str | None = None, env: dict[str, str] | None = None,
                 cwd: str | Path = ROOT) -> Result:
        return self.start(args, script, env, cwd).wait()

    def start(self, args, script: str | None = None, env: dict[str, str] | None = None,
              cwd: str | Path = ROOT) -> Started:
        """Start the command and return while it runs (one at a time: :meth:`Started.wait` before the next)."""
        self.count += 1
        out, err = Path(self.dir) / f"{self.count}.out", Path(self.dir) / f"{self.count}.err"
        request = {"target": script or "trl_multiagent", "args": [str(a) for a in args], "env": dict(env or {}),
                   "cwd": str(cwd), "stdout": str(out), "stderr": str(err)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return Started(self, args, json.loads(self._reply(args, err))["pid"], out, err)

    def _reply(self, args, err: Path) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        if not ready:
            self.proc.kill()
            raise TimeoutError(f"{args} did not finish in {self.timeout} s\n{err.read_text()[-3000:]}")
        return self.proc.stdout.readline()

    def close(self) -> None:
        """End the command process: it exits when its input closes; one that has not within 120 s (a loaded machine
        can take that long to schedule its exit) is killed, so that teardown never fails a run whose tests passed."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
