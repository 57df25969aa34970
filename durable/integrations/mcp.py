"""An MCP server's tools as steps of a code agent (``pip install 'durable-agents[mcp]'``):
three step tools, registered by ``McpServer(name, transport)``::

    ledger = McpServer("ledger", lambda: StdioTransport("python", ["-m", "ledger_server"]),
                       lookup=ledger_lookup)

    @agent(tools=ledger.steps)
    def books(ctx: RunContext, inp: FreeInput) -> Any:
        tools = ctx.call("ledger.tools")                 # the tool list, recorded once
        ctx.call(ledger.step_for(tools, "apply"), {"tool": "apply", "args": {"n": 1}})

- ``<name>.tools``: the server's tool list (effect-free), pinned in the run's log: the run
  reads it back on recovery, so a server that changes its tools mid-run cannot change it.
- ``<name>.call``: one call, ``{"tool": ..., "args": {...}}``, with the step's idempotency
  key and deadline in the request's ``_meta`` (``idempotency_key``, ``deadline_ms``) for the
  server to deduplicate on; a crash that leaves it unknown is resolved by ``lookup(key,
  args)``, else it waits for an operator.
- ``<name>.read``: the same for a tool the server marks ``readOnlyHint`` (effect-free: sent
  again after a crash); ``step_for(tools, tool)`` picks it from the recorded list.

A call's result is the tool's structured content when it has one, else its text; a tool
error fails the step (``McpToolError``, not retried). A worker keeps one session per server,
reused by every step of every run it holds, and opens a new one when the server died
(``durable.integrations.mcp_sessions``): a call the dying server may have received is
unknown, resolved by ``lookup``. A stdio server the worker started dies with the worker (on
Linux: ``mcp_sessions.dying_with_worker``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

try:
    from fastmcp import Client
    from fastmcp.client.transports import ClientTransport
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError("durable.integrations.mcp needs the MCP client: "
                      "pip install 'durable-agents[mcp]'") from exc

from durable.agents import Lookup, Tool, ToolContext, registry
from durable.errors import DurableError
from durable.integrations.base import (
    DEFAULT_TIMEOUT_S,
    EffectFreeStep,
    mcp_step_tools,
    run_in_step,
)
from durable.integrations.mcp_sessions import (
    META_DEADLINE,
    META_KEY,
    SESSIONS,
    dying_with_worker,
    read_only,
    step_meta,
)

__all__ = ["META_DEADLINE", "META_KEY", "McpServer", "McpToolError"]



class McpToolError(DurableError):
    """The server answered a call with an error (``isError``)."""


def _result(result: Any) -> Any:
    if result.is_error:
        raise McpToolError(" ".join(getattr(c, "text", "") for c in result.content)
                           or "the tool returned an error")
    if result.structured_content is not None:
        return result.structured_content
    texts = [getattr(c, "text", None) for c in result.content]
    return "\n".join(t for t in texts if t is not None)


class McpServer:
    """The step tools of one MCP server, named ``<name>.tools``, ``.call`` and ``.read``.
    ``transport()`` makes a client transport (a URL, a ``StdioTransport``...) for each session
    a worker opens; ``lookup(key, args)`` answers for an unknown call, plain or ``async``."""

    def __init__(self, name: str, transport: Callable[[], ClientTransport | str], *,
                 lookup: Callable[[str, dict[str, Any]], Lookup | Awaitable[Lookup]]
                 | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        taken = [n for n in (f"{name}.tools", f"{name}.call", f"{name}.read")
                 if n in registry.tools]
        if taken:
            raise ValueError(f"MCP server {name!r}: steps {taken} are registered already")
        self.name, self.transport, self.lookup = name, transport, lookup
        server = self

        class Listing(EffectFreeStep):
            cancellable = True

            async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
                async def listing(client: Client[Any]) -> Any:
                    tools = await client.list_tools()
                    return [t.model_dump(mode="json", by_alias=True, exclude_none=True)
                            for t in tools]

                return await run_in_step(lambda: server.session(listing, effect=False), ctx)

        class Calling(Tool):
            async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
                meta = step_meta(ctx)

                async def calling(client: Client[Any]) -> Any:
                    return _result(await client.call_tool(
                        args["tool"], dict(args.get("args") or {}), meta=meta,
                        timeout=ctx.remaining(), raise_on_error=False))

                return await run_in_step(
                    lambda: server.session(calling, effect=not self.effect_free), ctx)

            def lookup(self, key: str, args: dict[str, Any]) -> Lookup | Awaitable[Lookup]:
                if server.lookup is None:
                    return Lookup.unknown()
                return server.lookup(key, args)  # the worker awaits an ``async`` one

        made, _ = mcp_step_tools(name, Listing, Calling, {"timeout_s": timeout_s}, {})
        for step in made:
            registry.add_tool(step)
        #: The step tool names, for ``@agent(tools=...)``.
        self.steps: tuple[str, ...] = (f"{name}.tools", f"{name}.call", f"{name}.read")

    async def session(self, use: Callable[[Client[Any]], Awaitable[Any]], *,
                      effect: bool) -> Any:
        """``use(client)`` on this worker's open session with the server."""

        async def ping(client: Client[Any]) -> None:
            await client.ping()

        def make() -> Client[Any]:
            client: Client[Any] = Client(self.transport())
            dying_with_worker(client.transport)  # a stdio server dies with the worker
            return client

        return await SESSIONS.call(f"mcp:{self.name}", make, use, ping=ping, effect=effect)

    def step_for(self, tools: list[dict[str, Any]], tool: str) -> str:
        """The step to call ``tool`` with, by the recorded tool list: ``.read`` for a tool
        the server marks read-only, ``.call`` otherwise."""
        for listed in tools:
            if listed.get("name") == tool:
                return f"{self.name}.read" if read_only(listed) else f"{self.name}.call"
        raise LookupError(f"MCP server {self.name!r} lists no tool {tool!r}")
