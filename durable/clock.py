"""Where the library reads the wall clock: every event's time, every deadline, wait expiry,
timer and due-set score, and what ``ctx.now()``/``ctx.time()`` record, come from
``now_ms()``/``time()`` here.

A process reads the system clock. A test may put a clock it moves itself in its place for
a while (``with clock.using(durable.testing.TestClock()):``, as
``durable.testing.AgentEnvironment`` does), so that a timer of an hour, an approval's
expiry or a lease's time to live pass at once. The durations the processes measure (a
tool call's deadline watch, heartbeats, the watchdog) use ``time.monotonic`` and are not
the wall clock's business: they stay real.

Lease and liveness keys live in Redis with their own time to live, which Redis counts;
the test environment shortens them when it moves its clock.
"""

from __future__ import annotations

import time as _time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Seconds since the epoch, as ``time.time()``."""
        ...


class SystemClock:
    def time(self) -> float:
        return _time.time()


SYSTEM = SystemClock()
_current: Clock = SYSTEM


def time() -> float:
    """Seconds since the epoch, from the clock in use."""
    if _current is SYSTEM:  # the common case, read directly: a step reads it several times
        return _time.time()
    return _current.time()


def now_ms() -> int:
    """Milliseconds since the epoch, from the clock in use."""
    if _current is SYSTEM:
        return int(_time.time() * 1000)
    return int(_current.time() * 1000)


def current() -> Clock:
    return _current


@contextmanager
def using(clock: Clock) -> Iterator[Clock]:
    """Read ``clock`` instead of the one in use until the block ends (for tests: one clock
    per process at a time; the block restores the one before it)."""
    global _current
    before, _current = _current, clock
    try:
        yield clock
    finally:
        _current = before
