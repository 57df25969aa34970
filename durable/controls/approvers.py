"""The approver registry: who may sign approval decisions, vouched for by an admin key.

One Redis hash, ``dx:approvers``: NAME -> JSON ``{"roles", "public_key" (base64 of the raw
32 bytes), "fingerprint", "added", "by", "revoked" (ms, 0 = active), "admin_key",
"admin_sig"}``. Each entry is a statement signed by an admin::

    b"durable-approver-v1\\n" + canonical JSON of
    {"added", "by", "fingerprint", "name", "public_key", "revoked", "roles"}

and the processes (workers, the client, ``durable verify``, the console) trust an entry only
when that signature verifies against one of the public keys they are configured with
(``DURABLE_ADMIN_KEYS``: a setting, never Redis). Whoever can write Redis but holds no admin
key cannot register a signer, grant a role or undo a revocation into a fresh entry: an entry
without a valid admin signature grants nothing, and says why (``Approver.distrust``).

What the signature cannot stop is a Redis writer putting back an older entry the admin
signed (an approver's entry from before its revocation). That is why only the admin and
operator ACL users may write the hash at all (``deploy/users.acl``: the others read it
through a read-only selector).

A name is never re-used: rotating an approver's key is adding a new name and revoking the
old one, so a recorded decision always names the one key that signed it. A revoked entry
keeps its public key, so that decisions signed before the revocation still verify. Roles are
only ever added (``grant``): taking one away is revoking the name and adding a new one, so
a decision made under a role never stops verifying later.

Rotating the admin key: add the new public key to ``DURABLE_ADMIN_KEYS`` next to the old one
on every process, re-sign the registry with the new private key (``durable approvers resign
--admin-key NEW``: it re-signs only entries that verify now), then drop the old key.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import msgspec
import redis

from durable import clock
from durable.errors import UsageError
from durable.log import keys
from durable.security.signing import fingerprint, public_key_of, sign, statement, valid

#: What an admin's signature over an approver entry is made over starts with this line.
DOMAIN = b"durable-approver-v1\n"

#: Approver names: short, printable, usable as a file name.
NAME_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")

#: The fields of an entry the admin signs (with its name).
SIGNED = ("roles", "public_key", "fingerprint", "added", "by", "revoked")


@dataclass(frozen=True)
class Approver:
    name: str
    roles: list[str]
    #: Base64 of the raw 32-byte Ed25519 public key.
    public_key: str
    fingerprint: str
    added: int = 0
    by: str = ""
    #: When the key was revoked (ms since the epoch); 0 while it is active.
    revoked: int = 0
    #: Fingerprint of the admin key that signed this entry, and its base64 signature.
    admin_key: str = ""
    admin_sig: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: Why this entry is not trusted (no or a bad admin signature, unreadable), or "".
    distrust: str = ""

    @property
    def key_bytes(self) -> bytes:
        return base64.b64decode(self.public_key)

    def signed_body(self) -> dict[str, Any]:
        body = {name: getattr(self, name) for name in SIGNED}
        return {**body, "name": self.name}


class Approvers:
    """The approver registry in Redis (``dx:approvers``), checked against ``admin_keys``
    (raw Ed25519 public keys:
    ``durable.security.signing.parse_public_keys(settings.security.admin_keys)``)."""

    def __init__(self, client: redis.Redis, admin_keys: Sequence[bytes]) -> None:
        self.redis = client
        self.admin_keys = list(admin_keys)

    # Reading ------------------------------------------------------------------------------

    def get(self, name: str) -> Approver | None:
        raw = self.redis.hget(keys.APPROVERS, name)
        return None if raw is None else self._decode(name, raw)

    def list(self) -> list[Approver]:
        found = [self._decode(k.decode(), v)
                 for k, v in self.redis.hgetall(keys.APPROVERS).items()]
        return sorted(found, key=lambda a: a.name)

    # Writing: each change is signed with an admin's private key (PEM) -----------------------

    def add(self, name: str, roles: Iterable[str], public_key: bytes, *, admin_key: bytes,
            by: str = "operator", now: int | None = None) -> Approver:
        """Register ``name`` with ``roles`` and a raw public key; a name in use (even
        revoked) is refused: rotating is adding a new name, then revoking the old one."""
        if not NAME_RE.match(name):
            raise UsageError(f"invalid approver name {name!r}: use 1-64 of A-Z a-z 0-9 _ . @ -")
        entry = self._signed(Approver(
            name=name, roles=_roles(roles), public_key=base64.b64encode(public_key).decode(),
            fingerprint=fingerprint(public_key), added=_now(now), by=by), admin_key)
        if not self.redis.hsetnx(keys.APPROVERS, name, _encode(entry)):
            raise UsageError(f"approver {name!r} exists already; to rotate a key, add it "
                             f"under a new name and revoke {name!r}")
        return entry

    def grant(self, name: str, roles: Iterable[str], *, admin_key: bytes) -> Approver:
        """Add ``roles`` to an active, trusted entry."""
        entry = self._trusted(name, "grant roles to")
        if entry.revoked:
            raise UsageError(f"approver {name!r} is revoked: add a new name instead")
        return self._put(replace(entry, roles=_roles([*entry.roles, *roles])), admin_key)

    def revoke(self, name: str, *, admin_key: bytes, now: int | None = None) -> Approver:
        """Mark ``name``'s key revoked (kept, so that older decisions still verify)."""
        entry = self._trusted(name, "revoke")
        if entry.revoked:
            return entry
        return self._put(replace(entry, revoked=_now(now)), admin_key)

    def remove_untrusted(self, name: str) -> Approver:
        """Delete an entry no configured admin key vouches for (it grants nothing; this
        only tidies the registry). A trusted entry is never deleted: revoke it."""
        entry = self.get(name)
        if entry is None:
            raise UsageError(f"no approver {name!r}")
        if not entry.distrust:
            raise UsageError(f"approver {name!r} is signed by an admin: revoke it instead "
                             "(its decisions must stay verifiable)")
        self.redis.hdel(keys.APPROVERS, name)
        return entry

    def resign(self, admin_key: bytes,
               adopt: Iterable[str] = ()) -> tuple[Sequence[Approver], dict[str, str]]:
        """Re-sign every entry that verifies now with ``admin_key`` (the step of an admin key
        rotation), and the entries named in ``adopt`` whatever their signature (taking over
        entries written before the registry was signed, after an admin has checked their
        fingerprints). Returns (re-signed entries, {name: why left alone})."""
        wanted = set(adopt)
        done: list[Approver] = []
        left: dict[str, str] = {}
        for entry in self.list():
            if entry.distrust and entry.name not in wanted:
                left[entry.name] = entry.distrust
                continue
            if entry.distrust == "unreadable entry":
                left[entry.name] = entry.distrust
                continue
            done.append(self._put(entry, admin_key))
        missing = wanted - {a.name for a in done} - set(left)
        for name in sorted(missing):
            left[name] = "no such approver"
        return done, left

    # Inside -------------------------------------------------------------------------------

    def _trusted(self, name: str, what: str) -> Approver:
        entry = self.get(name)
        if entry is None:
            raise UsageError(f"no approver {name!r}")
        if entry.distrust:
            raise UsageError(f"cannot {what} {name!r}: {entry.distrust}")
        return entry

    def _put(self, entry: Approver, admin_key: bytes) -> Approver:
        signed = self._signed(entry, admin_key)
        self.redis.hset(keys.APPROVERS, entry.name, _encode(signed))
        return signed

    def _signed(self, entry: Approver, admin_key: bytes) -> Approver:
        if not entry.roles:
            raise UsageError("an approver needs at least one --role")
        public = public_key_of(admin_key)
        if public not in self.admin_keys:
            raise UsageError(
                f"the admin key {fingerprint(public)} is not one of DURABLE_ADMIN_KEYS "
                f"({', '.join(fingerprint(k) for k in self.admin_keys) or 'none set'}): "
                "entries it signs would be refused by every process")
        sig = sign(admin_key, statement(DOMAIN, entry.signed_body()))
        return replace(entry, admin_key=fingerprint(public), admin_sig=sig, distrust="")

    def _decode(self, name: str, raw: bytes | str) -> Approver:
        try:
            body = msgspec.json.decode(raw)
            known = {*SIGNED, "admin_key", "admin_sig"}
            entry = Approver(
                name=name, roles=[str(r) for r in body.get("roles", [])],
                public_key=str(body["public_key"]), fingerprint=str(body.get("fingerprint", "")),
                added=int(body.get("added", 0)), by=str(body.get("by", "")),
                revoked=int(body.get("revoked", 0)), admin_key=str(body.get("admin_key", "")),
                admin_sig=str(body.get("admin_sig", "")),
                extra={k: v for k, v in body.items() if k not in known})
            base64.b64decode(entry.public_key, validate=True)
        except (msgspec.DecodeError, ValueError, KeyError, TypeError, AttributeError):
            # An entry nobody can read grants nothing: a key that verifies nothing.
            return Approver(name=name, roles=[], public_key="", fingerprint="unreadable",
                            revoked=1, distrust="unreadable entry")
        return replace(entry, distrust=self._distrust(entry))

    def _distrust(self, entry: Approver) -> str:
        if not self.admin_keys:
            return "no admin key is configured (DURABLE_ADMIN_KEYS), so no registry entry " \
                   "can be trusted"
        if not entry.admin_sig:
            return f"{entry.name}'s registry entry carries no admin signature"
        message = statement(DOMAIN, entry.signed_body())
        if not any(valid(k, entry.admin_sig, message) for k in self.admin_keys):
            return f"{entry.name}'s registry entry is not signed by an admin key of " \
                   "DURABLE_ADMIN_KEYS (or was changed after it was signed)"
        if entry.fingerprint != fingerprint(entry.key_bytes):
            return f"{entry.name}'s registry entry names the wrong fingerprint"
        return ""


def standing_problem(entry: Approver | None, name: str, role: str, at: int, *,
                     who: str = "signer", purpose: str = "") -> str | None:
    """Why ``name``'s registry entry cannot vouch for what it signs at ``at`` (ms) with the
    role ``role`` ("": any): unknown, not trusted, revoked, or without the role; or None.
    ``who`` names the signer in the message, ``purpose`` what the role is for."""
    if entry is None:
        return f"unknown {who} {name!r} (an admin registers keys with " \
               f"`durable approvers add {name} --role {role or 'ROLE'}`)"
    if entry.distrust:
        return f"{who} {name!r} is not trusted: {entry.distrust}"
    if entry.revoked and entry.revoked <= at:
        return f"{who} {name!r}'s key ({entry.fingerprint}) was revoked"
    if role and role not in entry.roles:
        return f"{name} does not have the role {role!r}{purpose} " \
               f"(has: {', '.join(entry.roles) or 'none'})"
    return None


def _roles(roles: Iterable[str]) -> list[str]:
    return sorted({r for r in roles if r})


def _now(now: int | None) -> int:
    return clock.now_ms() if now is None else now


def _encode(entry: Approver) -> str:
    body = asdict(entry)
    extra = body.pop("extra")
    for inner in ("name", "distrust"):
        body.pop(inner)
    return msgspec.json.encode({**extra, **body}).decode()
