"""The JSON twins of the pages, for scripts behind the same login: ``/api/runs`` (the runs
page's filters), ``/api/runs/{id}`` (folded state, summary, timeline, steps),
``/api/runs/{id}/diff/{other}`` (two runs side by side, ``durable diff``),
``/api/workers``. Read-only: actions stay POSTs of the pages, with their CSRF token. And
``/metrics``, for Prometheus."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from durable.telemetry.metrics import exposition

from .auth import current
from .pages import Filters, client, diff_reads, run_reads, runs_reads, workers_reads
from .timeline import masked


def _json(data: Any) -> Response:
    def plain(obj: Any) -> Any:
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return dataclasses.asdict(obj)
        raise NotImplementedError
    return Response(msgspec.json.encode(data, enc_hook=plain), media_type="application/json")


async def metrics(request: Request) -> Response:
    """``/metrics`` in Prometheus's text format, without a login (a scraper cannot log in):
    counts and ages only, no run ids, arguments or results. Serve the console behind a proxy
    that restricts ``/metrics`` where even those must stay private."""
    body, content_type = await run_in_threadpool(exposition, client(request))
    return Response(body, media_type=content_type)


async def runs(request: Request) -> Response:
    current(request)
    found, counts, waiting, held = await run_in_threadpool(runs_reads, client(request),
                                                           Filters.of(request))
    return _json({"counts": counts, "runs": found, "waiting": waiting, "held": held})


async def run(request: Request) -> Response:
    current(request)
    data = await run_in_threadpool(run_reads, client(request), request.path_params["run_id"])
    tl = data["tl"]
    return _json({"run_id": data["run_id"], "summary": data["summary"],
                  "state": masked(msgspec.to_builtins(data["state"])), "lease": data["lease"],
                  "status": data["status"], "holder": data["holder"],
                  "timeline": tl.rows, "steps": tl.steps, "checkpoints": tl.checkpoints,
                  "open_approvals": [{"request": a.approval.request, "tool": a.tool,
                                      "args": a.args, "digest": a.approval.digest,
                                      "evidence": a.approval.evidence,
                                      "expires": a.approval.expires}
                                     for a in data["approvals"]]})


async def workers(request: Request) -> Response:
    current(request)
    return _json(await run_in_threadpool(workers_reads, client(request)))


async def diff_api(request: Request) -> Response:
    current(request)
    return _json(await run_in_threadpool(diff_reads, request))
