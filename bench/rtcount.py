"""Counting Redis round trips in a process: a worker hook, and a context for this process.

A round trip is one request written to a connection and answered: a command, a pipeline or
a script call each count once (redis-py sends each with one ``send_packed_command``), as do
RQ's blocking pops, heartbeats and pub/sub writes. Commands run inside a Lua script are one
round trip with their script.

In a worker: ``durable worker --hook bench.rtcount:Counter=PATH`` (``Worker(url,
hooks=[...])``) patches redis-py in that process and, every 50 ms from a thread (and at
exit), writes ``{"pid", "round_trips", "steps", "t"}`` to ``PATH``; ``steps`` counts the
``after_outcome`` windows this process passed. ``read(PATH)`` reads it back.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from redis.connection import AbstractConnection

_count = itertools.count()  # next() is atomic under the GIL
_sent = 0
_original = AbstractConnection.send_packed_command
_installed = 0
_lock = threading.Lock()


def _counting(self: Any, command: Any, check_health: bool = True) -> Any:
    global _sent
    _sent = next(_count) + 1
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
        self.path = Path(path)
        self._path, self._tmp = str(self.path), str(self.path.with_suffix(".tmp"))
        self._pid = os.getpid()
        self.steps = itertools.count()
        self._steps = 0
        install()
        self._write()
        threading.Thread(target=self._loop, name="bench-rtcount", daemon=True).start()
        atexit.register(self._write)

    def after_outcome(self, run_id: str, step: int) -> None:
        self._steps = next(self.steps) + 1

    def _write(self) -> None:
        # Plain string formatting and file calls: this thread's CPU is the worker's CPU the
        # bench reports (``json`` and ``pathlib`` here cost a worker 30 µs of CPU per run).
        fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, (f'{{"pid": {self._pid}, "round_trips": {_sent}, '
                          f'"steps": {self._steps}, "t": {time.time()}}}').encode())
        finally:
            os.close(fd)
        os.replace(self._tmp, self._path)

    def _loop(self) -> None:
        written = (-1, -1)
        while True:
            time.sleep(0.05)
            if (_sent, self._steps) == written:  # nothing new to say
                continue
            written = (_sent, self._steps)
            with contextlib.suppress(OSError):
                self._write()


def read(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return {}
