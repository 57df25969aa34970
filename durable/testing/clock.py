"""A wall clock a test moves itself (``durable.clock`` reads it while it is in use)."""

from __future__ import annotations

import threading
import time


class TestClock:
    """A wall clock that moves only when told to (``advance``); it starts at ``start``
    (seconds since the epoch; the real time by default) and never goes back."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else float(start)
        self._lock = threading.Lock()

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock ``seconds`` (>= 0) forward; returns the new time."""
        if not seconds >= 0:
            raise ValueError(f"a clock moves forward only, not by {seconds!r} s")
        with self._lock:
            self._now += seconds
            return self._now
