"""Counting Redis round trips in a process: a worker hook, and a context for this process.

A round trip is one request written to a connection and answered: a command, a pipeline or
a script call each count once (redis-py sends each with one ``send_packed_command``), as do
RQ's blocking pops, heartbeats and pub/sub writes. Commands run inside a Lua script are one
round trip with their script.

In a worker: ``durable worker --hook bench.rtcount:Counter=PATH`` (``Worker(url,
hooks=[...])``) patches redis-py in that process and keeps three integers in ``PATH``,
mapped into its memory and written in place (no thread): its pid, its round trips, and its
``steps``, the ``after_outcome`` windows it passed. ``read(PATH)`` reads them back as
``{"pid", "round_trips", "steps"}``.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from redis.connection import AbstractConnection

_count = itertools.count()  # next() is atomic under the GIL
_sent = 0
_original = AbstractConnection.send_packed_command
_installed = 0
_lock = threading.Lock()
#: The counters' file: pid, round trips, steps (native 64-bit integers).
LAYOUT = struct.Struct("=qqq")
#: One of its integers, written in place (round trips at offset 8, steps at 16).
_INT = struct.Struct("=q")
#: The file of this process's ``Counter``, once one is made.
_mapped: mmap.mmap | None = None


def _counting(self: Any, command: Any, check_health: bool = True) -> Any:
    global _sent
    _sent = next(_count) + 1
    if _mapped is not None:
        _INT.pack_into(_mapped, 8, _sent)
    return _original(self, command, check_health)


def install() -> None:
    global _installed
    with _lock:
        _installed += 1
        AbstractConnection.send_packed_command = _counting


def uninstall() -> None:
    global _installed
    with _lock:
        _installed -= 1
        if _installed <= 0:
            _installed = 0
            AbstractConnection.send_packed_command = _original


def sent() -> int:
    """Round trips started in this process since the patch was first installed."""
    return _sent


@contextlib.contextmanager
def counting() -> Iterator[None]:
    """Count this process's round trips while inside (``sent()`` before and after)."""
    install()
    try:
        yield
    finally:
        uninstall()


class Counter:
    """The worker hook (see the module docstring)."""

    def __init__(self, path: str) -> None:
        global _mapped
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, LAYOUT.pack(os.getpid(), _sent, 0))
            self._map = mmap.mmap(fd, LAYOUT.size)
        finally:
            os.close(fd)
        self.steps = itertools.count()
        _mapped = self._map
        install()

    def after_outcome(self, run_id: str, step: int) -> None:
        _INT.pack_into(self._map, 16, next(self.steps) + 1)


def read(path: Path) -> dict[str, Any]:
    """A worker's counts (``{}`` before its hook has written them)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return {}
    if len(raw) != LAYOUT.size:
        return {}
    pid, round_trips, steps = LAYOUT.unpack(raw)
    return {"pid": pid, "round_trips": round_trips, "steps": steps}
