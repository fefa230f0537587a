"""The CPU allocator setting (``cpu_malloc_mmap_threshold``): glibc serves large blocks from their own mappings.

glibc's default mmap threshold is dynamic: freeing a 4 MiB mapped block raises it to 4 MiB, so the next 2 MiB block
comes from the heap (where freed activations fragment). With the threshold pinned, the 2 MiB block is mapped on its
own and goes back to the OS when freed. ``mallinfo2().hblkhd`` (bytes in mapped blocks) grows by 2 MiB in the
second case only. Each
case runs in a fresh interpreter: the setting is process-wide.
"""

import platform
import subprocess
import sys

import pytest

from trl_multiagent.trainers import MultiAgentGRPOConfig
from trl_multiagent.utils import set_cpu_mmap_threshold

PROBE = r"""
import ctypes, sys
sys.path.insert(0, {root!r})
from trl_multiagent.utils import set_cpu_mmap_threshold

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
pinned = set_cpu_mmap_threshold({threshold})
big = libc.malloc(4 << 20)
libc.free(big)                      # glibc's dynamic threshold rises to 4 MiB here
mapped_before = libc.mallinfo2().hblkhd
block = libc.malloc(2 << 20)
print(pinned, libc.mallinfo2().hblkhd - mapped_before >= (2 << 20))
"""


def _probe(threshold: int) -> str:
    from pathlib import Path

    code = PROBE.format(root=str(Path(__file__).resolve().parents[1]), threshold=threshold)
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}  # no MALLOC_* variables
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=env).stdout.split()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt and mallinfo2 are glibc's")
def test_pinned_threshold_maps_large_blocks_and_default_does_not():
    assert _probe(0) == ["False", "False"]  # dynamic threshold: the 2 MiB block came from the heap
    assert _probe(131072) == ["True", "True"]  # pinned: it is its own mapping


def test_threshold_validation(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="mmap threshold"):
        set_cpu_mmap_threshold(-1)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert set_cpu_mmap_threshold(131072) is False  # the user's environment variable wins
    with pytest.raises(ValueError, match="cpu_malloc_mmap_threshold"):
        MultiAgentGRPOConfig(output_dir=str(tmp_path), cpu_malloc_mmap_threshold=-5, report_to=[])


RELAX_PROBE = r"""
import ctypes, sys
sys.path.insert(0, {root!r})
from trl_multiagent.utils import generation_mmap_threshold, set_cpu_mmap_threshold

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.mallinfo2.restype = MallInfo2

def mapped_after_malloc(size):
    before = libc.mallinfo2().hblkhd
    libc.malloc(size)
    return libc.mallinfo2().hblkhd - before >= size

print(set_cpu_mmap_threshold(131072))
print(mapped_after_malloc(2 << 20))             # pinned: a 2 MiB block is its own mapping
with generation_mmap_threshold():
    print(mapped_after_malloc(2 << 20))         # while generating: from the heap
    print(mapped_after_malloc(40 << 20))        # above 32 MiB: still mapped
print(mapped_after_malloc(2 << 20))             # the pinned threshold is back
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt and mallinfo2 are glibc's")
def test_generation_relaxes_the_pinned_threshold_and_restores_it():
    from pathlib import Path

    code = RELAX_PROBE.format(root=str(Path(__file__).resolve().parents[1]))
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == ["True", "True", "False", "True", "True"]
