"""``tools/call``: a call with a task starts the run and answers at once; a call without one
waits for the run, up to a bound, and then answers with the task to poll.

- **With a task** (``params.task``, the 2025-11-25 revision's task augmentation): the run is
  started (its id is the task id) and the answer is ``CreateTaskResult`` at once (``tasks``:
  the task, and the immediate response for the model). The SDK's ``tools/call`` pipeline
  would sieve that answer down to a ``CallToolResult``, so it is given by
  ``TaskAugmentation``, a server middleware, before that pipeline. The progress token the
  call carried stays the task's (``tasks/result`` reports progress with it).
- **Without**: ``on_call_tool`` starts the run and follows it (``watch``) for up to
  ``DURABLE_MCP_WAIT_S``: progress per step, an elicitation when the run waits for input;
  it answers with the run's result once it has ended, else with the task to poll (a
  ``CallToolResult`` naming it, ``tasks.running``: a call that did not ask for a task is
  never answered with ``CreateTaskResult``; on 2026-07-28, a client that declared the tasks
  extension is answered with the task itself, ``extension``). A call the client drops or
  cancels leaves its run going: ``tasks/list`` finds it, ``tasks/cancel`` cancels it.

Arguments the agent refuses are a tool error (``isError``, so a model can correct them) of
a call without a task, and the protocol's invalid-params error of one with a task; nothing
is started either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp import types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from durable.errors import UsageError

from . import extension, tasks, tools
from .door import Door
from .watch import Watch


def progress_token(params: Any) -> str | int | None:
    """The progress token a request's raw params carry, if any."""
    token = tools.meta_of(params).get("progressToken")
    return token if isinstance(token, str | int) and not isinstance(token, bool) else None


class Calls:
    """The ``tools/call`` handler and the task-augmentation middleware of one process."""

    def __init__(self, door: Door) -> None:
        self.door = door

    async def on_list_tools(self, ctx: ServerRequestContext[Any, Any],
                            params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        self.door.caller(ctx)  # only a caller lists them
        return types.ListToolsResult(tools=await self.door.call(tools.listed, self.door))

    async def on_call_tool(self, ctx: ServerRequestContext[Any, Any],
                           params: types.CallToolRequestParams) -> HandlerResult:
        door = self.door
        caller = door.caller(ctx)
        try:
            started, state = await tools.start(door, caller, params, tools.meta_of(ctx.params))
        except UsageError as exc:
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=str(exc))], is_error=True)
        run_id = started.run_id
        if not started.created:  # a retry: follow on from now
            after = await door.last(run_id)
            state = await door.status(run_id)
        else:
            after = "0"
        watch = Watch(door, ctx, run_id, token=progress_token(ctx.params),
                      stop_on_input=True)
        if not state.terminal:
            state = await watch.follow(state, after, door.wait_s)
        if state.terminal:
            return tasks.result(state)
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and extension.declared(ctx):
            return extension.created(state, door.retention_ms)
        return tasks.running(state, door.retention_ms)


class TaskAugmentation:
    """The server middleware that answers a task-augmented ``tools/call`` (handshake-era
    connections: the 2026-07-28 revision has no ``params.task``)."""

    def __init__(self, door: Door) -> None:
        self.door = door

    async def __call__(self, ctx: ServerRequestContext[Any, Any],
                       call_next: CallNext) -> HandlerResult:
        raw = ctx.params
        if ctx.method != "tools/call" or not isinstance(raw, Mapping) or \
                raw.get("task") is None or ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return await call_next(ctx)
        if ctx.session.client_params is None:  # the runner's gate, which this precedes
            raise MCPError(code=INVALID_PARAMS, message="Invalid request parameters",
                           data="")
        params = types.CallToolRequestParams.model_validate(raw, by_name=False)
        door = self.door
        caller = door.caller(ctx)
        try:
            started, state = await tools.start(door, caller, params, tools.meta_of(raw))
        except UsageError as exc:
            raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None
        door.remember_token(started.run_id, progress_token(raw))
        return tasks.created(state, door.retention_ms)
