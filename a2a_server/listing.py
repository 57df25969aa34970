"""``ListTasks``: a caller's tasks of one agent, the most recently updated first, in pages.

The tasks looked at are the caller's runs of the endpoint's agent (its tenant's, as every
answer is), at most ``MAX_LISTED`` of them, the latest first: with ``contextId``, the runs
of that context's session; else the tenant's runs (``durable.client.Client.runs``). The
filters (``status``, ``statusTimestampAfter``) are applied to them, and they are ordered by
their status timestamp (the run's last update), newest first, ties by id (A2A 1.0, 3.1.4);
``totalSize`` counts the ones that match.

A page token is the position after the last task of its page (that task's update time and
id, base64url): the next page starts there, whatever happened to that task since, so a
token never becomes unknown. A token this server did not give is refused (-32602), as is a
``pageSize`` outside 1..100, a negative ``historyLength``, an unknown ``status``
(``params``). ``includeArtifacts`` false (the default) leaves ``artifacts`` out of every
task.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from dataclasses import dataclass

from a2a.types import ListTasksRequest, ListTasksResponse, Task, TaskState
from a2a.utils.task import apply_history_length

from durable.client import Client, RunSummary
from durable.controls import sessions
from durable.log import keys

from . import params, tasks

#: The most runs one ListTasks looks at (the latest first).
MAX_LISTED = 1000


@dataclass(frozen=True, order=True)
class Position:
    """Where a task sorts: by update time, then id (both descending in a list)."""

    updated: int
    run_id: str

    @property
    def token(self) -> str:
        raw = f"{self.updated}:{self.run_id}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def of_token(cls, token: str) -> Position:
        """The position a page token names; refused when no page gave it."""
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raw = ""
        updated, _, run_id = raw.partition(":")
        if not updated.isdigit() or not keys.RUN_ID_RE.match(run_id):
            raise params.invalid("pageToken", f"{token[:80]!r} is not a page token of this "
                                 "server: send the nextPageToken of the previous page as it "
                                 "was, or none for the first page")
        return cls(int(updated), run_id)


def _matches(row: RunSummary, request: ListTasksRequest, after_ms: int | None) -> bool:
    if request.status != TaskState.TASK_STATE_UNSPECIFIED and \
            tasks.state_of(row.state, row.step) != request.status:
        return False
    return after_ms is None or row.updated >= after_ms


async def list_tasks(client: Client, request: ListTasksRequest, agent: str,
                     tenant: str) -> ListTasksResponse:
    """The page of ``agent``'s tasks of ``tenant`` that ``request`` asks for."""
    size = params.page_size(request)
    params.history_length(request)
    start = Position.of_token(request.page_token) if request.page_token else None
    after_ms = request.status_timestamp_after.ToMilliseconds() \
        if request.HasField("status_timestamp_after") else None
    session = tasks.session_of(agent, request.context_id) if request.context_id else None
    if session is not None and not sessions.NAME_RE.match(session):
        return ListTasksResponse(page_size=size)  # no context of that name can exist
    rows = await asyncio.to_thread(client.runs, None, MAX_LISTED, agent=agent,
                                   tenant=tenant or None, session=session)
    found = sorted((r for r in rows if r.tenant == tenant and r.agent == agent and
                    _matches(r, request, after_ms)),
                   key=lambda r: Position(r.updated, r.run_id), reverse=True)
    later = [r for r in found if start is None or Position(r.updated, r.run_id) < start]
    page = later[:size]
    states = await asyncio.gather(*(asyncio.to_thread(client.status, r.run_id)
                                    for r in page))
    listed: list[Task] = []
    for state in states:
        task = apply_history_length(tasks.task(state), request)
        if not request.include_artifacts:
            task.ClearField("artifacts")
        listed.append(task)
    more = len(later) > size
    return ListTasksResponse(
        tasks=listed, page_size=size, total_size=len(found),
        next_page_token=Position(page[-1].updated, page[-1].run_id).token if more else "")
