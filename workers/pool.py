"""Many runs at once in one worker process: a bounded pool of run slots.

This module drives each held run on a thread of its own (``DURABLE_DRIVER=threads``, and
always on a Redis Cluster or with ``DURABLE_MIN_REPLICAS``); the default driver is the hub
(``workers.hub``, a subclass that keeps the slots, the ``drain`` and the shutdown here and
drives every run from one thread at a time).

Model: one thread per held run, at most ``DURABLE_CONCURRENCY`` of them. Why threads and
not an asyncio loop: agent code and tools are ordinary, mostly blocking Python (HTTP
clients, SDKs, database drivers); on a thread each run may block as long as its deadline
allows without stalling the others, a tool runs on its run's thread with a deadline and an
interrupt enforced by one watcher (``workers.calls``), and an agent written as a plain
function that calls ``ctx.call(...)`` maps to one thread per run, with no colouring of
user code. The price is memory per held run (a thread stack's touched pages) and CPU for
thread switches; the benchmarks report both at 1,000 held runs.

How work arrives: producers push run ids on the ready list ``dx:ready:<queue>`` and put a
``drain`` command on RQ when none is pending. A ``drain`` fills this worker's free slots
from the ready list and returns at once (RQ's own job costs are paid per batch). A slot
whose run lets go takes the next ready run itself, so a busy worker keeps its slots full
without a command per run; a run that used its turn (``DURABLE_STEPS_PER_JOB``) goes to the
back of the ready list, so one run cannot starve the others.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import queue
import threading
import time
from collections.abc import Callable

import redis

from durable import fairness
from durable.agents import Registry
from durable.fairness import take_command
from durable.log import keys
from durable.outages import Backoff
from durable.queue import enqueue_advance, enqueue_many, ensure_drain
from workers.calls import CallAbandoned
from workers.loop import StepLoop
from workers.turns import SLOT, Abandoned

log = logging.getLogger("durable.worker")


def routes(registry: Registry) -> list[str]:
    """The routes a worker with ``registry``'s agents serves: each agent's name (its runs)
    and ``name@version`` for its version and those it declares compatible (runs handed
    over by a worker of another version)."""
    found = []
    for name, agent in sorted(registry.agents.items()):
        found += [name, *(f"{name}@{v}" for v in (agent.version, *agent.compatible_versions))]
    return found


class RunPool:
    #: How runs are driven, for the worker's start line.
    model = "run threads"

    def __init__(self, loop: StepLoop, size: int) -> None:
        self.loop = loop
        self.size = size
        self.redis = loop.redis
        self.queue = loop.queue
        #: The ready lists this worker takes runs from: one per agent it has (routing: only
        #: workers that have an agent take its runs), and the shared list (runs made ready
        #: before routing), taken from in turn.
        self.ready_keys = [keys.ready(loop.queue.name, route)
                           for route in routes(loop.registry)] + [keys.ready(loop.queue.name)]
        self._turn = 0
        #: The queue's server: the ready list and the drain marker live there.
        self.queues = loop.queue.connection
        fairness.load(self.queues)  # the take of ready runs (``durable.fairness``)
        #: The slots' pops of the next ready run go with the step writes of the other run
        #: threads when the ready list is on the log's server (one round trip for many).
        self._batcher = loop.leases.batcher if self.queues is self.redis else None
        self._free = threading.Semaphore(size)
        self._busy = 0
        self._idle = threading.Condition()
        #: False once shutdown began: no new runs are taken.
        self.accepting = True
        #: Runs dropped because a Redis call failed: taken again once Redis answers.
        self._dropped: set[str] = set()
        self._dropped_lock = threading.Lock()
        self._has_dropped = threading.Event()
        #: Runs a slot of this pool drives now -> whether that slot still drives it (see
        #: ``claim``).
        self._driving: dict[str, Callable[[], bool]] = {}
        self._driving_lock = threading.Lock()
        self._open()
        threading.Thread(target=self._rejoin, name="rejoin", daemon=True).start()

    def _open(self) -> None:
        """Start the slot threads."""
        loop = self.loop
        loop.on_abandon = self._replace
        loop.before_last_commit = self._pop_with_last_commit
        #: Runs handed to the slot threads. The threads are started here, once: starting
        #: hundreds of threads when a burst of runs arrives cost each run its share of the
        #: thread starts before its first step (about a millisecond each, in turn).
        self._inbox: queue.SimpleQueue[str] = queue.SimpleQueue()
        #: ``on`` in the slot threads (the only ones that pop runs for themselves).
        self._in_slot = threading.local()
        for _ in range(self.size):
            self._spawn()

    def _spawn(self) -> None:
        threading.Thread(target=self._serve, name="run-slot", daemon=True).start()

    def _serve(self) -> None:
        """A slot thread: drive the runs it is handed, until it is abandoned."""
        self._in_slot.on = True
        while self._slot(self._inbox.get()):
            pass

    def _replace(self) -> None:
        """The watchdog abandoned a slot's thread: its slot is free, and a new thread serves
        it."""
        self.give_back()
        self._spawn()

    @property
    def busy(self) -> int:
        """Slots driving a run now."""
        return self._busy

    # Taking runs ---------------------------------------------------------------------------

    def drain(self, queue_name: str) -> dict[str, object]:
        """The ``drain`` command: fill the free slots from the ready list."""
        if queue_name != self.queue.name:
            self.redis.hincrby(keys.STATS, "malformed_commands", 1)
            log.error("refused a drain of queue %r: this worker serves %r", queue_name,
                      self.queue.name)
            return {"refused": "wrong queue"}
        self.queues.delete(keys.drain_pending(queue_name))
        taken = self.fill()
        if taken and self.any_ready():
            ensure_drain(self.queue)  # more are ready: idle workers join in
        return {"taken": taken, "busy": self._busy}

    def fill(self) -> int:
        """Start ready runs while a slot is free; returns how many were started. The ready
        runs are taken in one ``LPOP key count`` for all the free slots."""
        taken = 0
        while self.accepting:
            free = 0
            while self._free.acquire(blocking=False):
                free += 1
            if not free:
                break
            try:
                run_ids = self._pop_many(free)
            except BaseException:
                for _ in range(free):
                    self._free.release()
                raise
            for _ in range(free - len(run_ids)):
                self._free.release()
            with self._idle:
                self._busy += len(run_ids)
            for run_id in run_ids:
                self._hand(run_id)
            taken += len(run_ids)
            if len(run_ids) < free:
                break
        return taken

    def _hand(self, run_id: str) -> None:
        """Drive ``run_id`` in a slot taken for it."""
        self._inbox.put(run_id)

    def _pop(self) -> str | None:
        popped = self._pop_many(1)
        return popped[0] if popped else None

    def _pop_with_last_commit(self) -> None:
        """A run's last commit is about to go: its slot's pop of the next ready run goes in
        the same batch (one wait for both, instead of a round trip after it)."""
        if self._batcher is not None and self.accepting and \
                getattr(self._in_slot, "on", False):  # not RQ's thread: it pops nothing
            self._batcher.ride_along(*take_command(self.next_ready_key()))

    def _next(self) -> str | None:
        """The run this slot drives next: the one popped with its last commit, else one
        popped now (None: none is ready)."""
        answered, run_id = self._ridden_run()
        return run_id if answered else self._pop()

    def _return_ridden(self) -> None:
        """An abandoned thread or a stopping pool: a run popped with its last commit and
        not driven goes back on the ready list."""
        _, run_id = self._ridden_run()
        if run_id is not None:
            with contextlib.suppress(redis.RedisError):
                enqueue_advance(self.redis, self.queue, run_id, force=True)

    def _ridden_run(self) -> tuple[bool, str | None]:
        """(whether a pop rode with this thread's last commit and was answered, the run it
        popped: None when the list was empty then)."""
        sent = self._batcher.ridden() if self._batcher is not None else None
        if sent is None or sent.error is not None:
            return False, None
        return True, None if sent.reply is None else _run_id(sent.reply)

    def next_ready_key(self) -> str:
        """The ready list to take from next (each in turn)."""
        self._turn = (self._turn + 1) % len(self.ready_keys)
        return self.ready_keys[self._turn]

    def any_ready(self) -> bool:
        """Whether a run waits on any of this worker's ready lists (one round trip)."""
        pipe = self.queues.pipeline(transaction=False)
        for name in self.ready_keys:
            fairness.depth(pipe, name)
        return any(int(n) for n in pipe.execute())

    def _pop_many(self, count: int) -> list[str]:
        """Up to ``count`` ready runs, from this worker's lists in turn."""
        out: list[str] = []
        for _ in range(len(self.ready_keys)):
            key = self.next_ready_key()
            # (``LPOP key count``, fair by tenant and priority: ``durable.fairness``)
            send = self._batcher.command if self._batcher is not None else \
                self.queues.execute_command
            raw = fairness.take(send, self.queues, key, count - len(out))
            out += [_run_id(x) for x in raw or ()]
            if len(out) >= count:
                break
        return out

    def _slot(self, run_id: str | None) -> bool:
        """One slot: drive ``run_id``, then the next ready run, until none is left. False
        when this thread was abandoned meanwhile.

        A thread whose agent code overran its time (or whose tool call got stuck) was
        abandoned by the watchdog, which gave its slot back already: it ends without giving
        it back twice.
        """
        me = threading.get_ident()
        try:
            while run_id is not None and me not in self.loop.abandoned_threads:
                try:
                    live = self._thread_live(me)
                    if self.claim(run_id, live):
                        try:
                            self.loop.advance(run_id)
                        finally:
                            self.unclaim(run_id, live)
                    self.loop.outage.ok()
                except redis.RedisError as exc:  # taken again once Redis answers
                    self.loop.outage.failed(exc)
                    self.dropped(run_id)
                except Exception:
                    log.exception("run %s: advance failed", run_id)
                    with contextlib.suppress(redis.RedisError):
                        self.redis.hincrby(keys.STATS, "advance_errors", 1)
                run_id = None
                if self.accepting and me not in self.loop.abandoned_threads:
                    with contextlib.suppress(redis.RedisError):
                        run_id = self._next()
        except (Abandoned, CallAbandoned):
            pass
        finally:
            self._return_ridden()
            abandoned = me in self.loop.abandoned_threads
            if abandoned:
                self.loop.abandoned_threads.discard(me)
            else:
                self.give_back()
        return not abandoned

    def give_back(self) -> None:
        """A slot is free again (its run let go, or its thread was abandoned)."""
        self._free.release()
        with self._idle:
            self._busy -= 1
            self._idle.notify_all()

    def poll(self, interval_s: float = 1.0, stop: threading.Event | None = None) -> None:
        """Look at the ready list every ``interval_s`` while a slot is free (a thread).

        ``drain`` commands wake workers at once; this is the safety net when a command went
        to a worker that cannot run it now (paused, or saturated): ready runs never wait for
        more than a second while any worker has a free slot.
        """
        stop = stop or threading.Event()
        while not stop.wait(interval_s):
            if not self.accepting:
                return
            if self._busy >= self.size:
                continue
            try:
                if self.any_ready():
                    self.fill()
            except redis.RedisError as exc:
                self.loop.outage.failed(exc)

    def claim(self, run_id: str, live: Callable[[], bool]) -> bool:
        """Whether a slot may drive ``run_id`` now: False while another slot of this worker
        drives it (``live`` says whether the claiming slot still does: an abandoned one, its
        thread stuck in a call, does not). A run can be handed twice (taken again after a
        Redis fault, and popped from the ready list where the reconciler put it); both
        would take the lease, which is this worker's either way, and the second would only
        lose a version conflict."""
        with self._driving_lock:
            held = self._driving.get(run_id)
            if held is not None and held():
                return False
            self._driving[run_id] = live
            return True

    def unclaim(self, run_id: str, live: Callable[[], bool]) -> None:
        """Drop the claim made with ``live`` (not a newer slot's)."""
        with self._driving_lock:
            if self._driving.get(run_id) is live:
                del self._driving[run_id]

    def _thread_live(self, thread_id: int) -> Callable[[], bool]:
        return lambda: thread_id not in self.loop.abandoned_threads

    # Redis faults ---------------------------------------------------------------------------

    def dropped(self, run_id: str) -> None:
        """``run_id`` stopped because a Redis call failed (its slot is given back): this
        worker takes it again once Redis answers, instead of leaving it to the reconciler
        after its lease's TTL. Its lease, if Redis kept it, is still this worker's: taking
        it again keeps the epoch."""
        with self._dropped_lock:
            self._dropped.add(run_id)
        self._has_dropped.set()

    def _rejoin(self) -> None:
        """A thread: once Redis answers again, drive the dropped runs in free slots (the
        rest go on the ready list). Its own backoff paces the attempts: on a cluster a ping
        answers while the master of a dropped run's keys is still down."""
        backoff = Backoff()
        said = 0
        while True:
            self._has_dropped.wait()
            backoff.wait()
            self.loop.outage.wait_until_up(self.redis, backoff=backoff)
            with self._dropped_lock:
                runs, self._dropped = sorted(self._dropped), set()
                self._has_dropped.clear()
            if runs and said != self.loop.outage.count:  # once per outage, not per try
                said = self.loop.outage.count
                log.info("Redis answers: taking %d dropped runs again", len(runs))
            left = [run_id for run_id in runs if not self._take_again(run_id)]
            try:
                if left:
                    enqueue_many(self.redis, self.queue, left, force=True)
            except redis.RedisError as exc:
                self.loop.outage.failed(exc)
                for run_id in left:
                    self.dropped(run_id)
            if not self.loop.outage.down:
                backoff.reset()

    def _take_again(self, run_id: str) -> bool:
        """Drive ``run_id`` in a free slot; False when none is free (or shutting down)."""
        if not self.accepting or not self._free.acquire(blocking=False):
            return False
        with self._idle:
            self._busy += 1
        self._hand(run_id)
        return True

    # Ending -------------------------------------------------------------------------------

    def wait_idle(self, timeout: float | None = None,
                  stop: threading.Event | None = None) -> bool:
        """Until no slot drives a run (True), ``timeout`` passes or ``stop`` is set (False)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._busy:
                if stop is not None and stop.is_set():
                    return False
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(0.1 if left is None else min(left, 0.1))
        return True

    def finish(self) -> None:
        """Burst mode: drive until the ready list is empty and no slot is busy."""
        while True:
            self.fill()
            self.wait_idle()
            if not self.any_ready():
                return

    def shutdown(self, grace_s: float, force: threading.Event | None = None) -> list[str]:
        """Take no new runs; every held run lets go at its next step boundary, so in-flight
        calls finish and their outcomes are recorded, within ``grace_s``; hand the runs
        still held after it back at once (leases released, runs made ready again) so another worker
        continues without waiting for a lease to expire. Returns the runs handed back."""
        self.accepting = False
        self.loop.stopping.set()
        if self.wait_idle(grace_s, force):
            return []
        return self.loop.hand_back()


def slot_live(ctx: contextvars.Context) -> Callable[[], bool]:
    """For ``RunPool.claim``: whether the run driven in ``ctx`` is still driven (its slot,
    once taken, was not abandoned)."""
    return lambda: not getattr(ctx.get(SLOT), "abandoned", False)


def _run_id(raw: object) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)
