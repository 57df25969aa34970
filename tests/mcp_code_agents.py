"""A code agent calling a real MCP stdio server (``tests.mcp_server``) through
``durable.integrations.mcp``: the tool list once, ``apply`` five times, ``peek`` once."""

from __future__ import annotations

import os
import sys
from typing import Any

from fastmcp.client.transports import StdioTransport

from durable.agents import Lookup
from durable.code import FreeInput, RunContext, agent
from durable.integrations.mcp import McpServer
from tests.pydantic_ai_agents import _applied

APPLIES = 5


def _applied_lookup(key: str, args: dict[str, Any]) -> Lookup:
    return Lookup.applied(f"applied {args['args']['n']} ({key})") if _applied(key) \
        else Lookup.not_applied()


ledger = McpServer("mcp_ledger", lambda: StdioTransport(
    command=sys.executable, args=["-m", "tests.mcp_server"], env=dict(os.environ),
    cwd=os.getcwd()), lookup=_applied_lookup, timeout_s=10.0)


@agent(tools=ledger.steps)
def mcp_books(ctx: RunContext, inp: FreeInput) -> Any:
    tools = ctx.call("mcp_ledger.tools")
    said = [ctx.call(ledger.step_for(tools, "apply"), {"tool": "apply", "args": {"n": n}})
            for n in range(1, APPLIES + 1)]
    seen = ctx.call(ledger.step_for(tools, "peek"), {"tool": "peek", "args": {}})
    return {"said": said, "peeked": seen}
