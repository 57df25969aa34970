"""What the framework integrations' step tools share: the event loop every step's coroutine
runs on, the step a coroutine runs in (``current_step()``), and a tool's ``lookup`` whose
answer is recorded as the tool's own result.

The loop is the process's (``durable.eventloop``), the one a worker runs ``async def`` agents
and tools on: a step tool's ``run`` is ``async def``, so a model request or a tool call in
flight is a task on it, holding no thread (a worker holds as many as its run slots, not as
many as ``DURABLE_USER_THREADS``). One loop per process for every integration: a model keeps
its HTTP client on the loop it was first used on, and an MCP session
(``durable.integrations.mcp_sessions``) stays open on it across steps. The worker cancels a
step's task at its deadline, and at a cancel (after its grace when the step cannot be
cancelled), as it does any ``async def`` tool's."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from durable.agents import Lookup, ToolContext
from durable.eventloop import EVENT_LOOP

__all__ = ["LOOP", "StepLoop", "current_step", "recorded_lookup"]

_current: ContextVar[ToolContext | None] = ContextVar("durable_integration_step", default=None)


def current_step() -> ToolContext | None:
    """The step the running coroutine belongs to, or ``None`` outside one."""
    return _current.get()


class StepLoop:
    """Runs each step's coroutine on the process's event loop (see the module doc)."""

    def get(self) -> asyncio.AbstractEventLoop:
        """The loop every step's coroutine runs on."""
        return EVENT_LOOP.loop

    async def step(self, make: Callable[[], Awaitable[Any]], ctx: ToolContext | None) -> Any:
        """Await the coroutine ``make()`` returns with ``current_step()`` set to ``ctx``: a
        step tool's ``run``, on the loop (the worker's task of the call)."""
        token = _current.set(ctx)
        try:
            return await make()
        finally:
            _current.reset(token)


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
