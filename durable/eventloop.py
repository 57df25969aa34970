"""The process's event loop for ``async def`` agent code and tools: one asyncio loop on one
thread, shared by every run the process holds.

An ``async def`` code agent's function is a task on this loop, and so is each call of an
``async def`` tool: a thousand runs waiting on their models or APIs cost a thousand tasks,
not a thousand threads. Whoever drives a run (a worker's hub, a run thread, a dry run)
hands work to the loop with ``submit`` and is called back when it is done; nothing waits
on a thread meanwhile.

Code on the loop must not block it: ``time.sleep`` or a blocking client in an ``async
def`` agent or tool stalls every other task of the process. The loop is watched (the
monitor thread looks at the task running on it every ``PING_S``):

- a task found running in every look for ``WARN_S`` is named in a warning (an agent's
  task is named ``agent:<run id>``, a tool call's ``tool:<name>:<run id>``);
- an agent's task that blocks it for longer than its limit (``block_limit_s``, the
  worker's ``DURABLE_DECIDE_TIMEOUT_MS``) gets ``LoopBlocked`` raised inside it, at its
  next bytecode (a call blocked in C, ``time.sleep`` among them, returns first): the
  function ends, its run is quarantined with the reason, and the loop goes on with the
  others. A tool's task is not interrupted here: its call's own deadline
  and cancel stop it once it yields.

What a tool keeps on a loop across calls (an HTTP client and its connections, bound to the
loop they were opened on) is closed when that loop shuts down: ``at_loop_close`` registers
it; ``asyncio.run`` closes it at its end, and a worker's shutdown closes what the process's
loop kept (``EventLoop.close_resources``).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import ctypes
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

from durable.errors import Signal

log = logging.getLogger("durable.eventloop")

T = TypeVar("T")

#: How often the monitor looks at the task running on the loop (s).
PING_S = 0.05

#: A task that holds the loop this long is reported (s), by name.
WARN_S = 0.5

#: How often a thread that waits for a task of the loop (``EventLoop.wait``) looks up (s):
#: an exception raised in it by another thread lands only while it runs Python.
POLL_S = 0.05

#: Tasks whose names start with this are an agent's function (``durable.code.execution``).
AGENT_TASK = "agent:"

#: How long ``EventLoop.close_resources`` waits for what it closes (s).
CLOSE_S = 2.0


_PENDING, _RESULT, _ERROR, _CANCELLED = range(4)


class Handoff(Generic[T]):
    """A result handed from the loop's thread to a run's driver (or back): the part of
    ``concurrent.futures.Future``'s protocol the worker uses, at a fraction of its cost.
    A worker makes two of these per step of every run it holds; a ``Future`` builds a
    ``Condition`` (a Python object around a re-entrant lock) for each, this one lock, and an
    ``Event`` only when a thread waits on it with ``result``.

    ``add_done_callback`` calls run on the thread that settles it (or at once when it is
    settled); settling twice raises ``InvalidStateError``, as a ``Future`` does."""

    __slots__ = ("_callbacks", "_lock", "_state", "_value", "_waiter")

    def __init__(self) -> None:
        self._state = _PENDING
        self._value: Any = None
        self._callbacks: list[Callable[[Handoff[T]], object]] | None = None
        self._lock = threading.Lock()
        self._waiter: threading.Event | None = None

    def done(self) -> bool:
        return self._state != _PENDING

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def set_result(self, value: T) -> None:
        if not self._settle(_RESULT, value):
            raise concurrent.futures.InvalidStateError("the hand-off is settled already")

    def set_exception(self, exc: BaseException) -> None:
        if not self._settle(_ERROR, exc):
            raise concurrent.futures.InvalidStateError("the hand-off is settled already")

    def cancel(self) -> bool:
        """Settle it as cancelled; False when it was settled already."""
        return self._settle(_CANCELLED, None)

    def add_done_callback(self, fn: Callable[[Handoff[T]], object]) -> None:
        with self._lock:
            if self._state == _PENDING:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn(self)

    def result(self, timeout: float | None = None) -> T:
        """Its value (waiting up to ``timeout`` seconds); raises what it was settled with,
        ``CancelledError``, or ``TimeoutError`` (``concurrent.futures``')."""
        self._wait(timeout)
        if self._state == _ERROR:
            raise self._value
        return self._value  # type: ignore[no-any-return]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return self._value if self._state == _ERROR else None

    def _wait(self, timeout: float | None) -> None:
        if self._state == _PENDING:
            with self._lock:
                waiter = None
                if self._state == _PENDING:
                    waiter = self._waiter = self._waiter or threading.Event()
            if waiter is not None and not waiter.wait(timeout):
                raise concurrent.futures.TimeoutError()
        if self._state == _CANCELLED:
            raise concurrent.futures.CancelledError()

    def _settle(self, state: int, value: Any) -> bool:
        with self._lock:
            if self._state != _PENDING:
                return False
            self._state, self._value = state, value
            callbacks, self._callbacks = self._callbacks, None
            waiter = self._waiter
        if waiter is not None:
            waiter.set()
        for fn in callbacks or ():
            try:
                fn(self)
            except Exception:
                log.exception("a done callback of a hand-off")
        return True


class LoopBlocked(Signal):
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
        #: Times a task was found holding the loop past ``WARN_S``, and the longest (s).
        self.blocked = 0
        self.longest_block_s = 0.0
        self._posted: collections.deque[Callable[[], object]] = collections.deque()
        self._woken = False

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

    def submit(self, coro: Coroutine[Any, Any, T], name: str = "",
               context: contextvars.Context | None = None) -> Handoff[T]:
        """Run ``coro`` as a task of the loop (in ``context``, else a copy of the loop's);
        its result (or what it raised) is on the hand-off returned, which may be waited on
        or given a done callback from any thread."""
        loop = self.loop
        done: Handoff[T] = Handoff()

        def start() -> None:
            loop.create_task(coro, name=name or None, context=context).add_done_callback(
                functools.partial(_hand_over, done))

        self._post(start)
        return done

    def wait(self, coro: Coroutine[Any, Any, T], name: str = "") -> T:
        """Run ``coro`` as a task of the loop, in a copy of the calling thread's context, and
        wait for its end on the calling thread (never the loop's own: that would wait
        forever). The wait is polled, so that an exception raised in this thread by another
        (a worker's call watcher, its watchdog) lands within ``POLL_S``; the task is then
        cancelled and the exception goes on. A task that ends cancelled raises
        ``asyncio.CancelledError``.

        The task is started and stopped with the loop's own ``call_soon_threadsafe``, not
        the batched ``_post``: wherever the interrupt lands, the task is cancelled once it
        exists, or never made (its coroutine closed) when the interrupt came first."""
        if self.on_loop():
            raise RuntimeError("code on the event loop's own thread cannot wait for a task "
                               "of the loop: await it")
        loop = self.loop
        context = contextvars.copy_context()
        done: Handoff[T] = Handoff()
        made: list[asyncio.Task[T]] = []

        def start() -> None:
            made.append(loop.create_task(coro, name=name or None, context=context))
            made[0].add_done_callback(functools.partial(_hand_over, done))

        def stop() -> None:  # on the loop, after ``start`` when that was posted first
            if made:
                made[0].cancel()
            else:
                coro.close()

        try:
            loop.call_soon_threadsafe(start)
            while True:
                try:
                    return done.result(POLL_S)
                except concurrent.futures.TimeoutError:
                    continue
        except concurrent.futures.CancelledError:
            raise asyncio.CancelledError() from None
        except BaseException:
            if not done.done():
                loop.call_soon_threadsafe(stop)
            raise

    def spawn(self, coro: Coroutine[Any, Any, object], name: str = "") -> None:
        """Run ``coro`` as a task of the loop when nobody waits for its end (it reports
        its own outcome); what it raises is logged."""
        loop = self.loop

        def start() -> None:
            loop.create_task(coro, name=name or None).add_done_callback(_log_failure)

        self._post(start)

    def call_soon(self, fn: Any, *args: Any) -> None:
        """Call ``fn(*args)`` on the loop, from any thread."""
        self._post(functools.partial(fn, *args) if args else fn)

    def close_resources(self, timeout: float = CLOSE_S) -> bool:
        """Close what was kept on the loop for as long as it runs (``at_loop_close``: the
        model step's HTTP clients), as the end of ``asyncio.run`` closes its loop's: a
        worker calls it at its shutdown, once its runs have ended or been handed back. The
        loop and its tasks run on (its thread ends with the process); what is used on it
        afterwards is made again. Waits ``timeout`` seconds at most; True when all of it
        was closed in time."""
        loop = self._loop
        if loop is None:
            return True

        async def close_all() -> None:
            with _closers_lock:
                kept = list(_CLOSERS.get(loop, ()))
            done = await asyncio.gather(*(gen.aclose() for gen in kept), return_exceptions=True)
            for error in (d for d in done if isinstance(d, BaseException)):
                log.warning("closing what the event loop kept: %r", error)

        try:
            self.submit(close_all(), name="close-resources").result(timeout)
        except concurrent.futures.TimeoutError:
            log.warning("what the event loop kept was not closed within %.1f s", timeout)
            return False
        return True

    def _post(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the loop soon: posted calls are run together, and the loop is
        woken (a write to its self-pipe) once per bunch, not once per call."""
        self._posted.append(fn)
        if not self._woken:
            self._woken = True
            try:
                self.loop.call_soon_threadsafe(self._run_posted)
            except BaseException:  # (an interrupt raised in this thread by another): the
                self._woken = False  # next post wakes it, else nothing posted would run
                raise

    def _run_posted(self) -> None:
        self._woken = False  # before draining: a call posted after the drain wakes it again
        posted = self._posted
        while posted:
            try:
                posted.popleft()()
            except Exception:
                log.exception("a call posted to the event loop")

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
        """Sample the task running on the loop every ``PING_S``: one found running in every
        sample for ``WARN_S`` holds the loop (a loop merely busy with many short steps, or
        slowed by a loaded machine, shows other tasks, or none, between them)."""
        loop = self._loop
        assert loop is not None
        warned_at = 0.0
        last: asyncio.Task[Any] | None = None
        since = time.monotonic()
        interrupted: asyncio.Task[Any] | None = None
        while True:
            time.sleep(PING_S)
            task = _running_task(loop)
            now = time.monotonic()
            if task is None or task is not last:
                if last is not None and now - since >= WARN_S:
                    self.blocked += 1
                    self.longest_block_s = max(self.longest_block_s, now - since)
                last, since = task, now
                continue
            held_s = now - since
            name = task.get_name()
            if held_s >= WARN_S and now - warned_at > 5.0:
                warned_at = now
                log.warning("the event loop of async agents and tools is blocked for %.2f s "
                            "by %s: code on it must not block (no time.sleep or blocking "
                            "clients in an async def agent or tool: await asyncio.sleep, an "
                            "async client, or asyncio.to_thread)", held_s, name)
            if held_s > self.block_limit_s and name.startswith(AGENT_TASK) and \
                    interrupted is not task:
                interrupted = task
                log.error("%s blocked the event loop for %.1f s: interrupted", name, held_s)
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self._thread_id), ctypes.py_object(LoopBlocked))


#: What ``at_loop_close`` registered, by loop: kept alive here (a loop holds its async
#: generators weakly) until the loop closes it.
_CLOSERS: dict[asyncio.AbstractEventLoop, set[Any]] = {}
_closers_lock = threading.Lock()


async def at_loop_close(close: Callable[[], Awaitable[object]]) -> None:
    """Have ``close()`` awaited on the running loop when it shuts down: at the end of
    ``asyncio.run`` (any runner that calls ``loop.shutdown_asyncgens()``, as asyncio's do),
    and at ``EventLoop.close_resources`` for the process's loop. It rides an async generator
    started here, which the loop closes with the others it started; a loop closed without
    shutting down (``loop.close()`` alone) runs nothing, and its entry is dropped by the
    next call."""
    loop = asyncio.get_running_loop()

    async def closer() -> AsyncIterator[None]:
        try:
            yield
        finally:
            with _closers_lock:
                kept = _CLOSERS.get(loop, set())
                kept.discard(gen)
                if not kept:
                    _CLOSERS.pop(loop, None)
            await close()

    gen = closer()
    with _closers_lock:
        for old in [old for old in _CLOSERS if old.is_closed()]:
            del _CLOSERS[old]
        _CLOSERS.setdefault(loop, set()).add(gen)
    await anext(gen)  # started: the loop knows it from now on


def _hand_over(done: Handoff[T], task: asyncio.Task[T]) -> None:
    """Settle ``done`` as ``task`` ended (its done callback)."""
    if task.cancelled():
        done.cancel()
    elif (exc := task.exception()) is not None:
        done.set_exception(exc)
    else:
        done.set_result(task.result())


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("task %s failed", task.get_name(), exc_info=exc)


def _running_task(loop: asyncio.AbstractEventLoop) -> asyncio.Task[Any] | None:
    """The task running on ``loop`` now, read from another thread."""
    try:
        return asyncio.current_task(loop)
    except RuntimeError:
        return None


#: The process's loop.
EVENT_LOOP = EventLoop()
