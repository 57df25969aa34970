"""The console's users: names, password hashes, roles, and (for approvers) the key that will
sign their decisions. Read by the console (its logins) and by ``durable a2a`` (HTTP Basic
credentials of a console user), so it lives in the library, which both processes import.

The users file (``DURABLE_CONSOLE_USERS``) is TOML or JSON, by its suffix::

    [users.alice]
    password = "scrypt$16384$8$1$<salt>$<hash>"   # `durable console --hash-password`
    roles = ["operator", "approver"]
    approver_key = "keys/alice.pem"                 # relative to the users file
    tenants = ["acme"]                              # optional: runs it may follow over HTTP

Roles: ``viewer`` (every user: read every page), ``operator`` (cancel, fork, reconcile,
release from quarantine), ``approver`` (approve or reject). An approval's own role (e.g.
``finance``) is still checked by the library against ``DURABLE_APPROVERS`` under the same
name: the console's ``approver`` role lets a user press the button, the approval decides
whether that user may decide it.

Passwords are hashed with scrypt (``hashlib.scrypt``, the standard library's binding of
OpenSSL's): memory-hard, with a random salt per user, compared in constant time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable.errors import UsageError

ROLES = frozenset({"viewer", "operator", "approver"})

#: scrypt cost: 16 MiB of memory and ~50 ms per login on a laptop core.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1


@dataclass(frozen=True)
class User:
    name: str
    roles: frozenset[str]
    password_hash: str = field(default="", repr=False)
    #: PEM file of the Ed25519 private key that signs this approver's decisions.
    approver_key: Path | None = None
    #: The tenants whose runs this user may follow over HTTP (``GET /runs/{id}/events``);
    #: empty: every tenant's.
    tenants: frozenset[str] = frozenset()

    def can(self, role: str) -> bool:
        return role == "viewer" or role in self.roles

    def sees(self, tenant: str) -> bool:
        """Whether this user may read a run of ``tenant`` ("": a run of no tenant)."""
        return not self.tenants or tenant in self.tenants


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P,
                            dklen=32)
    return "$".join(["scrypt", str(SCRYPT_N), str(SCRYPT_R), str(SCRYPT_P),
                     base64.b64encode(salt).decode(), base64.b64encode(digest).decode()])


def verify_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        got = hashlib.scrypt(password.encode(), salt=base64.b64decode(salt), n=int(n),
                             r=int(r), p=int(p), dklen=len(expected))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, expected)


class Users:
    """The users of one console process, read once from the users file."""

    def __init__(self, users: dict[str, User]) -> None:
        self.users = users

    def get(self, name: str) -> User | None:
        return self.users.get(name)

    def check(self, name: str, password: str) -> User | None:
        """The user, if the password is theirs. An unknown name costs the same hash."""
        user = self.users.get(name)
        if user is None:
            verify_password(password, _DUMMY)
            return None
        return user if verify_password(password, user.password_hash) else None

    @classmethod
    def load(cls, path: Path) -> Users:
        """Read the users file; a bad one is a ``UsageError`` naming what is wrong."""
        try:
            text = path.read_text()
        except OSError as exc:
            raise UsageError(f"console users file {path}: {exc.strerror or exc}") from None
        try:
            data: Any = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise UsageError(f"console users file {path}: not valid "
                             f"{'JSON' if path.suffix == '.json' else 'TOML'}: {exc}") from None
        entries = data.get("users") if isinstance(data, dict) else None
        if not isinstance(entries, dict) or not entries:
            raise UsageError(f"console users file {path}: no [users.NAME] entries")
        users = {}
        for name, entry in entries.items():
            users[name] = _user(path, str(name), entry)
        return cls(users)


def _user(path: Path, name: str, entry: Any) -> User:
    where = f"console users file {path}: user {name!r}"
    if not isinstance(entry, dict):
        raise UsageError(f"{where}: expected a table with password and roles")
    stored = entry.get("password")
    if not isinstance(stored, str) or not stored.startswith("scrypt$"):
        raise UsageError(f"{where}: password must be a scrypt hash "
                         "(make one with `durable console --hash-password`)")
    roles = entry.get("roles", ["viewer"])
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise UsageError(f"{where}: roles must be a list of names")
    unknown = set(roles) - ROLES
    if unknown:
        raise UsageError(f"{where}: unknown roles {sorted(unknown)} "
                         f"(known: {', '.join(sorted(ROLES))})")
    key = entry.get("approver_key")
    if key is not None and not isinstance(key, str):
        raise UsageError(f"{where}: approver_key must be a file path")
    key_path = (path.parent / key) if key else None
    if key_path is not None and not key_path.is_file():
        raise UsageError(f"{where}: approver_key {key_path} is not a file")
    tenants = entry.get("tenants", [])
    if not isinstance(tenants, list) or not all(isinstance(t, str) for t in tenants):
        raise UsageError(f"{where}: tenants must be a list of tenant names")
    return User(name, frozenset(roles) | {"viewer"}, stored, key_path, frozenset(tenants))


_DUMMY = hash_password("", salt=b"\0" * 16)
