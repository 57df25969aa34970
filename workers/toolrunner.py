"""Runs one tool call at a time on a dedicated thread, with a deadline and a cancel token.

The worker waits for whichever comes first: the call's end, its deadline, or a cancel.
A call that does not stop when told is interrupted (``Cancelled`` is raised inside its
thread) and abandoned: the runner moves on with a fresh thread, and the call is recorded as
outcome unknown. Its late effect, if any, is refused downstream past its deadline.
"""

from __future__ import annotations

import contextvars
import ctypes
import functools
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from durable.cancellation import Cancelled, CancelToken

Outcome = Literal["returned", "raised", "timed_out", "interrupted"]


@dataclass
class CallResult:
    outcome: Outcome
    value: Any = None
    error: BaseException | None = None


class _Job:
    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.wake = threading.Event()
        self.result: CallResult | None = None
        self.thread_id = 0
        self.abandoned = False


class ToolRunner:
    def __init__(self) -> None:
        self._new_thread()

    def _new_thread(self) -> None:
        self._inbox: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        inbox = self._inbox
        self._thread = threading.Thread(target=self._loop, args=(inbox,), name="tool",
                                        daemon=True)
        self._thread.start()

    @staticmethod
    def _loop(inbox: queue.SimpleQueue[_Job]) -> None:
        while True:
            job = inbox.get()
            job.thread_id = threading.get_ident()
            try:
                job.result = CallResult("returned", job.fn())
            except BaseException as exc:
                job.result = CallResult("raised", error=exc)
            job.done.set()
            job.wake.set()
            if job.abandoned:
                # The caller gave up on this thread (and a forced interrupt may still land
                # in it): a fresh thread serves the next call.
                return

    def call(self, fn: Callable[[], Any], timeout: float, token: CancelToken,
             grace: float) -> CallResult:
        # The tool sees the caller's context variables (its trace span, for one): spans a
        # tool opens, or its instrumented HTTP client, are children of the step's span.
        job = _Job(functools.partial(contextvars.copy_context().run, fn))
        token.add_listener(job.wake.set)
        try:
            self._inbox.put(job)
            job.wake.wait(max(timeout, 0.0))
            if job.done.is_set() and job.result is not None:
                return job.result
            if token.cancelled:
                # Cancelled: give the tool its grace period to stop by itself.
                if job.done.wait(grace) and job.result is not None:
                    return job.result
                self._abandon(job)
                return CallResult("interrupted")
            self._abandon(job)
            return CallResult("timed_out")
        finally:
            token.remove_listener(job.wake.set)

    def _abandon(self, job: _Job) -> None:
        job.abandoned = True
        if job.thread_id and not job.done.is_set():
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(job.thread_id), ctypes.py_object(Cancelled)
            )
        self._new_thread()
