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
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from console import actions, api, live, pages
from console.auth import Access, LoginRequired
from durable.cli.main import redis_problem
from durable.cli.output import age
from durable.client import Client
from durable.streaming import async_twin

HERE = Path(__file__).parent

#: A session lasts a working day.
SESSION_MAX_AGE_S = 12 * 3600


def when(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(int(ms) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def templates() -> Jinja2Templates:
    t = Jinja2Templates(directory=str(HERE / "templates"))
    t.env.filters["age"] = lambda ms: age(ms) or "-"
    t.env.filters["when"] = when
    t.env.filters["ms"] = lambda ms: f"{int(ms)} ms" if ms is not None else "-"
    return t


def _api(request: Request) -> bool:
    return request.url.path.startswith("/api/")


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
        return JSONResponse({"error": exc.detail}, exc.status_code)
    return pages.render(request, "error.html", {"status": exc.status_code,
                                                "detail": exc.detail}, exc.status_code)


def build_app(client: Client, access: Access, *, secret: str | None = None,
              https_only: bool = False) -> Starlette:
    """The console over ``client``. ``secret`` signs the session cookie (a random one when
    None: sessions end with the process)."""

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
        Route("/login", pages.login_page, methods=["GET"]),
        Route("/login", pages.login, methods=["POST"]),
        Route("/logout", pages.logout, methods=["POST"]),
        Route("/runs", pages.runs_page),
        Route("/runs/table", pages.runs_table),
        Route("/approvals", pages.approvals_page),
        Route("/workers", pages.workers_page),
        Route("/api/runs", api.runs),
        Route("/api/runs/{run_id:str}", api.run),
        Route("/api/workers", api.workers),
        Route("/metrics", api.metrics),
        Route("/live/runs", live.runs_events),
        Route("/live" + run, live.run_events),
        Route(run, pages.run_page),
        Route(run + "/panel", pages.run_panel),
        Route(run + "/state", pages.state_at),
        Route(run + "/cancel", actions.cancel, methods=["POST"]),
        Route(run + "/approve", actions.decide, methods=["POST"]),
        Route(run + "/fork", actions.fork, methods=["POST"]),
        Route(run + "/reconcile", actions.reconcile, methods=["POST"]),
        Route(run + "/release", actions.release, methods=["POST"]),
        Route(run + "/settle", actions.settle, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    middleware = [Middleware(SessionMiddleware, secret_key=secret or secrets.token_urlsafe(32),
                             session_cookie="durable_console", max_age=SESSION_MAX_AGE_S,
                             same_site="strict", https_only=https_only)]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={LoginRequired: _login_required,
                                        HTTPException: _http_error,
                                        redis.RedisError: _redis_down})
    app.state.client = client
    app.state.access = access
    app.state.dev = access.dev_user is not None
    app.state.templates = templates()
    return app
