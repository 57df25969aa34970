"""Tool calls run on the thread that calls them (a run's own thread, or the hub's driving
thread or one of its spares, ``workers.hub``); one watcher thread enforces their deadlines.

Why inline: a thread hop per call (hand the call to a tool thread, wait for it) cost a
worker holding hundreds of runs about 0.4 ms of CPU per step in thread switches, and a
second thread per held run. The hop bought one thing: the run could move on while a tool
that ignores its deadline or a cancel stays stuck. The watcher keeps that promise:

- A call still running at its deadline, or ``grace`` after its run's cancel token fired,
  gets :class:`Overrun` (a ``Cancelled``) raised inside it. Nearly every tool unwinds at
  once (a tool blocked in Python code, a sleep loop, an ``async`` tool), and the call is
  recorded ``timed_out`` or ``interrupted`` -- outcome unknown -- as before.
- A call that has not unwound ``escalate_s`` later (blocked in C, or swallowing
  ``BaseException``) is *stuck*: ``on_stuck`` is told its thread, and the worker gives the
  run up (lease released, run ready again: another thread continues it from the log, and
  resolves the call with ``lookup`` once its deadline has passed). The stuck thread is
  abandoned; if it ever returns, nothing of its call is written.

A call that returns is never interrupted after the fact: the watcher injects only while it
holds the call's lock and the call is not done, and the caller clears an interrupt that
was injected but not yet raised when it marks its call done under that lock.
"""

from __future__ import annotations

import contextvars
import ctypes
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from durable.agents.cancel_token import CancelToken, Overrun
from durable.errors import Signal

log = logging.getLogger("durable.worker")

Outcome = Literal["returned", "raised", "timed_out", "interrupted"]


@dataclass
class CallResult:
    outcome: Outcome
    value: Any = None
    error: BaseException | None = None


class CallAbandoned(Signal):
    """Raised on a stuck call's own thread when it finally returns: the worker gave its run
    up meanwhile, so nothing of the call may be recorded."""


@dataclass(eq=False)
class WatchedCall:
    thread_id: int
    token: CancelToken
    grace: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: bool = False
    #: "timed_out" / "interrupted" once the watcher raised Overrun in the call.
    injected: Outcome | None = None
    stuck: bool = False
    cancel_seen: bool = False
    #: Made when the call is found stuck; set once the worker has given its run up.
    given_up: threading.Event | None = None


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in a thread at its next bytecode (None clears a pending one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None)


class CallWatch:
    """Runs tool calls inline and watches their deadlines and cancels (see the module doc)."""

    def __init__(self, on_stuck: Callable[[int], object] = lambda tid: None,
                 escalate_s: float = 1.0) -> None:
        self.on_stuck = on_stuck
        self.escalate_s = escalate_s
        self._heap: list[tuple[float, int, WatchedCall, str]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        #: Calls not done yet. Done calls leave the heap lazily (when their time comes);
        #: it is compacted when mostly done ones, so long deadlines cannot pile them up.
        self._live = 0
        #: Stuck calls whose thread has not returned yet (each holds a thread).
        self.stuck_now = 0

    def call(self, fn: Callable[[], Any], timeout: float, token: CancelToken,
             grace: float) -> CallResult:
        """Run ``fn`` on this thread, for at most ``timeout`` seconds (and ``grace`` after a
        cancel of ``token``). Raises ``CallAbandoned`` when the call got stuck and its run
        was given up."""
        call = WatchedCall(threading.get_ident(), token, grace)
        began = time.monotonic()
        with self._cond:
            self._live += 1
        self._at(time.monotonic() + max(timeout, 0.0), call, "deadline")

        def cancelled() -> None:
            if not call.cancel_seen:
                call.cancel_seen = True
                self._at(time.monotonic() + grace, call, "cancel")

        token.add_listener(cancelled)
        result: CallResult | None = None
        try:
            try:
                result = CallResult("returned", contextvars.copy_context().run(fn))
            except Overrun:  # the watcher's, or an async tool's own deadline
                pass
            except BaseException as exc:
                result = CallResult("raised", error=exc)
            finally:
                self._finish(call)
        except Overrun:  # raised between the call's end and its finish: it overran anyway
            self._finish(call)
        token.remove_listener(cancelled)
        if call.stuck:
            assert call.given_up is not None  # made before ``stuck`` was set
            call.given_up.wait()
            with self._cond:
                self.stuck_now -= 1
            log.warning("a tool call given up as stuck on thread %d returned after %.1f s; "
                        "nothing of it is recorded", call.thread_id, time.monotonic() - began)
            raise CallAbandoned()
        if result is None or (call.injected is not None and result.outcome != "returned"):
            return CallResult(call.injected or "timed_out")
        return result

    def _finish(self, call: WatchedCall) -> None:
        with call.lock:
            if call.done:
                return
            call.done = True
            with self._cond:
                self._live -= 1
            if call.injected is not None:  # injected, perhaps not raised yet: never later
                _raise_in(call.thread_id, None)

    # The watcher -----------------------------------------------------------------------

    def _at(self, when: float, call: WatchedCall, kind: str) -> None:
        with self._cond:
            if len(self._heap) > 2 * self._live + 1024:
                self._heap = [entry for entry in self._heap if not entry[2].done]
                heapq.heapify(self._heap)
            heapq.heappush(self._heap, (when, next(self._seq), call, kind))
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="call-watch",
                                                daemon=True)
                self._thread.start()
            if self._heap[0][2] is call:
                self._cond.notify()

    def _watch(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        _, _, call, kind = heapq.heappop(self._heap)
                        break
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
            if call.done:
                continue
            try:
                self._act(call, kind)
            except Exception:
                log.exception("call watcher")

    def _act(self, call: WatchedCall, kind: str) -> None:
        with call.lock:
            if call.done:
                return
            if kind != "stuck":
                if call.injected is not None:
                    return
                call.injected = "timed_out" if kind == "deadline" else "interrupted"
                _raise_in(call.thread_id, Overrun)
                escalate = time.monotonic() + max(self.escalate_s, call.grace)
            else:
                call.given_up = threading.Event()
                call.stuck = True
                with self._cond:
                    self.stuck_now += 1
        if kind != "stuck":
            self._at(escalate, call, "stuck")
            return
        log.warning("a tool call on thread %d did not stop when interrupted: its run is "
                    "given up and continues elsewhere", call.thread_id)
        try:
            self.on_stuck(call.thread_id)
        finally:
            assert call.given_up is not None
            call.given_up.set()
