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

from pydantic_ai.exceptions import ModelRetry
from pydantic_ai.tools import RunContext
from pydantic_ai.toolsets import AbstractToolset

from durable.integrations.base import current_step
from durable.integrations.mcp_sessions import (
    connection_lost,
    dying_with_worker,
    read_only,
    step_meta,
)

__all__ = ["prepare", "read_only_tool"]

#: Marks a ``process_tool_call`` hook this module installed (installed once per toolset).
_MARK = "_durable_step_meta"


def prepare(toolset: AbstractToolset[Any]) -> None:
    """Make an MCP toolset's calls carry their step's key, and its stdio server die with
    the worker (idempotent: a toolset in two agents is prepared once)."""
    hook = getattr(toolset, "process_tool_call", None)
    if not getattr(hook, _MARK, False):
        toolset.process_tool_call = with_step_meta(hook, toolset)  # type: ignore[attr-defined]
    dying_with_worker(getattr(getattr(toolset, "client", None), "transport", None))


def with_step_meta(hook: Any, toolset: Any = None) -> Any:
    """A ``process_tool_call`` hook that adds the step's key and deadline to a call's
    ``_meta`` inside a step, then calls ``hook`` (the toolset's own), if any. A call whose
    connection closed raises the lost connection (not pydantic-ai's retry) and reopens the
    toolset's session for the calls after it (``reopen``)."""

    async def process(ctx: RunContext[Any], call_tool: Any, name: str,
                      args: dict[str, Any]) -> Any:
        step = current_step()

        async def call(name: str, args: dict[str, Any], *,
                       metadata: dict[str, Any] | None = None) -> Any:
            if step is not None:
                metadata = {**(metadata or {}), **step_meta(step)}
            try:
                return await call_tool(name, args, metadata=metadata)
            except ModelRetry as exc:
                # pydantic-ai tells the model to retry a call whose connection closed: the
                # call may have reached the server, so the step sees the lost connection
                # (an unknown outcome, resolved by its lookup), never a retry of the effect.
                cause = exc.__cause__
                if step is not None and cause is not None and connection_lost(cause):
                    if toolset is not None:
                        await reopen(toolset)
                    raise cause from None
                raise

        if hook is not None:
            return await hook(ctx, call, name, args)
        return await call(name, args)

    setattr(process, _MARK, True)
    return process


async def reopen(toolset: Any) -> None:
    """Close an MCP toolset's dead session and open a new one, entered as often as the old
    one was (the run's entry and the calls in flight): pydantic-ai keeps a session whose
    server died, and every later call would fail on it. ``_running_count`` is
    pydantic-ai's count of entries (its ``__aenter__``/``__aexit__`` pair keeps it)."""
    entered = int(getattr(toolset, "_running_count", 0))
    for _ in range(entered):
        await toolset.__aexit__(None, None, None)
    for _ in range(entered):
        await toolset.__aenter__()


def read_only_tool(tool: Any) -> bool:
    """Whether the server marks the tool read-only (its definition's metadata holds MCP's
    annotations)."""
    tool_def = getattr(tool, "tool_def", None)
    return tool_def is not None and read_only(tool_def.metadata or {})
