"""Files written whole or not at all, and a full disk reported as one line.

A run's results are written beside their place under a temporary name (``<name>.tmp-<pid>``) and renamed over it
(``os.replace``) when complete: a file (:func:`write_atomically`, :func:`write_text_atomically`,
:func:`open_atomically`) or a whole folder
(:func:`staged_directory`: the team's adapters; a checkpoint is staged the same way,
:mod:`trl_multiagent.trainers.checkpoint_staging`). A process killed, a crash or a full disk in the middle of a write
thus leaves the earlier file or folder as it was, and never part of a new one under the name a reader takes; the
temporary one is removed on an error (a folder of a killed process, by the next save).

A write that runs out of space raises :class:`~trl_multiagent.errors.DiskFullError`: one line that names what was
being written and where, the space it needs (the size of what was being written) and the space left on that file
system (``shutil.disk_usage``). Out of space is ``ENOSPC`` (or ``EDQUOT``, a quota), safetensors' ``SafetensorError``
"No space left on device (os error 28)", and ``torch.save``'s ``RuntimeError`` ("unexpected pos ...", "file write
failed"), which names no cause: that one counts as out of space when the file system has less room left than the
write needed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from trl_multiagent.errors import DiskFullError

#: What a temporary file or folder has in its name, before the writing process's id.
TEMP_MARK = ".tmp-"
_NO_SPACE_WORDS = ("no space left on device", "os error 28", "disk quota exceeded", "os error 122")
_TORCH_WRITE_WORDS = ("unexpected pos", "file write failed", "pytorchstreamwriter failed")


def temporary_name(path: str | Path, token: int | str | None = None) -> Path:
    """``<path>.tmp-<token>`` (default token: this process's id), beside ``path``."""
    path = Path(path)
    return path.with_name(f"{path.name}{TEMP_MARK}{os.getpid() if token is None else token}")


def is_temporary(path: str | Path) -> bool:
    """The name is one of :func:`temporary_name`'s (a write in progress, or one a killed process left)."""
    return TEMP_MARK in Path(path).name


def free_space(path: str | Path) -> int | None:
    """Bytes free for this user on the file system of ``path`` (of its nearest existing folder), or None."""
    path = Path(path).absolute()
    for candidate in (path, *path.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def folder_size(path: str | Path) -> int:
    """The bytes of every file under ``path`` (0 when it does not exist)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def format_size(size: int | None) -> str:
    """``1.5 MiB``; ``?`` when unknown."""
    if size is None:
        return "?"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # not reached


def is_disk_full(exc: BaseException | None, path: str | Path | None = None, needed: int | None = None) -> bool:
    """``exc`` (or an exception it was raised from) says the disk is full (see the module docstring); ``path`` and
    ``needed``: where the write went and its size, to judge ``torch.save``'s wordless error by the space left."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFullError):
            return True
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(exc).lower()
        if any(words in text for words in _NO_SPACE_WORDS):
            return True
        if isinstance(exc, RuntimeError) and path is not None and any(w in text for w in _TORCH_WRITE_WORDS):
            free = free_space(path)
            if free is not None and free < max(needed or 0, 1 << 20):
                return True
        exc = exc.__cause__ or exc.__context__
    return False


def disk_full_error(what: str, path: str | Path, needed: int | None, kept: str) -> DiskFullError:
    """The one-line :class:`~trl_multiagent.errors.DiskFullError` of writing ``what`` to ``path``: the space
    ``needed`` (None: not known), the space left there, and ``kept``, what is as it was and the way on."""
    free = free_space(path)
    need = f"it needs about {format_size(needed)}" if needed else "it needs more"
    return DiskFullError(f"no space left on device writing {what} ({str(path)!r}): {need}, {format_size(free)} "
                         f"{'is' if free == 1 else 'are'} left on that file system; {kept}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


@contextlib.contextmanager
def replacing(path: str | Path, needed: int | None = None, what: str | None = None,
              kept: str | None = None) -> Iterator[Path]:
    """The temporary path for the ``with`` block to write, renamed over ``path`` (``os.replace``) when the block ends
    and removed when it raises, leaving ``path`` as it was; out of space is a
    :class:`~trl_multiagent.errors.DiskFullError` (``needed``: the bytes of the write, default what was written of
    it; ``what``: its name in the message, default the file's name; ``kept``: the message's end)."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except Exception as exc:
        size = needed if needed is not None else (folder_size(tmp) or None)
        full = is_disk_full(exc, path.parent, size)
        _remove(tmp)
        if full:
            raise disk_full_error(what or path.name, path, size, kept or _kept_file(path)) from exc
        raise
    except BaseException:
        _remove(tmp)
        raise


def write_atomically(path: str | Path, write: Callable[[Path], None], needed: int | None = None,
                     what: str | None = None, kept: str | None = None) -> Path:
    """Write ``path`` whole or not at all: ``write(temporary path)``, then renamed over ``path`` (:func:`replacing`,
    which says what an error leaves)."""
    with replacing(path, needed, what, kept) as tmp:
        write(tmp)
    return Path(path)


@contextlib.contextmanager
def open_atomically(path: str | Path, what: str | None = None, kept: str | None = None) -> Iterator[IO[str]]:
    """A text file opened for writing whose contents replace ``path`` only when the ``with`` block ends without an
    error (:func:`replacing`)."""
    with replacing(path, None, what, kept) as tmp, open(tmp, "w") as handle:
        yield handle


def _kept_file(path: Path) -> str:
    earlier = "the earlier file is as it was" if path.exists() else "nothing was written"
    return f"{earlier}; free space on that file system, or choose another output_dir"


def write_text_atomically(path: str | Path, text: str, what: str | None = None, kept: str | None = None) -> Path:
    """:func:`write_atomically` of a text (UTF-8)."""
    data = text.encode()
    return write_atomically(path, lambda tmp: tmp.write_bytes(data), len(data), what, kept)


def publish_directory(stage: str | Path, final: str | Path) -> None:
    """Rename the complete folder ``stage`` to ``final``. An existing ``final`` is renamed aside first
    (``<final>.old-<pid>``) and removed after, so that ``final`` is always the old folder or the new one, whole."""
    stage, final = Path(stage), Path(final)
    if not final.exists():
        os.rename(stage, final)
        return
    old = final.with_name(f"{final.name}.old-{os.getpid()}")
    _remove(old)
    os.rename(final, old)
    os.rename(stage, final)
    _remove(old)


@contextlib.contextmanager
def staged_directory(final: str | Path, needed: int | None, what: str, kept: str) -> Iterator[Path]:
    """A temporary folder beside ``final`` for the ``with`` block to fill; renamed to ``final`` when the block ends
    (:func:`publish_directory`), removed when it raises, out of space as a
    :class:`~trl_multiagent.errors.DiskFullError` (``needed``: the bytes to write; ``what`` and ``kept``: for the
    message)."""
    final = Path(final)
    stage = temporary_name(final)
    _remove(stage)
    try:
        stage.mkdir(parents=True)
        yield stage
        publish_directory(stage, final)
    except Exception as exc:
        size = max(needed or 0, folder_size(stage)) or None
        full = is_disk_full(exc, final.parent, size)
        _remove(stage)
        if full:
            raise disk_full_error(what, final, size, kept) from exc
        raise
    except BaseException:
        _remove(stage)
        raise
