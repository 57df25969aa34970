"""The tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663) on 2026-07-28
connections: the same runs, in the shapes that revision gives tasks.

The 2026-07-28 revision took tasks out of the core protocol and into this extension: the
server decides which call becomes a task (a client opts in by declaring the extension in
the request's capabilities; ``params.task`` is gone), ``tasks/get`` carries the outcome
(``result``) or the input the task waits for (``inputRequests``), ``tasks/update`` answers
it, ``tasks/cancel`` acknowledges; ``tasks/result`` and ``tasks/list`` are no more.

- **A call** from a client that declared the extension is followed as any call without a
  task (``DURABLE_MCP_WAIT_S``); if the run has not ended by then, or waits for input (a
  2026 server may send the client no request of its own), the answer is the task
  (``resultType: "task"``). A client that did not declare it is never answered so.
- **Status**: as on 2025-11-25, except that a run that failed or expired is ``completed``
  with an error result (``isError``): ``failed`` is for a JSON-RPC error, and a run's
  failure is the tool's.
- **Input**: a run waiting for input is ``input_required``, its ``inputRequests`` one
  elicitation keyed by the wait's request id (unique over the run's life, as the extension
  wants keys); ``tasks/update``'s accepted response for that key is the run's response
  (recorded as by ``<owner> tasks/update``); any other key is ignored.
- **Cancel**: the durable cancel; acknowledged with an empty result, also for a task that
  has ended (cancellation is cooperative: nothing to do).
"""

from __future__ import annotations

from typing import Any

from mcp import types
from mcp.server.context import ServerRequestContext
from pydantic import Field

from durable.errors import DurableError
from durable.log.state import RunState

from . import tasks
from .door import Door

IDENTIFIER = "io.modelcontextprotocol/tasks"


class UpdateTaskParams(types.RequestParams):
    """``tasks/update``'s params."""

    task_id: str
    input_responses: dict[str, Any] = Field(default_factory=dict)


def declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether the client declared the extension on this request."""
    return ctx.session.check_client_capability(
        types.ClientCapabilities(extensions={IDENTIFIER: {}}))


def status(state: RunState) -> tuple[str, str]:
    """The task status of ``state`` on this revision, and its status message."""
    st, message = tasks.status(state)
    if st == "failed":
        return "completed", message
    return st, message


def detailed(state: RunState, retention_ms: int | None = None) -> dict[str, Any]:
    """The task ``state`` is, with its outcome or the input it waits for."""
    st, message = status(state)
    out: dict[str, Any] = {"taskId": state.run_id, "status": st,
                           "createdAt": tasks.iso(state.created or state.updated),
                           "lastUpdatedAt": tasks.iso(state.updated or state.created),
                           "ttlMs": tasks.ttl(state, retention_ms),
                           "pollIntervalMs": tasks.POLL_INTERVAL_MS}
    if message:
        out["statusMessage"] = message
    if st == "completed":
        out["result"] = tasks.result(state).model_dump(by_alias=True, mode="json",
                                                       exclude_none=True)
    if st == "input_required" and state.wait is not None:
        message_, schema = tasks.asking(state.wait)
        out["inputRequests"] = {state.wait.request: {
            "method": "elicitation/create",
            "params": {"mode": "form", "message": message_, "requestedSchema": schema}}}
    return out


def created(state: RunState, retention_ms: int | None = None) -> dict[str, Any]:
    """A call's answer as a task (``CreateTaskResult``: the task's fields, flat)."""
    out = detailed(state, retention_ms)
    out.pop("result", None)
    return {"resultType": "task", **out}


class Extension:
    """``tasks/get``, ``tasks/update`` and ``tasks/cancel`` on 2026-07-28 connections."""

    def __init__(self, door: Door) -> None:
        self.door = door

    async def get(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> dict[str, Any]:
        return detailed(await self.door.run(ctx, task_id), self.door.retention_ms)

    async def update(self, ctx: ServerRequestContext[Any, Any],
                     params: UpdateTaskParams) -> dict[str, Any]:
        door = self.door
        state = await door.run(ctx, params.task_id)
        wait = state.wait
        if state.state != "waiting_input" or wait is None:
            return {}
        got = params.input_responses.get(wait.request)
        if not isinstance(got, dict) or got.get("action") != "accept":
            return {}
        content = got.get("content")
        value = tasks.answer(wait, content if isinstance(content, dict) else None)
        if value is None:
            return {}
        caller = door.caller(ctx)
        try:
            await door.call(door.client.respond, params.task_id, value, request=wait.request,
                            by=f"{caller.owner} tasks/update")
        except DurableError:
            pass  # answered meanwhile, or expired: the task's status says which
        return {}

    async def cancel(self, ctx: ServerRequestContext[Any, Any],
                     task_id: str) -> dict[str, Any]:
        door = self.door
        state = await door.run(ctx, task_id)
        if not state.terminal and not tasks.canceled(state):
            caller = door.caller(ctx)
            await door.call(door.client.cancel, task_id, "canceled by an MCP caller",
                            by=caller.owner)
        return {}
