"""Two runs side by side (``/runs/{run}/diff/{other}``, and its JSON twin
``/api/runs/{run}/diff/{other}``): a counterfactual fork against its parent, or any two
runs, as ``durable diff`` shows them (``durable.audit.diff``). Values with
sensitive-looking names are masked, as on the run page."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from durable.audit.diff import diff
from durable.errors import RunNotFound
from durable.security.sealing import shown

from .auth import current
from .pages import client, render
from .timeline import masked


def diff_reads(request: Request) -> dict[str, Any]:
    c = client(request)
    a, b = request.path_params["run_id"], request.path_params["other"]
    for run in (a, b):
        try:
            c.projection(run)
        except RunNotFound:
            raise HTTPException(404, f"run {run} not found") from None
    found = diff(c.log, a, b)

    def side(value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        return {**value, "result": masked(shown(value["result"], c.log.keyring))}

    return {"a": a, "b": b, "states": [found.a.state, found.b.state],
            "first_divergence": found.first,
            "totals": {a: found.a.totals(), b: found.b.totals()},
            "steps": [{**row, "a": side(row["a"]), "b": side(row["b"])}
                      for row in found.rows]}


def _short(value: Any, limit: int = 90) -> str:
    text = msgspec.json.encode(value).decode()
    return text if len(text) <= limit else text[: limit - 3] + "..."


async def diff_page(request: Request) -> Response:
    current(request)
    data = await run_in_threadpool(diff_reads, request)
    return render(request, "diff.html", {**data, "short": _short})


async def diff_api(request: Request) -> Response:
    current(request)
    data = await run_in_threadpool(diff_reads, request)
    return Response(msgspec.json.encode(data), media_type="application/json")
