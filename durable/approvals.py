"""Approver identity: Ed25519-signed decisions, checked against a registry of approver keys.

An approval decision is valid only with a signature made by a key an operator registered
(``durable approvers add NAME --role R --public-key FILE``). The signature covers what the
decision is about, so it cannot be moved to another run, request, action or decision::

    b"durable-approval-v1\\n" + canonical JSON of
    {"decision", "digest", "expires_at", "request", "run"}     (sorted keys, no spaces)

``expires_at`` is the request's own expiry (ms since the epoch, as its
``approval_requested`` event records it; 0 = none). Who signs where: the CLI signs locally
with the approver's private key file (``durable approve ... --approver NAME --key FILE``);
a console signs server-side with the key file configured for its logged-in approver
(``sign_decision``). The client checks a decision before it writes it (``check_decision``),
the worker checks it again right before it sends the approved call, and ``durable verify``
re-checks every recorded one (``check_recorded``). The caller's environment grants nothing.

The registry is one Redis hash, ``dx:approvers``: NAME -> JSON ``{"roles", "public_key"
(base64 of the raw 32 bytes), "fingerprint", "added", "by", "revoked" (ms, 0 = active)}``.
A name is never re-used: rotating a key is adding a new name and revoking the old one, so a
recorded decision always names the one key that signed it. A revoked entry keeps its public
key, so that decisions signed before the revocation still verify.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import redis
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from durable.errors import UsageError
from durable.log import keys
from durable.log.state import Approval

#: What a signature is made over starts with this line (domain separation).
DOMAIN = b"durable-approval-v1\n"

#: Approver names: short, printable, usable as a file name.
NAME_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


def payload(run_id: str, request: str, digest: str, decision: str, expires_at: int) -> bytes:
    """The bytes an approver signs for one decision."""
    body = {"decision": decision, "digest": digest, "expires_at": int(expires_at),
            "request": request, "run": run_id}
    return DOMAIN + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def sign_decision(private_key_pem: bytes, run_id: str, request: str, digest: str,
                  decision: str, expires_at: int) -> str:
    """The base64 Ed25519 signature of a decision, with a PEM (PKCS#8) private key."""
    key = load_private_key(private_key_pem)
    return base64.b64encode(key.sign(payload(run_id, request, digest, decision,
                                             expires_at))).decode()


def signature_valid(public_key: bytes, signature: str, run_id: str, request: str,
                    digest: str, decision: str, expires_at: int) -> bool:
    """Whether ``signature`` (base64) is the raw 32-byte ``public_key``'s over the decision."""
    try:
        sig = base64.b64decode(signature, validate=True)
        Ed25519PublicKey.from_public_bytes(public_key).verify(
            sig, payload(run_id, request, digest, decision, expires_at))
    except (InvalidSignature, ValueError, binascii.Error):
        return False
    return True


# Keys -------------------------------------------------------------------------------------


def load_private_key(pem: bytes) -> Ed25519PrivateKey:
    """A PEM private key (PKCS#8 or OpenSSH), or a one-line ``UsageError``."""
    try:
        if pem.lstrip().startswith(b"-----BEGIN OPENSSH PRIVATE KEY"):
            key: Any = serialization.load_ssh_private_key(pem, password=None)
        else:
            key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise UsageError(f"not a usable private key: {_first_line(exc)}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise UsageError("the private key is not an Ed25519 key")
    return key


def load_public_key(data: bytes) -> bytes:
    """The raw 32 bytes of a public key given as PEM (SubjectPublicKeyInfo), OpenSSH
    (``ssh-ed25519 AAAA...``) or base64 of the raw bytes; else a one-line ``UsageError``."""
    text = data.strip()
    try:
        if text.startswith(b"-----BEGIN"):
            key: Any = serialization.load_pem_public_key(text)
        elif text.startswith(b"ssh-"):
            key = serialization.load_ssh_public_key(text)
        else:
            raw = base64.b64decode(text, validate=True)
            key = Ed25519PublicKey.from_public_bytes(raw)
    except (ValueError, TypeError, UnsupportedAlgorithm, binascii.Error) as exc:
        raise UsageError(f"not a usable public key: {_first_line(exc)}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise UsageError("the public key is not an Ed25519 key")
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_key_of(private_key_pem: bytes) -> bytes:
    """The raw public key that goes with a PEM private key."""
    return load_private_key(private_key_pem).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def fingerprint(public_key: bytes) -> str:
    """A short, stable name for a raw public key: ``ed25519:`` + 16 hex digits of SHA-256."""
    return "ed25519:" + hashlib.sha256(public_key).hexdigest()[:16]


def keygen() -> tuple[bytes, bytes]:
    """A new key pair: (PEM PKCS#8 private key, PEM public key)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# The registry -----------------------------------------------------------------------------


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
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key_bytes(self) -> bytes:
        return base64.b64decode(self.public_key)


class Approvers:
    """The approver registry in Redis (``dx:approvers``)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def add(self, name: str, roles: list[str], public_key: bytes, by: str = "operator",
            now: int | None = None) -> Approver:
        """Register ``name`` with ``roles`` and a raw public key; a name in use (even
        revoked) is refused: rotating is adding a new name, then revoking the old one."""
        if not NAME_RE.match(name):
            raise UsageError(f"invalid approver name {name!r}: use 1-64 of A-Z a-z 0-9 _ . @ -")
        roles = [r for r in roles if r]
        if not roles:
            raise UsageError("an approver needs at least one --role")
        entry = Approver(name=name, roles=sorted(set(roles)),
                         public_key=base64.b64encode(public_key).decode(),
                         fingerprint=fingerprint(public_key),
                         added=_now(now), by=by)
        if not self.redis.hsetnx(keys.APPROVERS, name, _encode(entry)):
            raise UsageError(f"approver {name!r} exists already; to rotate a key, add it "
                             f"under a new name and revoke {name!r}")
        return entry

    def get(self, name: str) -> Approver | None:
        raw = self.redis.hget(keys.APPROVERS, name)
        return None if raw is None else _decode(name, raw)

    def list(self) -> list[Approver]:
        found = [_decode(k.decode(), v) for k, v in self.redis.hgetall(keys.APPROVERS).items()]
        return sorted(found, key=lambda a: a.name)

    def revoke(self, name: str, now: int | None = None) -> Approver:
        """Mark ``name``'s key revoked (kept, so that older decisions still verify)."""
        entry = self.get(name)
        if entry is None:
            raise UsageError(f"no approver {name!r}")
        if entry.revoked:
            return entry
        revoked = Approver(**{**asdict(entry), "revoked": _now(now)})
        self.redis.hset(keys.APPROVERS, name, _encode(revoked))
        return revoked


def _now(now: int | None) -> int:
    return int(time.time() * 1000) if now is None else now


def _encode(entry: Approver) -> str:
    body = asdict(entry)
    extra = body.pop("extra")
    body.pop("name")
    return json.dumps({**extra, **body}, sort_keys=True)


def _decode(name: str, raw: bytes | str) -> Approver:
    try:
        body = json.loads(raw)
        known = {"roles", "public_key", "fingerprint", "added", "by", "revoked"}
        return Approver(name=name, roles=[str(r) for r in body.get("roles", [])],
                        public_key=str(body["public_key"]),
                        fingerprint=str(body.get("fingerprint", "")),
                        added=int(body.get("added", 0)), by=str(body.get("by", "")),
                        revoked=int(body.get("revoked", 0)),
                        extra={k: v for k, v in body.items() if k not in known})
    except (ValueError, KeyError, TypeError, AttributeError):
        # An entry nobody can read grants nothing: a key that verifies nothing.
        return Approver(name=name, roles=[], public_key="", fingerprint="unreadable",
                        revoked=1)


# Checks -----------------------------------------------------------------------------------


def check_decision(approver: Approver | None, name: str, run_id: str, appr: Approval,
                   decision: str, signature: str, *, now: int | None = None,
                   decided_at: int | None = None) -> str | None:
    """Why ``name``'s signed ``decision`` on ``appr`` is not valid, or None when it is.

    ``now``: the time the key must be active at (revocation); ``decided_at``: the time the
    decision is made or was recorded, which must be before the request's expiry.
    """
    at = _now(now)
    if approver is None:
        return f"unknown approver {name!r} (an operator registers keys with " \
               "`durable approvers add`)"
    if approver.revoked and approver.revoked <= at:
        return f"approver {name!r}'s key ({approver.fingerprint}) was revoked"
    if appr.role and appr.role not in approver.roles:
        return f"{name} does not have the role {appr.role!r} " \
               f"(has: {', '.join(approver.roles) or 'none'})"
    when = at if decided_at is None else decided_at
    if appr.expires and appr.expires <= when:
        return f"approval request {appr.request} expired"
    if not signature:
        return f"the decision on {appr.request} carries no signature"
    if not signature_valid(approver.key_bytes, signature, run_id, appr.request, appr.digest,
                           decision, appr.expires):
        return f"the signature is not {name}'s ({approver.fingerprint}) over this decision " \
               f"(run {run_id}, request {appr.request}, its digest, {decision!r}, its expiry)"
    return None


def check_recorded(registry: Approvers, run_id: str, appr: Approval,
                   now: int | None = None) -> str | None:
    """Why a decision recorded in the log does not hold (now), or None when it does.

    What the worker asks before it sends an approved call: the key must still be active.
    """
    if appr.decision is None:
        return None
    name = appr.approver or ""
    approver = registry.get(name) if name else None
    problem = check_decision(approver, name, run_id, appr, appr.decision, appr.sig,
                             now=now, decided_at=appr.decided_at)
    if problem is None and appr.key and approver is not None \
            and appr.key != approver.fingerprint:
        problem = f"the decision names key {appr.key}, {name}'s is {approver.fingerprint}"
    return problem


def check_history(registry: Approvers, run_id: str, appr: Approval) -> str | None:
    """Why a recorded decision was not valid when it was made, or None: what ``verify``
    asks (a key revoked after the decision does not make it invalid)."""
    if appr.decision is None:
        return None
    return check_recorded(registry, run_id, appr, now=appr.decided_at)
