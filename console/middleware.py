"""The console's two middlewares, around every request: server-side sessions and
security headers.

**Sessions.** The signed cookie carries a random session id, and Redis holds
``dx:console:session:<sha256 of the id>`` -> the user's name, expiring with the session.
A cookie is a user only while its key exists: logout deletes it, so a cookie saved before
the logout is refused after it (the signature alone would still hold for 12 hours). The key
lives in Redis, so a console restart or a second console process behind the same proxy sees
the same sessions (given the same ``DURABLE_CONSOLE_SECRET``). ``SessionCheck`` runs after
Starlette's ``SessionMiddleware`` (which decodes the cookie): for a session naming a user,
it looks the id up (one ``GET``, on the async client) and clears the session when the key
is gone or names someone else.

**Headers**, on every response (pages, fragments, JSON, server-sent events, static files,
errors). The pages need no inline script or style and fetch nothing from elsewhere: the
policy allows this origin only (plus the ``data:`` favicon), so injected markup cannot run
script, and no other site may frame the console (clickjacking of its buttons).
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

import redis
from starlette.datastructures import MutableHeaders
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from durable.cli.main import redis_problem
from durable.log import keys

#: A session lasts a working day (the cookie's max age and its key's expiry).
SESSION_MAX_AGE_S = 12 * 3600


def _key(sid: str) -> str:
    return keys.console_session(hashlib.sha256(sid.encode()).hexdigest())


def open_session(client: redis.Redis, session: dict[str, Any], user: str,
                 max_age_s: int = SESSION_MAX_AGE_S) -> str:
    """Start a new session for ``user`` in ``session`` (cleared first: a new id and CSRF
    token on every login) and record it in Redis; the new id."""
    session.clear()
    sid = secrets.token_urlsafe(32)
    client.set(_key(sid), user, px=max_age_s * 1000)
    session["sid"], session["user"] = sid, user
    return sid


def close_session(client: redis.Redis, session: dict[str, Any]) -> None:
    """End the session: its key is deleted (the cookie is worth nothing from now on)."""
    sid = session.get("sid")
    if isinstance(sid, str):
        client.delete(_key(sid))
    session.clear()


class SessionCheck:
    """Drop the user from a session whose id is not (or no longer) in Redis."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        session = scope.get("session") if scope["type"] in ("http", "websocket") else None
        if session and "user" in session:
            sid = session.get("sid")
            try:
                name = await scope["app"].state.aredis.get(_key(sid)) \
                    if isinstance(sid, str) else None
            except redis.RedisError as exc:  # who it is cannot be known: say why, one line
                await PlainTextResponse(redis_problem(exc), 503)(scope, receive, send)
                return
            if name is None or name.decode() != session["user"]:
                session.clear()
        await self.app(scope, receive, send)


# Headers ---------------------------------------------------------------------------------

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}


class SecurityHeaders:
    def __init__(self, app: ASGIApp, *, hsts: bool = False) -> None:
        self.app = app
        self.headers = dict(HEADERS)
        if hsts:  # only when served over TLS (``--secure-cookies``)
            self.headers["Strict-Transport-Security"] = "max-age=31536000"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in self.headers.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, with_headers)
