"""Live updates by server-sent events: the runs page hears when counts or the newest run
change; a run's page hears each new log entry and the partial output of the step in flight
(``Client.afollow``: entries read with ``XREAD BLOCK``, partials from the run's stream
channel). The browser reloads the part of the page that changed; no event is the data
itself, so a missed one costs nothing but a late refresh."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import redis
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from durable.client import Client
from durable.errors import RunNotFound, UsageError
from durable.streams.sse import event_stream, resume_from
from durable.streams.streaming import Partial

from .auth import caller, current
from .timeline import column

#: Seconds between two looks at the runs' counts; and between two keep-alive comments.
POLL_S = 1.0
KEEPALIVE_S = 15.0

HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def message(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data, default=str)}\n\n"


def _runs_signature(c: Client) -> dict[str, Any]:
    newest = c.runs(limit=1)
    return {"counts": c.counts(),
            "newest": [newest[0].run_id, newest[0].updated] if newest else None}


async def runs_events(request: Request) -> Response:
    current(request)
    c: Client = request.app.state.client

    async def stream() -> AsyncIterator[str]:
        last: dict[str, Any] | None = None
        quiet = 0.0
        yield "retry: 2000\n\n"
        while not await request.is_disconnected():
            try:
                sig = await run_in_threadpool(_runs_signature, c)
            except redis.RedisError as exc:  # Redis away: say so, look again later
                sig = {"unavailable": str(exc)[:200]}
            if sig != last:
                yield message("runs", sig)
                last, quiet = sig, 0.0
            elif quiet >= KEEPALIVE_S:
                yield ": keep-alive\n\n"
                quiet = 0.0
            await asyncio.sleep(POLL_S)
            quiet += POLL_S

    return StreamingResponse(stream(), media_type="text/event-stream", headers=HEADERS)


async def run_events(request: Request) -> Response:
    """The run's entries after ``from`` (the last one the page shows) and partial output,
    until the run is terminal."""
    current(request)
    c: Client = request.app.state.client
    run_id = request.path_params["run_id"]
    after = request.query_params.get("from", "0") or "0"

    async def stream() -> AsyncIterator[str]:
        yield "retry: 2000\n\n"
        items = c.afollow(run_id, from_id=after, client=request.app.state.aredis)
        try:
            async for item in items:
                if isinstance(item, Partial):
                    yield message("partial", {"step": item.step, "attempt": item.attempt,
                                              "seq": item.seq, "data": item.data})
                else:
                    yield message("entry", {"id": item.id, "column": column(item.event),
                                            "type": item.event.__struct_config__.tag
                                            if item.event else "undecodable"})
        except RunNotFound:
            yield message("gone", {"run": run_id})
        finally:
            await items.aclose()  # type: ignore[attr-defined]
        yield message("end", {"run": run_id})

    return StreamingResponse(stream(), media_type="text/event-stream", headers=HEADERS)


async def run_event_stream(request: Request) -> Response:
    """``GET /runs/{id}/events``: the run's entries and partial output as server-sent
    events, resumable by ``Last-Event-ID`` (``durable.streams.sse``), for a logged-in user
    or one sending ``Authorization: Basic``, of a tenant the user may see. An unknown run
    and a run of another tenant are the same 404."""
    user = caller(request)
    c: Client = request.app.state.client
    run_id = request.path_params["run_id"]
    try:
        resume = resume_from(request.headers.get("last-event-id")
                             or request.query_params.get("from"))
    except UsageError as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)
    proj = await run_in_threadpool(c.log.projection, run_id)
    if not proj or not user.sees(proj.get("tenant", "")):
        return JSONResponse({"error": f"no run {run_id}"}, status_code=404)
    frames = event_stream(request.app.state.aredis, c.log.keys, run_id, resume,
                          reconnect_s=c.settings.redis.connect_timeout_s)
    return StreamingResponse(frames, media_type="text/event-stream", headers=HEADERS)
