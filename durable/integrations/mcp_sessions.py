"""One MCP session per server and worker process, reused across steps, reopened when the
server died (``durable.integrations.mcp`` for code agents, ``pydantic_ai.mcp`` and
``openai_agents.mcp`` for the frameworks).

A session lives on the steps' event loop (the process's, ``durable.integrations.steploop``): it
is opened by the first step that needs it and stays open while the server answers. A stdio
server that died (killed, crashed, out of memory) closes the session's streams; what a step
does then depends on what it knows:

- before a call with an effect, the session is pinged (any answer, even an error, says the
  server lives): a dead one is closed and opened again
  (a new server process), so a server that died between two calls costs nothing;
- a call whose connection closed while it was in flight may have reached the server: the step
  raises ``OutcomeUnknown`` (resolved by its ``lookup``, never sent again blindly) and the
  next step opens a new session;
- an effect-free call (the tool list, a read-only tool) is sent again once on a new session.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import anyio

from durable.agents import OutcomeUnknown, ToolContext
from durable.errors import causes

__all__ = ["META_DEADLINE", "META_KEY", "SESSIONS", "McpSession", "Sessions", "connection_lost",
           "read_only", "step_meta"]

T = TypeVar("T")

#: The JSON-RPC error code of a closed connection (the MCP SDK's ``CONNECTION_CLOSED``).
CONNECTION_CLOSED = -32000
#: How long a liveness ping may take before the session counts as dead.
PING_TIMEOUT_S = 5.0
#: How long closing a dead session may take before it is left to itself.
CLOSE_TIMEOUT_S = 5.0
#: Where a call's idempotency key and deadline travel in its ``_meta``.
META_KEY, META_DEADLINE = "idempotency_key", "deadline_ms"


def step_meta(ctx: ToolContext) -> dict[str, Any]:
    """What a call's ``_meta`` carries for the server to deduplicate on: the step's
    idempotency key and deadline."""
    return {META_KEY: ctx.key, META_DEADLINE: ctx.deadline_ms}


def read_only(listed: dict[str, Any]) -> bool:
    """Whether a tool of a recorded tool list (MCP's JSON of a tool) is marked read-only: its
    calls are then effect-free steps."""
    return bool((listed.get("annotations") or {}).get("readOnlyHint"))


class McpSession(Protocol):
    """What a pooled session is: an async context manager (entered once, exited when dead)."""

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc: Any) -> Any: ...


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the connection to the server is gone: the MCP
    SDK's "Connection closed", a closed or broken stream, a broken pipe. A tool's own error,
    or a timeout, is not."""
    for cur in causes(exc):
        if isinstance(cur, anyio.ClosedResourceError | anyio.BrokenResourceError
                      | anyio.EndOfStream | BrokenPipeError | ConnectionResetError):
            return True
        error = getattr(cur, "error", None)  # mcp.shared.exceptions.MCPError's ErrorData
        if getattr(error, "code", None) == CONNECTION_CLOSED:
            return True
        if getattr(cur, "code", None) == CONNECTION_CLOSED:
            return True
    return False


@dataclass
class _Slot:
    session: Any = None
    #: Set to close the open session (its host task leaves the context it entered).
    closing: asyncio.Event | None = None
    host: asyncio.Task[None] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: How often a session was opened for this server in this process.
    opened: int = 0


async def _host(session: McpSession, entered: asyncio.Future[None], closing: asyncio.Event) -> None:
    """Enter ``session`` and leave it in this one task (anyio's task groups, which stdio
    clients open, must be left by the task that entered them), when ``closing`` is set."""
    try:
        await session.__aenter__()
    except BaseException as exc:
        if not entered.done():
            entered.set_exception(exc)
        return
    entered.set_result(None)
    try:
        await closing.wait()
    finally:
        with contextlib.suppress(Exception):
            await session.__aexit__(None, None, None)


class Sessions:
    """The open sessions of one process, by server name. Use only on the steps' loop."""

    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}

    def opened(self, name: str) -> int:
        slot = self._slots.get(name)
        return slot.opened if slot is not None else 0

    async def _get(self, name: str, make: Callable[[], McpSession]) -> Any:
        slot = self._slots.setdefault(name, _Slot())
        async with slot.lock:
            if slot.session is None:
                session = make()
                entered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                closing = asyncio.Event()
                host = asyncio.ensure_future(_host(session, entered, closing))
                await entered
                slot.session, slot.closing, slot.host = session, closing, host
                slot.opened += 1
            return slot.session

    async def drop(self, name: str, session: Any) -> None:
        """Close ``session`` (a dead one: its errors are of no interest) if it is the open one."""
        slot = self._slots.get(name)
        if slot is None or slot.session is not session:
            return
        closing, host = slot.closing, slot.host
        slot.session, slot.closing, slot.host = None, None, None
        if closing is not None and host is not None:
            closing.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(host), CLOSE_TIMEOUT_S)

    async def call(self, name: str, make: Callable[[], McpSession],
                   use: Callable[[Any], Awaitable[T]], *,
                   ping: Callable[[Any], Awaitable[Any]], effect: bool) -> T:
        """``use(session)`` on the open session of ``name`` (``make()`` makes one), by the
        rules of the module's docstring: ``effect`` calls ping first and raise
        ``OutcomeUnknown`` when the connection closes under them; others are sent again once."""
        session = await self._get(name, make)
        if effect:
            try:
                with anyio.fail_after(PING_TIMEOUT_S):
                    await ping(session)
            except Exception as exc:
                # An error the server sent back (some refuse ``ping``) says it is alive.
                if connection_lost(exc) or isinstance(exc, TimeoutError):
                    await self.drop(name, session)
                    session = await self._get(name, make)
        try:
            return await use(session)
        except Exception as exc:
            if not connection_lost(exc):
                raise
            await self.drop(name, session)
            if effect:
                raise OutcomeUnknown(f"the connection to the MCP server {name!r} closed during "
                                     "the call: it may have been applied") from exc
        return await use(await self._get(name, make))


#: The sessions of this process.
SESSIONS = Sessions()
