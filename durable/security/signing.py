"""Ed25519 keys and signatures: what approvers sign decisions with, and what the registry's
admins sign approver entries with.

Every signature here is made over a domain line (what kind of statement it is) followed by
the canonical JSON of the statement (sorted keys, no spaces), so a signature made for one
purpose never verifies for another. Keys are read as PEM (PKCS#8 / SubjectPublicKeyInfo),
OpenSSH, or base64 of the raw 32 bytes; anything else is a one-line ``UsageError``.

``cryptography`` is imported by the functions that use it: a process that neither signs nor
checks a signature does not load it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durable.errors import UsageError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def statement(domain: bytes, body: dict[str, Any]) -> bytes:
    """The bytes signed for ``body`` under ``domain`` (a line ending in a newline)."""
    return domain + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def sign(private_key_pem: bytes, message: bytes) -> str:
    """The base64 Ed25519 signature of ``message`` with a PEM or OpenSSH private key."""
    return base64.b64encode(load_private_key(private_key_pem).sign(message)).decode()


def valid(public_key: bytes, signature: str, message: bytes) -> bool:
    """Whether ``signature`` (base64) is the raw 32-byte ``public_key``'s over ``message``."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        sig = base64.b64decode(signature, validate=True)
        Ed25519PublicKey.from_public_bytes(public_key).verify(sig, message)
    except (InvalidSignature, ValueError, binascii.Error):
        return False
    return True


def load_private_key(pem: bytes) -> Ed25519PrivateKey:
    """A PEM private key (PKCS#8 or OpenSSH), or a one-line ``UsageError``."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

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
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

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
    from cryptography.hazmat.primitives import serialization

    return load_private_key(private_key_pem).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def fingerprint(public_key: bytes) -> str:
    """A short, stable name for a raw public key: ``ed25519:`` + 16 hex digits of SHA-256."""
    return "ed25519:" + hashlib.sha256(public_key).hexdigest()[:16]


def keygen() -> tuple[bytes, bytes]:
    """A new key pair: (PEM PKCS#8 private key, PEM public key)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public


def read_key_file(path: str | Path) -> bytes:
    """A key file's bytes, or a one-line ``UsageError``."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read key file {path}: {exc.strerror or exc}") from None


def parse_public_keys(spec: str | None) -> list[bytes]:
    """Raw public keys from a setting such as ``DURABLE_ADMIN_KEYS``: comma-separated items,
    each a key inline (base64 of the raw 32 bytes, or ``ssh-ed25519 AAAA...``) or the path
    of a file holding one (PEM or OpenSSH). Empty or unset: no key."""
    found: list[bytes] = []
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        inline = item.startswith("ssh-") or (len(item) == 44 and item.endswith("="))
        data = item.encode() if inline else read_key_file(item)
        found.append(load_public_key(data))
    return found


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
