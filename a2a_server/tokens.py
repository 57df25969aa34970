"""Who calls: bearer tokens, each naming a caller and the tenant its tasks belong to.

The tokens file (``DURABLE_A2A_TOKENS`` or ``durable a2a --tokens``) is TOML::

    [tokens.billing-bot]
    sha256 = "<hex SHA-256 of the token>"   # `durable a2a --new-token` prints one
    tenant = "acme"                         # its tasks are acme's; "" (the default): none

Only the token's digest is kept: a token is 32 random bytes, so a plain SHA-256 is enough to
make a leaked file useless (no password to guess). A caller sees and acts on the tasks of
its tenant only: a task id of another tenant is answered as an unknown task. The runs it
starts record the tenant and, as owner, ``a2a:<name>``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable.errors import UsageError
from durable.flow import tenants


@dataclass(frozen=True)
class Caller:
    """An authenticated caller."""

    name: str
    tenant: str = ""

    @property
    def owner(self) -> str:
        """The owner recorded by the runs this caller starts."""
        return f"a2a:{self.name}"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> tuple[str, str]:
    """A new random token and its digest (what the tokens file keeps)."""
    token = secrets.token_urlsafe(32)
    return token, digest(token)


class Tokens:
    """The tokens of one ``durable a2a`` process, read once from its tokens file."""

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
        presented = digest(token.strip())
        found = None
        for known, caller in self.callers.items():  # every entry compared: constant time
            if hmac.compare_digest(known, presented):
                found = caller
        return found

    @classmethod
    def load(cls, path: Path) -> Tokens:
        """Read the tokens file; a bad one is a ``UsageError`` naming what is wrong."""
        try:
            data: Any = tomllib.loads(path.read_text())
        except OSError as exc:
            raise UsageError(f"A2A tokens file {path}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"A2A tokens file {path}: not valid TOML: {exc}") from None
        entries = data.get("tokens")
        if not isinstance(entries, dict) or not entries:
            raise UsageError(f"A2A tokens file {path}: no [tokens.NAME] entries")
        callers: dict[str, Caller] = {}
        for name, entry in entries.items():
            where = f"A2A tokens file {path}: token {name!r}"
            if not isinstance(entry, dict):
                raise UsageError(f"{where}: expected a table with sha256 and tenant")
            sha = entry.get("sha256")
            if not isinstance(sha, str) or len(sha) != 64 or \
                    any(c not in "0123456789abcdef" for c in sha):
                raise UsageError(f"{where}: sha256 must be 64 lowercase hex digits "
                                 "(`durable a2a --new-token` prints one)")
            tenant = entry.get("tenant", "")
            if not isinstance(tenant, str):
                raise UsageError(f"{where}: tenant must be a string")
            try:
                who = tenants.checked(tenant or None, Caller(str(name)).owner, None)
            except UsageError as exc:
                raise UsageError(f"{where}: {exc}") from None
            if sha in callers:
                raise UsageError(f"{where}: the same token as {callers[sha].name!r}")
            callers[sha] = Caller(str(name), who.tenant)
        return cls(callers)
