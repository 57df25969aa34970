"""What every request handler of one ``durable mcp`` process shares: the client (the one
door to run state, its sync calls made on threads), one asyncio Redis client for following
runs, who is calling, and the runs a caller may see.

Who calls: over Streamable HTTP, the caller the request was admitted as (``app``, from a
bearer token or a console user: ``durable.security.callers``); over stdio, the one caller
the process serves (its token in the environment, ``cli``). A caller sees and acts on the
runs of its tenant only: a task id of another tenant is answered as an unknown task.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import anyio.to_thread
import redis.asyncio
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from durable.client import Client
from durable.durations import parse_duration_ms
from durable.errors import RunNotFound
from durable.log import keys
from durable.log.state import RunState
from durable.security.callers import Caller
from durable.streams.async_streaming import last_id
from durable.streams.streaming import async_twin

#: Where the HTTP app leaves the caller it admitted, in the request's ASGI scope.
CALLER = "durable.caller"
#: How many runs' progress tokens are remembered (the oldest forgotten first).
TOKENS_KEPT = 4096
#: How long a published input schema read is taken as current (s; ``schema``).
SCHEMA_FRESH_S = 30.0


class Door:
    """One process's shared state (see the module). ``wait_s``: how long a ``tools/call``
    without a task waits for its run before it answers with the task to poll;
    ``stdio_caller``: the caller of a process serving stdio."""

    def __init__(self, client: Client, *, wait_s: float,
                 stdio_caller: Caller | None = None) -> None:
        self.client = client
        self.wait_s = wait_s
        self.stdio_caller = stdio_caller
        retention = client.settings.log.retention
        #: How long an ended run's keys live (ms), None: forever (a task's ``ttl``).
        self.retention_ms = parse_duration_ms(retention) if retention else None
        self._aredis: redis.asyncio.Redis | None = None
        #: run id -> the progress token of the call that created its task (in this process).
        self._tokens: OrderedDict[str, str | int] = OrderedDict()
        #: agent -> (its published input schema, when it was read)
        self._schemas: dict[str, tuple[dict[str, Any], float]] = {}

    @property
    def aredis(self) -> redis.asyncio.Redis:
        """One async client (one pool) for every follower, made in the serving loop."""
        if self._aredis is None:
            self._aredis = async_twin(self.client.redis)
        return self._aredis

    async def aclose(self) -> None:
        if self._aredis is not None:
            await self._aredis.aclose()
            self._aredis = None

    async def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` of the sync client, on a worker thread."""
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    def caller(self, ctx: ServerRequestContext[Any, Any]) -> Caller:
        """Who sent the request ``ctx`` is for."""
        request = ctx.request
        scope = getattr(request, "scope", None)
        found = scope.get(CALLER) if isinstance(scope, dict) else None
        if isinstance(found, Caller):
            return found
        if request is None and self.stdio_caller is not None:
            return self.stdio_caller
        raise MCPError(code=INVALID_PARAMS, message="no caller: nothing was done")

    async def run(self, ctx: ServerRequestContext[Any, Any], run_id: str) -> RunState:
        """The run of the task ``run_id`` if it is the caller's tenant's; else the protocol's
        error for a task that does not exist (-32602)."""
        tenant = self.caller(ctx).tenant
        proj = await self.call(self.client.log.projection, run_id) \
            if keys.RUN_ID_RE.match(run_id) else {}
        if not proj or proj.get("tenant", "") != tenant:
            raise MCPError(code=INVALID_PARAMS,
                           message=f"Failed to retrieve task: no task {run_id!r}")
        return await self.status(run_id)

    async def status(self, run_id: str) -> RunState:
        try:
            state: RunState = await self.call(self.client.status, run_id)
        except RunNotFound:
            raise MCPError(code=INVALID_PARAMS,
                           message=f"Failed to retrieve task: task {run_id!r} has expired") \
                from None
        return state

    async def last(self, run_id: str) -> str:
        """The id of the run's last log entry ("0": none), to follow on from."""
        return last_id(await self.aredis.xrevrange(self.client.log.keys.log(run_id),
                                                   count=1)) or "0"

    def remember_token(self, run_id: str, token: str | int | None) -> None:
        """Keep the progress token of the call that created ``run_id``'s task: it stays valid
        for the task's life, and ``tasks/result`` reports progress with it."""
        if token is None:
            return
        self._tokens[run_id] = token
        self._tokens.move_to_end(run_id)
        while len(self._tokens) > TOKENS_KEPT:
            self._tokens.popitem(last=False)

    def token(self, run_id: str) -> str | int | None:
        return self._tokens.get(run_id)

    def saw_schema(self, agent: str, schema: dict[str, Any]) -> None:
        """Keep the input schema just read from the catalog for ``agent``."""
        self._schemas[agent] = (schema, time.monotonic())

    def schema(self, agent: str) -> dict[str, Any] | None:
        """The input schema of ``agent`` read lately (no I/O: the SDK asks on the event loop,
        before each 2026-07-28 call, to check its ``Mcp-Param-*`` headers); None: not known
        now, and the SDK skips that check (the start checks the arguments all the same)."""
        got = self._schemas.get(agent)
        if got is None or time.monotonic() - got[1] > SCHEMA_FRESH_S:
            return None
        return got[0]
