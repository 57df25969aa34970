"""Redis going away and coming back is ordinary: processes wait, retry with backoff, and say
so once per outage (not a traceback per call)."""

from __future__ import annotations

import logging
import threading
import time

import redis


class Outage:
    """Tracks one process's view of Redis: one line when calls start failing, one when a
    call succeeds again."""

    def __init__(self, logger: logging.Logger) -> None:
        self.log = logger
        self._lock = threading.Lock()
        self.since: float | None = None
        self.failures = 0
        #: Outages seen by this process (a test and an operator can read it).
        self.count = 0

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            self.failures += 1
            if self.since is None:
                self.since = time.monotonic()
                self.count += 1
                self.log.warning("Redis unavailable (%s); retrying with backoff", exc)

    def ok(self) -> None:
        if self.since is None:  # the common case, without the lock
            return
        with self._lock:
            if self.since is not None:
                self.log.warning("Redis answers again after %.1f s (%d failed calls)",
                                 time.monotonic() - self.since, self.failures)
                self.since, self.failures = None, 0

    def wait_until_up(self, client: redis.Redis, stop: threading.Event | None = None,
                      max_delay_s: float = 2.0) -> bool:
        """Ping with exponential backoff until Redis answers (True) or ``stop`` is set."""
        delay = 0.05
        while stop is None or not stop.is_set():
            try:
                client.ping()
            except redis.RedisError as exc:
                self.failed(exc)
                if stop is not None:
                    if stop.wait(delay):
                        return False
                else:
                    time.sleep(delay)
                delay = min(delay * 2, max_delay_s)
                continue
            self.ok()
            return True
        return False
