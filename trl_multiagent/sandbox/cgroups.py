"""The memory cgroup of a sandboxed run: the launcher enters it (its children inherit it), the host removes it.

cgroup v2 (the unified hierarchy, with the memory controller enabled at its root) or cgroup v1's memory hierarchy;
where neither can be used (a read-only cgroupfs in a container, ...) the run goes on without one and says so.
"""

from __future__ import annotations

import os

_CGROUP_V2 = "/sys/fs/cgroup"
_CGROUP_V1_MEMORY = "/sys/fs/cgroup/memory"
_CGROUP_DIR = "trl-multiagent-sandbox"


def cgroup_paths(name: str) -> list[str]:
    return [os.path.join(root, _CGROUP_DIR, name) for root in (_CGROUP_V2, _CGROUP_V1_MEMORY)]


def _write_file(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter_cgroup(cg: dict) -> str | None:
    """Create a memory cgroup capped at ``cg["bytes"]`` and move this process into it (children inherit it).

    Returns a warning instead of raising when cgroups are unavailable (read-only cgroupfs in a container, ...)."""
    limit = str(cg["bytes"])
    try:
        if os.path.exists(os.path.join(_CGROUP_V2, "cgroup.controllers")):  # unified hierarchy
            with open(os.path.join(_CGROUP_V2, "cgroup.subtree_control")) as f:
                if "memory" not in f.read().split():
                    return "memory cgroup: the memory controller is not enabled at the cgroup v2 root"
            base = os.path.join(_CGROUP_V2, _CGROUP_DIR)
            os.makedirs(base, exist_ok=True)
            _write_file(os.path.join(base, "cgroup.subtree_control"), "+memory")
            path = os.path.join(base, cg["name"])
            os.mkdir(path)
            _write_file(os.path.join(path, "memory.max"), limit)
            if os.path.exists(os.path.join(path, "memory.swap.max")):
                _write_file(os.path.join(path, "memory.swap.max"), "0")
        elif os.path.isdir(_CGROUP_V1_MEMORY):
            path = os.path.join(_CGROUP_V1_MEMORY, _CGROUP_DIR, cg["name"])
            os.makedirs(path)
            _write_file(os.path.join(path, "memory.limit_in_bytes"), limit)
            if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                _write_file(os.path.join(path, "memory.memsw.limit_in_bytes"), limit)
        else:
            return "memory cgroup: no cgroup filesystem found"
        _write_file(os.path.join(path, "cgroup.procs"), str(os.getpid()))
    except OSError as exc:
        return f"memory cgroup: {exc}"
    return None
