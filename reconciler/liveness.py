"""The reconciler's liveness watch: every sixth of ``DURABLE_LIVENESS_TTL_MS`` it looks for
workers whose liveness key is gone and releases their leases at once, run by run
(``durable.telemetry.liveness``), so their runs resume on another worker within a second instead of
after the lease's TTL and the next sweep.

A thread of its own, beside the sweep: a sweep of many due runs can take longer than the
liveness TTL, and a dead worker's runs should not wait for it. Several reconcilers may
watch at once: a lease is released only while it still has the value read, and a run made
ready twice is taken once (the second ``advance`` finds the lease held, or nothing to do).
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from durable.backend.outages import Backoff
from durable.leases import Lease
from durable.queue import enqueue_many
from durable.telemetry.liveness import AFTER_OUTAGE_S, dead_workers, release_worker

from .sweep import Sweeper

log = logging.getLogger("durable.reconciler")


class LivenessWatch(threading.Thread):
    def __init__(self, rec: Sweeper, stop: threading.Event | None = None) -> None:
        super().__init__(name="liveness-watch", daemon=True)
        self.rec = rec
        self.ttl_s = rec.settings.leases.liveness_ttl_ms / 1000
        self.stop = stop or threading.Event()
        #: Workers found dead so far, and their runs released.
        self.dead = 0
        self.released = 0
        #: Before this (monotonic), a missing key is not believed: the reconciler's own
        #: calls failed, and so, likely, did the workers' beats (``AFTER_OUTAGE_S``).
        self._trust_after = time.monotonic() + self.ttl_s

    def run(self) -> None:
        backoff = Backoff(max_s=max(self.ttl_s, 0.05))
        while not self.stop.is_set():
            try:
                self.check()
            except redis.RedisError as exc:
                self.rec.outage.failed(exc)
                self._trust_after = time.monotonic() + max(self.ttl_s, AFTER_OUTAGE_S)
                if backoff.wait(self.stop):
                    return
                continue
            backoff.reset()
            self.stop.wait(self.ttl_s / 6)

    def check(self) -> list[str]:
        """Release the leases of every dead worker now; returns the runs made ready.

        A missing key is believed only while this process sees Redis answer normally: not
        within ``AFTER_OUTAGE_S`` of any failed call of its own (its sweep's, its
        listener's, this watch's), nor after a look that took over a third of the TTL
        (redis-py retried inside it: a cluster refusing commands while a replica takes
        over a master, when the workers' beats fail too)."""
        now = time.monotonic()
        if now < self._trust_after or now - self.rec.outage.last_failure < AFTER_OUTAGE_S:
            return []
        rec = self.rec
        dead = dead_workers(rec.redis)
        if time.monotonic() - now > self.ttl_s / 3:
            self._trust_after = time.monotonic() + max(self.ttl_s, AFTER_OUTAGE_S)
            return []
        ready: list[str] = []
        for wid in dead:
            started = time.monotonic()
            released = release_worker(
                rec.redis, rec.log.keys,
                lambda run_id, value: rec.leases.release(Lease(run_id, value)), wid)
            if released:
                ready += released
                enqueue_many(rec.redis, rec.log.keys, rec.queue, released, force=True)
            self.dead += 1
            self.released += len(released)
            log.warning("worker %s is gone (its liveness key expired): released its %d "
                        "leases in %.0f ms; the runs are ready again", wid, len(released),
                        (time.monotonic() - started) * 1000)
        return ready
