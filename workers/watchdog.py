"""Letting go of held runs from outside their steps: the watchdog and the hand-back.

- A run whose agent code has run longer than ``DURABLE_DECIDE_TIMEOUT_MS`` is quarantined
  and its slot given back; ``Abandoned`` is raised in the thread that runs the code.
- A tool call that did not stop when interrupted (blocked in C, or it swallows the
  interrupt) gives its run up: lease released, run ready again, slot given back. Past
  ``DURABLE_MAX_STUCK_CALLS`` such calls in one process, the process is renewed.
- On shutdown, every run still held is handed back at once.

These run on the watchdog's, the call watcher's or the shutting-down thread, never in a
run's coroutine: their Redis calls are plain blocking ones.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable

import redis
from rq import Queue

from durable.backend.outages import Outage
from durable.leases import Heartbeats, Leases
from durable.log import keys
from durable.log.store import EventLog
from durable.queue import make_ready
from durable.settings import Settings

from .turns import Abandoned, Slot

log = logging.getLogger("durable.worker")


class Watchdog:
    """Abandons the held runs (``held``, shared with the step loop) that overran, or whose
    tool call is stuck; hands them all back on shutdown (see the module doc)."""

    def __init__(self, settings: Settings, client: redis.Redis, elog: EventLog,
                 leases: Leases, heartbeats: Heartbeats, queue: Queue, worker_id: str,
                 held: dict[str, Slot], outage: Outage, *,
                 stuck_now: Callable[[], int],
                 on_restart: Callable[[], object] = lambda: None) -> None:
        self.settings = settings
        self.redis = client
        self.log = elog
        self.leases = leases
        self.heartbeats = heartbeats
        self.queue = queue
        self.worker_id = worker_id
        self.held = held
        self.outage = outage
        #: How many tool calls of this process are stuck now.
        self.stuck_now = stuck_now
        #: Threads whose run was abandoned: their slot was given back already.
        self.abandoned_threads: set[int] = set()
        #: Set once too many tool calls are stuck (``DURABLE_MAX_STUCK_CALLS``); then
        #: ``on_restart`` is called (the worker process: shut down, then start afresh).
        self.restart_requested = threading.Event()
        self.on_restart = on_restart

    def check_overruns(self, now: float | None = None) -> list[str]:
        """Abandon every run whose agent code has run longer than
        ``DURABLE_DECIDE_TIMEOUT_MS``. Returns their ids."""
        limit = self.settings.worker.decide_timeout_ms / 1000
        now = time.monotonic() if now is None else now
        overran = []
        for run_id, slot in list(self.held.items()):
            since = slot.user_code_since
            if since and now - since > limit and not slot.abandoned:
                self.abandon(run_id, slot, f"{slot.user_code} did not return within "
                                           f"{self.settings.worker.decide_timeout_ms} ms")
                overran.append(run_id)
        return overran

    def abandon(self, run_id: str, slot: Slot, reason: str) -> None:
        """Stop holding a run whose agent code is wedged: quarantine it with ``reason``, let
        go of its lease, give its slot back, and interrupt its thread (``Abandoned``). A
        write the thread still attempts is refused (version and fencing)."""
        log.error("run %s: %s; quarantined, its slot goes on with other runs", run_id, reason)
        self._let_go(run_id, slot, reason, "user_code_overruns")
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(slot.thread_id),
                                                   ctypes.py_object(Abandoned))

    def stuck_call(self, thread_id: int) -> None:
        """A tool call on ``thread_id`` did not stop when interrupted: give its run up --
        lease released, run ready again -- so another thread continues it from the log and
        resolves the call with ``lookup`` once its deadline has passed. The stuck thread is
        abandoned with its slot given back; if it ever returns, nothing of its call is
        written (``CallAbandoned``)."""
        for run_id, slot in list(self.held.items()):
            if slot.thread_id == thread_id and slot.in_call and not slot.abandoned:
                log.error("run %s: its tool call did not stop when interrupted; the run is "
                          "handed back and its slot goes on with other runs", run_id)
                self._let_go(run_id, slot, None, "stuck_calls")
        stuck = self.stuck_now()
        if stuck >= self.settings.worker.max_stuck_calls and not self.restart_requested.is_set():
            # Each stuck call keeps its thread (and what its tool holds) until it returns,
            # which may be never: past the bound, the process is renewed.
            log.error("%d tool calls are stuck in this process (DURABLE_MAX_STUCK_CALLS=%d): "
                      "it hands its runs back and restarts", stuck,
                      self.settings.worker.max_stuck_calls)
            self.restart_requested.set()
            self.on_restart()

    def _let_go(self, run_id: str, slot: Slot, quarantine: str | None, stat: str) -> None:
        """Abandon ``slot``'s thread: quarantine the run with the reason given, or make it
        ready again; release its lease; give the slot back."""
        slot.abandoned = True
        self.abandoned_threads.add(slot.thread_id)
        self.held.pop(run_id, None)
        if slot.lease is not None:
            self.heartbeats.drop(slot.lease)
        try:
            moved_on = False
            if quarantine is not None:
                moved_on = not self.log.quarantine(run_id, quarantine, self.worker_id)
            if slot.lease is not None:
                self.leases.release(slot.lease)
            if quarantine is None or moved_on:  # let another attempt continue it
                make_ready(self.redis, self.log.keys, self.queue, run_id, force=True,
                           route=slot.route)
            self.redis.hincrby(keys.STATS, stat, 1)
        except redis.RedisError as exc:  # the lease expires; the reconciler takes it from there
            self.outage.failed(exc)
        finally:
            slot.callbacks.on_abandon()

    def hand_back(self) -> list[str]:
        """Let go of every held run at once (shutdown): stop renewing, signal the run's token,
        release the lease and make the run ready again. A write the run's thread still
        attempts is refused by fencing; an effect in flight is found ``dispatched`` by the
        next worker, which asks ``lookup`` once its deadline has passed."""
        handed = []
        for run_id, slot in list(self.held.items()):
            if slot.lease is None:
                continue
            self.heartbeats.drop(slot.lease)
            slot.token.cancel("lease lost")
            if self.leases.release(slot.lease):
                make_ready(self.redis, self.log.keys, self.queue, run_id, force=True,
                           route=slot.route)
                handed.append(run_id)
        return handed
