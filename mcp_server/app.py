"""The Streamable HTTP application of ``durable mcp``.

- ``POST|GET|DELETE /mcp``: the MCP endpoint, the SDK's Streamable HTTP transport (stateful
  sessions, its DNS-rebinding protection on a loopback address, its body limit). A request
  needs a bearer token or a console user's credentials (``durable.security.callers.Access``)
  unless the process serves in development mode: a missing or wrong one is answered 401
  (``WWW-Authenticate`` naming the schemes), a console viewer's 403, each as a JSON-RPC
  error object. The caller is handed to the handlers in the request's scope, and to the
  SDK as its authenticated user, which binds each MCP session to the credentials that
  opened it (another caller's request for that session is answered as an unknown session).
- ``GET /healthz``: ``ok`` while the process serves (no credentials needed).

A client's message that arrives while its session closes (a cancel notification racing the
session's ``DELETE``) makes the SDK's transport answer it twice (its 202, then a 500 once
the closed session refuses the message: python-sdk issue 2741); the second answer is
dropped here, not raised into the server's log (``responded_once``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from durable.security.callers import Access, Caller, NotAllowed

from .door import CALLER
from .server import DurableServer

PATH = "/mcp"


def _refusal(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
    return Response(json.dumps(body), status_code=status, media_type="application/json",
                    headers=headers)


class Admission:
    """The ASGI layer that admits a caller before the SDK's app sees the request (see the
    module); ``access`` None: every request is ``dev_caller`` (development mode)."""

    def __init__(self, app: ASGIApp, access: Access | None, dev_caller: Caller | None) -> None:
        if access is None and dev_caller is None:
            raise ValueError("access or a development caller")
        self.app, self.access, self.dev_caller = app, access, dev_caller

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") != PATH:
            await self.app(scope, receive, send)
            return
        refused, caller = await self.admit(Request(scope))
        if refused is not None:
            await refused(scope, receive, send)
            return
        assert caller is not None
        once = RespondedOnce(send)
        scope[CALLER] = caller
        # The SDK binds a session to the principal that opened it: this caller.
        scope["user"] = AuthenticatedUser(AccessToken(
            token="", client_id=f"{caller.door}:{caller.name}", scopes=[],
            subject=caller.tenant or None))
        try:
            await self.app(scope, receive, once)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            if not once.completed:  # the message was answered: its session had closed
                raise

    async def admit(self, request: Request) -> tuple[Response | None, Caller | None]:
        access = self.access
        if access is None:
            return None, self.dev_caller
        try:
            caller = await run_in_threadpool(access.check, request.headers.get("authorization"))
        except NotAllowed as exc:
            return _refusal(403, f"{exc}; nothing was done"), None
        if caller is None:
            return _refusal(401, f"{access.required} is required",
                            {"WWW-Authenticate": access.challenge}), None
        return None, caller


class ClosedSessionRecords(logging.Filter):
    """Turns the SDK transport's traceback for a message that reached a closed session into
    one warning line (see the module): the client left, nothing is wrong here."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if record.name.startswith("mcp.server.streamable_http") and isinstance(
                error, anyio.ClosedResourceError | anyio.BrokenResourceError):
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg, record.args = "a client's message reached its closed session: " \
                "dropped", ()
        return True


class RespondedOnce:
    """``send``, dropping a response started after one was completed (and its body)."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.completed = self.dropping = False

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start" and self.completed:
            self.dropping = True
        if self.dropping and kind in ("http.response.start", "http.response.body"):
            return
        if kind == "http.response.body" and not message.get("more_body"):
            self.completed = True
        await self.send(message)


def build_app(server: DurableServer, access: Access | None, *, host: str,
              dev_caller: Caller | None = None, body_limit: int) -> Any:
    """The ASGI application serving ``server`` (see the module)."""

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    inner: Starlette = server.streamable_http_app(
        streamable_http_path=PATH, host=host, max_request_body_size=body_limit,
        custom_starlette_routes=[Route("/healthz", healthz, methods=["GET"])])
    return Admission(inner, access, dev_caller)
