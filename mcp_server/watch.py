"""Following one run for one open request (a ``tools/call`` without a task, or
``tasks/result``): its steps and partial output as progress notifications, its task status
changes as ``notifications/tasks/status``, a wait for input as an elicitation; until the run
ends, or until a bound.

Every item is read from the run's log and partial-output channel (``Client.afollow``), never
from this process's memory: a request to any ``durable mcp`` process, after any restart,
follows on from where the run is.

- **Progress** (when the request, or the call that created the task, gave a progress
  token): one notification per step decided ("step 2: charge"), per chunk of partial output
  (its text), per wait; ``progress`` counts the notifications, as the protocol wants it to
  grow with each.
- **Input**: on a wait for input, a client that declared elicitation is asked (form mode,
  ``tasks.asking``), the elicitation tied to the task (``io.modelcontextprotocol/related-task``);
  the accepted answer is the run's response (``Client.respond``, recorded as by
  ``<owner> elicitation``). A declined or dismissed one is not asked again by this request;
  the run goes on waiting.
- **The bound** is how long the request waits for the run, time spent in an elicitation
  left out (the user is answering, not the run stalling).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError, NoBackChannelError
from mcp.shared.message import ServerMessageMetadata
from pydantic import SerializerFunctionWrapHandler, model_serializer

from durable.errors import DurableError, RunNotFound
from durable.log import events as ev
from durable.log.state import RunState, WaitInfo
from durable.log.store import Entry
from durable.streams.partials import Partial

from . import tasks
from .door import Door

#: Events after which the task's status may have changed (its state is read again).
STATUS_EVENTS = (ev.WaitEntered, ev.WaitResolved, ev.ApprovalRequested, ev.ApprovalDecided,
                 ev.CancelRequested, ev.Quarantined, ev.Released, ev.Completed, ev.Failed,
                 ev.Expired, ev.Canceled)
#: The most characters of partial output one progress message carries.
CHUNK_CHARS = 2000


class StatusParams(types.TaskStatusNotificationParams):
    """A task status notification's params, ``ttl`` kept when it is null: the protocol
    requires the field (null: unlimited), and the SDK's session drops every null field."""

    @model_serializer(mode="wrap")
    def _with_ttl(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        out.setdefault("ttl", self.ttl)
        return out


class StatusNote(types.TaskStatusNotification):
    """``notifications/tasks/status`` with ``StatusParams``."""

    params: StatusParams


@dataclass
class Watch:
    """One request following the run ``run_id`` (see the module). ``statuses``: send
    ``notifications/tasks/status`` (``tasks/result``); ``stop_on_input``: end when the run
    waits for input it cannot ask for here (a ``tools/call`` then answers with its task)."""

    door: Door
    ctx: ServerRequestContext[Any, Any]
    run_id: str
    token: str | int | None = None
    statuses: bool = False
    stop_on_input: bool = False
    sent: int = 0
    #: The last status notified (status, message).
    notified: tuple[str, str] | None = None
    #: The wait requests asked for already (each is asked once per request).
    asked: set[str] = field(default_factory=set)
    declined: bool = False
    #: The run waits for input now (as far as this request has followed it).
    waiting_input: bool = False
    #: The steps said already (the one in flight when the request joined, then each decided).
    said: set[int] = field(default_factory=set)

    @property
    def can_elicit(self) -> bool:
        session = self.ctx.session
        return not self.declined and session.can_send_request and \
            session.check_client_capability(
                types.ClientCapabilities(elicitation=types.ElicitationCapability()))

    async def follow(self, state: RunState, after: str, bound_s: float | None) -> RunState:
        """Follow the run from the entry after ``after`` (``state``: the run as read just
        after ``after``); the run as it is when the run has ended, the bound has passed,
        or (``stop_on_input``) it waits for input nobody is asked for here."""
        deadline = math.inf if bound_s is None else time.monotonic() + bound_s
        if self.statuses:
            await self._status(state)
        current = state.current
        if current is not None and not state.terminal:  # joined mid-step: say which
            self.said.add(current.step)
            await self._progress(f"step {current.step}: {current.tool}")
        if state.state == "waiting_input" and state.wait is not None:
            deadline += await self._ask(state.wait)
            if self._stuck():
                return await self.door.status(self.run_id)
        items = self.door.client.afollow(self.run_id, from_id=after, client=self.door.aredis)
        it = aiter(items)
        try:
            while not state.terminal:
                with anyio.move_on_after(deadline - time.monotonic()) as scope:
                    try:
                        item = await anext(it)
                    except StopAsyncIteration:
                        break
                if scope.cancelled_caught:
                    break
                deadline += await self._item(item)
                if self._stuck():
                    break
        except RunNotFound:
            pass  # expired meanwhile: the status below says so
        finally:
            await items.aclose()  # type: ignore[attr-defined]
        return await self.door.status(self.run_id)

    def _stuck(self) -> bool:
        """Whether a request that stops on input has nothing more to wait for."""
        return self.stop_on_input and self.waiting_input

    async def _item(self, item: Entry | Partial) -> float:
        """Report one followed item; the seconds spent asking the user (not counted in the
        bound)."""
        if isinstance(item, Partial):
            data = item.data if isinstance(item.data, str) else json.dumps(item.data,
                                                                          default=str)
            await self._progress(f"step {item.step}: {data[:CHUNK_CHARS]}")
            return 0.0
        e = item.event
        if isinstance(e, ev.StepDecided) and e.step not in self.said:
            self.said.add(e.step)
            await self._progress(f"step {e.step}: {e.tool}")
        elif isinstance(e, ev.ApprovalRequested):
            await self._progress(f"waiting for an approver ({e.role or 'any role'})")
        elif isinstance(e, ev.WaitEntered) and e.kind == "input":
            self.waiting_input = True
            await self._progress(e.reason or "waiting for input")
        elif isinstance(e, ev.WaitResolved):
            self.waiting_input = False
        spent = 0.0
        if self.statuses and isinstance(e, STATUS_EVENTS):
            await self._status(await self.door.status(self.run_id))
        if isinstance(e, ev.WaitEntered) and e.kind == "input":
            spent = await self._ask(WaitInfo(kind=e.kind, reason=e.reason, until=e.until,
                                             request=e.request, data=e.data))
        return spent

    async def _progress(self, message: str) -> None:
        if self.token is None:
            return
        self.sent += 1
        await self.ctx.session.send_progress_notification(
            self.token, float(self.sent), None, message,
            related_request_id=str(self.ctx.request_id))

    async def _status(self, state: RunState) -> None:
        task = tasks.task(state, self.door.retention_ms)
        now = (task["status"], task.get("statusMessage", ""))
        if now == self.notified:
            return
        self.notified = now
        # The SDK's typed union of server notifications leaves the 2025-11-25 task status
        # out (its task types are types only); the session sends it all the same.
        note = StatusNote(params=StatusParams(
            task_id=task["taskId"], status=task["status"],
            status_message=task.get("statusMessage"), created_at=task["createdAt"],
            last_updated_at=task["lastUpdatedAt"], ttl=task["ttl"],
            poll_interval=task["pollInterval"]))
        await self.ctx.session.send_notification(
            note, related_request_id=str(self.ctx.request_id))  # type: ignore[arg-type]

    async def _ask(self, wait: WaitInfo) -> float:
        """Ask the user for what ``wait`` waits for, once per request; answer the run with
        what they submit. The seconds it took."""
        self.waiting_input = True
        if wait.request in self.asked or not self.can_elicit:
            return 0.0
        self.asked.add(wait.request)
        message, schema = tasks.asking(wait)
        t0 = time.monotonic()
        try:
            got = await self.ctx.session.send_request(
                types.ElicitRequest(params=types.ElicitRequestFormParams(
                    message=message, requested_schema=schema,
                    _meta=tasks.related(self.run_id))),  # type: ignore[arg-type]
                types.ElicitResult,
                metadata=ServerMessageMetadata(related_request_id=self.ctx.request_id))
        except (MCPError, NoBackChannelError):
            self.declined = True  # this client cannot be asked: the run goes on waiting
            return time.monotonic() - t0
        spent = time.monotonic() - t0
        value = tasks.answer(wait, got.content) if got.action == "accept" else None
        if value is None:
            self.declined = True
            return spent
        caller = self.door.caller(self.ctx)
        try:
            await self.door.call(self.door.client.respond, self.run_id, value,
                                 request=wait.request, by=f"{caller.owner} elicitation")
        except DurableError:
            return spent  # answered meanwhile (or expired): the log says which
        self.waiting_input = False
        return spent
