"""``cpu_keep_freed_memory`` (``utils.keep_freed_cpu_memory``): the process keeps the CPU memory it frees.

Each case runs in a fresh interpreter (the setting is process-wide and stays). A 64 MiB block is allocated with
glibc's ``malloc`` and freed; ``mallinfo2`` tells where it came from (``hblkhd``: bytes in blocks with a mapping of
their own; ``arena``: bytes of the heap) and whether the heap still holds it after ``release_freed_memory``. With
glibc's defaults a block that large (above the dynamic threshold's 32 MiB ceiling) is mapped on its own and unmapped
when freed; kept, it comes from the heap and stays there.
"""

import json
import os
import platform
import subprocess
import sys

from trl_multiagent.runtime import memory as utils
from trl_multiagent.trainers import MAGRPOConfig

PROBE = r"""
import ctypes, json, sys
import torch
from trl_multiagent.runtime.provenance import kernel_record
from trl_multiagent.runtime.memory import keep_freed_cpu_memory, release_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                                "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
kept = keep_freed_cpu_memory() if sys.argv[1] == "keep" else None
before = libc.mallinfo2()
block = libc.malloc(64 << 20)
during = libc.mallinfo2()
libc.free(block)
release_freed_memory()
after = libc.mallinfo2()
print(json.dumps({"kept": kept, "mapped": during.hblkhd - before.hblkhd, "heap": during.arena - before.arena,
                  "mapped_after": after.hblkhd - before.hblkhd, "heap_after": after.arena - before.arena,
                  "allocator": kernel_record()["cpu_allocator"]}))
"""
MIB64 = 64 << 20
#: The heap may already have had some free space at its top: "from the heap" means it grew by most of the block.
MOST = MIB64 - (4 << 20)


def probe(mode: str, **env) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], env={**clean, "CUDA_VISIBLE_DEVICES": "", **env},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_large_freed_block_is_kept_in_the_heap_and_not_trimmed():
    if platform.libc_ver()[0] != "glibc":  # nothing to set: the function says so
        assert probe("keep")["kept"] is False
        return
    default, kept = probe("default"), probe("keep")
    # glibc's defaults: the block has a mapping of its own, gone once freed
    assert default["mapped"] >= MIB64 and default["heap"] < MOST and default["mapped_after"] <= 0
    assert default["allocator"] == "glibc's defaults"
    # kept: from the heap, and still there after the free and release_freed_memory (which trims nothing now)
    assert kept["kept"] is True and kept["mapped"] < MIB64 and kept["heap"] >= MOST and kept["heap_after"] >= MOST
    assert kept["allocator"].startswith("keeps freed memory")


def test_the_users_allocator_variables_win():
    if platform.libc_ver()[0] != "glibc":
        return
    for env in ({"MALLOC_TRIM_THRESHOLD_": "131072"}, {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}):
        result = probe("keep", **env)
        name = next(iter(env))
        assert result["kept"] is False and name in result["allocator"]
        assert result["mapped"] >= MIB64  # glibc's (or the user's) mapping of a large block, not the kept heap
    # a GLIBC_TUNABLES without malloc settings does not count as the user's choice
    assert probe("keep", GLIBC_TUNABLES="glibc.cpu.hwcaps=-AVX512F")["kept"] is True


def test_the_config_field_is_off_by_default_and_can_be_turned_on(tmp_path):
    assert MAGRPOConfig(output_dir=str(tmp_path), report_to=[]).cpu_keep_freed_memory is False
    on = MAGRPOConfig(output_dir=str(tmp_path), report_to=[], cpu_keep_freed_memory=True)
    assert on.cpu_keep_freed_memory is True


class _RefusingLibc:
    """A libc whose mallopt takes mmap thresholds up to 32 MiB only (as glibc's manual describes); records the calls."""

    def __init__(self):
        self.calls = []

    def mallopt(self, param, value):
        self.calls.append((param, value))
        return int(not (param == -3 and value > 32 << 20))


def test_a_refused_1_gib_threshold_falls_back_to_the_ceiling(monkeypatch):
    """In process, on a stand-in libc (nothing of the real allocator changes): 1 GiB is asked, refused, 32 MiB set,
    trimming off (-1), and the record names the threshold set."""
    fake = _RefusingLibc()
    monkeypatch.setattr(utils, "_libc", lambda: fake)
    monkeypatch.setattr(utils, "_ALLOCATOR", {"keeps_freed": False, "note": "glibc's defaults"})
    for name in utils.ALLOCATOR_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert utils.keep_freed_cpu_memory() is True
    assert fake.calls == [(-3, 1 << 30), (-3, 32 << 20), (-1, -1)]
    assert utils.cpu_allocator_record() == "keeps freed memory (mallopt: no trimming, mmap threshold 33554432)"
