"""Who is asking: logins, the session, CSRF tokens and role checks.

The session is Starlette's signed cookie (``SessionMiddleware``, ``SameSite=strict``,
``HttpOnly``, ``Secure`` with ``--secure-cookies``) holding a session id, the user's name
and a CSRF token; the id must still be in Redis (``console.middleware``: logout deletes
it). Every POST must carry that token in
its form (``csrf``) or an ``X-CSRF-Token`` header, so another site cannot make a logged-in
browser act. Roles are read from the users file on every request, so removing a user or a
role takes effect at once.

Development mode (``durable console --dev``, only on a loopback address): no login, and
every request is the user ``--dev-user`` with every role.
"""

from __future__ import annotations

import base64
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request

from durable.errors import DurableError
from durable.security.users import ROLES, User, Users

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


@dataclass(frozen=True)
class Access:
    """How this console admits people: a users file, or development mode as one user."""

    users: Users | None
    dev_user: str | None = None

    def user(self, request: Request) -> User | None:
        if self.dev_user is not None:
            return User(self.dev_user, ROLES)
        name = request.session.get("user")
        if not isinstance(name, str) or self.users is None:
            return None
        return self.users.get(name)


class LoginRequired(DurableError):
    """Raised by a page that needs a user when there is none: answered with a redirect (the
    app's handler for it; no page catches it as a refusal)."""


def csrf_token(request: Request) -> str:
    token = request.session.get("csrf")
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        request.session["csrf"] = token
    return token


async def check_csrf(request: Request) -> dict[str, Any]:
    """The POST's form, if it carries the session's CSRF token; 403 otherwise."""
    form = dict(await request.form())
    sent = request.headers.get("x-csrf-token") or form.get("csrf")
    expected = request.session.get("csrf")
    if not isinstance(sent, str) or not isinstance(expected, str) or \
            not hmac.compare_digest(sent, expected):
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")
    return form


def current(request: Request) -> User:
    user: User | None = request.app.state.access.user(request)
    if user is None:
        raise LoginRequired
    return user


def caller(request: Request) -> User:
    """Who asks for a read a script or a service makes: the logged-in user, else the user
    whose name and password come as ``Authorization: Basic`` (checked against the users
    file as a login is); 401 with a challenge otherwise."""
    access: Access = request.app.state.access
    user = access.user(request)
    header = request.headers.get("authorization", "")
    if user is None and header[:6].lower() == "basic " and access.users is not None:
        try:
            name, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            name, password = "", ""
        user = access.users.check(name, password) if name else None
    if user is None:
        raise HTTPException(401, "log in, or send a console user's name and password "
                                 "(Authorization: Basic)",
                            headers={"WWW-Authenticate": 'Basic realm="durable console"'})
    return user


def require(request: Request, role: str) -> User:
    """The logged-in user if they have ``role``; 403 otherwise."""
    user = current(request)
    if not user.can(role):
        raise HTTPException(403, f"{user.name} does not have the console role {role!r}")
    return user
