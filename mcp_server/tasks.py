"""A run as an MCP task (the 2025-11-25 revision's task utility), and its outcome as the
``tools/call`` result a task's ``tasks/result`` returns.

The task id is the run id. Statuses:

==============================================  ===================================
run                                             task
==============================================  ===================================
pending, outcome_unknown, waiting_retry, ...    working (the step in flight named)
waiting_approval                                working: an approver decides, in the
                                                console or ``durable approve``, not the
                                                caller
quarantined                                     working: it waits for an operator
waiting_input                                   input_required (answered by an
                                                elicitation, ``durable respond``...)
completed                                       completed
failed, expired                                 failed
a run-scoped cancel recorded, canceled          cancelled
==============================================  ===================================

A cancel is durable from the moment it is recorded and no later status replaces it, so a
run whose log holds one is ``cancelled`` at once, as the protocol asks of ``tasks/cancel``
("transition the task to cancelled before sending the response", "it MUST remain
cancelled"): the status message says when the step in flight is still being stopped.

A task's ``ttl`` is how long it can be read from its creation: unlimited (null) while the
run lives or without ``DURABLE_RETENTION``; once it has ended, until its keys expire.

**A wait for input as an elicitation** (form mode), the user's answer as the run's response
(``Client.respond``). An elicitation asks for a flat object of primitive fields. The agent
says what it wants in the wait's ``data``: ``{"schema": {"type": "object", "properties":
{...}}}`` (a form of strings, numbers, integers, booleans and enums, as the protocol
allows): the run is given the object the user submitted. Without one the form has one text
field, ``answer``, and the run is given that text, as ``durable respond --input '"..."'``
would give it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from mcp import types

from durable.log.state import RunState, WaitInfo

#: The ``_meta`` key that ties a message to its task.
RELATED_TASK = "io.modelcontextprotocol/related-task"
#: The ``_meta`` key of a task-augmented call's immediate answer, for a host that hands the
#: call back to its model while the task runs.
IMMEDIATE = "io.modelcontextprotocol/model-immediate-response"
#: How often a requestor is asked to poll ``tasks/get`` (ms).
POLL_INTERVAL_MS = 1000

TERMINAL = frozenset({"completed", "failed", "cancelled"})
#: The field of the form asked when the wait names no schema.
ANSWER = "answer"
#: The property types a form may have (the protocol's primitive schemas).
PRIMITIVES = frozenset({"string", "number", "integer", "boolean", "array"})


def iso(ms: int) -> str:
    """``ms`` since the epoch as an ISO 8601 UTC timestamp."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def canceled(state: RunState) -> bool:
    """Whether the task is ``cancelled``: the run was, or a run-scoped cancel is recorded."""
    return state.state == "canceled" or (
        state.cancel is not None and state.cancel.scope == "run")


def status(state: RunState) -> tuple[str, str]:
    """The task status of ``state`` and its status message ("" when nothing needs saying)."""
    s = state.state
    if canceled(state):
        if s == "canceled":
            return "cancelled", state.reason or "canceled"
        return "cancelled", "cancel requested: the step in flight is being stopped"
    if s == "completed":
        return "completed", ""
    if s in ("failed", "expired"):
        return "failed", state.error or state.reason or s
    if s == "waiting_input":
        reason = state.wait.reason if state.wait is not None else ""
        return "input_required", reason or "the agent waits for input"
    if s == "waiting_approval":
        open_ = [a for a in state.approvals.values() if a.decision is None]
        role = open_[-1].role if open_ else ""
        return "working", f"waiting for an approver{f' ({role})' if role else ''}: an " \
            "approval is decided in the console or with `durable approve`"
    if s == "quarantined":
        return "working", f"quarantined, waiting for an operator: {state.reason or ''}" \
            .rstrip(": ")
    current = state.current
    if current is not None:
        return "working", f"step {current.step}: {current.tool}"
    return "working", "" if state.step else "started"


def ttl(state: RunState, retention_ms: int | None) -> int | None:
    """How long the task can be read from its creation (ms); None: unlimited."""
    if retention_ms is None or not state.terminal:
        return None
    return max(0, state.updated - state.created) + retention_ms


def task(state: RunState, retention_ms: int | None = None) -> dict[str, Any]:
    """The task ``state`` is, as its wire dict (``ttl`` present even when null, as the
    protocol requires)."""
    st, message = status(state)
    out: dict[str, Any] = {"taskId": state.run_id, "status": st,
                           "createdAt": iso(state.created or state.updated),
                           "lastUpdatedAt": iso(state.updated or state.created),
                           "ttl": ttl(state, retention_ms),
                           "pollInterval": POLL_INTERVAL_MS}
    if message:
        out["statusMessage"] = message
    return out


def related(run_id: str) -> dict[str, Any]:
    """The ``_meta`` that ties a message to the task ``run_id``."""
    return {RELATED_TASK: {"taskId": run_id}}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def result(state: RunState) -> types.CallToolResult:
    """What the ``tools/call`` that started the task returns once the run has ended: its
    result (as text, and as structured content when it is an object), or an error result
    saying why it did not complete."""
    meta = related(state.run_id)
    if state.state == "completed":
        value = state.result
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=_text(value))],
            structured_content=value if isinstance(value, dict) else None, _meta=meta)
    if state.state == "canceled":
        why = f"the run was canceled: {state.reason or 'canceled'}"
    else:
        why = f"the run {state.state}: {state.error or state.reason or state.state}"
    return types.CallToolResult(content=[types.TextContent(type="text", text=why)],
                                is_error=True, _meta=meta)


def running(state: RunState, retention_ms: int | None = None) -> types.CallToolResult:
    """What a ``tools/call`` without a task returns when its run has not ended in the time it
    waits: the task to poll (``tasks/get``, ``tasks/result``) in text, in structured content
    and in ``_meta``."""
    got = task(state, retention_ms)
    said = f" ({got['statusMessage']})" if "statusMessage" in got else ""
    text = (f"The run goes on as task {state.run_id}, {got['status']}{said}. Poll tasks/get "
            f"with this task id; tasks/result returns the result once it has ended.")
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content={"task": got},
                                _meta=related(state.run_id))


def created(state: RunState, retention_ms: int | None = None) -> dict[str, Any]:
    """A task-augmented ``tools/call``'s answer: ``CreateTaskResult`` (the task), with the
    immediate response for the model in ``_meta``, and as ``content`` too: a result may
    carry more fields than its type names, and a client that validates every ``tools/call``
    answer as a ``CallToolResult`` (the official Python SDK's does) accepts it then."""
    got = task(state, retention_ms)
    text = f"Started task {state.run_id} ({got['status']}): poll tasks/get, then fetch " \
        "tasks/result."
    return {"task": got, "content": [{"type": "text", "text": text}],
            "_meta": {IMMEDIATE: text}}


def _form(data: Any) -> dict[str, Any] | None:
    """The form the wait's data names, if it is one an elicitation may ask."""
    schema = data.get("schema") if isinstance(data, dict) else None
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return None
    props = schema.get("properties")
    if not isinstance(props, dict) or not props or not all(
            isinstance(p, dict) and p.get("type") in PRIMITIVES for p in props.values()):
        return None
    return schema


def asking(wait: WaitInfo) -> tuple[str, dict[str, Any]]:
    """The message and the requested schema of the elicitation that asks for ``wait``."""
    message = wait.reason or "The agent waits for your input."
    form = _form(wait.data)
    if form is not None:
        return message, form
    return message, {"type": "object", "required": [ANSWER],
                     "properties": {ANSWER: {"type": "string", "title": "Answer",
                                             "description": message}}}


def answer(wait: WaitInfo, content: dict[str, Any] | None) -> Any:
    """The run's response from an accepted elicitation's ``content``; None when the content
    does not answer what was asked (the run then goes on waiting)."""
    if content is None:
        return None
    if _form(wait.data) is not None:
        return dict(content)
    value = content.get(ANSWER)
    return value if isinstance(value, str) else None
