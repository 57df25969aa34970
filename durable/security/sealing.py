"""Sensitive fields, sealed at rest: AES-256-GCM envelopes inside the log's events.

A tool names its sensitive argument and result fields (``Tool.sensitive``), an agent its
sensitive input and result fields (``Agent.sensitive``; pydantic ``SecretStr`` fields of its
``input_model`` count too). Wherever such a field appears in an event's payload (a run's
input, a step's arguments, an outcome's result, a wait's data or response, and the same
places inside a checkpoint's state), the value written to Redis is an envelope::

    {"_sealed": "aes-256-gcm", "kid": "k2", "nonce": "<base64>", "ct": "<base64>"}

``ct`` is the value's JSON, encrypted and authenticated with the key ``kid`` (the key id is
the associated data, so an envelope cannot be passed off under another key). Keys come from
``DURABLE_ENCRYPTION_KEYS`` (``id:base64key,...``, 32-byte keys; the first one seals, every
one opens): rotation is adding a new key in front and keeping the old ones for as long as
runs sealed with them are kept.

The worker and the reconciler open envelopes when they read a log (agent and tool code get
the plaintext); every other reader keeps them sealed in the state it folds and shows them as
``***`` (``shown``) unless the caller holds the key. Approval digests are computed over the
plaintext, before sealing.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import msgspec

from durable.errors import SealError, UsageError
from durable.settings import Settings

TAG = "_sealed"
ALGORITHM = "aes-256-gcm"
#: What a sealed value is shown as to a caller without its key.
MASK = "***"

#: Payload fields of an event (and of a checkpoint's state) where sensitive fields live.
PAYLOAD_FIELDS = ("input", "args", "result", "data", "response")


class Keyring:
    """Keys by id; the first one given is the one that seals."""

    def __init__(self, keys: dict[str, bytes], current: str | None) -> None:
        self.keys = keys
        self.current = current

    @classmethod
    def parse(cls, text: str | None) -> Keyring:
        """``id:base64key,id:base64key`` (the first is current); a bad entry is a
        ``UsageError`` naming it, never its key."""
        keys: dict[str, bytes] = {}
        current = None
        for item in [i.strip() for i in (text or "").split(",") if i.strip()]:
            kid, sep, b64 = item.partition(":")
            kid = kid.strip()
            if not sep or not kid:
                raise UsageError("DURABLE_ENCRYPTION_KEYS: each entry is id:base64key")
            try:
                key = base64.b64decode(b64.strip(), validate=True)
            except (binascii.Error, ValueError):
                raise UsageError(f"DURABLE_ENCRYPTION_KEYS: key {kid!r} is not base64") from None
            if len(key) != 32:
                raise UsageError(f"DURABLE_ENCRYPTION_KEYS: key {kid!r} has {len(key)} bytes, "
                                 "not 32 (make one with: openssl rand -base64 32)")
            if kid in keys:
                raise UsageError(f"DURABLE_ENCRYPTION_KEYS: key id {kid!r} is given twice")
            keys[kid] = key
            current = current or kid
        return cls(keys, current)

    def __bool__(self) -> bool:
        return bool(self.keys)

    def seal(self, value: Any) -> dict[str, str]:
        if self.current is None:
            raise UsageError("a sensitive field must be sealed but DURABLE_ENCRYPTION_KEYS "
                             "is not set")
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce = os.urandom(12)
        ct = AESGCM(self.keys[self.current]).encrypt(
            nonce, msgspec.json.encode(value), self.current.encode())
        return {TAG: ALGORITHM, "kid": self.current,
                "nonce": base64.b64encode(nonce).decode(), "ct": base64.b64encode(ct).decode()}

    def holds(self, envelope: dict[str, Any]) -> bool:
        return str(envelope.get("kid")) in self.keys

    def open(self, envelope: dict[str, Any]) -> Any:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        kid = str(envelope.get("kid"))
        key = self.keys.get(kid)
        if key is None:
            raise SealError(kid, "sealed with a key this process does not hold "
                                 "(DURABLE_ENCRYPTION_KEYS)")
        try:
            plain = AESGCM(key).decrypt(base64.b64decode(envelope["nonce"]),
                                        base64.b64decode(envelope["ct"]), kid.encode())
            return msgspec.json.decode(plain)
        except (InvalidTag, KeyError, TypeError, ValueError, msgspec.DecodeError):
            raise SealError(kid, "the sealed value does not open with that key "
                                 "(altered, or another key under the same id)") from None


def settings_keyring(settings: Settings) -> Keyring:
    """The keyring of ``DURABLE_ENCRYPTION_KEYS``."""
    keys = settings.security.encryption_keys
    return Keyring.parse(keys.get_secret_value() if keys is not None else None)


def require_keys(names: Iterable[str], settings: Settings) -> None:
    """For a process that runs agent and tool code (a worker, the reconciler): refuse to
    start when what it serves marks fields sensitive and no key can seal them."""
    wanted = sorted(set(names))
    if wanted and not settings_keyring(settings):
        raise UsageError(f"fields marked sensitive ({', '.join(wanted[:5])}) cannot be "
                         "sealed: set DURABLE_ENCRYPTION_KEYS")


def is_envelope(value: Any) -> bool:
    return isinstance(value, dict) and value.get(TAG) == ALGORITHM and "ct" in value


def contains_envelope(value: Any) -> bool:
    if is_envelope(value):
        return True
    if isinstance(value, dict):
        return any(contains_envelope(v) for v in value.values())
    if isinstance(value, list):
        return any(contains_envelope(v) for v in value)
    return False


def _walk(value: Any, on_envelope: Callable[[dict[str, Any], str | None], Any],
          parent: str | None = None) -> Any:
    if is_envelope(value):
        return on_envelope(value, parent)
    if isinstance(value, dict):
        return {k: _walk(v, on_envelope, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, on_envelope, parent) for v in value]
    return value


def open_all(value: Any, keyring: Keyring, learned: set[str] | None = None) -> Any:
    """``value`` with every envelope opened; the field names they were found under are
    added to ``learned`` (so that a checkpoint written later seals them again). Raises
    ``SealError`` for an envelope that does not open."""

    def open_one(envelope: dict[str, Any], name: str | None) -> Any:
        if learned is not None and name is not None:
            learned.add(name)
        return keyring.open(envelope)

    return _walk(value, open_one)


def shown(value: Any, keyring: Keyring | None = None) -> Any:
    """``value`` for display: envelopes opened when ``keyring`` holds their key, else
    ``***``."""

    def show(envelope: dict[str, Any], name: str | None) -> Any:
        if keyring is not None and keyring.holds(envelope):
            try:
                return keyring.open(envelope)
            except SealError:
                return MASK
        return MASK

    return _walk(value, show)


def contains_sensitive(value: Any, names: Iterable[str]) -> bool:
    """Whether ``value`` has a dict key in ``names`` at any depth."""
    wanted = frozenset(names)
    if isinstance(value, dict):
        return any(k in wanted or contains_sensitive(v, wanted) for k, v in value.items())
    if isinstance(value, list):
        return any(contains_sensitive(v, wanted) for v in value)
    return False


def seal_fields(value: Any, names: Iterable[str], keyring: Keyring) -> Any:
    """``value`` with the value of every dict key in ``names`` (at any depth) sealed;
    envelopes already there are left as they are."""
    wanted = frozenset(names)
    if not wanted:
        return value

    def walk(v: Any) -> Any:
        if is_envelope(v):
            return v
        if isinstance(v, dict):
            return {k: (keyring.seal(x) if k in wanted and not is_envelope(x) else walk(x))
                    for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(value)


def seal_payloads(event: dict[str, Any], names: Iterable[str], keyring: Keyring) -> None:
    """Seal ``names`` inside an event's payload fields, in place (``event`` as builtins);
    for a checkpoint, inside its state's input, result, actions and waits."""
    names = frozenset(names)
    for field in PAYLOAD_FIELDS:
        if event.get(field) is not None:
            event[field] = seal_fields(event[field], names, keyring)
    state = event.get("state")
    if isinstance(state, dict):
        for field in ("input", "result"):
            if state.get(field) is not None:
                state[field] = seal_fields(state[field], names, keyring)
        for action in (state.get("actions") or {}).values():
            for field in ("args", "result"):
                if isinstance(action, dict) and action.get(field) is not None:
                    action[field] = seal_fields(action[field], names, keyring)
        for wait in ("wait", "last_wait"):
            info = state.get(wait)
            if isinstance(info, dict):
                for field in ("data", "response"):
                    if info.get(field) is not None:
                        info[field] = seal_fields(info[field], names, keyring)


def secret_fields(model: Any) -> tuple[str, ...]:
    """Fields of a pydantic model class declared ``SecretStr``/``SecretBytes`` (also inside
    ``Optional``)."""
    from pydantic import SecretBytes, SecretStr

    found = []
    for name, info in getattr(model, "model_fields", {}).items():
        ann = info.annotation
        options = getattr(ann, "__args__", None) or (ann,)
        if any(isinstance(o, type) and issubclass(o, SecretStr | SecretBytes) for o in options):
            found.append(name)
    return tuple(found)


T = TypeVar("T")


def shown_struct(obj: T, keyring: Keyring | None = None) -> T:
    """An event or a folded state (a msgspec Struct) for display: see ``shown``."""
    data = msgspec.to_builtins(obj)
    if not contains_envelope(data):
        return obj
    return msgspec.convert(shown(data, keyring), type(obj))
