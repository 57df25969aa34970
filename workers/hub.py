"""Many runs at once from one driving thread: a worker's hub.

Each held run is a coroutine of the step protocol (``StepLoop.advance_async``). It
suspends at every Redis call (``await`` on a batched script call) and at every call of
user code (``await`` on an ``Offload``: a ``decide()``, a tool call, a wait on a deadline).
One thread at a time *drives*: it resumes every run that can go on until each suspends
again, sends their Redis calls in pipelines on its own connection (the next batch is built
while Redis works on the last), and resumes each run when its reply is read.

Why not one thread per run (``workers.pool``): a run thread sleeps at every Redis call and
is woken when its reply is in, and under the GIL each of those hand-offs costs two thread
switches: about 40 % of a worker's CPU per step on the CPU-bound bench. Here a step costs
no thread switch while its user code is quick.

User code runs outside the coroutine, so it can run on any thread, and a slow call never
stalls the other runs. The hub works like Go's scheduler when a goroutine blocks in a
system call (``workers.spares``): quick user code is called inline on the driving thread;
once a call runs for ``HANDOFF_S`` a spare thread becomes the driver and goes on with every
other run; code known to be slow, and every wait on a deadline or a lookup, goes to a spare
thread at once. User code the event loop runs (an ``async def`` agent or tool), and a plain
code agent's function on its own thread, is awaited without any thread of the hub waiting
on it: the run comes back when it is done (``workers.aio``). A log's fold (``FOLD``) is step
code: always inline. The step protocol makes no Redis call in place (``workers.redis_io``):
every one is a call of the next batch, or library code on a spare thread.

The driving thread alone runs step code, so the threads that return from slow calls never
contend with it for the GIL beyond handing a result back. A coroutine is not tied to a
thread (unlike a greenlet); each run's coroutine runs in a ``contextvars.Context`` of its
own, as an asyncio task does, and so does its user code. Everything else is as on the run
threads: a run's lease, fencing epoch, cancel token and deadline; the watchdog that
abandons agent code past ``DURABLE_DECIDE_TIMEOUT_MS`` (it raises in the thread that runs
the code); stuck tool calls; shutdown and hand-back.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import logging
import queue
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import redis

from durable.flow import fairness
from durable.flow.fairness import take_command
from durable.log import keys
from durable.log.batching import RedisCall
from durable.log.inflight import Stream

from .aio import Awaiting
from .calls import CallAbandoned
from .loop import StepLoop
from .slots import Slots, run_id_of, slot_live
from .spares import HubThread, Spares
from .turns import BLOCKING, FOLD, SLOT, Abandoned, DriverCallbacks, Offload

log = logging.getLogger("durable.worker")

#: Calls in a batch, per server it goes to (a cluster's masters), before it is sent while
#: more runs are resumed (Redis works on it meanwhile); the rest go when no run is left to
#: resume.
FLUSH_EVERY = 16

#: Batches out at most before a new run is started (runs already going are not held).
MAX_INFLIGHT = 4

#: Runs taken from the ready lists and not started yet, at most (``_pop_ready``).
TAKE_AHEAD = 256


@dataclass(eq=False)
class _Task:
    """One held run: its coroutine and the context it runs in."""

    run_id: str
    coro: Coroutine[RedisCall | Offload, None, Any]
    ctx: contextvars.Context = field(default_factory=contextvars.copy_context)
    started: bool = False


#: Who takes a batched call's answer: the run whose coroutine awaits it (resumed then), or
#: the hub itself (called with the answered call: a pop of the ready lists, a statistic).
_Reader: TypeAlias = "_Task | Callable[[RedisCall], None]"


class RunHub:
    """Drives up to ``size`` held runs from one thread at a time (see the module doc)."""

    model = "hub"

    def __init__(self, loop: StepLoop, size: int) -> None:
        batcher = loop.leases.batcher
        if batcher is None:
            raise ValueError("the hub needs batched script calls: a step loop whose "
                             "settings name the hub (DURABLE_DRIVER=hub)")
        self.loop = loop
        #: From other threads: new runs, and runs whose user code returned off the driving
        #: thread (its result is on the ``Offload`` they wait on).
        self._incoming: queue.SimpleQueue[_Task] = queue.SimpleQueue()
        #: The worker's run slots: ``drain``, ``fill``, ``poll``, ``shutdown`` and the rest.
        self.slots = Slots(loop, size, hand=self._hand, on_popped=self._popped_by_fill,
                           room=self._room)
        self._callbacks = DriverCallbacks(on_abandon=self.slots.give_back, resumes_later=True)
        self._sender = batcher
        #: The ready list is popped in the hub's own batches when it is on the log's server.
        self._pops_in_batch = self.slots.queues is loop.redis
        #: Whether the ready list may hold runs (a pop came back full, or runs were taken
        #: from it by a ``drain``): not before the worker serves its first command.
        self._more_ready = False
        #: Pops in a row that found fewer runs than asked (each list is asked in turn).
        self._short = 0
        #: Runs to resume now, and the calls of the runs waiting for the next batch.
        self._ready: collections.deque[_Task] = collections.deque()
        #: Runs just taken, not started yet: started while few batches are out, so that
        #: a burst of new runs does not delay the runs already going (each reply is read
        #: in the order sent).
        self._fresh: collections.deque[_Task] = collections.deque()
        self._batch: list[tuple[_Reader, RedisCall]] = []
        #: Batches sent and not read yet, oldest first, on the hub's own connections (one
        #: per server: a cluster's masters).
        self._inflight: collections.deque[list[tuple[_Reader, RedisCall]]] = \
            collections.deque()
        self._stream = Stream(batcher)
        self._flush_at = FLUSH_EVERY * self._stream.servers
        #: The driver, the spares, and the threads left in slow user code.
        self.spares = Spares(self._drive, self._incoming.put, lambda: self.slots.busy,
                             loop.settings.worker.user_threads)
        self.spares.start(size)

    @property
    def threads(self) -> int:
        """Threads the hub started (the driver, spares, and those in slow user code)."""
        return self.spares.threads

    @property
    def handoffs(self) -> int:
        """Times the driving moved to another thread (the first driver's start included)."""
        return self.spares.handoffs

    @property
    def offloads(self) -> int:
        """Calls of user code sent to a spare thread as they started (known to be slow)."""
        return self.spares.offloads

    # Taking runs ---------------------------------------------------------------------------

    def _hand(self, run_id: str) -> None:
        self._incoming.put(self._task(run_id))

    def _room(self) -> int:
        """How many more runs to take now: ``TAKE_AHEAD`` less those waiting to be started
        (``_fresh``) or taken in (``_incoming``: runs handed to the hub, and runs coming
        back from user code, a busy hub's share). At least 0."""
        return max(0, TAKE_AHEAD - len(self._fresh) - self._incoming.qsize())

    def _popped_by_fill(self, asked: int, got: int) -> None:
        """``fill``'s pop (a ``drain``, the poll): whether more may be ready is known."""
        self._more_ready = got >= asked
        self._short = 0

    def _task(self, run_id: str) -> _Task:  # the claim looks at the task's own context
        return _Task(run_id, self._drive_run(run_id, ctx := contextvars.copy_context()), ctx)

    async def _drive_run(self, run_id: str, ctx: contextvars.Context) -> None:
        live = slot_live(ctx)
        # While another of the hub's runs drives it, it is driven again by that one
        # (``Slots.claim``); this one, handed again meanwhile, drives it once more.
        while self.slots.claim(run_id, live):
            try:
                answer = await self.loop.advance_async(run_id, self._callbacks)
            finally:
                again = self.slots.unclaim(run_id, live)
            self.loop.outage.ok()
            if answer.get("more"):
                self._more_ready, self._short = True, 0  # it went back on the ready list
            if not again:
                return

    # Driving ---------------------------------------------------------------------------

    def _drive(self, me: HubThread) -> None:
        """Drive until another thread drives (this one was left in slow user code)."""
        while True:
            self._intake()
            while self._ready or (self._fresh and len(self._inflight) < MAX_INFLIGHT):
                task = self._ready.popleft() if self._ready else self._fresh.popleft()
                task.started = True
                item = self._resume(task)
                while isinstance(item, Offload):
                    if isinstance(item, Awaiting):  # on the event loop: called back
                        item.begin(functools.partial(self._incoming.put, task))
                        item = None
                        break
                    if item.what == BLOCKING or (item.what != FOLD and
                                                self.spares.slow(item.what)):
                        self.spares.elsewhere(task, item)
                        item = None
                        break
                    self.spares.inline(me, task, item)
                    if not self.spares.drives(me):  # it ran long: the new driver takes
                        self._incoming.put(task)  # the run back
                        return
                    item = self._resume(task)
                if item is not None:
                    self._batch.append((task, item))
                    if len(self._batch) >= self._flush_at:
                        self._flush()
            self._pop_ready()
            if self._batch:
                self._flush()
            if self._inflight:
                self._read_oldest()
            elif not self._ready and not self._fresh:
                try:
                    task = self._incoming.get(timeout=1.0)
                except queue.Empty:
                    continue
                self._take(task)

    def _intake(self) -> None:
        while True:
            try:
                task = self._incoming.get_nowait()
            except queue.Empty:
                return
            self._take(task)

    def _take(self, task: _Task) -> None:
        (self._ready if task.started else self._fresh).append(task)

    def _resume(self, task: _Task) -> RedisCall | Offload | None:
        """Run ``task``'s step code until it waits on a Redis call or on user code
        (returned), or ends (None)."""
        try:
            item: RedisCall | Offload = task.ctx.run(task.coro.send, None)
            return item
        except StopIteration:
            self._ended(task)
        except (Abandoned, CallAbandoned):  # its slot was given back by the watchdog
            self._ended(task)
        except redis.RedisError as exc:  # taken again once Redis answers (``_rejoin``)
            self.loop.outage.failed(exc)
            self._ended(task)
            self.slots.dropped(task.run_id)
        except Exception:
            log.exception("run %s: advance failed", task.run_id)
            self._ended(task)
            # Counted in the next batch: a call sent here would hold up every other run.
            self._batch.append((self._counted, RedisCall(
                None, ("HINCRBY", keys.STATS, "advance_errors", 1))))
        return None

    def _counted(self, call: RedisCall) -> None:
        """A statistic's answer: only a failure (an outage) matters."""
        if call.error is not None:
            self.loop.outage.failed(call.error)

    def _ended(self, task: _Task) -> None:
        slot = task.ctx.get(SLOT)
        if slot is not None and slot.abandoned:  # given back already
            self.loop.abandoned_threads.discard(slot.thread_id)
            return
        self.slots.give_back()

    def _pop_ready(self) -> None:
        """Free slots take ready runs: one ``LPOP key count`` in the batch about to go (on
        the queue's own server when it has one: a round trip, while runs may be ready).

        No more than ``TAKE_AHEAD`` runs wait here to be started: a backlog is shared by
        the workers at the pace each starts runs, instead of going whole to the first that
        asks (5,000 ready runs went to one of two workers of 5,000 slots, which then did
        all the work on one core while the other sat idle)."""
        slots = self.slots
        if not (self._more_ready and slots.accepting) or slots.paused:
            return
        room = self._room()
        if room <= 0:
            return
        if not self._pops_in_batch:
            if slots.busy < slots.size:
                try:
                    slots.fill(room)
                except redis.RedisError as exc:
                    self._more_ready = False
                    self.loop.outage.failed(exc)
            return
        free = slots.take_free(room)
        if free:
            self._batch.append((self._popped, RedisCall(None, take_command(
                slots.next_ready_key(), free))))

    # Batches: sent as soon as they are full, read when nothing else is ready ------------

    def _flush(self) -> None:
        """Send the batch gathered so far without waiting for its replies: the runs after
        it are resumed while Redis runs its calls."""
        batch, self._batch = self._batch, []
        calls = [call for _, call in batch]
        try:
            self._stream.send(calls)
        except Exception:
            self._inflight.append(batch)
            self._recover()
            return
        self._inflight.append(batch)

    def _read_oldest(self) -> None:
        """Read the replies of the oldest batch sent and make its runs ready."""
        try:
            self._stream.read_oldest()  # may send NOSCRIPT refusals, redirections again
        except Exception:
            self._recover()
            return
        self._answered(self._inflight.popleft())

    def _recover(self) -> None:
        """The hub's connection failed with batches out: whether their calls ran is not
        known. Each batch is sent again as the batcher sends one (retried as redis-py
        retries a pipeline, then the error is each call's answer), exactly as a batch whose
        connection failed is retried on the run threads: an append sent twice is refused
        by its version check the second time, and its run reloads. Calls answered already
        (their server's part was read) are not sent again."""
        self._stream.close()
        while self._inflight:
            batch = self._inflight.popleft()
            self._sender.send_now([call for _, call in batch])
            self._answered(batch)

    def _answered(self, batch: list[tuple[_Reader, RedisCall]]) -> None:
        for reader, call in batch:
            if isinstance(reader, _Task):
                self._ready.append(reader)
            else:
                reader(call)

    def _popped(self, call: RedisCall) -> None:
        asked = fairness.asked(call.command)
        run_ids = [] if call.error is not None or call.reply is None else \
            [run_id_of(x) for x in call.reply]
        if isinstance(call.error, redis.exceptions.NoScriptError):  # the server restarted
            try:
                fairness.load(self.slots.queues)
            except redis.RedisError as exc:
                self.loop.outage.failed(exc)
        elif call.error is not None:
            self.loop.outage.failed(call.error)
        if len(run_ids) < asked:
            # This list had no more; the others are asked in turn, until each was short.
            self._short += 1
            if self._short >= len(self.slots.ready_keys):
                self._more_ready = False
        else:
            self._short = 0
        self.slots.give_back(asked - len(run_ids))
        if run_ids:
            if not self.slots.accepting:  # shutdown began while the pop was out: put them back
                for run_id in run_ids:
                    self._incoming.put(self._task(run_id))
                return
            for run_id in run_ids:
                self._fresh.append(self._task(run_id))
