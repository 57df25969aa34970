"""A code agent calling a real MCP stdio server (``tests.servers.mcp``) through
``durable.integrations.mcp``: the tool list once, ``apply`` five times, ``peek`` once."""

from __future__ import annotations

from typing import Any

from fastmcp.client.transports import StdioTransport

from durable.code import FreeInput, RunContext, agent
from durable.integrations.mcp import McpServer
from tests.servers.integration_world import mcp_apply_lookup, mcp_server_command

APPLIES = 5


def _transport() -> StdioTransport:
    command, args, env, cwd = mcp_server_command()
    return StdioTransport(command=command, args=args, env=env, cwd=cwd)


ledger = McpServer("mcp_ledger", _transport, lookup=mcp_apply_lookup, timeout_s=10.0)


@agent(tools=ledger.steps)
def mcp_books(ctx: RunContext, inp: FreeInput) -> Any:
    tools = ctx.call("mcp_ledger.tools")
    said = [ctx.call(ledger.step_for(tools, "apply"), {"tool": "apply", "args": {"n": n}})
            for n in range(1, APPLIES + 1)]
    seen = ctx.call(ledger.step_for(tools, "peek"), {"tool": "peek", "args": {}})
    return {"said": said, "peeked": seen}
