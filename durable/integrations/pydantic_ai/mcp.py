"""An MCP server's tools inside a durable run (``pydantic_ai.mcp.MCPToolset``).

pydantic-ai's base makes the server's tool list (``<name>.mcp.<id>.tools``), its
instructions (``.instructions``) and each call (``.call``; ``.read``, effect-free, for a
tool the server marks ``readOnlyHint``) durable operations, each a step here; the run holds
one session with the server, opened by the first step that needs it and closed when the run's
function ends (its ``enter-in-durable-unit`` lifecycle). What this module adds, once per
toolset when the agent registers:

- each call carries its step's idempotency key and deadline in the request's ``_meta``
  (``idempotency_key``, ``deadline_ms``), for the server to deduplicate on: through the
  toolset's own ``process_tool_call`` hook, around the one it had (``with_step_meta``);
- a stdio server the worker starts dies with the worker (``mcp_sessions.dying_with_worker``).

The tool list is recorded once per run (``backend``): a server that changes its tools
mid-run cannot change a recorded run. A call whose connection closed under it may have
reached the server: its outcome is unknown, resolved by its ``lookup`` (``steps``).
"""

from __future__ import annotations

from typing import Any

from pydantic_ai.tools import RunContext
from pydantic_ai.toolsets import AbstractToolset

from durable.integrations.base import current_step
from durable.integrations.mcp_sessions import dying_with_worker, read_only, step_meta

__all__ = ["prepare", "read_only_tool"]

#: Marks a ``process_tool_call`` hook this module installed (installed once per toolset).
_MARK = "_durable_step_meta"


def prepare(toolset: AbstractToolset[Any]) -> None:
    """Make an MCP toolset's calls carry their step's key, and its stdio server die with
    the worker (idempotent: a toolset in two agents is prepared once)."""
    hook = getattr(toolset, "process_tool_call", None)
    if not getattr(hook, _MARK, False):
        toolset.process_tool_call = with_step_meta(hook)  # type: ignore[attr-defined]
    dying_with_worker(getattr(getattr(toolset, "client", None), "transport", None))


def with_step_meta(hook: Any) -> Any:
    """A ``process_tool_call`` hook that adds the step's key and deadline to a call's
    ``_meta`` inside a step, then calls ``hook`` (the toolset's own), if any."""

    async def process(ctx: RunContext[Any], call_tool: Any, name: str,
                      args: dict[str, Any]) -> Any:
        step = current_step()

        async def call(name: str, args: dict[str, Any], *,
                       metadata: dict[str, Any] | None = None) -> Any:
            if step is not None:
                metadata = {**(metadata or {}), **step_meta(step)}
            return await call_tool(name, args, metadata=metadata)

        if hook is not None:
            return await hook(ctx, call, name, args)
        return await call(name, args)

    setattr(process, _MARK, True)
    return process


def read_only_tool(tool: Any) -> bool:
    """Whether the server marks the tool read-only (its definition's metadata holds MCP's
    annotations)."""
    tool_def = getattr(tool, "tool_def", None)
    return tool_def is not None and read_only(tool_def.metadata or {})
