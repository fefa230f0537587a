"""What the sandbox's file system holds: the allow-list, computed on the caller's side.

The launcher builds the sandbox's root from scratch (a small tmpfs, see :func:`.launcher.build_root`) and shows in
it, read-only and at their usual absolute paths, only what is listed here:

* the interpreter: ``sys.executable`` with every symbolic link on its way (a virtualenv's ``bin/python`` ->
  the base interpreter), the virtualenv's ``pyvenv.cfg``, and the real binary;
* the standard library (``os.py``'s directory, ``lib-dynload`` and the other standard entries of ``sys.path``),
  with every ``site-packages``/``dist-packages`` directory inside it covered by an empty one;
* the shared libraries of the interpreter, of ``lib-dynload`` and of the allowed packages' extension modules (found
  with ``ldd``): the whole directory that holds the C library (the system's library directory, where glibc also
  finds what it loads at run time, like ``libgcc_s``), any other library as a single file;
* the sandbox's own modules (``trl_multiagent/sandbox/``, not the rest of the project);
* the allowed packages (:attr:`SandboxConfig.allowed_packages`): each one's directory (or module file), its
  ``<name>.libs`` directory and its ``.dist-info``;
* ``/etc/ld.so.cache``, ``/etc/localtime``, the time zone database, the ``C.UTF-8`` locale, and the device nodes
  ``/dev/null``, ``/dev/zero``, ``/dev/random``, ``/dev/urandom``.

The plan is computed once per process and package list (``ldd`` takes about a second) and is plain data: a sorted
list of ``[kind, path, target]`` entries, where kind is ``dir``/``file``/``dev`` (bind-mounted), ``link`` (a
symbolic link re-created with the same target) or ``mask`` (an empty tmpfs over a directory of a bound tree).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

from .config import SandboxError

_HERE = os.path.dirname(os.path.abspath(__file__))
_SITE_NAMES = ("site-packages", "dist-packages")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
_lock = threading.Lock()
_plans: dict[tuple[str, ...], dict] = {}


def root_plan(packages: tuple[str, ...] = ()) -> dict:
    """The allow-list for these packages: ``{"entries": [[kind, path, target], ...], "notes": [...], "paths":
    [...]}``; ``paths`` are the folders that hold the packages, added to ``sys.path`` in the sandbox (where ``site``
    would not add them: a package found through a ``.pth`` file, an editable install, ``PYTHONPATH``)."""
    key = tuple(packages)
    with _lock:
        plan = _plans.get(key)
        if plan is None:
            plan = _plans[key] = _Plan(key).finish()
        return plan


def resolve(path: str, links: dict[str, str]) -> str:
    """``os.path.realpath(path)``, recording every symbolic link met on the way (``link path -> its target``)."""
    pending = [p for p in reversed(path.split("/")) if p]
    done: list[str] = []
    hops = 0
    while pending:
        part = pending.pop()
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        current = "/" + "/".join([*done, part])
        if os.path.islink(current):
            hops += 1
            if hops > 40:
                raise OSError(f"too many levels of symbolic links: {path}")
            target = os.readlink(current)
            links[current] = target
            if target.startswith("/"):
                done = []
            pending.extend(p for p in reversed(target.split("/")) if p)
        else:
            done.append(part)
    return "/" + "/".join(done)


def _is_site(path: str) -> bool:
    return any(part in _SITE_NAMES for part in path.split("/"))


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


class _Plan:
    def __init__(self, packages: tuple[str, ...]):
        self.packages = packages
        self.links: dict[str, str] = {}
        self.binds: dict[str, str] = {}
        self.masks: set[str] = set()
        self.notes: list[str] = []
        self.elf: list[str] = []  # files whose shared libraries are exposed
        self.paths: list[str] = []  # the folders that hold the allowed packages (for sys.path)

    def expose(self, path: str | None, kind: str | None = None) -> str | None:
        if not path or not os.path.lexists(path):
            return None
        real = resolve(os.path.abspath(path), self.links)
        if not os.path.exists(real):
            return None
        if kind is None:
            kind = "dir" if os.path.isdir(real) else "file"
        self.binds.setdefault(real, kind)
        return real

    def finish(self) -> dict:
        self.interpreter()
        self.expose(_HERE, "dir")
        for name in self.packages:
            self.package(name)
        self.libraries()
        self.runtime_data()
        return {"entries": self.entries(), "notes": self.notes, "paths": list(dict.fromkeys(self.paths))}

    def interpreter(self) -> None:
        exe = self.expose(sys.executable, "file")
        if exe is None:
            raise SandboxError(f"the interpreter {sys.executable!r} cannot be found")
        self.elf.append(exe)
        self.expose(getattr(sys, "_base_executable", None), "file")
        if sys.prefix != sys.base_prefix:
            self.expose(os.path.join(sys.prefix, "pyvenv.cfg"), "file")
        bases = [p for p in {sys.base_prefix, sys.base_exec_prefix} if p]
        stdlib = [os.path.dirname(os.__file__)]
        stdlib += [p for p in sys.path if p and not _is_site(p) and any(_under(os.path.abspath(p), b) for b in bases)]
        for path in stdlib:
            real = self.expose(path)
            if real is None or not os.path.isdir(real):
                continue
            for name in _SITE_NAMES:  # the base interpreter's own packages stay hidden
                if os.path.isdir(os.path.join(real, name)):
                    self.masks.add(os.path.join(real, name))
            dynload = os.path.join(real, "lib-dynload")
            for folder in (real, dynload):
                if os.path.isdir(folder):
                    self.elf += [os.path.join(folder, f) for f in os.listdir(folder) if ".so" in f]
        # every site directory that a bound tree may contain is covered, whatever its layout
        hidden = [*_site_dirs()]
        for path in hidden:
            if os.path.isdir(path):
                self.masks.add(resolve(path, {}))

    def package(self, name: str) -> None:
        import importlib.util

        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError) as exc:
            raise SandboxError(f"allowed package {name!r} cannot be found: {exc}") from exc
        if spec is None:
            raise SandboxError(f"allowed package {name!r} is not importable by this interpreter")
        locations = list(spec.submodule_search_locations or [])
        if not locations and spec.origin and os.path.exists(spec.origin):
            locations = [spec.origin]  # a single module (or extension module) file
        for location in locations:
            real = self.expose(location)
            if real is None:
                continue
            parent = os.path.dirname(real)
            if not _under(real, os.path.dirname(os.__file__)):  # (a standard module is on the path anyway)
                self.paths.append(parent)
            self.expose(os.path.join(parent, f"{name}.libs"), "dir")
            for info in _dist_infos(parent, name):
                self.expose(info, "dir")
            if os.path.isdir(real):
                for folder, _, files in os.walk(real):
                    self.elf += [os.path.join(folder, f) for f in files if ".so" in f]
            elif ".so" in real:
                self.elf.append(real)

    def libraries(self) -> None:
        libs = _ldd(self.elf)
        if libs is None:
            libs = _mapped_libraries()
            self.notes.append("ldd not found: shared libraries taken from the libraries this process has loaded")
        real_libs = [resolve(p, self.links) for p in libs if os.path.exists(p)]
        libc_dirs = {os.path.dirname(p) for p in real_libs if os.path.basename(p).startswith(("libc.so", "libc-"))}
        for path in real_libs:
            folder = os.path.dirname(path)
            if folder in libc_dirs:
                self.expose(folder, "dir")
            else:
                self.expose(path, "file")

    def runtime_data(self) -> None:
        self.expose("/etc/ld.so.cache", "file")
        import sysconfig

        for folder in (sysconfig.get_config_var("TZPATH") or "").split(os.pathsep):
            if folder and os.path.isdir(folder):
                self.expose(folder, "dir")
                break
        self.expose("/etc/localtime", "file")
        for name in ("C.utf8", "C.UTF-8"):
            self.expose(os.path.join("/usr/lib/locale", name), "dir")
        for dev in _DEVICES:
            if os.path.exists(dev):
                self.binds[dev] = "dev"

    def entries(self) -> list[list]:
        def nearest(path: str, masks) -> str | None:
            """What shows ``path`` already: ``bind`` (a bound directory above it), ``mask`` or ``None``."""
            folder = path
            while folder != "/":
                folder = os.path.dirname(folder)
                if folder in masks:
                    return "mask"
                if self.binds.get(folder) == "dir":
                    return "bind"
            return None

        masks = {m for m in self.masks if m not in self.binds and nearest(m, self.masks) == "bind"}
        out = [["mask", m, None] for m in masks]
        out += [[kind, p, None] for p, kind in self.binds.items() if nearest(p, masks) != "bind"]
        out += [["link", p, t] for p, t in self.links.items() if p not in self.binds and nearest(p, masks) != "bind"]
        out.sort(key=lambda e: e[1].split("/"))
        return out


def _site_dirs() -> list[str]:
    import site
    import sysconfig

    dirs = []
    try:
        dirs += site.getsitepackages()
    except Exception:  # noqa: BLE001 - site may be stripped down
        pass
    try:
        dirs.append(site.getusersitepackages())
    except Exception:  # noqa: BLE001
        pass
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    for scheme_vars in (None, base):
        paths = sysconfig.get_paths(vars=scheme_vars) if scheme_vars else sysconfig.get_paths()
        dirs += [paths.get("purelib", ""), paths.get("platlib", "")]
    dirs += [p for p in sys.path if p and _is_site(p)]
    return [d for d in dict.fromkeys(dirs) if d]


def _dist_infos(folder: str, name: str) -> list[str]:
    """The ``*.dist-info`` directories in ``folder`` that install the top-level package ``name``."""
    found = []
    try:
        candidates = [f for f in os.listdir(folder) if f.endswith(".dist-info")]
    except OSError:
        return found
    for info in candidates:
        path = os.path.join(folder, info)
        try:
            with open(os.path.join(path, "top_level.txt")) as f:
                if name in f.read().split():
                    found.append(path)
                    continue
        except OSError:
            pass
        try:
            with open(os.path.join(path, "RECORD")) as f:
                if any(line.startswith((f"{name}/", f"{name}.")) for line in f):
                    found.append(path)
        except OSError:
            pass
    return found


def _ldd(files: list[str]) -> list[str] | None:
    """The shared libraries (and the dynamic loader) that ``files`` need, as ``ldd`` resolves them."""
    ldd = shutil.which("ldd", path="/usr/bin:/bin:/usr/local/bin:/usr/sbin:/sbin")
    if ldd is None:
        return None
    found: list[str] = []
    for k in range(0, len(files), 200):
        try:
            out = subprocess.run(
                [ldd, *files[k : k + 200]],
                capture_output=True,
                text=True,
                timeout=120,
                env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
                check=False,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        for line in out.splitlines():
            line = line.strip()
            if "=>" in line:
                path = line.split("=>", 1)[1].strip().split(" (", 1)[0].strip()
            else:
                path = line.split(" (", 1)[0].strip()
            if path.startswith("/") and not path.endswith(":"):
                found.append(path)
    found += [p for p in (_elf_interpreter(f) for f in files[:1]) if p]
    return list(dict.fromkeys(found))


def _mapped_libraries() -> list[str]:
    """Without ``ldd``: the C library, the dynamic loader and libpython as this process has them loaded."""
    found = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split(None, 5)[5].strip() if len(line.split(None, 5)) == 6 else ""
                base = os.path.basename(path)
                if path.startswith("/") and base.startswith(("libc.so", "libc-", "ld-", "libpython", "libm.so")):
                    found.append(path)
    except OSError:
        pass
    exe_interp = _elf_interpreter(os.path.realpath(sys.executable))
    return list(dict.fromkeys(found + ([exe_interp] if exe_interp else [])))


def _elf_interpreter(path: str) -> str | None:
    """``PT_INTERP`` of an ELF executable (the dynamic loader's path, e.g. ``/lib64/ld-linux-x86-64.so.2``)."""
    import struct

    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF":
                return None
            order = "<" if head[5] == 1 else ">"
            if head[4] == 2:  # 64-bit: e_phoff at 32, e_phentsize/e_phnum at 54; p_offset at 8, p_filesz at 32
                (phoff,) = struct.unpack(order + "Q", head[32:40])
                phentsize, phnum = struct.unpack(order + "HH", head[54:58])
                entry = order + "I4xQ16xQ"
            else:  # 32-bit: e_phoff at 28, e_phentsize/e_phnum at 42; p_offset at 4, p_filesz at 16
                (phoff,) = struct.unpack(order + "I", head[28:32])
                phentsize, phnum = struct.unpack(order + "HH", head[42:46])
                entry = order + "II8xI"
            for k in range(phnum):
                f.seek(phoff + k * phentsize)
                kind, offset, size = struct.unpack(entry, f.read(struct.calcsize(entry)))
                if kind == 3:  # PT_INTERP
                    f.seek(offset)
                    return f.read(size).rstrip(b"\0").decode() or None
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None
