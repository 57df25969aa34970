"""The process's event loop for ``async def`` agent code and tools: one asyncio loop on one
thread, shared by every run the process holds.

An ``async def`` code agent's function is a task on this loop, and so is each call of an
``async def`` tool: a thousand runs waiting on their models or APIs cost a thousand tasks,
not a thousand threads. Whoever drives a run (a worker's hub, a run thread, a dry run)
hands work to the loop with ``submit`` and is called back when it is done; nothing waits
on a thread meanwhile.

Code on the loop must not block it: ``time.sleep`` or a blocking client in an ``async
def`` agent or tool stalls every other task of the process. The loop is watched (the
monitor thread pings it every ``PING_S``):

- blocked for ``WARN_S``, it logs a warning naming the task that blocks it (an agent's
  task is named ``agent:<run id>``, a tool call's ``tool:<name>:<run id>``);
- an agent's task that blocks it for longer than its limit (``block_limit_s``, the
  worker's ``DURABLE_DECIDE_TIMEOUT_MS``) gets ``LoopBlocked`` raised inside it, at its
  next bytecode (a call blocked in C, ``time.sleep`` among them, returns first): the
  function ends, its run is quarantined with the reason, and the loop goes on with the
  others. A tool's task is not interrupted here: its call's own deadline
  and cancel stop it once it yields.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import logging
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger("durable.eventloop")

T = TypeVar("T")

#: How often the monitor pings the loop (s).
PING_S = 0.05

#: A loop blocked this long is reported (s), naming the task that blocks it.
WARN_S = 0.25

#: Tasks whose names start with this are an agent's function (``durable.session``).
AGENT_TASK = "agent:"


class LoopBlocked(BaseException):
    """Raised inside an agent's task that blocked the process's event loop past its limit
    (a ``BaseException``: an agent's ``except Exception`` does not swallow it)."""


class EventLoop:
    """One asyncio loop on a thread of its own, started on first use (see the module doc)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_id = 0
        self._lock = threading.Lock()
        #: Longest an agent's task may block the loop before ``LoopBlocked`` (s).
        self.block_limit_s = 30.0
        #: Times the loop was found blocked past ``WARN_S``, and the longest block (s).
        self.blocked = 0
        self.longest_block_s = 0.0

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            with self._lock:
                if self._loop is None:
                    self._start()
                loop = self._loop
        assert loop is not None
        return loop

    @property
    def thread_id(self) -> int:
        self.loop  # noqa: B018 -- started on first use
        return self._thread_id

    def on_loop(self) -> bool:
        """Whether the calling code runs on this loop's thread."""
        return self._loop is not None and threading.get_ident() == self._thread_id

    def submit(self, coro: Coroutine[Any, Any, T], name: str = "") -> concurrent.futures.Future[T]:
        """Run ``coro`` as a task of the loop; its result (or what it raised) is on the
        future returned, which may be waited on or given a done callback from any thread."""
        loop = self.loop
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def start() -> None:
            task = loop.create_task(coro, name=name or None)

            def finished(t: asyncio.Task[T]) -> None:
                if t.cancelled():
                    done.cancel()
                    done.set_running_or_notify_cancel()
                elif t.exception() is not None:
                    done.set_exception(t.exception())
                else:
                    done.set_result(t.result())

            task.add_done_callback(finished)

        loop.call_soon_threadsafe(start)
        return done

    def call_soon(self, fn: Any, *args: Any) -> None:
        """Call ``fn(*args)`` on the loop, from any thread."""
        self.loop.call_soon_threadsafe(fn, *args)

    def _start(self) -> None:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._thread_id = threading.get_ident()
            self._loop = loop
            ready.set()
            while True:  # a LoopBlocked that lands past its task's code ends run_forever
                try:
                    loop.run_forever()
                    return
                except LoopBlocked:
                    continue

        threading.Thread(target=run, name="durable-aio", daemon=True).start()
        ready.wait()
        threading.Thread(target=self._monitor, name="durable-aio-monitor", daemon=True).start()

    def _monitor(self) -> None:
        loop = self._loop
        assert loop is not None
        warned_at = 0.0
        while True:
            pong = threading.Event()
            sent = time.monotonic()
            loop.call_soon_threadsafe(pong.set)
            interrupted = None
            while not pong.wait(PING_S):
                blocked_s = time.monotonic() - sent
                task = _running_task(loop)
                name = task.get_name() if task is not None else "?"
                if blocked_s >= WARN_S and time.monotonic() - warned_at > 5.0:
                    warned_at = time.monotonic()
                    log.warning("the event loop of async agents and tools is blocked for "
                                "%.2f s by %s: code on it must not block (no time.sleep or "
                                "blocking clients in an async def agent or tool: await "
                                "asyncio.sleep, an async client, or asyncio.to_thread)",
                                blocked_s, name)
                if blocked_s > self.block_limit_s and task is not None and \
                        name.startswith(AGENT_TASK) and interrupted is not task:
                    interrupted = task
                    log.error("%s blocked the event loop for %.1f s: interrupted",
                              name, blocked_s)
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(self._thread_id), ctypes.py_object(LoopBlocked))
            took = time.monotonic() - sent
            if took >= WARN_S:
                self.blocked += 1
                self.longest_block_s = max(self.longest_block_s, took)
            time.sleep(PING_S)


def _running_task(loop: asyncio.AbstractEventLoop) -> asyncio.Task[Any] | None:
    """The task running on ``loop`` now, read from another thread."""
    try:
        return asyncio.current_task(loop)
    except RuntimeError:
        return None


#: The process's loop.
EVENT_LOOP = EventLoop()
