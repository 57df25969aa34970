"""The task methods of the 2025-11-25 revision, each mapped to the run (task id = run id),
each answered from the run's log through the client: any ``durable mcp`` process answers for
any task, after any restart, to a client on any connection. On 2026-07-28 connections
``tasks/get``, ``tasks/update`` and ``tasks/cancel`` are the tasks extension's
(``extension``).

- ``tasks/get``: the task (``tasks.task``).
- ``tasks/result``: blocks until the run has ended, then returns what the ``tools/call``
  would have (``tasks.result``, tied to the task by ``_meta``). While it waits it reports
  the run's steps as progress (with its own progress token, else the one of the call that
  created the task), its status changes as ``notifications/tasks/status``, and asks for
  input by elicitation when the run waits for it (``watch``).
- ``tasks/cancel``: the durable cancel (``Client.cancel``, recorded as by
  ``mcp:<caller>``); the task is ``cancelled`` from then on. An ended task is refused
  (-32602), as the protocol says.
- ``tasks/list``: the caller's tenant's runs, newest first, 50 a page (``nextCursor``: the
  last run id of a full page).

An unknown task id, one of another tenant, or a run whose keys have expired is the
protocol's -32602 error.
"""

from __future__ import annotations

from typing import Any

from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, METHOD_NOT_FOUND
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from durable.client import RunSummary
from durable.log import keys

from . import tasks
from .calls import progress_token
from .door import Door
from .extension import Extension, UpdateTaskParams
from .watch import Watch

#: Tasks per ``tasks/list`` page.
PAGE = 50


def modern(ctx: ServerRequestContext[Any, Any]) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


class TaskMethods:
    """The handlers of ``tasks/get``, ``tasks/result``, ``tasks/cancel``, ``tasks/list``
    (and, on 2026-07-28, ``tasks/update``)."""

    def __init__(self, door: Door) -> None:
        self.door = door
        self.extension = Extension(door)

    async def get(self, ctx: ServerRequestContext[Any, Any],
                  params: types.GetTaskRequestParams) -> dict[str, Any]:
        if modern(ctx):
            return await self.extension.get(ctx, params.task_id)
        return tasks.task(await self.door.run(ctx, params.task_id), self.door.retention_ms)

    async def update(self, ctx: ServerRequestContext[Any, Any],
                     params: UpdateTaskParams) -> dict[str, Any]:
        if not modern(ctx):
            raise MCPError(code=METHOD_NOT_FOUND, message="Method not found",
                           data="tasks/update")
        return await self.extension.update(ctx, params)

    async def result(self, ctx: ServerRequestContext[Any, Any],
                     params: types.GetTaskPayloadRequestParams) -> dict[str, Any]:
        door, run_id = self.door, params.task_id
        await door.run(ctx, run_id)  # the caller's, or refused
        after = await door.last(run_id)
        state = await door.status(run_id)
        if not state.terminal:
            token = progress_token(ctx.params)
            watch = Watch(door, ctx, run_id, token=token if token is not None
                          else door.token(run_id), statuses=True)
            state = await watch.follow(state, after, None)
        return tasks.result(state).model_dump(by_alias=True, mode="json", exclude_none=True)

    async def cancel(self, ctx: ServerRequestContext[Any, Any],
                     params: types.CancelTaskRequestParams) -> dict[str, Any]:
        if modern(ctx):
            return await self.extension.cancel(ctx, params.task_id)
        door, run_id = self.door, params.task_id
        state = await door.run(ctx, run_id)
        status, _ = tasks.status(state)
        if status in tasks.TERMINAL:
            raise MCPError(code=INVALID_PARAMS, message=f"Cannot cancel task: already in "
                           f"terminal status {status!r}")
        caller = door.caller(ctx)
        state = await door.call(door.client.cancel, run_id, "canceled by an MCP caller",
                                by=caller.owner)
        return tasks.task(state, door.retention_ms)

    async def list(self, ctx: ServerRequestContext[Any, Any],
                   params: types.PaginatedRequestParams) -> dict[str, Any]:
        door = self.door
        tenant = door.caller(ctx).tenant
        cursor = params.cursor
        if cursor is not None:
            proj = await door.call(door.client.log.projection, cursor) \
                if keys.RUN_ID_RE.match(cursor) else {}
            if not proj or proj.get("tenant", "") != tenant:
                raise MCPError(code=INVALID_PARAMS, message=f"invalid cursor {cursor!r}")
        rows: list[RunSummary] = []
        after, more = cursor, True
        while more and len(rows) < PAGE:  # the default tenant's runs are among all runs
            batch = await door.call(door.client.runs, None, PAGE, tenant=tenant or None,
                                    after=after)
            matching = [r for r in batch if r.tenant == tenant]
            taken = matching[:PAGE - len(rows)]
            rows += taken
            more = len(batch) == PAGE or len(taken) < len(matching)
            after = batch[-1].run_id if batch else after
        out: dict[str, Any] = {"tasks": [tasks.task(await door.status(r.run_id),
                                                    door.retention_ms) for r in rows]}
        if more and rows:
            out["nextCursor"] = rows[-1].run_id
        return out
