"""How a worker's held runs share its threads: the slot each run holds, the step turns a
run thread takes while it drives steps, and the user code (agent code, tools, waits) a
run's coroutine hands to whoever drives it (``Offload``), timed by the watchdog."""

from __future__ import annotations

import contextlib
import contextvars
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from durable.agents.cancel_token import CancelToken
from durable.errors import Signal
from durable.leases import Lease

#: Run threads (``DURABLE_DRIVER=threads``; the hub drives from one thread) of one worker
#: that may drive steps at once (load, fold, append) -- not counting
#: those waiting on agent code or a tool, which give their turn back. Step code is mostly
#: Python under the GIL: with hundreds of held runs ready at once (their tools returned
#: together), every thread contending for the GIL at each Redis reply made a step take
#: far longer than its CPU time (a step's commit came 0.6-1.2 s after its tool returned,
#: at 500 runs a process). Waiting for a turn costs no CPU; 32 turns still overlap the
#: Redis round trips of a process's steps many times over.
STEP_TURNS = 32


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class DriverCallbacks:
    """What the driver that hands a run to the step loop is told (``workers.pool``,
    ``workers.hub``): given once, when the driver is built, and carried by the slot of each
    run it hands over. Defaults: nothing (a run driven on RQ's thread holds no slot)."""

    #: The watchdog gave the run's slot back (its thread is left in wedged code).
    on_abandon: Callable[[], object] = _nothing
    #: On the run's thread, just before the commit that ends its work here (and releases
    #: its lease): a run thread sends its pop of the next ready run along with it.
    before_last_commit: Callable[[], object] = _nothing
    #: The driver resumes a run from a callback once the code it awaits is done, instead of
    #: waiting on a thread (the hub): a plain code agent's decision is awaited that way too.
    resumes_later: bool = False


#: A driver that is told nothing.
NO_CALLBACKS = DriverCallbacks()


class Abandoned(Signal):
    """Raised (asynchronously) in a run's thread whose agent code overran its time: the run
    is quarantined and its slot already given back. A ``BaseException``, so that agent code's
    ``except Exception`` does not swallow it."""


@dataclass
class Slot:
    """A run this worker holds: its lease, the token of its in-flight call, and which agent
    code runs now (and since when, on the monotonic clock) for the watchdog."""

    lease: Lease | None = None
    token: CancelToken = field(default_factory=CancelToken)
    thread_id: int = 0
    #: True while a tool call of the run is in flight (on ``thread_id``).
    in_call: bool = False
    user_code: str = ""
    user_code_since: float = 0.0
    abandoned: bool = False
    #: The ready list the run goes back on (its agent's), once its log is read.
    route: str | None = None
    #: Set when the job ends only because its turn is used up, to the run's version then:
    #: a code agent's function is kept alive for the next job (``CodeAgent.park``).
    park_at: int | None = None
    #: The driver's callbacks (``DriverCallbacks``).
    callbacks: DriverCallbacks = NO_CALLBACKS


#: The run the current coroutine (or thread) drives: agent code is timed on its slot.
SLOT: contextvars.ContextVar[Slot | None] = contextvars.ContextVar("durable_slot",
                                                                  default=None)

#: The name a hub knows a wait on a deadline or a lookup by (always run on its own thread).
BLOCKING = "(wait)"

#: The name a hub knows a log's fold by: step code, always run inline (one that reads
#: more than it was given, a large value beside the run, hands the driving over once it
#: has run for the hand-off time, as slow user code does).
FOLD = "(fold)"


class Offload:
    """User code a run's coroutine waits on (a ``decide()``, a tool call, a wait): ``await``
    it. Whoever drives the coroutine runs ``fn`` and resumes it with the result or the
    exception: a run thread at once, in place (``drive``); a hub inline while such calls
    are quick, else on a thread of its own (``workers.hub``)."""

    __slots__ = ("error", "fn", "result", "what")

    def __init__(self, what: str, fn: Callable[[], Any]) -> None:
        self.what = what
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None

    def settle(self) -> None:
        """Run ``fn`` on this thread and keep what it returned or raised."""
        try:
            self.result = self.fn()
        except BaseException as exc:  # raised again in the coroutine that awaits it
            self.error = exc

    def __await__(self) -> Generator[Offload, None, Any]:
        yield self
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return self.result


class Turns:
    """The step turns of one worker process (``STEP_TURNS``): a queue of tokens, taken and
    put back in C (a ``threading.Semaphore`` is Python code around a ``Condition``), and
    whether the current thread holds one."""

    def __init__(self, n: int) -> None:
        self.local = threading.local()
        self.tokens: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(n):
            self.tokens.put(None)

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """This thread drives a run's steps: hold a turn while it does, except while it
        waits on user code (``outside``)."""
        self.tokens.get()
        self.local.inside = True
        try:
            yield
        finally:
            if self.local.inside:
                self.local.inside = False
                self.tokens.put(None)

    def outside(self) -> Outside:
        """This thread waits on user code, a tool, or a deadline: give its turn back."""
        return Outside(self)


class Outside:
    """``Turns.outside``: a class, not a generator -- it is entered twice per step."""

    __slots__ = ("gave", "turns")

    def __init__(self, turns: Turns) -> None:
        self.turns = turns
        self.gave = False

    def __enter__(self) -> None:
        local = self.turns.local
        if getattr(local, "inside", False):
            local.inside = False
            self.turns.tokens.put(None)
            self.gave = True

    def __exit__(self, *exc: object) -> None:
        if self.gave:
            self.turns.tokens.get()
            self.turns.local.inside = True


class UserCode:
    """Agent code on ``slot``: outside the step turns, timed by the watchdog."""

    __slots__ = ("outside", "slot", "what")

    def __init__(self, turns: Turns, what: str, slot: Slot | None) -> None:
        self.what = what
        self.slot = slot
        self.outside = Outside(turns)

    def __enter__(self) -> None:
        slot = self.slot
        if slot is None:
            return
        self.outside.__enter__()  # its turn is taken again after the timing stops
        slot.thread_id = threading.get_ident()
        slot.user_code, slot.user_code_since = self.what, time.monotonic()

    def __exit__(self, *exc: object) -> None:
        if self.slot is None:
            return
        try:
            self.slot.user_code_since = 0.0
        finally:
            self.outside.__exit__()
