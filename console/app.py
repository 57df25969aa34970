"""The Starlette application: routes, the session, templates, errors."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis

try:
    import jinja2  # noqa: F401  (the templates)
    import starlette  # noqa: F401
except ModuleNotFoundError as exc:  # the console is an extra, not a hard dependency
    raise ModuleNotFoundError(f"durable.console needs {exc.name!r}: pip install "
                              "'durable-agents[console]'", name=exc.name) from None
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from durable.cli.main import redis_problem
from durable.cli.output import age
from durable.client import Client
from durable.streams.streaming import async_twin

from . import actions, api, live, login, pages
from .auth import Access, LoginRequired
from .middleware import SESSION_MAX_AGE_S, SecurityHeaders, SessionCheck

HERE = Path(__file__).parent

def when(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(int(ms) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def clock(ms: int | None) -> str:
    """The time of day of a log entry, to the millisecond (UTC; ``when`` has the date)."""
    if not ms:
        return "-"
    return datetime.fromtimestamp(int(ms) / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]


def duration(ms: int | None) -> str:
    """A duration: 840 ms, 12.3 s, 4 min 05 s, 2 h 03 min."""
    if ms is None:
        return "-"
    ms = max(int(ms), 0)
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    s = ms // 1000
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def templates() -> Jinja2Templates:
    t = Jinja2Templates(directory=str(HERE / "templates"))
    t.env.filters["age"] = lambda ms: age(ms) or "-"
    t.env.filters["when"] = when
    t.env.filters["clock"] = clock
    t.env.filters["duration"] = duration
    t.env.filters["ms"] = lambda ms: f"{int(ms)} ms" if ms is not None else "-"
    return t


def _api(request: Request) -> bool:
    """A request of a script, answered in JSON: the API, and a run's event stream."""
    path = request.url.path
    return path.startswith("/api/") or (path.startswith("/runs/") and path.endswith("/events"))


async def _login_required(request: Request, exc: Exception) -> Response:
    if _api(request):
        return JSONResponse({"error": "log in first"}, 401)
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target)}", 303)


async def _redis_down(request: Request, exc: Exception) -> Response:
    """Redis could not be used: one line saying so (no password), not a traceback."""
    assert isinstance(exc, redis.RedisError)
    if _api(request):
        return JSONResponse({"error": redis_problem(exc)}, 503)
    return pages.render(request, "error.html", {"status": 503, "detail": redis_problem(exc)},
                        503)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if _api(request):
        return JSONResponse({"error": exc.detail}, exc.status_code, headers=exc.headers)
    shown = pages.render(request, "error.html", {"status": exc.status_code,
                                                 "detail": exc.detail}, exc.status_code)
    shown.headers.update(exc.headers or {})
    return shown


def build_app(client: Client, access: Access, *, secret: str | None = None,
              https_only: bool = False) -> Starlette:
    """The console over ``client``. ``secret`` signs the session cookie (a random one when
    None: sessions end with the process); ``https_only`` sets the cookie's ``Secure`` flag
    (``--secure-cookies``: served over TLS, directly or by a proxy)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.aredis = async_twin(client.redis)  # one pool for every live follower
        try:
            yield
        finally:
            await app.state.aredis.aclose()

    run = "/runs/{run_id:str}"
    routes: list[Any] = [
        Route("/", pages.home),
        Route("/login", login.login_page, methods=["GET"]),
        Route("/login", login.login, methods=["POST"]),
        Route("/logout", login.logout, methods=["POST"]),
        Route("/runs", pages.runs_page),
        Route("/runs/table", pages.runs_table),
        Route("/approvals", pages.approvals_page),
        Route("/workers", pages.workers_page),
        Route("/api/runs", api.runs),
        Route("/api/runs/{run_id:str}", api.run),
        Route("/api/runs/{run_id:str}/diff/{other:str}", api.diff_api),
        Route("/api/workers", api.workers),
        Route("/metrics", api.metrics),
        Route("/live/runs", live.runs_events),
        Route("/live" + run, live.run_events),
        Route(run, pages.run_page),
        Route(run + "/events", live.run_event_stream),
        Route(run + "/panel", pages.run_panel),
        Route(run + "/state", pages.state_at),
        Route(run + "/diff/{other:str}", pages.diff_page),
        Route(run + "/cancel", actions.cancel, methods=["POST"]),
        Route(run + "/approve", actions.decide, methods=["POST"]),
        Route(run + "/fork", actions.fork, methods=["POST"]),
        Route(run + "/reconcile", actions.reconcile, methods=["POST"]),
        Route(run + "/release", actions.release, methods=["POST"]),
        Route(run + "/settle", actions.settle, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    middleware = [Middleware(SecurityHeaders, hsts=https_only),
                  Middleware(SessionMiddleware, secret_key=secret or secrets.token_urlsafe(32),
                             session_cookie="durable_console", max_age=SESSION_MAX_AGE_S,
                             same_site="strict", https_only=https_only),
                  Middleware(SessionCheck)]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={LoginRequired: _login_required,
                                        HTTPException: _http_error,
                                        redis.RedisError: _redis_down})
    app.state.client = client
    app.state.access = access
    app.state.dev = access.dev_user is not None
    app.state.templates = templates()
    return app
