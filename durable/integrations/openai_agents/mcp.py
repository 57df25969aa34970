"""An agent's MCP servers (``Agent(mcp_servers=[MCPServerStdio(name="ledger", ...)])``) inside
a durable run, pinned per run as the code agents' ``durable.integrations.mcp`` pins them:

- the tool list is the effect-free step ``<name>.mcp.<server>.tools``, taken once per run
  and read back from the log on recovery (a server that changes its tools mid-run cannot
  change a recorded run);
- each call is the step ``<name>.mcp.<server>.call`` with arguments ``{"call_id", "tool",
  "args"}``, its idempotency key and deadline in the request's ``_meta``
  (``idempotency_key``, ``deadline_ms``), resolved after a crash by the ``lookup`` of the
  ``StepOptions`` given as ``"<server>.*"``; a tool the server marks ``readOnlyHint`` is the
  effect-free step ``<name>.mcp.<server>.read``. Its recorded result is the server's whole
  ``CallToolResult``, which the SDK turns into the tool's output as it always does;
- ``StepOptions(requires_approval=True)`` gates every call of the server's tools behind a
  signed approval (the SDK's own ``require_approval`` would interrupt the run: refused).

The clone's agents hold a ``DurableMCPServer`` in place of each server: the SDK asks it for
tools and calls, it takes the steps; the step tools talk to the real server over the worker's
one session per server (``durable.integrations.mcp_sessions``), a stdio server dying with
the worker (on Linux: ``mcp_sessions.dying_with_worker``). Inside a run its ``connect()`` and
``cleanup()`` do nothing: no session is opened by the function."""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from agents.mcp import MCPServer
from agents.mcp.util import MCPToolMetaContext
from mcp import Tool as MCPTool
from mcp.types import CallToolResult

from durable.agents import Tool, ToolContext
from durable.integrations.base import (
    EffectFreeStep,
    StepOptions,
    jsonable,
    mcp_step_tools,
    recorded_lookup,
    run_in_step,
    stable,
)
from durable.integrations.mcp_sessions import (
    SESSIONS,
    dying_with_worker,
    read_only,
    step_meta,
)
from durable.integrations.openai_agents.run import AgentOwner, bound

#: Where the SDK's tool call id travels from the tool's context to ``call_tool``.
CALL_ID = "durable_call_id"
_NAME = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class McpList:
    server: MCPServer
    run_context: Any
    agent: Any


@dataclass(frozen=True)
class McpCall:
    server: MCPServer
    tool: str
    arguments: dict[str, Any] | None
    meta: dict[str, Any] | None


class _Connection:
    """The worker's session with one SDK MCP server, as ``SESSIONS`` holds it."""

    def __init__(self, server: MCPServer) -> None:
        self.server = server

    async def __aenter__(self) -> Self:
        # A stdio server (``MCPServerStdio``'s ``params``) dies with the worker.
        dying_with_worker(getattr(self.server, "params", None))
        await self.server.connect()  # type: ignore[no-untyped-call]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.server.cleanup()  # type: ignore[no-untyped-call]


async def _ping(connection: _Connection) -> None:
    session = getattr(connection.server, "session", None)
    if session is None:
        raise ConnectionResetError("the MCP server's session is closed")
    await session.send_ping()


async def _session(owner: AgentOwner, server: MCPServer,
                   use: Callable[[_Connection], Awaitable[Any]], *, effect: bool) -> Any:
    """``use(connection)`` on this worker's open session with ``server``."""
    return await SESSIONS.call(f"openai-agents:{owner.name}:{server.name}",
                               lambda: _Connection(server), use, ping=_ping, effect=effect)


def as_call_result(value: Any) -> dict[str, Any]:
    """A lookup's answer as a recorded ``CallToolResult``: one the server sent, as it is;
    text as its text; anything else as structured content."""
    if isinstance(value, dict) and "content" in value:
        return CallToolResult.model_validate(value).model_dump(mode="json", by_alias=True)
    if isinstance(value, str):
        return {"content": [{"type": "text", "text": value}], "isError": False}
    return {"content": [{"type": "text", "text": str(jsonable(value))}],
            "structuredContent": jsonable(value), "isError": False}


class McpToolsStep(EffectFreeStep):
    """``<name>.mcp.<server>.tools``: the server's tool list, recorded once per run."""

    cancellable = True
    owner: ClassVar[AgentOwner]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        call = self.owner.handed(ctx, self.name, args, McpList)

        async def listing(connection: _Connection) -> Any:
            tools = await connection.server.list_tools(call.run_context, call.agent)
            return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]

        return await run_in_step(lambda: _session(self.owner, call.server, listing,
                                                effect=False), ctx)


class McpCallStep(Tool):
    """``<name>.mcp.<server>.call`` / ``.read``: one call of a tool of the server."""

    owner: ClassVar[AgentOwner]
    options: ClassVar[StepOptions]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        call = self.owner.handed(ctx, self.name, args, McpCall)
        meta = {**(call.meta or {}), **step_meta(ctx)}

        async def calling(connection: _Connection) -> Any:
            result = await connection.server.call_tool(call.tool, call.arguments, meta=meta)
            return result.model_dump(mode="json", by_alias=True, exclude_none=True)

        return await run_in_step(lambda: _session(self.owner, call.server, calling,
                                                effect=not self.effect_free), ctx)

    def lookup(self, key: str, args: dict[str, Any]) -> Any:
        return recorded_lookup(self.options.lookup, key, args, as_call_result)


class DurableMCPServer(MCPServer):
    """``real`` inside a durable run of ``owner``: its tool list and calls are steps."""

    def __init__(self, owner: AgentOwner, real: MCPServer, steps: dict[str, str]) -> None:
        super().__init__(
            use_structured_content=real.use_structured_content,
            failure_error_function=real._failure_error_function,
            tool_meta_resolver=self._meta, custom_data_extractor=real.custom_data_extractor,
            tool_input_guardrails=real.tool_input_guardrails,
            tool_output_guardrails=real.tool_output_guardrails)
        self.owner, self.real, self.steps = owner, real, steps
        self._locks: dict[str, asyncio.Lock] = {}

    @property
    def name(self) -> str:
        return self.real.name

    async def connect(self) -> None:
        if bound(self.owner) is None:  # in a run, only the steps talk to the server
            await self.real.connect()  # type: ignore[no-untyped-call]

    async def cleanup(self) -> None:
        if bound(self.owner) is None:
            await self.real.cleanup()  # type: ignore[no-untyped-call]

    async def list_prompts(self) -> Any:
        return await self.real.list_prompts()

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        return await self.real.get_prompt(name, arguments)

    async def _meta(self, context: MCPToolMetaContext) -> dict[str, Any] | None:
        resolver = self.real.tool_meta_resolver
        found: Any = resolver(context) if resolver is not None else None
        if inspect.isawaitable(found):
            found = await found
        out = dict(found or {})
        call_id = getattr(context.run_context, "tool_call_id", None)
        if call_id and bound(self.owner) is not None:
            out[CALL_ID] = call_id
        return out or None

    async def _listed(self, run_context: Any, agent: Any) -> list[dict[str, Any]]:
        b = bound(self.owner)
        assert b is not None
        pin = self.steps["tools"]
        lock = self._locks.setdefault(f"{b.ctx.run_id}:{pin}", asyncio.Lock())
        async with lock:
            if pin not in b.pinned:
                b.pinned[pin] = await b.step(pin, {}, McpList(self.real, run_context, agent))
        self._locks.pop(f"{b.ctx.run_id}:{pin}", None)
        listed: list[dict[str, Any]] = b.pinned[pin]
        return listed

    async def list_tools(self, run_context: Any = None, agent: Any = None) -> list[MCPTool]:
        if bound(self.owner) is None:
            return await self.real.list_tools(run_context, agent)
        return [MCPTool.model_validate(t) for t in await self._listed(run_context, agent)]

    async def call_tool(self, tool_name: str, arguments: dict[str, Any] | None,
                        meta: dict[str, Any] | None = None) -> CallToolResult:
        b = bound(self.owner)
        rest = {k: v for k, v in (meta or {}).items() if k != CALL_ID}
        if b is None:
            return await self.real.call_tool(tool_name, arguments, rest or None)
        listed = next((t for t in await self._listed(None, None)
                       if t.get("name") == tool_name), {})
        step = self.steps["read" if read_only(listed) else "call"]
        args = stable({"call_id": (meta or {}).get(CALL_ID), "tool": tool_name,
                            "args": arguments or {}})
        data = await b.step(step, args, McpCall(self.real, tool_name, arguments, rest or None))
        return CallToolResult.model_validate(data)


def mcp_steps(owner: AgentOwner, server: MCPServer,
              opts: StepOptions | None) -> tuple[list[Tool], dict[str, str]]:
    """The step tools of the MCP server ``server`` of ``owner``'s graph, and their names."""
    if not _NAME.fullmatch(server.name):
        raise ValueError(f"DurableAgent({owner.name!r}): MCP server {server.name!r} needs a "
                         "name of letters, digits, '_' and '-' (MCPServerStdio(name=...)): "
                         "its steps are named after it")
    if server._needs_approval_policy:
        raise TypeError(f"DurableAgent({owner.name!r}): MCP server {server.name!r} asks the "
                        "SDK for approvals, which would interrupt the run; give "
                        f"tools={{'{server.name}.*': StepOptions(requires_approval=True)}}")
    opts = opts or StepOptions()
    call = {"options": opts, "retryable": opts.retryable, "approver_role": opts.approver_role,
            "approval_ttl_s": opts.approval_ttl_s, "cancellable": opts.cancellable,
            "effect_free": opts.effect_free, "requires_approval": bool(opts.requires_approval)}
    return mcp_step_tools(f"{owner.name}.mcp.{server.name}", McpToolsStep, McpCallStep,
                          {"owner": owner, "timeout_s": opts.timeout()}, call)
