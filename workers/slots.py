"""The run slots of a worker, shared by its two drivers (``workers.pool``'s run threads
and ``workers.hub``): how many are free, the ready lists they fill from, which runs a slot
drives now, the runs dropped by a Redis fault, and the shutdown.

How work arrives: producers push run ids on the ready list ``dx:ready:<queue>`` and put a
``drain`` command on RQ when none is pending. A ``drain`` fills this worker's free slots
from the ready list and returns at once (RQ's own job costs are paid per batch). A slot
whose run lets go takes the next ready run itself, so a busy worker keeps its slots full
without a command per run; a run that used its turn (``DURABLE_STEPS_PER_JOB``) goes to the
back of the ready list, so one run cannot starve the others. While another region owns the
runs (``workers.regions``: ``paused``), nothing is popped.

A driver holds one ``Slots``, built with how it drives a run it is handed (``hand``) and,
optionally, what it learns from each pop (``on_popped``: asked, got).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

import redis

from durable.agents import Registry
from durable.backend.outages import Backoff
from durable.flow import fairness
from durable.log import keys
from durable.queue import enqueue_many, ensure_drain

from .loop import StepLoop
from .turns import SLOT

log = logging.getLogger("durable.worker")


def routes(registry: Registry) -> list[str]:
    """The routes a worker with ``registry``'s agents serves: each agent's name (its runs)
    and ``name@version`` for its version and those it declares compatible (runs handed
    over by a worker of another version)."""
    found = []
    for name, agent in sorted(registry.agents.items()):
        found += [name, *(f"{name}@{v}" for v in (agent.version, *agent.compatible_versions))]
    return found


class Driver(Protocol):
    """A worker's driver (``RunPool``, ``RunHub``): how it drives runs, for the start line,
    and the slots it holds (what the worker process asks of it: ``drain``, ``poll``,
    ``finish``, ``shutdown``)."""

    model: str
    slots: Slots


def _nothing(asked: int, got: int) -> None:
    return None


class Slots:
    """Up to ``size`` runs driven at once (see the module doc)."""

    def __init__(self, loop: StepLoop, size: int, *, hand: Callable[[str], None],
                 on_popped: Callable[[int, int], None] = _nothing,
                 room: Callable[[], int | None] = lambda: None) -> None:
        self.loop = loop
        self.size = size
        #: How many more runs the driver takes now (None: as many as slots are free).
        self.room = room
        self.redis = loop.redis
        self.queue = loop.queue
        #: Drives a run in a slot taken for it.
        self.hand = hand
        self.on_popped = on_popped
        #: The ready lists this worker takes runs from: one per agent it has (routing: only
        #: workers that have an agent take its runs), and the shared list (runs made ready
        #: before routing), taken from in turn.
        self.ready_keys = [keys.ready(loop.queue.name, route)
                           for route in routes(loop.registry)] + [keys.ready(loop.queue.name)]
        self._turn = 0
        #: The queue's server: the ready list and the drain marker live there.
        self.queues = loop.queue.connection
        try:  # the take of ready runs (``durable.flow.fairness``)
            fairness.load(self.queues)
        except redis.RedisError as exc:  # Redis went away as the worker started: the take
            loop.outage.failed(exc)      # loads it again when it finds it missing
        #: Pops of the next ready run go with the other Redis calls of the run threads when
        #: the ready list is on the log's server (one round trip for many).
        self.batcher = loop.leases.batcher if self.queues is self.redis else None
        #: Slots free, and slots driving a run (or taken for a pop on its way), both under
        #: ``_idle``: taking or giving back many at once is one lock, not one per slot.
        self._free = size
        self._busy = 0
        self._idle = threading.Condition()
        #: False once shutdown began: no new runs are taken.
        self.accepting = True
        #: Runs dropped because a Redis call failed: taken again once Redis answers.
        self._dropped: set[str] = set()
        self._dropped_lock = threading.Lock()
        self._has_dropped = threading.Event()
        #: Runs a slot of this worker drives now -> whether that slot still drives it (see
        #: ``claim``).
        self._driving: dict[str, Callable[[], bool]] = {}
        #: Runs handed to this worker again while one of its slots drove them (``claim``).
        self._asked_again: set[str] = set()
        self._driving_lock = threading.Lock()
        threading.Thread(target=self._rejoin, name="rejoin", daemon=True).start()

    @property
    def busy(self) -> int:
        """Slots driving a run now."""
        return self._busy

    @property
    def paused(self) -> bool:
        """Another region owns runs this worker was fenced from: it pops none
        (``workers.regions.RegionGate``; an attribute read, no Redis call)."""
        return self.loop.regions.paused


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

    def fill(self, limit: int | None = None) -> int:
        """Start ready runs while a slot is free (at most ``limit``); returns how many were
        started. The ready runs are taken in one ``LPOP key count`` for the free slots.
        Without ``limit``, the driver's ``room`` bounds it."""
        if limit is None:
            limit = self.room()
        taken = 0
        while self.accepting:
            free = self._take(None if limit is None else limit - taken)
            if not free:
                break
            try:
                run_ids = self.pop_many(free)
            except BaseException:
                with self._idle:
                    self._free += free
                raise
            with self._idle:
                self._free += free - len(run_ids)
                self._busy += len(run_ids)
            for run_id in run_ids:
                self.hand(run_id)
            taken += len(run_ids)
            if len(run_ids) < free:
                break
        return taken


    def pop(self) -> str | None:
        """One ready run, or None."""
        popped = self.pop_many(1)
        return popped[0] if popped else None


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

    def pop_many(self, count: int) -> list[str]:
        """Up to ``count`` ready runs, from this worker's lists in turn (none while
        ``paused``: ``fill``, ``drain``, ``poll`` and a slot's next run all pop here)."""
        out: list[str] = []
        if self.paused:
            return out
        for _ in range(len(self.ready_keys)):
            key = self.next_ready_key()
            # (``LPOP key count``, fair by tenant and priority: ``durable.flow.fairness``)
            send = self.batcher.command if self.batcher is not None else \
                self.queues.execute_command
            raw = fairness.take(send, self.queues, key, count - len(out))
            out += [run_id_of(x) for x in raw or ()]
            if len(out) >= count:
                break
        self.on_popped(count, len(out))
        return out


    def give_back(self, n: int = 1) -> None:
        """``n`` slots are free again (their runs let go, their threads were abandoned, or
        a pop found fewer runs than slots taken for it)."""
        if n <= 0:
            return
        with self._idle:
            self._free += n
            self._busy -= n
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
            if self._busy >= self.size or self.paused:
                continue
            try:
                if self.any_ready():
                    self.fill()
            except redis.RedisError as exc:
                self.loop.outage.failed(exc)

    def claim(self, run_id: str, live: Callable[[], bool]) -> bool:
        """Whether a slot may drive ``run_id`` now: False while another slot of this worker
        drives it (``live`` says whether the claiming slot still does: an abandoned one, its
        thread stuck in a call, does not). A run can be handed twice: popped from the ready
        list where its own slot put it back at a job boundary (``DURABLE_STEPS_PER_JOB``)
        before that slot let go of it, taken again after a Redis fault, or put there by the
        reconciler. The hand-off refused here is not lost: the slot that drives the run is
        told so when it lets go (``unclaim``), and drives it once more. (Dropped, it was
        lost for good: its enqueue set the run's "queued" marker, which keeps every other
        enqueue out until a lease taken with it drops it.)"""
        with self._driving_lock:
            held = self._driving.get(run_id)
            if held is not None and held():
                self._asked_again.add(run_id)
                return False
            self._driving[run_id] = live
            self._asked_again.discard(run_id)  # this slot takes what was asked
            return True

    def unclaim(self, run_id: str, live: Callable[[], bool]) -> bool:
        """Drop the claim made with ``live`` (not a newer slot's); True when the run was
        handed to this worker again meanwhile (``claim``): drive it once more."""
        with self._driving_lock:
            if self._driving.get(run_id) is not live:
                return False
            del self._driving[run_id]
            if run_id in self._asked_again:
                self._asked_again.discard(run_id)
                return True
            return False


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
            left = [run_id for run_id in runs if not self.take_again(run_id)]
            try:
                if left:
                    enqueue_many(self.redis, self.loop.log.keys, self.queue, left, force=True)
            except redis.RedisError as exc:
                self.loop.outage.failed(exc)
                for run_id in left:
                    self.dropped(run_id)
            if not self.loop.outage.down:
                backoff.reset()

    def take_again(self, run_id: str) -> bool:
        """Drive ``run_id`` in a free slot; False when none is free (or shutting down)."""
        if not self.accepting:
            return False
        with self._idle:
            if not self._free:
                return False
            self._free -= 1
            self._busy += 1
        self.hand(run_id)
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

    def take_free(self, limit: int | None = None) -> int:
        """Take the free slots (at most ``limit``) for runs about to be popped; returns how
        many (each is given back unless a run is handed to it)."""
        return self._take(limit, busy=True)  # a burst worker must not end while it pops

    def _take(self, limit: int | None, busy: bool = False) -> int:
        """Take up to ``limit`` free slots (all of them when None), counted busy from now
        when ``busy``; returns how many."""
        with self._idle:
            free = self._free if limit is None else max(0, min(limit, self._free))
            self._free -= free
            if busy:
                self._busy += free
        return free


def slot_live(ctx: contextvars.Context) -> Callable[[], bool]:
    """For ``Slots.claim``: whether the run driven in ``ctx`` is still driven (its slot,
    once taken, was not abandoned)."""
    return lambda: not getattr(ctx.get(SLOT), "abandoned", False)


def run_id_of(raw: object) -> str:
    """A run id as a ready list holds it."""
    return raw.decode() if isinstance(raw, bytes) else str(raw)
