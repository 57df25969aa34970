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
run."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Self

from pydantic import TypeAdapter
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool, WrapperToolset

from durable.agents import Lookup, Tool, ToolContext
from durable.integrations.mcp_sessions import META_DEADLINE, META_KEY, SESSIONS
from durable.integrations.pydantic_ai.codec import tool_outcome
from durable.integrations.pydantic_ai.model import retryable_but_not_usage
from durable.integrations.pydantic_ai.steps import StepOptions, bound
from durable.integrations.pydantic_ai.toolsets import ToolStep, take_step
from durable.integrations.steploop import LOOP

if TYPE_CHECKING:
    from durable.integrations.pydantic_ai.capability import RedisDurability

try:
    from pydantic_ai.mcp import MCPToolset
except ImportError:  # pragma: no cover - pydantic-ai without its MCP extra
    MCPToolset = None  # type: ignore[assignment,misc]

_DEFS: TypeAdapter[list[ToolDefinition]] = TypeAdapter(list[ToolDefinition])



def is_mcp(toolset: AbstractToolset[Any]) -> bool:
    return MCPToolset is not None and isinstance(toolset, MCPToolset)


def read_only(tool_def: ToolDefinition) -> bool:
    annotations = (tool_def.metadata or {}).get("annotations") or {}
    return bool(annotations.get("readOnlyHint"))


@dataclass
class ToolsCall:
    """The live tool-list request of a run: handed from the function to the tools step."""

    ctx: RunContext[Any]


class _McpStep(Tool):
    owner: ClassVar[RedisDurability]
    ident: ClassVar[str]
    options: ClassVar[StepOptions]

    def server(self) -> AbstractToolset[Any]:
        return self.owner.mcp_toolsets[self.ident]

    async def session(self, use: Callable[[Any], Awaitable[Any]], *, effect: bool) -> Any:
        """``use(toolset)`` with this worker's session with the server open."""
        server = self.server()

        async def ping(toolset: Any) -> None:
            await toolset.client.ping()

        return await SESSIONS.call(f"pydantic-ai:{self.owner.name}:{self.ident}",
                                   lambda: server, use, ping=ping, effect=effect)


class McpToolsStep(_McpStep):
    """``<name>.mcp.<id>.tools``: the server's tool list, recorded once per run."""

    effect_free = True
    cancellable = True

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        call = self.owner.handed(ctx, ToolsCall)

        async def listing(server: Any) -> Any:
            tools = await server.get_tools(call.ctx)
            return _DEFS.dump_python([t.tool_def for t in tools.values()], mode="json")

        return await LOOP.step(lambda: self.session(listing, effect=False), ctx)

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


class McpCallStep(_McpStep, ToolStep):
    """``<name>.mcp.<id>.call`` / ``.read``: one call of a tool of the server."""

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        meta = {META_KEY: ctx.key, META_DEADLINE: ctx.deadline_ms}

        async def calling(server: Any) -> Any:
            # A lost connection is raised, not told to the model: ``SESSIONS`` must see it.
            return await server.direct_call_tool(args["tool"], args["args"], metadata=meta)

        async def invoke() -> dict[str, Any]:
            return await tool_outcome(self.session(calling, effect=not self.effect_free))

        return await LOOP.step(invoke, ctx)


def mcp_steps(owner: RedisDurability, ident: str,
              opts: StepOptions | None) -> tuple[list[Tool], dict[str, str]]:
    """The step tools of the MCP toolset ``ident`` and their names by role."""
    opts = opts or StepOptions()
    base = f"{owner.name}.mcp.{ident}"
    names = {"tools": f"{base}.tools", "call": f"{base}.call", "read": f"{base}.read"}
    common = {"owner": owner, "ident": ident, "options": opts,
              "retryable": retryable_but_not_usage(opts.retryable)}
    made: list[Tool] = [
        type(f"{owner.name}_mcp_{ident}_tools", (McpToolsStep,),
             {"name": names["tools"], "timeout_s": opts.timeout_s, **common})(),
        type(f"{owner.name}_mcp_{ident}_call", (McpCallStep,), {
            "name": names["call"], "timeout_s": opts.timeout_s,
            "cancellable": opts.cancellable, "effect_free": opts.effect_free, **common})(),
        type(f"{owner.name}_mcp_{ident}_read", (McpCallStep,), {
            "name": names["read"], "timeout_s": opts.timeout_s,
            "cancellable": True, "effect_free": True, **common})(),
    ]
    return made, names


@dataclass
class DurableMCPToolset(WrapperToolset[Any]):
    """An MCP toolset inside a durable run: its tool list and its calls are steps."""

    owner: RedisDurability | None = None
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
