"""The MCP server of ``durable mcp``: the official SDK's low-level ``Server`` (its
protocol, both eras' handshakes, validation, transports) with this process's handlers.

- ``tools/list``, ``tools/call``: ``calls`` (a task-augmented call: ``TaskAugmentation``);
- ``tasks/get``, ``tasks/result``, ``tasks/cancel``, ``tasks/list``: ``methods``;
  ``tasks/update`` (2026-07-28): ``extension``;
- capabilities: the SDK's, plus ``tasks`` on handshake-era connections (``list``,
  ``cancel``, task-augmented ``tools/call``), the revision that defines them, and the tasks
  extension (``io.modelcontextprotocol/tasks``) on 2026-07-28 ones;
- a Redis that does not answer is the protocol's internal error (-32603) naming it, never a
  traceback.

Served on stdio by ``on_stdio`` (one client, the process's caller: a host that launches the
server talks to it on its stdin and stdout; every log line goes to stderr), over HTTP by
``app``.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.to_thread
import redis
from mcp import types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from . import extension
from .calls import Calls, TaskAugmentation
from .door import Door
from .extension import UpdateTaskParams
from .methods import TaskMethods

NAME = "durable-agents"
INSTRUCTIONS = (
    "Each tool is a durable agent: a call is a run that survives crashes and can be "
    "cancelled. Call a tool with a task (task-augmented tools/call) to get its task id at "
    "once, then poll tasks/get and fetch tasks/result; a call without a task waits for the "
    "result for a while, then answers with the task to poll.")


class DurableServer(Server[dict[str, Any]]):
    """The SDK's server, declaring the ``tasks`` capability where the protocol has it."""

    def get_capabilities(self, notification_options: NotificationOptions | None = None,
                         experimental_capabilities: dict[str, dict[str, Any]] | None = None,
                         extensions: dict[str, dict[str, Any]] | None = None, *,
                         protocol_version: str | None = None) -> types.ServerCapabilities:
        caps = super().get_capabilities(notification_options, experimental_capabilities,
                                        extensions, protocol_version=protocol_version)
        if protocol_version not in MODERN_PROTOCOL_VERSIONS:
            caps.extensions = None  # the tasks extension is 2026-07-28's; this is ``tasks``
            caps.tasks = types.ServerTasksCapability(
                list=types.TasksListCapability(), cancel=types.TasksCancelCapability(),
                requests=types.ServerTasksRequestsCapability(
                    tools=types.TasksToolsCapability(call=types.TasksCallCapability())))
        return caps


async def redis_errors(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """A Redis that does not answer, said as the protocol says errors."""
    try:
        return await call_next(ctx)
    except redis.RedisError as exc:
        raise MCPError(code=INTERNAL_ERROR, message=f"Redis is unavailable: {exc}") from None


def build_server(door: Door, version: str = "") -> DurableServer:
    """The server over ``door`` (its handlers, middleware and lifespan)."""
    calls, methods = Calls(door), TaskMethods(door)

    @contextlib.asynccontextmanager
    async def lifespan(_: Server[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        # Loaded now rather than by the first start by name (a quarter second).
        await anyio.to_thread.run_sync(importlib.import_module, "jsonschema")
        try:
            yield {}
        finally:
            await door.aclose()

    server = DurableServer(NAME, version=version, instructions=INSTRUCTIONS,
                           lifespan=lifespan, on_list_tools=calls.on_list_tools,
                           get_tool_input_schema=door.schema)
    # Its answer may be the tasks extension's task (a dict), not only a ``CallToolResult``.
    server.add_request_handler("tools/call", types.CallToolRequestParams, calls.on_call_tool)
    server.add_request_handler("tasks/get", types.GetTaskRequestParams, methods.get)
    server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams,
                               methods.result)
    server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, methods.cancel)
    server.add_request_handler("tasks/list", types.PaginatedRequestParams, methods.list)
    server.add_request_handler("tasks/update", UpdateTaskParams, methods.update)
    server.extensions[extension.IDENTIFIER] = {}
    server.middleware.extend([redis_errors, TaskAugmentation(door)])
    return server


def on_stdio(door: Door, version: str = "") -> None:
    """Serve one client on this process's stdin and stdout until it leaves (``door`` has
    the caller it serves)."""
    server = build_server(door, version)

    async def serve() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(serve)
