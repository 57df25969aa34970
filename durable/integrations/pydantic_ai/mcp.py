"""An MCP server's tools inside a durable run (``pydantic_ai.mcp.MCPToolset``), pinned per
run: its tool list is the step ``<name>.mcp.<id>.tools``, taken once per run and read back
from the log on recovery (a server that changes its tools mid-run cannot change a recorded
run); each call is the step ``<name>.mcp.<id>.call`` with its idempotency key in the
request's ``_meta`` (``idempotency_key``, ``deadline_ms``), or ``<name>.mcp.<id>.read``
(effect-free: sent again after a crash) for a tool the server marks ``readOnlyHint``.

The worker talks to the server over one session per process, opened on the steps' event
loop on first use, kept open across steps and runs, and opened again when the server died
(``durable.integrations.mcp_sessions``: a call the dying server may have received is unknown,
resolved by ``lookup``); the function's own ``async with`` of the toolset is a no-op inside a
run. A stdio server the worker started dies with the worker (on Linux:
``mcp_sessions.dying_with_worker``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from pydantic import TypeAdapter
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool, WrapperToolset

from durable.agents import Tool, ToolContext
from durable.integrations import mcp_sessions
from durable.integrations.base import EffectFreeStep, StepOptions, mcp_step_tools, run_in_step
from durable.integrations.mcp_sessions import SESSIONS, dying_with_worker, step_meta
from durable.integrations.pydantic_ai.model import retryable_but_not_usage
from durable.integrations.pydantic_ai.run import Durability, bound
from durable.integrations.pydantic_ai.tools import ToolStep, take_step, tool_outcome

try:
    from pydantic_ai.mcp import MCPToolset
except ImportError:  # pragma: no cover - pydantic-ai without its MCP extra
    MCPToolset = None  # type: ignore[assignment,misc]

_DEFS: TypeAdapter[list[ToolDefinition]] = TypeAdapter(list[ToolDefinition])


def is_mcp(toolset: AbstractToolset[Any]) -> bool:
    return MCPToolset is not None and isinstance(toolset, MCPToolset)


def read_only(tool_def: ToolDefinition) -> bool:
    """Whether the server marks the tool read-only (its metadata holds MCP's annotations)."""
    return mcp_sessions.read_only(tool_def.metadata or {})


@dataclass
class ToolsCall:
    """The live tool-list request of a run: handed from the function to the tools step."""

    ctx: RunContext[Any]


class _McpStep(Tool):
    owner: ClassVar[Durability]
    ident: ClassVar[str]
    options: ClassVar[StepOptions]

    def server(self) -> AbstractToolset[Any]:
        return self.owner.mcp_toolsets[self.ident]

    async def session(self, use: Callable[[Any], Awaitable[Any]], *, effect: bool) -> Any:
        """``use(toolset)`` with this worker's session with the server open."""
        server = self.server()

        async def ping(toolset: Any) -> None:
            await toolset.client.ping()

        def make() -> Any:
            # A stdio server dies with the worker (its fastmcp transport starts it).
            dying_with_worker(getattr(getattr(server, "client", None), "transport", None))
            return server

        return await SESSIONS.call(f"pydantic-ai:{self.owner.name}:{self.ident}", make, use,
                                   ping=ping, effect=effect)


class McpToolsStep(_McpStep, EffectFreeStep):
    """``<name>.mcp.<id>.tools``: the server's tool list, recorded once per run."""

    cancellable = True

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        call = self.owner.handed(ctx, self.name, args, ToolsCall)

        async def listing(server: Any) -> Any:
            tools = await server.get_tools(call.ctx)
            return _DEFS.dump_python([t.tool_def for t in tools.values()], mode="json")

        return await run_in_step(lambda: self.session(listing, effect=False), ctx)


class McpCallStep(_McpStep, ToolStep):
    """``<name>.mcp.<id>.call`` / ``.read``: one call of a tool of the server."""

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        meta = step_meta(ctx)

        async def calling(server: Any) -> Any:
            # A lost connection is raised, not told to the model: ``SESSIONS`` must see it.
            return await server.direct_call_tool(args["tool"], args["args"], metadata=meta)

        async def invoke() -> dict[str, Any]:
            return await tool_outcome(self.session(calling, effect=not self.effect_free))

        return await run_in_step(invoke, ctx)


def mcp_steps(owner: Durability, ident: str,
              opts: StepOptions | None) -> tuple[list[Tool], dict[str, str]]:
    """The step tools of the MCP toolset ``ident`` and their names by role."""
    opts = opts or StepOptions()
    shared = {"owner": owner, "ident": ident, "options": opts, "timeout_s": opts.timeout(),
              "retryable": retryable_but_not_usage(opts.retryable)}
    return mcp_step_tools(f"{owner.name}.mcp.{ident}", McpToolsStep, McpCallStep, shared,
                          {"cancellable": opts.cancellable, "effect_free": opts.effect_free})


@dataclass
class DurableMCPToolset(WrapperToolset[Any]):
    """An MCP toolset inside a durable run: its tool list and its calls are steps."""

    owner: Durability | None = None
    steps: dict[str, str] = field(default_factory=dict)

    def _bound(self) -> bool:
        return self.owner is not None and bound(self.owner) is not None

    async def __aenter__(self) -> Self:
        if not self._bound():  # in a run, only the steps talk to the server
            await super().__aenter__()
        return self

    async def __aexit__(self, *args: Any) -> bool | None:
        if not self._bound():
            return await super().__aexit__(*args)
        return None

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        owner = self.owner
        b = bound(owner) if owner is not None else None
        if owner is None or b is None:
            return await super().get_tools(ctx)
        pin = self.steps["tools"]
        if pin not in b.pinned:
            b.pinned[pin] = await b.step(pin, {}, ToolsCall(ctx))
        server: Any = self.wrapped
        return {d.name: server.tool_for_tool_def(d, ctx=ctx)
                for d in _DEFS.validate_python(b.pinned[pin])}

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        owner = self.owner
        if owner is None or bound(owner) is None:
            return await super().call_tool(name, tool_args, ctx, tool)
        step = self.steps["read" if read_only(tool.tool_def) else "call"]
        return await take_step(owner, step, self.wrapped, name, tool_args, ctx, tool,
                               step_args={"tool": name, "args": tool_args})
