"""What the framework integrations' step tools share: the one event loop per process on which
every step's coroutine runs, the step a coroutine runs in (``current_step()``), and a tool's
``lookup`` whose answer is recorded as the tool's own result.

One loop, on a daemon thread, for every integration: a model keeps its HTTP client on the
loop it was first used on, and an MCP session (``durable.integrations.mcp_sessions``) stays
open on it across steps. A step tool runs on a worker's tool thread and waits there for its
coroutine; the worker interrupts that thread by raising in it, so the wait is polled."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from durable.agents import Lookup, ToolContext
from durable.cancellation import Cancelled

__all__ = ["LOOP", "StepLoop", "current_step", "recorded_lookup"]

_current: ContextVar[ToolContext | None] = ContextVar("durable_integration_step", default=None)


def current_step() -> ToolContext | None:
    """The step the running coroutine belongs to, or ``None`` outside one."""
    return _current.get()


class StepLoop:
    """One event loop per process, on a daemon thread, for every step's coroutine."""

    def __init__(self, name: str = "durable-integration-steps") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name=self._name, daemon=True).start()
                self._loop = loop
            return self._loop

    def run(self, make: Callable[[], Awaitable[Any]], ctx: ToolContext | None,
            cancellable: bool) -> Any:
        """Run the coroutine ``make()`` returns, with ``current_step()`` set to ``ctx``, and
        wait for it on the calling (tool) thread. A cancel of a cancellable step cancels it;
        a thread interrupted by the worker (deadline, grace spent) cancels it too."""

        async def body() -> Any:
            _current.set(ctx)
            return await make()

        fut = asyncio.run_coroutine_threadsafe(body(), self.get())
        try:
            # Polled, not a blocking wait: the worker interrupts a tool thread by raising in
            # it, which only lands while it runs Python.
            while not concurrent.futures.wait([fut], timeout=0.05).done:
                if cancellable and ctx is not None and ctx.token.cancelled:
                    fut.cancel()
                    raise Cancelled(ctx.token.reason or "cancelled")
            try:
                return fut.result()
            except concurrent.futures.CancelledError:
                reason = ctx.token.reason if ctx is not None else ""
                raise Cancelled(reason or "cancelled") from None
        except BaseException:
            fut.cancel()
            raise


LOOP = StepLoop()


def recorded_lookup(fn: Callable[[str, dict[str, Any]], Lookup | Awaitable[Lookup]] | None,
                    key: str, args: dict[str, Any],
                    encode: Callable[[Any], Any]) -> Lookup | Awaitable[Lookup]:
    """A user's ``lookup(key, args)`` (plain or ``async``), its "applied" result encoded the
    way the step records a result (``encode``); without one, the outcome stays unknown."""
    if fn is None:
        return Lookup.unknown()

    def recorded(found: Lookup) -> Lookup:
        return Lookup.applied(encode(found.result)) if found.status == "applied" else found

    found = fn(key, args)
    if inspect.isawaitable(found):
        pending = found

        async def wrapped() -> Lookup:
            return recorded(await pending)

        return wrapped()
    return recorded(found)
