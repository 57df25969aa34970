"""Each published agent as an MCP tool, and a ``tools/call`` as the start of its run.

A tool is an agent of the catalog the workers publish (``durable.catalog``): its name, its
input schema (the agent's input model's JSON schema), a description saying how a call
runs, and ``execution.taskSupport: "optional"``: it may be called with a task (the run's id
comes back at once) or without (the call waits for the result, up to a bound). An agent
that publishes no input schema cannot be started by name: it is not listed.

**Starting nothing twice.** A call starts a new run, ``mcp-<random>``, unless it names one:
``_meta: {"durable-agents/idempotency-key": "<key>"}`` makes the run
``mcp-<digest of tenant, agent, key>``, so a caller that retries a call it did not hear back
from gets the run it started (the same key with other arguments is refused).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from typing import Any

from mcp import types
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from durable import catalog
from durable.catalog import Published
from durable.controls.starts import Started
from durable.errors import DurableError, RunIdConflict, UsageError
from durable.log.state import RunState
from durable.security.callers import Caller

from .door import Door

#: The ``_meta`` key a caller names its run with (see the module).
IDEMPOTENCY_KEY = "durable-agents/idempotency-key"
#: The longest idempotency key accepted.
KEY_MAX = 200


def tool(item: Published, wait_s: float) -> types.Tool:
    """The MCP tool of the published agent ``item``."""
    fields = ", ".join(f"{n} ({p.get('type', 'any')})" for n, p in
                       ((item.schema or {}).get("properties") or {}).items()
                       if isinstance(p, dict))
    description = (
        f"Durable agent {item.name!r} (version {item.version}): each call is a durable run, "
        "resumed after any crash and cancellable (tasks/cancel). Called with a task, it "
        "answers at once with the task to poll (tasks/get, tasks/result); called without "
        f"one, it waits up to {wait_s:g} s for the result, then answers with the task."
        + (f" Input fields: {fields}." if fields else ""))
    return types.Tool(name=item.name, description=description,
                      input_schema=dict(item.schema or {"type": "object"}),
                      execution=types.ToolExecution(task_support="optional"))


def listed(door: Door) -> list[types.Tool]:
    """Every published agent that can be started by name, as a tool (read on a thread)."""
    out = []
    for name in catalog.names(door.client.redis):
        item = catalog.published(door.client.redis, name)
        if item is not None and item.schema is not None:
            door.saw_schema(name, item.schema)
            out.append(tool(item, door.wait_s))
    return out


def run_id_for(tenant: str, agent: str, meta: Mapping[str, Any]) -> str:
    """The run a call starts: named by its idempotency key, else a new random one."""
    key = meta.get(IDEMPOTENCY_KEY)
    if key is None:
        return f"mcp-{uuid.uuid4().hex}"
    if not isinstance(key, str) or not key or len(key) > KEY_MAX:
        raise MCPError(code=INVALID_PARAMS, message=f"_meta[{IDEMPOTENCY_KEY!r}] must be a "
                       f"string of 1-{KEY_MAX} characters; nothing was started")
    raw = "\0".join((tenant, agent, key)).encode()
    return "mcp-" + hashlib.sha256(raw).hexdigest()[:32]


def meta_of(params: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A request's raw ``_meta`` ({} when it has none)."""
    meta = (params or {}).get("_meta")
    return meta if isinstance(meta, Mapping) else {}


async def start(door: Door, caller: Caller, params: types.CallToolRequestParams,
                meta: Mapping[str, Any]) -> tuple[Started, RunState]:
    """Start the run ``params`` calls for; it and the run as it is then (one thread hop:
    the catalog, the start, the state). An unknown tool is the protocol's error
    (``MCPError``); a ``UsageError``: arguments the agent refuses, which the caller can
    fix (nothing was started)."""
    run_id = run_id_for(caller.tenant, params.name, meta)
    client = door.client

    def begin() -> tuple[Started, RunState] | None:
        item = catalog.published(client.redis, params.name)
        if item is None or item.schema is None:
            return None
        door.saw_schema(params.name, item.schema)
        started = client.start(params.name, dict(params.arguments or {}), run_id,
                               tenant=caller.tenant or None, owner=caller.owner)
        return started, client.status(run_id)

    try:
        begun: tuple[Started, RunState] | None = await door.call(begin)
    except RunIdConflict:
        raise UsageError(f"idempotency key {meta.get(IDEMPOTENCY_KEY)!r} was used already with "
                         "other arguments: a new call needs a new key; nothing was started") \
            from None
    except UsageError as exc:
        raise UsageError(f"{exc}; nothing was started") from None
    except DurableError as exc:
        raise MCPError(code=INVALID_PARAMS, message=f"{exc}; nothing was started") from None
    if begun is None:
        raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {params.name!r}")
    return begun
