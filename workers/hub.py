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
system call:

- User code is called inline on the driving thread while its kind (the agent's
  ``decide()``, a tool by name) has been quick. A monitor thread looks every millisecond;
  once a call has run for ``HANDOFF_S`` it makes a spare thread the driver, which goes on
  with every other run at once. The thread left in the call hands its result back when
  the call returns, and becomes a spare.
- Code whose recent calls were slower than ``HANDOFF_S`` (a running average per kind),
  and every wait on a deadline or a lookup, goes to a spare thread at once; its result
  comes back the same way. A log's fold (``FOLD``) is step code: always inline.
- The step protocol makes no Redis call in place (``workers.redis_io``): every one is a
  call of the next batch, or library code on a spare thread.

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
import contextlib
import contextvars
import functools
import logging
import queue
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import redis

from durable import fairness
from durable.fairness import take_command
from durable.log import keys
from durable.log.batching import RedisCall
from durable.log.inflight import Stream

from .aio import Awaiting
from .calls import CallAbandoned
from .loop import StepLoop
from .slots import Slots, run_id_of, slot_live
from .turns import FOLD, SLOT, WAITING, Abandoned, DriverCallbacks, Offload

log = logging.getLogger("durable.worker")

#: User code that runs longer than this on the driving thread hands the driving over.
HANDOFF_S = 0.001

#: Calls in a batch, per server it goes to (a cluster's masters), before it is sent while
#: more runs are resumed (Redis works on it meanwhile); the rest go when no run is left to
#: resume.
FLUSH_EVERY = 16

#: Batches out at most before a new run is started (runs already going are not held).
MAX_INFLIGHT = 4

#: Runs taken from the ready lists and not started yet, at most (``_pop_ready``).
TAKE_AHEAD = 256

#: Spare threads started with the hub (more are started as slow calls need them).
PRESTARTED = 16

#: How often the monitor looks at the driving thread while runs are held.
MONITOR_S = 0.001

#: Weight of a call's duration in the running average that tells slow code from quick.
_RECENT = 0.2


@dataclass(eq=False)
class _Task:
    """One held run: its coroutine and the context it runs in."""

    run_id: str
    coro: Coroutine[RedisCall | Offload, None, Any]
    ctx: contextvars.Context = field(default_factory=contextvars.copy_context)
    started: bool = False


class _Thread:
    """A thread of the hub: the driver, a spare waiting to drive, or one left in user code."""

    __slots__ = ("job", "since", "wake", "what")

    def __init__(self) -> None:
        #: User code to run when woken, instead of driving.
        self.job: tuple[_Task, Offload] | None = None
        #: Released to wake it: to run ``job``, or to drive.
        self.wake = threading.Lock()
        self.wake.acquire()
        #: When the user code it runs inline as the driver began (0: none now).
        self.since = 0.0
        self.what = ""


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
        self._batch: list[tuple[_Task | None, RedisCall]] = []
        #: Batches sent and not read yet, oldest first, on the hub's own connections (one
        #: per server: a cluster's masters).
        self._inflight: collections.deque[list[tuple[_Task | None, RedisCall]]] = \
            collections.deque()
        self._stream = Stream(batcher)
        self._flush_at = FLUSH_EVERY * self._stream.servers
        #: Guards who drives (the driver checks it after inline user code, the monitor moves
        #: it) and the spares.
        self._mu = threading.Lock()
        self._spares: list[_Thread] = []
        self._threads = 0
        #: User-code name -> running average of its duration (seconds).
        self._took: dict[str, float] = {}
        self._owner: _Thread | None = None
        #: Times the driving moved to another thread (the first driver's start included).
        self.handoffs = -1
        #: Calls of user code sent to a spare thread as they started (known to be slow).
        self.offloads = 0
        #: Most threads that run user code handed to them at once (``DURABLE_USER_THREADS``);
        #: past it, such calls wait in ``_queued`` for one of them (the driving never does).
        self.max_jobs = max(1, loop.settings.worker.user_threads)
        self._jobs = 0
        self._queued: collections.deque[tuple[_Task, Offload]] = collections.deque()
        with self._mu:
            self._promote()
            # A few spares started now: a thread's start waits for the new thread to run,
            # about a millisecond each; more are started as calls need them, up to the cap.
            for _ in range(min(size, self.max_jobs, PRESTARTED)):
                self._spares.append(self._start_thread())
        threading.Thread(target=self._monitor, name="hub-monitor", daemon=True).start()

    @property
    def threads(self) -> int:
        """Threads the hub started (the driver, spares, and those in slow user code)."""
        return self._threads

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
        if not self.slots.claim(run_id, live):  # the hub drives it already (``Slots.claim``)
            return
        try:
            answer = await self.loop.advance_async(run_id, self._callbacks)
        finally:
            self.slots.unclaim(run_id, live)
        self.loop.outage.ok()
        if answer.get("more"):
            self._more_ready, self._short = True, 0  # it went back on the ready list

    # Driving ---------------------------------------------------------------------------

    def _serve_as(self, me: _Thread) -> None:
        while True:
            me.wake.acquire()
            job, me.job = me.job, None
            if job is not None:
                while job is not None:  # then the calls that waited for a thread, in turn
                    with contextlib.suppress(BaseException):  # see ``_run_job``
                        self._run_job(*job)
                    with self._mu:
                        job = self._queued.popleft() if self._queued else None
                        if job is None:
                            self._jobs -= 1
            else:
                try:
                    self._drive(me)
                except BaseException:  # a bug of the hub: never leave the runs undriven
                    log.exception("hub driver")
                    with self._mu:
                        if self._owner is me:
                            self._promote()
            with self._mu:
                self._spares.append(me)

    def _drive(self, me: _Thread) -> None:
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
                    if item.what == WAITING or (item.what != FOLD and
                                                self._took.get(item.what, 0.0) > HANDOFF_S):
                        self._elsewhere(task, item)
                        item = None
                        break
                    self._inline(me, task, item)
                    with self._mu:
                        mine = self._owner is me
                    if not mine:  # it ran long: the new driver takes the run back
                        self._incoming.put(task)
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
            try:
                self.loop.redis.hincrby(keys.STATS, "advance_errors", 1)
            except redis.RedisError as exc:
                self.loop.outage.failed(exc)
        return None

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
        if not (self._more_ready and slots.accepting):
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
            self._batch.append((None, RedisCall(None, take_command(slots.next_ready_key(),
                                                                   free))))

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

    def _answered(self, batch: list[tuple[_Task | None, RedisCall]]) -> None:
        for task, call in batch:
            if task is not None:
                self._ready.append(task)
            else:
                self._popped(call)

    def _popped(self, call: RedisCall) -> None:
        asked = fairness.asked(call.command)
        run_ids = [] if call.error is not None or call.reply is None else \
            [run_id_of(x) for x in call.reply]
        if call.error is not None:
            self.loop.outage.failed(call.error)
        if len(run_ids) < asked:
            # This list had no more; the others are asked in turn, until each was short.
            self._short += 1
            if self._short >= len(self.slots.ready_keys):
                self._more_ready = False
        else:
            self._short = 0
        for _ in range(asked - len(run_ids)):
            self.slots.give_back()
        if run_ids:
            if not self.slots.accepting:  # shutdown began while the pop was out: put them back
                for run_id in run_ids:
                    self._incoming.put(self._task(run_id))
                return
            for run_id in run_ids:
                self._fresh.append(self._task(run_id))

    # User code ---------------------------------------------------------------------------

    def _inline(self, me: _Thread, task: _Task, call: Offload) -> None:
        """Run ``call`` on the driving thread, timed by the monitor."""
        began = time.monotonic()
        me.what, me.since = call.what, began
        try:
            task.ctx.run(call.settle)
        finally:
            me.since = 0.0
            self._note(call.what, time.monotonic() - began)

    def _elsewhere(self, task: _Task, call: Offload) -> None:
        """Run ``call`` on a spare thread; ``task`` goes on once it returns."""
        self.offloads += 1
        with self._mu:
            if self._jobs >= self.max_jobs:
                self._queued.append((task, call))
                return
            self._jobs += 1
            self._spare((task, call))

    def _run_job(self, task: _Task, call: Offload) -> None:
        began = time.monotonic()
        try:
            task.ctx.run(call.settle)  # keeps what the call raised for the run
            self._note(call.what, time.monotonic() - began)
        except BaseException:  # raised in this thread after its call returned (the
            pass               # watchdog's ``Abandoned``): the run learns it from the call
        while True:  # the run must come back, whatever is raised in this thread meanwhile
            try:
                self._incoming.put(task)
                return
            except BaseException:
                continue

    def _note(self, what: str, took: float) -> None:
        """The running average of how long ``what`` takes."""
        recent = self._took.get(what)
        self._took[what] = took if recent is None else recent + _RECENT * (took - recent)

    def _monitor(self) -> None:
        while True:
            time.sleep(MONITOR_S if self.slots.busy else 0.05)
            owner = self._owner
            since = owner.since if owner is not None else 0.0
            if not since or time.monotonic() - since < HANDOFF_S:
                continue
            with self._mu:
                if self._owner is owner and owner is not None and owner.since == since:
                    what = owner.what
                    self._took[what] = max(self._took.get(what, 0.0), 2 * HANDOFF_S)
                    self._promote()

    def _promote(self) -> None:
        """Make a spare thread the driver. Under ``_mu``."""
        spare = self._spare()
        self._owner = spare
        self.handoffs += 1

    def _start_thread(self) -> _Thread:
        """A new thread of the hub, waiting to be woken (``_spare``)."""
        spare = _Thread()
        self._threads += 1
        threading.Thread(target=self._serve_as, args=(spare,), name="hub",
                         daemon=True).start()
        return spare

    def _spare(self, job: tuple[_Task, Offload] | None = None) -> _Thread:
        """A spare thread (a new one if none waits), woken to run ``job``, or to drive
        when None. Under ``_mu``."""
        spare = self._spares.pop() if self._spares else self._start_thread()
        spare.job = job
        spare.wake.release()
        return spare
