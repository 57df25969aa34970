"""The threads of a worker's hub (``workers.hub``): the one that drives, the spares waiting
to drive or to run user code, and those left in slow user code.

User code is called inline on the driving thread while its kind (an agent's ``decide()``, a
tool by name) has been quick. A monitor thread looks every ``MONITOR_S`` (and, once it
found none for ``PARK_AFTER`` looks, sleeps until inline code begins); once a call has run
for ``HANDOFF_S`` it makes a spare thread the driver, which goes on with every other run at
once. The thread left in the call hands its result back when the call returns (the run
goes back to the hub), and becomes a spare. Code whose recent calls were slower than
``HANDOFF_S`` (a running average per kind) goes to a spare thread as it starts
(``elsewhere``), at most ``DURABLE_USER_THREADS`` of them at once; past it, calls wait for
one of them in turn (the driving never does).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from .turns import Offload

log = logging.getLogger("durable.worker")

#: User code that runs longer than this on the driving thread hands the driving over.
HANDOFF_S = 0.001

#: Spare threads started with the hub (more are started as slow calls need them).
PRESTARTED = 16

#: How often the monitor looks at the driving thread while runs are held.
MONITOR_S = 0.001

#: Looks in a row that find no inline user code before the monitor sleeps until some begins
#: (``Spares.inline`` wakes it): an agent whose user code never runs inline (``async def``
#: code, tools on the event loop) would otherwise wake it a thousand times a second, each
#: wake taking the interpreter from the driving thread.
PARK_AFTER = 20

#: Weight of a call's duration in the running average that tells slow code from quick.
_RECENT = 0.2


class Run(Protocol):
    """What the threads need of a held run: the context its code runs in."""

    ctx: contextvars.Context


class HubThread:
    """A thread of the hub: the driver, a spare waiting to drive, or one left in user code."""

    __slots__ = ("job", "serves", "since", "wake", "what")

    def __init__(self) -> None:
        #: User code to run when woken, instead of driving.
        self.job: tuple[Run, Offload] | None = None
        #: Started by the spawner: when woken, serve the calls waiting (never drive).
        self.serves = False
        #: Released to wake it: to run ``job``, or to drive.
        self.wake = threading.Lock()
        self.wake.acquire()
        #: When the user code it runs inline as the driver began (0: none now).
        self.since = 0.0
        self.what = ""


class Spares:
    """The hub's threads (see the module doc). ``drive(me)`` drives on thread ``me`` until
    another thread drives; ``back(run)`` takes back a run whose user code returned on a
    spare; ``busy()`` says whether runs are held (the monitor looks less often when not)."""

    def __init__(self, drive: Callable[[HubThread], None], back: Callable[[Any], None],
                 busy: Callable[[], int], max_jobs: int) -> None:
        self._drive, self._back, self._busy = drive, back, busy
        #: Guards who drives (the driver checks it after inline user code, the monitor moves
        #: it) and the spares.
        self._mu = threading.Lock()
        self._spares: list[HubThread] = []
        self._threads = 0
        #: User-code name -> running average of its duration (seconds).
        self._took: dict[str, float] = {}
        self._owner: HubThread | None = None
        #: Times the driving moved to another thread (the first driver's start included).
        self.handoffs = -1
        #: Calls of user code sent to a spare thread as they started (known to be slow).
        self.offloads = 0
        #: Most threads that run user code handed to them at once (``DURABLE_USER_THREADS``);
        #: past it, such calls wait in ``_queued`` for one of them (the driving never does).
        self.max_jobs = max(1, max_jobs)
        self._jobs = 0
        self._queued: collections.deque[tuple[Run, Offload]] = collections.deque()
        #: Threads to start for calls that found no idle spare (``_spawn``): started by a
        #: thread of their own, so that the driving never waits for a thread's start.
        self._to_start = 0
        self._start_more = threading.Event()
        #: The monitor sleeps until inline user code begins (``PARK_AFTER``); set to wake it.
        self._parked = False
        self._inline_began = threading.Event()

    def start(self, size: int) -> None:
        """The first driver, a few spares, and the monitor."""
        with self._mu:
            self._promote()
            # A few spares started now: a thread's start waits for the new thread to run,
            # about a millisecond each; more are started as calls need them, up to the cap.
            for _ in range(min(size, self.max_jobs, PRESTARTED)):
                self._spares.append(self._start_thread())
        threading.Thread(target=self._monitor, name="hub-monitor", daemon=True).start()
        threading.Thread(target=self._spawn, name="hub-spawner", daemon=True).start()

    @property
    def threads(self) -> int:
        """Threads started (the driver, spares, and those in slow user code)."""
        return self._threads

    @property
    def took(self) -> dict[str, float]:
        """The running average duration (s) of each kind of user code the hub's threads ran
        (inline or on a spare)."""
        return dict(self._took)

    def slow(self, what: str) -> bool:
        """Whether user code of kind ``what`` has lately run longer than ``HANDOFF_S``."""
        return self._took.get(what, 0.0) > HANDOFF_S

    def drives(self, me: HubThread) -> bool:
        """Whether ``me`` still drives (after inline user code: the monitor may have moved
        the driving meanwhile)."""
        with self._mu:
            return self._owner is me

    def inline(self, me: HubThread, run: Run, call: Offload) -> None:
        """Run ``call`` on the driving thread ``me``, timed by the monitor."""
        began = time.monotonic()
        me.what, me.since = call.what, began
        if self._parked:  # (read after ``since`` is set: see ``_monitor``)
            self._parked = False
            self._inline_began.set()
        try:
            run.ctx.run(call.settle)
        finally:
            me.since = 0.0
            self._note(call.what, time.monotonic() - began)

    def elsewhere(self, run: Run, call: Offload) -> None:
        """Run ``call`` on a spare thread; ``run`` goes back to the hub once it returns.
        With no idle spare, the call waits for a thread the spawner starts (or for one that
        finishes its call first): a thread's start waits for the new thread to run, about a
        millisecond, and a thousand calls of a slow sync tool at once would stall the
        driving for a second."""
        self.offloads += 1
        with self._mu:
            if self._jobs >= self.max_jobs:
                self._queued.append((run, call))
                return
            self._jobs += 1
            if self._spares:
                self._spare((run, call))
                return
            self._queued.append((run, call))
            self._to_start += 1
        self._start_more.set()

    # The threads ----------------------------------------------------------------------------

    def _spawn(self) -> None:
        """Start the threads ``elsewhere`` asked for; each serves the calls waiting."""
        while True:
            self._start_more.wait()
            self._start_more.clear()
            while True:
                with self._mu:
                    if not self._to_start:
                        break
                    self._to_start -= 1
                    spare = HubThread()
                    spare.serves = True
                    self._threads += 1
                threading.Thread(target=self._serve_as, args=(spare,), name="hub",
                                 daemon=True).start()
                spare.wake.release()

    def _serve_as(self, me: HubThread) -> None:
        while True:
            me.wake.acquire()
            job, me.job = me.job, None
            if job is None and me.serves:  # started for the calls waiting (``elsewhere``)
                me.serves = False
                with self._mu:
                    job = self._queued.popleft() if self._queued else None
                    if job is None:  # another thread took them: a spare, not a job thread
                        self._jobs -= 1
                        self._spares.append(me)
                        continue
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

    def _run_job(self, run: Run, call: Offload) -> None:
        began = time.monotonic()
        try:
            run.ctx.run(call.settle)  # keeps what the call raised for the run
            self._note(call.what, time.monotonic() - began)
        except BaseException:  # raised in this thread after its call returned (the
            pass               # watchdog's ``Abandoned``): the run learns it from the call
        while True:  # the run must come back, whatever is raised in this thread meanwhile
            try:
                self._back(run)
                return
            except BaseException:
                continue

    def _note(self, what: str, took: float) -> None:
        """The running average of how long ``what`` takes."""
        recent = self._took.get(what)
        self._took[what] = took if recent is None else recent + _RECENT * (took - recent)

    def _monitor(self) -> None:
        quiet = 0  # looks in a row that found no inline user code
        while True:
            if quiet >= PARK_AFTER:
                self._park()
                quiet = 0
            else:
                time.sleep(MONITOR_S if self._busy() else 0.05)
            owner = self._owner
            since = owner.since if owner is not None else 0.0
            if not since:
                quiet += 1
                continue
            quiet = 0
            if time.monotonic() - since < HANDOFF_S:
                continue
            with self._mu:
                if self._owner is owner and owner is not None and owner.since == since:
                    what = owner.what
                    self._took[what] = max(self._took.get(what, 0.0), 2 * HANDOFF_S)
                    self._promote()

    def _park(self) -> None:
        """Sleep until inline user code begins (or for 50 ms). ``_parked`` is set before
        the driver's ``since`` is read again, and ``inline`` sets ``since`` before it reads
        ``_parked``: either the driver sees the monitor parked and wakes it, or the monitor
        sees the call and does not sleep."""
        self._inline_began.clear()
        self._parked = True
        owner = self._owner
        if owner is None or not owner.since:
            self._inline_began.wait(0.05)
        self._parked = False

    def _promote(self) -> None:
        """Make a spare thread the driver. Under ``_mu``."""
        self._owner = self._spare()
        self.handoffs += 1

    def _start_thread(self) -> HubThread:
        """A new thread of the hub, waiting to be woken (``_spare``)."""
        spare = HubThread()
        self._threads += 1
        threading.Thread(target=self._serve_as, args=(spare,), name="hub",
                         daemon=True).start()
        return spare

    def _spare(self, job: tuple[Run, Offload] | None = None) -> HubThread:
        """A spare thread (a new one if none waits), woken to run ``job``, or to drive
        when None. Under ``_mu``."""
        spare = self._spares.pop() if self._spares else self._start_thread()
        spare.job = job
        spare.wake.release()
        return spare
