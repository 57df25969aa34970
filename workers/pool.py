"""Many runs at once in one worker process, one thread per held run: the run threads.

This driver runs each held run on a thread of its own (``DURABLE_DRIVER=threads``, and
always on a Redis Cluster or with ``DURABLE_MIN_REPLICAS``); the default driver is the hub
(``workers.hub``). Both hold a worker's run slots (``workers.slots``: the ready lists, the
``drain``, the claims, the shutdown) and drive the same step protocol (``workers.loop``).

Model: one thread per held run, at most ``DURABLE_CONCURRENCY`` of them. Why threads and
not an asyncio loop: agent code and tools are ordinary, mostly blocking Python (HTTP
clients, SDKs, database drivers); on a thread each run may block as long as its deadline
allows without stalling the others, a tool runs on its run's thread with a deadline and an
interrupt enforced by one watcher (``workers.calls``), and an agent written as a plain
function that calls ``ctx.call(...)`` maps to one thread per run, with no colouring of
user code. The price is memory per held run (a thread stack's touched pages) and CPU for
thread switches; the benchmarks report both at 1,000 held runs.

A slot thread whose run lets go takes the next ready run itself: its pop goes out with the
run's last commit (one wait for both, ``DriverCallbacks.before_last_commit``).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable

import redis

from durable.flow.fairness import take_command
from durable.log import keys
from durable.queue import make_ready

from .calls import CallAbandoned
from .loop import StepLoop
from .slots import Slots, run_id_of
from .turns import Abandoned, DriverCallbacks

log = logging.getLogger("durable.worker")


class RunPool:
    """Drives up to ``size`` held runs, each on a slot thread of its own."""

    #: How runs are driven, for the worker's start line.
    model = "run threads"

    def __init__(self, loop: StepLoop, size: int) -> None:
        self.loop = loop
        #: Runs handed to the slot threads. The threads are started here, once: starting
        #: hundreds of threads when a burst of runs arrives cost each run its share of the
        #: thread starts before its first step (about a millisecond each, in turn).
        self._inbox: queue.SimpleQueue[str] = queue.SimpleQueue()
        #: The worker's run slots: ``drain``, ``fill``, ``poll``, ``shutdown`` and the rest.
        self.slots = Slots(loop, size, hand=self._hand)
        self._callbacks = DriverCallbacks(on_abandon=self._replace,
                                          before_last_commit=self._pop_with_last_commit)
        #: ``on`` in the slot threads (the only ones that pop runs for themselves).
        self._in_slot = threading.local()
        for _ in range(size):
            self._spawn()

    # The slot threads ------------------------------------------------------------------

    def _hand(self, run_id: str) -> None:
        """Drive ``run_id`` in a slot taken for it (a slot thread takes it)."""
        self._inbox.put(run_id)

    def _spawn(self) -> None:
        threading.Thread(target=self._serve, name="run-slot", daemon=True).start()

    def _serve(self) -> None:
        """A slot thread: drive the runs it is handed, until it is abandoned."""
        self._in_slot.on = True
        while self.slot(self._inbox.get()):
            pass

    def _replace(self) -> None:
        """The watchdog abandoned a slot's thread: its slot is free, and a new thread serves
        it."""
        self.slots.give_back()
        self._spawn()

    def _pop_with_last_commit(self) -> None:
        """A run's last commit is about to go: its slot's pop of the next ready run goes in
        the same batch (one wait for both, instead of a round trip after it)."""
        batcher = self.slots.batcher
        if batcher is not None and self.slots.accepting and not self.slots.paused and \
                getattr(self._in_slot, "on", False):  # not RQ's thread: it pops nothing
            batcher.ride_along(*take_command(self.slots.next_ready_key()))

    def _next(self) -> str | None:
        """The run this slot drives next: the one popped with its last commit, else one
        popped now (None: none is ready)."""
        answered, run_id = self._ridden_run()
        return run_id if answered else self.slots.pop()

    def _return_ridden(self) -> None:
        """An abandoned thread or a stopping pool: a run popped with its last commit and
        not driven goes back on the ready list."""
        _, run_id = self._ridden_run()
        if run_id is not None:
            with contextlib.suppress(redis.RedisError):
                make_ready(self.loop.redis, self.loop.log.keys, self.loop.queue, run_id, force=True)

    def _ridden_run(self) -> tuple[bool, str | None]:
        """(whether a pop rode with this thread's last commit and was answered, the run it
        popped: None when the list was empty then)."""
        batcher = self.slots.batcher
        sent = batcher.ridden() if batcher is not None else None
        if sent is None or sent.error is not None:
            return False, None
        return True, None if sent.reply is None else run_id_of(sent.reply)

    def slot(self, run_id: str | None) -> bool:
        """One slot: drive ``run_id``, then the next ready run, until none is left. False
        when this thread was abandoned meanwhile.

        A thread whose agent code overran its time (or whose tool call got stuck) was
        abandoned by the watchdog, which gave its slot back already: it ends without giving
        it back twice.
        """
        me = threading.get_ident()
        abandoned = self.loop.abandoned_threads
        try:
            while run_id is not None and me not in abandoned:
                try:
                    live = self._thread_live(me)
                    # Driven once more when it was handed again meanwhile (``Slots.claim``).
                    while self.slots.claim(run_id, live):
                        try:
                            self.loop.advance(run_id, self._callbacks)
                        finally:
                            again = self.slots.unclaim(run_id, live)
                        if not again:
                            break
                    self.loop.outage.ok()
                except redis.RedisError as exc:  # taken again once Redis answers
                    self.loop.outage.failed(exc)
                    self.slots.dropped(run_id)
                except Exception:
                    log.exception("run %s: advance failed", run_id)
                    with contextlib.suppress(redis.RedisError):
                        self.loop.redis.hincrby(keys.STATS, "advance_errors", 1)
                run_id = None
                if self.slots.accepting and me not in abandoned:
                    with contextlib.suppress(redis.RedisError):
                        run_id = self._next()
        except (Abandoned, CallAbandoned):
            pass
        finally:
            self._return_ridden()
            was_abandoned = me in abandoned
            if was_abandoned:
                abandoned.discard(me)
            else:
                self.slots.give_back()
        return not was_abandoned

    def _thread_live(self, thread_id: int) -> Callable[[], bool]:
        return lambda: thread_id not in self.loop.abandoned_threads
