"""Logging in and out: the password check behind a rate limit, and sessions kept in Redis
(``console.middleware``) so that a logout ends the session for every copy of its cookie.

**The rate limit.** Failed logins are counted per user name and per client address over
a sliding window, in Redis (``dx:console:fails:*``: the time of each failure within the
window), so a console restart forgets nothing and several console processes share the
count. An attempt first takes a place in both windows (``login_take.lua``, one call per
key); while either already holds ``LIMIT`` failures within the last ``WINDOW_S``, the
attempt is refused with 429 and ``Retry-After`` (until the oldest failure leaves the
window) without the password being checked, so the right password is refused too. However
fast the attempts come, concurrent ones included, at most ``LIMIT`` passwords are checked
per name and per address in any window. A failed attempt keeps its places; a successful
one gives back the address's and clears its user name's count (not the address's: one
valid account must not reset an address that guesses others).

The address is the one uvicorn sees: behind a proxy, its ``X-Forwarded-For`` when the proxy
connects from an address in ``FORWARDED_ALLOW_IPS`` (uvicorn's default: 127.0.0.1).
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from dataclasses import dataclass
from urllib.parse import quote

import redis
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from durable.log import keys
from durable.log.scripts import Scripts
from durable.security.users import User, Users

from .auth import check_csrf
from .middleware import close_session, open_session
from .pages import client, render

log = logging.getLogger("durable.console")

#: Failed logins allowed per user name and per address within the window.
LIMIT = 5
#: The sliding window failed logins are counted over, seconds.
WINDOW_S = 15 * 60


def _who(value: str) -> str:
    return quote(value, safe="")[:200] or "-"


def subjects(name: str, address: str) -> list[tuple[str, str]]:
    return [("user", _who(name)), ("addr", _who(address))]


@dataclass(frozen=True)
class Locked:
    """A login refused without a look at the password: retry after ``retry_after_s``."""

    retry_after_s: float


@dataclass(frozen=True)
class Attempt:
    """The places one login attempt took in its windows (keys), under ``member``."""

    keys: tuple[str, ...]
    member: str


def take(client: redis.Redis, name: str, address: str) -> Attempt | Locked:
    """Take the attempt's place in the name's and the address's windows; ``Locked`` (the
    places taken given back) while either is full."""
    member, now = f"{time.time_ns()}-{secrets.token_hex(4)}", int(time.time() * 1000)
    scripts = Scripts(client)
    taken: list[str] = []
    refused_ms = 0
    for kind, who in subjects(name, address):
        key = keys.login_failures(kind, who)
        ok, wait_ms = scripts.login_take(keys=[key], args=[now, WINDOW_S * 1000, LIMIT,
                                                           member])
        if int(ok):
            taken.append(key)
        else:
            refused_ms = max(refused_ms, int(wait_ms))
    if refused_ms:
        give_back(client, Attempt(tuple(taken), member))
        return Locked(refused_ms / 1000)
    return Attempt(tuple(taken), member)


def give_back(client: redis.Redis, attempt: Attempt) -> None:
    for key in attempt.keys:
        client.zrem(key, attempt.member)


def full(client: redis.Redis, name: str, address: str) -> list[str]:
    """Which of the name and the address a failure just filled the window of."""
    return [f"{kind} {who}" for kind, who in subjects(name, address)
            if client.zcard(keys.login_failures(kind, who)) >= LIMIT]


def succeeded(client: redis.Redis, name: str, attempt: Attempt) -> None:
    give_back(client, attempt)
    client.delete(keys.login_failures("user", _who(name)))


# Pages -----------------------------------------------------------------------------------



async def login_page(request: Request) -> Response:
    if request.app.state.access.user(request) is not None:
        return RedirectResponse("/runs", 303)
    return render(request, "login.html", {"next": _next(request.query_params.get("next"))})


def _address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def _check(request: Request, users: Users | None, name: str, password: str
           ) -> User | Locked | None:
    """The user; or the lock that refuses the attempt (the password unread); or None."""
    r = client(request).redis
    address = _address(request)
    attempt = take(r, name, address)
    if isinstance(attempt, Locked):
        return attempt
    user = users.check(name, password) if users else None
    if user is None:
        filled = full(r, name, address)
        if filled:
            log.warning("login of %r from %s failed: %d failures within %d s for %s; logins "
                        "refused until the oldest leaves the window", name, address, LIMIT,
                        WINDOW_S, " and ".join(filled))
        return None
    succeeded(r, name, attempt)
    return user


async def login(request: Request) -> Response:
    form = await check_csrf(request)
    name, password = str(form.get("username", "")), str(form.get("password", ""))
    got = await run_in_threadpool(_check, request, request.app.state.access.users, name,
                                  password)
    if isinstance(got, Locked):
        wait = max(math.ceil(got.retry_after_s), 1)
        response = render(request, "login.html", {
            "error": f"too many failed logins: try again in {wait} s",
            "next": _next(form.get("next"))}, 429)
        response.headers["Retry-After"] = str(wait)
        return response
    if got is None:
        return render(request, "login.html", {"error": "wrong name or password",
                                              "next": _next(form.get("next"))}, 401)
    await run_in_threadpool(open_session, client(request).redis, request.session, got.name)
    return RedirectResponse(_next(form.get("next")), 303)


async def logout(request: Request) -> Response:
    await check_csrf(request)
    await run_in_threadpool(close_session, client(request).redis, request.session)
    return RedirectResponse("/login", 303)


def _next(value: object) -> str:
    """Where to go after logging in: a path of this site only."""
    text = value if isinstance(value, str) else ""
    return text if text.startswith("/") and not text.startswith("//") else "/runs"
