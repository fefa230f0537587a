"""A full disk and a cut-short write (issue 65, points 4 and 5; trl_multiagent/runtime/atomic_files.py,
trl_multiagent/trainers/checkpoint_staging.py).

A checkpoint, the team's final adapters, summary.json and report.md are written under a temporary name and renamed
when complete, so that a write that fails (a full disk, a crash, a kill) leaves what was there before as it was and
nothing that a resume would take for a checkpoint; out of space is one error line naming what was written where, the
space it needs and the space left.

The disk fills for real where a tmpfs can be mounted (root, and a kernel that lets this container mount): the output
directory lives on a 16 MiB tmpfs, and the training process itself fills it at the chosen moment (a small wrapper
around the command line). Elsewhere the `fill` cases are skipped and the `stand-in` cases, which run everywhere,
replace the writers (safetensors' save_file, Path.write_bytes) by ones that raise ENOSPC at the write.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from tests.cli_harness import CommandRunner
from tests.test_cli import TINY_RECIPE
from trl_multiagent.errors import DiskFullError
from trl_multiagent.evaluation.report import write_run_outputs
from trl_multiagent.runtime.atomic_files import (
    format_size,
    is_disk_full,
    publish_directory,
    write_atomically,
    write_text_atomically,
)
from trl_multiagent.trainers.outputs import check_checkpoint, check_output_dir, resolve_checkpoint

# The command line, with the disk filling (FAULT_MODE=fill: the file system of DISK, to the last byte) or the
# writers raising ENOSPC (FAULT_MODE=stand-in) at FAULT_AT: "step:<n>" (the start of the step taken at global_step n,
# after writing the hashes of the checkpoints so far to BEFORE), "save_model" (the final save of the team),
# "write_summary" (the trainer's summary.json) or "write_report" (report.md).
DISK_RUN = r"""
import errno, hashlib, json, os, sys
from pathlib import Path

from trl_multiagent.team import adapter_files
from trl_multiagent.command.cli import run_recipe_script
from trl_multiagent.evaluation import report
from trl_multiagent.trainers import base
from trl_multiagent.trainers.magrpo import MAGRPOTrainer

FAULT, MODE = os.environ.get("FAULT_AT", ""), os.environ.get("FAULT_MODE", "")
armed = []


def fill(disk):
    fd = os.open(os.path.join(disk, "filler"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    size = 1 << 20
    while size:
        try:
            os.write(fd, b"\0" * size)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            size //= 2
    os.close(fd)


def trip():
    if MODE == "fill":
        fill(os.environ["DISK"])
    else:
        armed.append(True)


def no_space(path):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


save_file, write_bytes = adapter_files.save_file, Path.write_bytes


def stand_in_save_file(tensors, filename, *args, **kwargs):
    if armed:
        raise no_space(filename)
    return save_file(tensors, filename, *args, **kwargs)


def stand_in_write_bytes(self, data):
    if armed:
        raise no_space(self)
    return write_bytes(self, data)


adapter_files.save_file, Path.write_bytes = stand_in_save_file, stand_in_write_bytes


def tripping(function, when=lambda *args, **kwargs: True):
    def tripped(*args, **kwargs):
        if when(*args, **kwargs):
            trip()
        return function(*args, **kwargs)
    return tripped


if FAULT.startswith("step:"):
    step, training_step = int(FAULT[5:]), MAGRPOTrainer.training_step

    def before(self, *args, **kwargs):
        if self.state.global_step == step:
            out = Path(self.args.output_dir)
            Path(os.environ["BEFORE"]).write_text(json.dumps({
                str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(out.glob("checkpoint-*/**/*")) if p.is_file()}))
            return True
        return False

    MAGRPOTrainer.training_step = tripping(training_step, before)
elif FAULT == "save_model":  # the final save, not a checkpoint's
    MAGRPOTrainer.save_model = tripping(MAGRPOTrainer.save_model,
                                                lambda self, output_dir=None, _internal_call=False: not _internal_call)
elif FAULT == "write_summary":
    base.write_summary = tripping(base.write_summary)
elif FAULT == "write_report":
    report.write_report = tripping(report.write_report)
sys.exit(run_recipe_script(None, "disk_run.py"))
"""

# The command line, stopping for good in the middle of the save of checkpoint-KILL_AT (its adapters and optimizer
# written, its RNG state and trainer state not) after writing PAUSED: the test kills it there.
KILL_RUN = r"""
import os, sys, time
from pathlib import Path

from transformers import Trainer

from trl_multiagent.command.cli import run_recipe_script

kill_at, save_rng_state = int(os.environ.get("KILL_AT", "-1")), Trainer._save_rng_state


def stalled(self, output_dir):
    if self.state.global_step == kill_at:
        Path(os.environ["PAUSED"]).write_text(output_dir)
        time.sleep(3600)
    return save_rng_state(self, output_dir)


Trainer._save_rng_state = stalled
sys.exit(run_recipe_script(None, "kill_run.py"))
"""

SIZE = "16m"


@pytest.fixture(scope="module")
def cli():
    runner = CommandRunner(timeout=300)
    yield runner
    runner.close()


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs mounted at ``tmp_path / 'disk'`` where this process may mount one, else None."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        yield None
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(disk)],
                             capture_output=True).returncode == 0
    try:
        yield disk if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _root(mode: str, small_disk, tmp_path: Path) -> Path:
    if mode == "fill":
        if small_disk is None:
            pytest.skip("no tmpfs can be mounted here (not root, or not permitted): the stand-in cases cover it")
        return small_disk
    return tmp_path / "disk"


def _hashes(folder: Path, pattern: str = "**/*") -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.glob(pattern)) if p.is_file()}


def _leftovers(folder: Path) -> list[str]:
    """Temporary files and folders of a write (``.tmp-<pid>``, ``.old-<pid>``) anywhere under ``folder``."""
    return [str(p) for p in folder.rglob("*") if ".tmp-" in p.name or ".old-" in p.name]


def _one_error(result) -> str:
    assert result.returncode == 1, (result.returncode, result.output[-3000:])
    assert "Traceback" not in result.output, result.output[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr[-3000:]
    return errors[0]


def _script(tmp_path: Path) -> str:
    script = tmp_path / "disk_run.py"
    script.write_text(DISK_RUN)
    return str(script)


COMMON = ["--config", TINY_RECIPE, "--eval_stages", "[]", "--save_strategy", "steps", "--lr_scheduler_type",
          "constant"]


# ------------------------------------------------------------------------------------------------ a checkpoint
@pytest.mark.parametrize("mode", ["fill", "stand-in"])
def test_a_full_disk_at_a_checkpoint_keeps_the_earlier_ones_and_the_run_resumes(cli, tiny_ab_model, tmp_path,
                                                                                small_disk, mode):
    """checkpoint-1 is saved, then the disk is full at the start of step 2 (no metrics line is due at step 2, so the
    checkpoint of step 2 is the first write to meet it): one error line, exit code 1, run_status failed, no
    checkpoint-2 and no temporary folder, checkpoint-1 byte for byte as it was; with space again, `true` resumes from
    checkpoint-1 to max_steps."""
    root = _root(mode, small_disk, tmp_path)
    out = root / "run"
    args = [*COMMON, "--model", tiny_ab_model, "--output_dir", out, "--max_steps", "3", "--save_steps", "1",
            "--logging_steps", "10"]
    before = tmp_path / "before.json"
    result = cli(args, script=_script(tmp_path), env={"FAULT_AT": "step:1", "FAULT_MODE": mode, "DISK": str(root),
                                                      "BEFORE": str(before)})
    line = _one_error(result)
    assert line.startswith(f"disk_run.py: error: no space left on device writing checkpoint-2 "
                           f"({str(out / 'checkpoint-2')!r}): it needs about "), line
    assert line.endswith(" left on that file system; nothing of this save was kept, and the earlier checkpoints are as "
                         "they were (checkpoint-1); free space on that file system (or move output_dir), then resume "
                         "with --resume_from_checkpoint true"), line
    needed, left = re.search(r"it needs about ([\d.]+ \w+), ([\d.]+ \w+) (?:is|are) left", line).groups()
    if mode == "fill":
        assert left.endswith((" B", "KiB")), left  # the few blocks the removed temporary folder gave back
    status = json.loads((out / "run_status.json").read_text())
    assert status["status"] == "failed" and status["error"] == line.removeprefix("disk_run.py: error: ")
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"] and not _leftovers(out)
    assert _hashes(out, "checkpoint-*/**/*") == json.loads(before.read_text())
    check_checkpoint(str(out / "checkpoint-1"), out, ["agent1", "agent2"])
    assert resolve_checkpoint("true", out) == str(out / "checkpoint-1")

    (root / "filler").unlink(missing_ok=True)  # space again
    resumed = cli([*args, "--resume_from_checkpoint", "true"], script=_script(tmp_path))
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert json.loads((out / "summary.json").read_text())["global_step"] == 3
    assert json.loads((out / "run_status.json").read_text())["status"] == "finished"


def test_a_kill_during_a_checkpoint_write_leaves_nothing_to_resume_from(cli, tiny_ab_model, tmp_path):
    """SIGKILL while checkpoint-2 is half written: no checkpoint-2, only its temporary folder, which `true` passes
    over for checkpoint-1; the resumed run removes it at its next save and ends at max_steps."""
    script, paused, out = tmp_path / "kill_run.py", tmp_path / "paused", tmp_path / "run"
    script.write_text(KILL_RUN)
    args = [*COMMON, "--model", tiny_ab_model, "--output_dir", out, "--max_steps", "3", "--save_steps", "1"]
    started = cli.start(args, script=str(script), env={"KILL_AT": "2", "PAUSED": str(paused)})
    deadline = time.monotonic() + 240
    while not paused.exists():
        assert time.monotonic() < deadline, started.err.read_text()[-3000:]
        time.sleep(0.05)
    os.kill(started.pid, signal.SIGKILL)
    assert started.wait().returncode == -signal.SIGKILL
    staged = Path(paused.read_text())
    assert staged.name == "checkpoint-2" and staged.parent.name.startswith("checkpoint-2.tmp-")
    assert (staged / "optimizer.pt").is_file() and not (staged / "trainer_state.json").exists()  # half written
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", staged.parent.name]
    assert resolve_checkpoint("true", out) == str(out / "checkpoint-1")

    resumed = cli([*args, "--resume_from_checkpoint", "true"], script=str(script))
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert not _leftovers(out)
    assert json.loads((out / "summary.json").read_text())["global_step"] == 3


def test_a_crash_during_a_checkpoint_write_is_the_crash_with_nothing_kept(tiny_ab_model, tmp_path, monkeypatch):
    """Any other error in the middle of a checkpoint's save goes on as it was raised; the half-written checkpoint is
    removed, the earlier ones are as they were."""
    from tests.test_long_run_faults import _trainer

    trainer = _trainer(tiny_ab_model, tmp_path, max_steps=3, save_strategy="steps", save_steps=1)
    save_rng_state = trainer._save_rng_state

    def crash(output_dir):
        if trainer.state.global_step == 2:
            raise RuntimeError("the machine fell over")
        return save_rng_state(output_dir)

    monkeypatch.setattr(trainer, "_save_rng_state", crash)
    first = {}

    class Keep(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == 1:
                first.update(_hashes(tmp_path, "checkpoint-1/**/*"))

    trainer.add_callback(Keep())
    with pytest.raises(RuntimeError, match="^the machine fell over$"):
        trainer.train()
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1"] and not _leftovers(tmp_path)
    assert first and _hashes(tmp_path, "checkpoint-1/**/*") == first


# ------------------------------------------------------------------------------------------------ the end of a run
@pytest.fixture(scope="module")
def finished_run(cli, tiny_ab_model, tmp_path_factory) -> Path:
    """A finished 2-step run with checkpoint-2, final adapters, summary.json and report.md."""
    out = tmp_path_factory.mktemp("finished") / "run"
    result = cli(["train", *COMMON, "--model", tiny_ab_model, "--output_dir", out, "--max_steps", "2", "--save_steps",
                  "2"])
    assert result.returncode == 0, result.output[-3000:]
    for name in ("adapters/team.json", "summary.json", "report.md", "checkpoint-2/trainer_state.json"):
        assert (out / name).is_file(), name
    return out


@pytest.mark.parametrize("fault,what,kept", [
    ("save_model", "the team's adapters", "adapters"),
    ("write_summary", "summary.json", "summary.json"),
    ("write_report", "report.md", "report.md"),
])
@pytest.mark.parametrize("mode", ["fill", "stand-in"])
def test_a_full_disk_at_the_end_of_a_run_keeps_the_earlier_results(cli, tiny_ab_model, finished_run, tmp_path,
                                                                   small_disk, mode, fault, what, kept):
    """The finished run is continued to 3 steps (`--resume_from_checkpoint true`) and the disk is full right before
    its final adapters, its summary or its report are written: one error line naming them, exit code 1, run_status
    failed, and those of the earlier run byte for byte as they were, with no temporary file left."""
    root = _root(mode, small_disk, tmp_path)
    out = root / "run"
    shutil.copytree(finished_run, out)
    earlier = _hashes(out / kept) if (out / kept).is_dir() else _hashes(out, kept)
    assert earlier
    result = cli([*COMMON, "--model", tiny_ab_model, "--output_dir", out, "--max_steps", "3", "--save_steps", "2",
                  "--resume_from_checkpoint", "true"], script=_script(tmp_path),
                 env={"FAULT_AT": fault, "FAULT_MODE": mode, "DISK": str(root)})
    line = _one_error(result)
    path = out / ("adapters" if fault == "save_model" else what)
    assert line.startswith(f"disk_run.py: error: no space left on device writing {what} ({str(path)!r}): it needs "
                           "about "), line
    earlier_left = "the adapters saved before are" if fault == "save_model" else "the earlier file is"
    assert f" left on that file system; {earlier_left} as they were" in line or \
        f" left on that file system; {earlier_left} as it was" in line, line
    status = json.loads((out / "run_status.json").read_text())
    assert status["status"] == "failed" and "no space left on device" in status["error"]
    assert (_hashes(out / kept) if (out / kept).is_dir() else _hashes(out, kept)) == earlier
    assert not _leftovers(out)
    if fault == "save_model":  # the earlier adapters still load
        for policy in ("agent1", "agent2"):
            assert load_file(str(out / "adapters" / policy / "adapter_model.safetensors"))


# ------------------------------------------------------------------------------------------------ in one process
def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_file_written_atomically_is_the_old_one_or_the_new_one(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text("old")
    write_text_atomically(path, "new")
    assert path.read_text() == "new" and not _leftovers(tmp_path)
    monkeypatch.setattr(Path, "write_bytes", _no_space)
    with pytest.raises(DiskFullError) as info:
        write_text_atomically(path, "x" * 3000)
    assert str(info.value).startswith(f"no space left on device writing summary.json ({str(path)!r}): it needs "
                                      f"about 2.9 KiB, ")
    assert str(info.value).endswith("left on that file system; the earlier file is as it was; free space on that file "
                                    "system, or choose another output_dir")
    assert path.read_text() == "new" and not _leftovers(tmp_path)
    with pytest.raises(ZeroDivisionError):  # any other error: the file as it was, the error as it was
        write_atomically(path, lambda tmp: (tmp.write_text("half"), 1 / 0))
    assert path.read_text() == "new" and not _leftovers(tmp_path)


def test_the_run_outputs_keep_the_earlier_files_on_a_full_disk(tmp_path, small_disk, monkeypatch):
    out = (small_disk or tmp_path) / "run"
    write_run_outputs(out, None, {"command": "first"})
    earlier = _hashes(out)
    assert {"summary.json", "report.md"} <= set(earlier)
    if small_disk is not None:
        fd = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT)
        with pytest.raises(OSError):
            while True:
                os.write(fd, b"\0" * (1 << 16))
        os.close(fd)
    else:
        monkeypatch.setattr(Path, "write_bytes", _no_space)
    with pytest.raises(DiskFullError, match=r"^no space left on device writing summary.json .* the earlier file is as "
                                            r"it was"):
        write_run_outputs(out, None, {"command": "second, much longer " * 400})
    assert _hashes(out) == earlier and not _leftovers(out)


def test_what_counts_as_a_full_disk(tmp_path):
    from safetensors import SafetensorError

    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_disk_full(SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    # torch.save says only "unexpected pos": a full disk where the file system has less room than the write needed
    wordless = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert not is_disk_full(wordless, tmp_path, 1000)
    assert is_disk_full(wordless, tmp_path, 1 << 62)
    try:
        raise RuntimeError("saving failed") from OSError(errno.ENOSPC, "No space left on device")
    except RuntimeError as exc:
        assert is_disk_full(exc)  # the cause counts
    assert [format_size(n) for n in (None, 0, 1023, 1024, 3 << 20)] == ["?", "0 B", "1023 B", "1.0 KiB", "3.0 MiB"]


def test_torch_save_on_a_full_file_system_is_a_full_disk(small_disk):
    if small_disk is None:
        pytest.skip("no tmpfs can be mounted here")
    with pytest.raises(DiskFullError, match="it needs about"):
        write_atomically(small_disk / "optimizer.pt", lambda tmp: torch.save(torch.zeros(8 << 20), tmp), 32 << 20)
    assert not list(small_disk.iterdir())


def test_a_folder_is_replaced_whole(tmp_path):
    final, stage = tmp_path / "adapters", tmp_path / "adapters.tmp-1"
    final.mkdir()
    (final / "old.txt").write_text("old")
    stage.mkdir()
    (stage / "new.txt").write_text("new")
    publish_directory(stage, final)
    assert [p.name for p in final.iterdir()] == ["new.txt"] and not _leftovers(tmp_path)


def test_a_temporary_checkpoint_folder_is_never_resumed_from(tmp_path):
    """A process killed while it wrote checkpoint-6 leaves checkpoint-6.tmp-<pid>/checkpoint-6 (whole or not): `true`
    takes checkpoint-4, and a new run's refusal does not offer the temporary folder."""
    out = tmp_path / "run"
    (out / "checkpoint-4").mkdir(parents=True)
    (out / "checkpoint-4" / "trainer_state.json").write_text("{}")
    staged = out / "checkpoint-6.tmp-4242" / "checkpoint-6"
    staged.mkdir(parents=True)
    (staged / "trainer_state.json").write_text("{}")
    (out / "checkpoint-6.tmp-4242" / "trainer_state.json").write_text("{}")
    assert resolve_checkpoint("true", out) == str(out / "checkpoint-4")
    with pytest.raises(ValueError, match=r"checkpoint-4, checkpoint-6.tmp-4242\).*true for the last complete one: "
                                         r"checkpoint-4\)"):
        check_output_dir(out, None, False)
