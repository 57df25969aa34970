"""Logging in and out: the password check behind a rate limit, and sessions kept in Redis
(``console.middleware``) so that a logout ends the session for every copy of its cookie.

**The rate limit.** Failed logins are counted per user name and per client address,
in Redis (``dx:console:fails:*``, ``dx:console:lock:*``), so a console restart forgets
nothing and several console processes share the count.

After ``LIMIT`` failures within ``WINDOW_S`` (a window renewed by each failure), the name or
address is locked: every login for it is refused with 429 and ``Retry-After`` until the
lock expires, without the password being checked, so the right password is refused too.
The lock lasts ``BASE_LOCK_S`` after the limit is reached and doubles with each further
failure, up to ``MAX_LOCK_S``. A successful login clears its user name's count (not the
address's: one valid account must not reset an address that guesses others).

The address is the one uvicorn sees: behind a proxy, its ``X-Forwarded-For`` when the proxy
connects from an address in ``FORWARDED_ALLOW_IPS`` (uvicorn's default: 127.0.0.1).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from urllib.parse import quote

import redis
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from durable.log import keys
from durable.security.users import User, Users

from .auth import check_csrf
from .middleware import close_session, open_session
from .pages import client, render

log = logging.getLogger("durable.console")

#: Failures allowed within the window before a lock.
LIMIT = 5
#: The counting window (renewed by each failure), seconds.
WINDOW_S = 15 * 60
#: The first lock, doubled with each failure past the limit, up to the last.
BASE_LOCK_S = 1.0
MAX_LOCK_S = 15 * 60.0


def _who(value: str) -> str:
    return quote(value, safe="")[:200] or "-"


def subjects(name: str, address: str) -> list[tuple[str, str]]:
    return [("user", _who(name)), ("addr", _who(address))]


@dataclass(frozen=True)
class Locked:
    """A login refused without a look at the password: retry after ``retry_after_s``."""

    retry_after_s: float


def locked(client: redis.Redis, name: str, address: str) -> Locked | None:
    """The longest lock on the name or the address, if any."""
    pipe = client.pipeline(transaction=False)
    for kind, who in subjects(name, address):
        pipe.pttl(keys.login_lock(kind, who))
    left = max(int(ms) for ms in pipe.execute())
    return Locked(left / 1000) if left > 0 else None


def lock_s(failures: int) -> float:
    """How long a lock lasts after this many failures (0 below the limit)."""
    if failures < LIMIT:
        return 0.0
    return float(min(BASE_LOCK_S * 2 ** min(failures - LIMIT, 30), MAX_LOCK_S))


def failed(client: redis.Redis, name: str, address: str) -> float:
    """Count a failed login; the lock it starts (seconds, 0 for none)."""
    longest = 0.0
    for kind, who in subjects(name, address):
        key = keys.login_failures(kind, who)
        pipe = client.pipeline(transaction=False)  # works on a cluster too
        pipe.incr(key)
        pipe.pexpire(key, WINDOW_S * 1000)
        count = int(pipe.execute()[0])
        seconds = lock_s(count)
        if seconds:
            client.set(keys.login_lock(kind, who), count, px=int(seconds * 1000))
            longest = max(longest, seconds)
    return longest


def succeeded(client: redis.Redis, name: str) -> None:
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
    lock = locked(r, name, address)
    if lock is not None:
        return lock
    user = users.check(name, password) if users else None
    if user is None:
        seconds = failed(r, name, address)
        if seconds:
            log.warning("login of %r from %s failed: logins locked for %.0f s", name,
                        address, seconds)
        return None
    succeeded(r, name)
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
