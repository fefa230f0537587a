"""The sandbox's wire formats: result records for the host, the call channel between judge and worker, and the
exception and repr texts that both of them put into messages.

**Records** (:func:`emit`) are single-line JSON objects written to a private pipe that the host reads.

**Call channel.** The judge and the worker talk over two pipes, one message per line: a JSON object whose values
are *plain data* in a tagged encoding. Plain data is ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``,
``bytes`` and ``list``, ``tuple``, ``dict``, ``set``, ``frozenset`` of plain data, checked by exact type
(``type(x) is int``): a subclass of any of them, whatever its ``__eq__``, is not plain. The encoding:

* ``None``, ``bool``, ``str``, ``float`` (including ``nan``/``inf``) and ints below 2**63 in magnitude are
  themselves; bigger ints are ``["i", hex]``;
* ``["b", hex]`` bytes, ``["c", real, imag]`` complex, ``["l", *items]`` list, ``["t", *items]`` tuple,
  ``["s", *items]`` set, ``["f", *items]`` frozenset, ``["d", k1, v1, k2, v2, ...]`` dict;
* ``["r", name, attr, ...]`` (judge to worker only): one of the worker's own objects, by its path in the program.

:func:`decode` rebuilds only these types from ``json.loads`` output (which itself only builds exact ``dict``,
``list``, ``str``, ``int``, ``float``, ``bool`` and ``None``); anything else raises :class:`WireError`. No code of
the sender runs while decoding: no ``__eq__``, ``__hash__`` or ``__reduce__`` of a foreign object is ever called.
"""

from __future__ import annotations

import json
import os
import select
import time

MESSAGE_LIMIT = 2000
REPR_LIMIT = 300
MAX_MESSAGE_BYTES = 16 << 20
MAX_DEPTH = 100
_BIG = 1 << 63


class WireError(ValueError):
    """A message or a value that does not follow the wire format (malformed, too large, too deep)."""


class NotPlain(TypeError):
    """A value that is not plain data; its message names the offending type and where it sits."""


def emit(fd: int, record: dict) -> None:
    """Write one JSON record line to ``fd``, ignoring a closed pipe."""
    data = (json.dumps(record) + "\n").encode()
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass


def describe(exc: BaseException) -> str:
    """``"Type: message"`` of an exception (or its ``sandbox_text``), at most :data:`MESSAGE_LIMIT` characters."""
    text = getattr(exc, "sandbox_text", None)
    if type(text) is not str:
        try:
            text = str(exc)
        except BaseException:  # noqa: BLE001
            text = ""
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


def short_repr(value) -> str:
    try:
        text = repr(value)
    except BaseException as exc:  # noqa: BLE001
        text = f"<repr failed: {type(exc).__name__}>"
    return text if len(text) <= REPR_LIMIT else text[: REPR_LIMIT - 3] + "..."


# ---------------------------------------------------------------------------------------------------- plain values

_TAGS = {list: "l", tuple: "t", set: "s", frozenset: "f"}


def encode(value, ref=None, depth: int = 0):
    """The tagged, JSON-ready form of a plain value. ``ref(x)`` may return a path (tuple of names) for a value that
    is not plain (the judge's proxies); otherwise such a value raises :class:`NotPlain`."""
    kind = type(value)
    if value is None or kind is bool or kind is str or kind is float:
        return value
    if kind is int:
        return value if -_BIG < value < _BIG else ["i", format(value, "x")]
    if depth >= MAX_DEPTH:
        raise NotPlain(f"nested deeper than {MAX_DEPTH} levels (or cyclic)")
    tag = _TAGS.get(kind)
    if tag is not None:
        return [tag, *(encode(item, ref, depth + 1) for item in value)]
    if kind is dict:
        out = ["d"]
        for key, item in value.items():
            out.append(encode(key, ref, depth + 1))
            out.append(encode(item, ref, depth + 1))
        return out
    if kind is bytes:
        return ["b", value.hex()]
    if kind is complex:
        return ["c", value.real, value.imag]
    path = ref(value) if ref is not None else None
    if path is not None:
        return ["r", *path]
    raise NotPlain(f"a value of type {_type_name(value)} is not plain data")


def _type_name(value) -> str:
    kind = type(value)
    name = getattr(kind, "__qualname__", None)
    return name if type(name) is str else "?"


def _number(x) -> float:
    if type(x) is float or type(x) is int:
        return float(x)
    raise WireError("malformed complex number")


def decode(data, resolve=None, depth: int = 0):
    """Rebuild a value from its tagged form. ``resolve(path)`` turns an ``["r", ...]`` reference into an object
    (worker side only); without it a reference is a :class:`WireError`."""
    kind = type(data)
    if data is None or kind is bool or kind is str or kind is float or kind is int:
        return data
    if kind is not list or not data or type(data[0]) is not str:
        raise WireError("malformed value")
    if depth >= MAX_DEPTH:
        raise WireError(f"nested deeper than {MAX_DEPTH} levels")
    tag, items = data[0], data[1:]
    try:
        if tag == "l":
            return [decode(x, resolve, depth + 1) for x in items]
        if tag == "t":
            return tuple(decode(x, resolve, depth + 1) for x in items)
        if tag == "s":
            return {decode(x, resolve, depth + 1) for x in items}
        if tag == "f":
            return frozenset(decode(x, resolve, depth + 1) for x in items)
        if tag == "d":
            if len(items) % 2:
                raise WireError("malformed dict")
            out = {}
            for k in range(0, len(items), 2):
                out[decode(items[k], resolve, depth + 1)] = decode(items[k + 1], resolve, depth + 1)
            return out
        if len(items) == 1 and type(items[0]) is str:
            if tag == "i":
                return int(items[0], 16)
            if tag == "b":
                return bytes.fromhex(items[0])
        if tag == "c" and len(items) == 2:
            return complex(_number(items[0]), _number(items[1]))
        if tag == "r" and resolve is not None and items and all(type(x) is str for x in items):
            return resolve(tuple(items))
    except TypeError as exc:  # an unhashable set element or dict key
        raise WireError(f"malformed value ({exc})") from None
    except ValueError as exc:
        raise WireError(f"malformed value ({exc})") from None
    raise WireError(f"malformed value (tag {tag[:20]!r})")


# ---------------------------------------------------------------------------------------------------- messages


class Channel:
    """One end of the call channel: newline-delimited JSON objects over a pair of pipes."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf already searched for a newline
        self._skip_line = False  # inside the tail of an oversized message
        self.partial = False

    def send(self, message: dict) -> None:
        self.send_raw((json.dumps(message, separators=(",", ":")) + "\n").encode())

    def send_raw(self, data: bytes) -> None:
        view = memoryview(data)
        self.partial = True  # until the whole line is written (a signal may interrupt a blocked write)
        while view:
            view = view[os.write(self.write_fd, view) :]
        self.partial = False

    def recv(self, timeout: float | None = None):
        """The next message (a dict), ``None`` at end of file; :class:`WireError` for a malformed or oversized line
        (which is consumed); :class:`TimeoutError` when ``timeout`` seconds pass without a whole line."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            end = self._buf.find(b"\n", self._scanned)
            if end >= 0:
                line = bytes(self._buf[:end])
                del self._buf[: end + 1]
                self._scanned = 0
                return self._parse(line)
            self._scanned = len(self._buf)
            if len(self._buf) > MAX_MESSAGE_BYTES:
                self._buf.clear()
                self._scanned = 0
                self._skip_line = True
                raise WireError(f"message over {MAX_MESSAGE_BYTES} bytes")
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
                    raise TimeoutError
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                return None
            self._buf += chunk

    def _parse(self, line: bytes) -> dict:
        if self._skip_line:
            self._skip_line = False
            raise WireError(f"message over {MAX_MESSAGE_BYTES} bytes")
        try:
            message = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise WireError(f"malformed message ({type(exc).__name__})") from None
        if type(message) is not dict:
            raise WireError("malformed message")
        return message
