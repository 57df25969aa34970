"""A run's events as Server-Sent Events, resumable by ``Last-Event-ID``: what ``GET
/runs/{id}/events`` answers in the console and in ``durable a2a``, for browsers and for
services in any language that speak HTTP.

Frames (``text/event-stream``)::

    id: 1795973278178-1
    event: entry
    data: {"id": "1795973278178-1", "seq": 3, "type": "step_decided", "ts": ..., "actor": ...,
           "event": {...the entry's fields, sealed values shown as "***"...}}

    id: 1795973278178-2;4.1.7
    event: partial
    data: {"step": 4, "attempt": 1, "seq": 7, "data": "the next tokens"}

    event: end
    data: {"run": "...", "last": "1795973278186-1"}

An entry's id is its stream id; a partial chunk's (``durable.streams.partials``: a step's
output while it runs, never in the log) is the id of the last entry sent before it and, for
each step in flight, the last chunk sent of it (``step.attempt.seq``). A client that
reconnects sends the last id it got as ``Last-Event-ID`` (browsers' ``EventSource`` does it by
itself) or ``?from=``: it gets every entry after that entry, and of the steps still in flight
every chunk after the ones it had, each once. A chunk of a step that ended meanwhile is not
sent again: its outcome, in the log, is. ``end`` follows the run's terminal entry; a
comment keeps the connection alive every ``KEEPALIVE_S`` seconds of quiet.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import redis.asyncio

from durable.errors import RunNotFound, UsageError
from durable.log import events as ev
from durable.log import keys
from durable.log.store import Entry
from durable.security.sealing import shown
from durable.streams.async_streaming import afollow
from durable.streams.partials import Partial

__all__ = ["KEEPALIVE_S", "Resume", "event_stream", "resume_from"]

#: Seconds of quiet after which a comment keeps the connection (and proxies) alive.
KEEPALIVE_S = 15.0

#: How long a client waits before it reconnects (ms), sent first.
RETRY_MS = 2000

_ENTRY_ID = re.compile(r"^(0|\d+-\d+)$")
_POSITION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")

#: Outcome events: the step they name has ended, and its chunks are not kept any more.
_OUTCOMES = (ev.ActionSucceeded, ev.ActionFailed, ev.ActionTimedOut, ev.ActionInterrupted,
             ev.ActionReconciled, ev.CallCanceled)


@dataclass
class Resume:
    """Where a stream (re)starts: after the entry ``entry`` ("0": the first), and for each
    step in flight ``(step, attempt)`` the last chunk the client has (its ``seq``)."""

    entry: str = "0"
    chunks: dict[tuple[int, int], int] = field(default_factory=dict)

    def event_id(self) -> str:
        """The SSE id of the client's position now."""
        return ";".join([self.entry, *(f"{s}.{a}.{n}" for (s, a), n in
                                       sorted(self.chunks.items()))])

    def entry_seen(self, entry: Entry) -> None:
        self.entry = entry.id
        e = entry.event
        if isinstance(e, _OUTCOMES):
            for step, attempt in [k for k in self.chunks if k[0] == e.step]:
                del self.chunks[(step, attempt)]

    def fresh(self, chunk: Partial) -> bool:
        """Whether ``chunk`` is one the client has not had (and note it as had)."""
        at = (chunk.step, chunk.attempt)
        if chunk.seq <= self.chunks.get(at, 0):
            return False
        for old in [k for k in self.chunks if k[0] == chunk.step and k[1] < chunk.attempt]:
            del self.chunks[old]  # a new dispatch of the step: the old one's chunks are over
        self.chunks[at] = chunk.seq
        return True


def resume_from(last_event_id: str | None) -> Resume:
    """The position a client's ``Last-Event-ID`` (or ``?from=``) names; ``UsageError`` for
    one this stream never sent."""
    if not last_event_id:
        return Resume()
    entry, *chunks = last_event_id.strip().split(";")
    if not _ENTRY_ID.match(entry):
        raise UsageError(f"not an event id of this stream: {last_event_id[:80]!r} (an entry "
                         "id such as 1795973278178-1, then ;step.attempt.seq per step)")
    resume = Resume(entry)
    for chunk in chunks:
        m = _POSITION.match(chunk)
        if m is None:
            raise UsageError(f"not an event id of this stream: {last_event_id[:80]!r}")
        resume.chunks[(int(m[1]), int(m[2]))] = int(m[3])
    return resume


def _frame(event: str, data: Any, event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, default=str)}\n\n"


def _entry_data(entry: Entry) -> dict[str, Any]:
    e = entry.event
    if e is None:
        return {"id": entry.id, "type": "undecodable", "error": entry.error}
    fields = shown(msgspec.to_builtins(e))  # a sealed value stays "***": never opened here
    return {"id": entry.id, "seq": e.seq, "type": e.__struct_config__.tag, "ts": e.ts,
            "actor": e.actor, "event": fields}


async def event_stream(aredis: redis.asyncio.Redis, layout: keys.KeyLayout, run_id: str,
                       resume: Resume, *, keepalive_s: float = KEEPALIVE_S,
                       reconnect_s: float = 30.0) -> AsyncIterator[str]:
    """The frames of ``run_id``'s stream from ``resume`` until the run has ended (then
    ``end``), or ``gone`` when there is no such run. The caller has checked who may read
    it."""
    yield f"retry: {RETRY_MS}\n\n"
    items = afollow(aredis, layout, run_id, after=resume.entry, reconnect_s=reconnect_s)
    queue: asyncio.Queue[Entry | Partial | BaseException | None] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for item in items:
                await queue.put(item)
            await queue.put(None)
        except BaseException as exc:  # RunNotFound, Redis gone for good: told to the reader
            await queue.put(exc)

    task = asyncio.create_task(pump())
    try:
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), keepalive_s)
            except TimeoutError:
                yield ": keep-alive\n\n"
                continue
            if item is None:
                break
            if isinstance(item, RunNotFound):
                yield _frame("gone", {"run": run_id})
                return
            if isinstance(item, BaseException):
                yield _frame("error", {"run": run_id, "error": str(item)[:300]})
                return
            if isinstance(item, Partial):
                if resume.fresh(item):
                    yield _frame("partial", {"step": item.step, "attempt": item.attempt,
                                             "seq": item.seq, "data": item.data},
                                 resume.event_id())
                continue
            resume.entry_seen(item)
            yield _frame("entry", _entry_data(item), resume.event_id())
        yield _frame("end", {"run": run_id, "last": resume.entry})
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await items.aclose()  # type: ignore[attr-defined]
