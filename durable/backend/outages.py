"""Redis going away and coming back is ordinary: processes wait, retry with backoff, and say
so once per outage (not a traceback per call, nor a line per retry).

Two things keep that true on a Redis Cluster, where a process sees a master's death as some
calls failing while others (and ``PING``, which goes to one node) still succeed:

- **An outage ends after a quiet spell, not at the first success.** ``Outage.ok()`` closes
  it only once no call has failed for ``QUIET_S``; a success between failures (another
  master answered) changes nothing. So a process logs one "unavailable" line when calls
  start failing and one "answers again" line after the failover, however its calls
  interleave.
- **Every retry loop waits on a ``Backoff`` of its own**, which grows on each failure and
  is reset only by that loop's own success: a ``PING`` that answers while the loop's real
  work still fails does not make it retry at once (before, idle workers spun at 90 % CPU
  and logged ~8,300 lines per second while a master was down).
"""

from __future__ import annotations

import logging
import random
import threading
import time

import redis

#: An outage ends only after calls succeed for this long with no failure between.
QUIET_S = 1.0

#: First and longest wait of a ``Backoff`` (seconds): the longest also bounds how late a
#: process notices that Redis answers again.
FIRST_DELAY_S = 0.05
MAX_DELAY_S = 0.5


class Backoff:
    """The wait of one retry loop: doubles from ``first_s`` to ``max_s`` on each failure
    (with jitter, so processes restarted together do not retry in step), reset by the
    loop's own success."""

    def __init__(self, first_s: float = FIRST_DELAY_S, max_s: float = MAX_DELAY_S) -> None:
        self.first_s, self.max_s = first_s, max_s
        self.delay = first_s

    def reset(self) -> None:
        self.delay = self.first_s

    def next(self) -> float:
        """The wait before the next attempt (and the one after grows)."""
        delay = self.delay * random.uniform(0.75, 1.0)
        self.delay = min(self.delay * 2, self.max_s)
        return delay

    def wait(self, stop: threading.Event | None = None) -> bool:
        """Sleep the next delay; True when ``stop`` was set meanwhile."""
        delay = self.next()
        if stop is not None:
            return stop.wait(delay)
        time.sleep(delay)
        return False


class Outage:
    """Tracks one process's view of Redis: one line when calls start failing, one when
    calls have succeeded again for ``QUIET_S`` (see the module doc)."""

    def __init__(self, logger: logging.Logger, quiet_s: float = QUIET_S) -> None:
        self.log = logger
        self.quiet_s = quiet_s
        self._lock = threading.Lock()
        self.since: float | None = None
        self.last_failure = 0.0
        self.failures = 0
        #: Outages seen by this process (a test and an operator can read it).
        self.count = 0

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            self.failures += 1
            self.last_failure = time.monotonic()
            if self.since is None:
                self.since = self.last_failure
                self.count += 1
                self.log.warning("Redis unavailable (%s); retrying with backoff", exc)

    def ok(self) -> None:
        if self.since is None:  # the common case, without the lock
            return
        now = time.monotonic()
        if now - self.last_failure < self.quiet_s:
            return  # still failing elsewhere (a cluster's other master), or just back
        with self._lock:
            if self.since is not None and now - self.last_failure >= self.quiet_s:
                self.log.warning("Redis answers again after %.1f s (%d failed calls)",
                                 self.last_failure - self.since, self.failures)
                self.since, self.failures = None, 0

    @property
    def down(self) -> bool:
        """Whether an outage is open (calls failed and have not succeeded quietly since)."""
        return self.since is not None

    def wait_until_up(self, client: redis.Redis, stop: threading.Event | None = None,
                      backoff: Backoff | None = None) -> bool:
        """Ping with ``backoff`` until Redis answers (True) or ``stop`` is set (False).

        On a cluster a ping reaches one node only: the caller's next real call may fail
        again, and its own ``backoff`` (pass it here) keeps growing until that call works.
        """
        backoff = backoff or Backoff()
        while stop is None or not stop.is_set():
            try:
                client.ping()
            except redis.RedisError as exc:
                self.failed(exc)
                if backoff.wait(stop):
                    return False
                continue
            self.ok()
            return True
        return False
