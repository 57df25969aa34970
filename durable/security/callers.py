"""Who calls a front door over HTTP (``durable mcp``, ``durable a2a``): bearer tokens, each
naming a caller and the tenant its runs belong to, and (``Access``) the console's users by
HTTP Basic credentials. A door is named (``door``: ``"mcp"``, ``"a2a"``); the runs its
callers start record the owner ``<door>:<caller>``.

The tokens file is TOML, the format ``durable a2a``'s tokens file has too (one file can
serve both doors)::

    [tokens.billing-bot]
    sha256 = "<hex SHA-256 of the token>"   # `durable mcp --new-token` prints one
    tenant = "acme"                         # its runs are acme's; "" (the default): none

Only the token's digest is kept: a token is 32 random bytes, so a plain SHA-256 is enough to
make a leaked file useless (no password to guess). A caller sees and acts on the runs of
its tenant only.

The console's users file (``durable.security.users``) admits its users by ``Authorization:
Basic``: a user with the console's ``operator`` role (a viewer only reads in the console;
a door's every call can start or cancel a run). The console scopes no tenant to a user's
starts: their runs are the default tenant's, and record the owner ``<door>:user:<name>``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
import time
import tomllib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable.errors import DurableError, UsageError
from durable.flow import tenants
from durable.security.users import User, Users


@dataclass(frozen=True)
class Caller:
    """An authenticated caller of the door ``door``."""

    name: str
    tenant: str = ""
    door: str = "mcp"

    @property
    def owner(self) -> str:
        """The owner recorded by the runs this caller starts."""
        return f"{self.door}:{self.name}"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> tuple[str, str]:
    """A new random token and its digest (what the tokens file keeps)."""
    token = secrets.token_urlsafe(32)
    return token, digest(token)


class Tokens:
    """The tokens of one door's process, read once from its tokens file."""

    def __init__(self, callers: dict[str, Caller]) -> None:
        #: token digest -> caller
        self.callers = callers

    def check(self, header: str | None) -> Caller | None:
        """The caller an ``Authorization: Bearer <token>`` header names; None if none."""
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self.token(token.strip())

    def token(self, token: str) -> Caller | None:
        """The caller of ``token`` itself (stdio: from the environment); None if unknown."""
        presented = digest(token)
        found = None
        for known, caller in self.callers.items():  # every entry compared: constant time
            if hmac.compare_digest(known, presented):
                found = caller
        return found

    @classmethod
    def load(cls, path: Path, door: str = "mcp") -> Tokens:
        """Read the tokens file; a bad one is a ``UsageError`` naming what is wrong."""
        what = f"{door.upper()} tokens file {path}"
        try:
            data: Any = tomllib.loads(path.read_text())
        except OSError as exc:
            raise UsageError(f"{what}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{what}: not valid TOML: {exc}") from None
        entries = data.get("tokens")
        if not isinstance(entries, dict) or not entries:
            raise UsageError(f"{what}: no [tokens.NAME] entries")
        callers: dict[str, Caller] = {}
        for name, entry in entries.items():
            where = f"{what}: token {name!r}"
            if not isinstance(entry, dict):
                raise UsageError(f"{where}: expected a table with sha256 and tenant")
            sha = entry.get("sha256")
            if not isinstance(sha, str) or len(sha) != 64 or \
                    any(c not in "0123456789abcdef" for c in sha):
                raise UsageError(f"{where}: sha256 must be 64 lowercase hex digits "
                                 f"(`durable {door} --new-token` prints one)")
            tenant = entry.get("tenant", "")
            if not isinstance(tenant, str):
                raise UsageError(f"{where}: tenant must be a string")
            try:
                who = tenants.checked(tenant or None, Caller(str(name), door=door).owner, None)
            except UsageError as exc:
                raise UsageError(f"{where}: {exc}") from None
            if sha in callers:
                raise UsageError(f"{where}: the same token as {callers[sha].name!r}")
            callers[sha] = Caller(str(name), who.tenant, door)
        return cls(callers)


class NotAllowed(DurableError):
    """Credentials that are right, of a user whose role may not call (answered 403)."""


#: How long a user's right name and password are remembered (seconds): a caller sends them
#: with every request, and each check costs a scrypt hash (~50 ms of CPU).
REMEMBER_S = 300.0
#: The most credentials remembered at once (the oldest forgotten first).
REMEMBER_MAX = 1024


class Access:
    """Who may call one door's process: bearer tokens, the console's users, or both.

    HTTP Basic sends a user's password with every request, and a console's login checks it
    with scrypt (~50 ms of CPU, by design); the console pays that once per session, a
    client of a door on every call. So a name and password found right are remembered for
    ``remember_s`` seconds, as a keyed digest (HMAC-SHA-256 under a key made at start and
    never written anywhere), at most ``REMEMBER_MAX`` of them: the same credentials again
    cost one HMAC. A wrong password is never remembered: each guess costs the full hash."""

    def __init__(self, tokens: Tokens | None, users: Users | None = None, *,
                 door: str = "mcp", remember_s: float = REMEMBER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if tokens is None and users is None:
            raise ValueError("tokens or users")
        self.tokens, self.users, self.door = tokens, users, door
        self.remember_s, self._clock = remember_s, clock
        self._key = secrets.token_bytes(32)
        #: keyed digest of "name:password" -> (the user, when it was found right)
        self._known: OrderedDict[bytes, tuple[User, float]] = OrderedDict()
        self._lock = threading.Lock()

    def _user(self, name: str, password: str) -> User | None:
        """``Users.check``, remembered when right (see the class)."""
        assert self.users is not None
        mark = hmac.new(self._key, f"{name}:{password}".encode(), "sha256").digest()
        now = self._clock()
        with self._lock:
            known = self._known.get(mark)
            if known is not None and now - known[1] < self.remember_s:
                return known[0]
        user = self.users.check(name, password)
        if user is not None and self.remember_s > 0:
            with self._lock:
                self._known[mark] = (user, now)
                self._known.move_to_end(mark)
                while len(self._known) > REMEMBER_MAX:
                    self._known.popitem(last=False)
        return user

    @property
    def challenge(self) -> str:
        """The ``WWW-Authenticate`` header of a refusal: the schemes this process accepts."""
        return ", ".join(f'{s} realm="durable {self.door}"' for s, on in
                         (("Bearer", self.tokens), ("Basic", self.users)) if on is not None)

    @property
    def required(self) -> str:
        """What a refusal says is required."""
        return " or ".join(what for what, on in (
            ("a bearer token (Authorization: Bearer <token>)", self.tokens),
            ("a console operator's name and password (Authorization: Basic)", self.users))
            if on is not None)

    def check(self, header: str | None) -> Caller | None:
        """The caller an ``Authorization`` header names; None if none (a wrong token, an
        unknown user, a wrong password). A user's first check costs a scrypt hash (~50 ms):
        call it off the event loop. ``NotAllowed``: a user without the ``operator`` role."""
        scheme, _, credentials = (header or "").partition(" ")
        if scheme.lower() == "bearer" and self.tokens is not None:
            return self.tokens.check(header)
        if scheme.lower() != "basic" or self.users is None:
            return None
        try:
            name, colon, password = base64.b64decode(credentials.strip(), validate=True) \
                .decode().partition(":")
        except ValueError:  # not base64, not UTF-8
            return None
        user = self._user(name, password) if colon else None
        if user is None:
            return None
        if not user.can("operator"):
            raise NotAllowed(f"console user {name!r} has no operator role: a viewer may not "
                             "start or cancel runs")
        return Caller(f"user:{name}", door=self.door)
