"""The pub/sub hint of a cancel: its format, its signature and the guard against replays.

A cancel is first an event in the run's log (``cancel_requested``), then a message on the
channel ``dx:cancel``. The message is only a hint: whoever receives it records the request
in the log (if it is not there yet) before anything acts on it.

Message format (UTF-8 JSON, one object)::

    {"run": "<run id>", "reason": "<text>", "scope": "run" | "call",
     "ts": <ms since epoch>, "sig": "<hex>"}

``sig`` is required when ``DURABLE_CANCEL_SECRET`` is set: the hex HMAC-SHA256, keyed with
the secret, of ``"<run>|<scope>|<reason>|<ts>"`` -- the whole message: every field, the
reason in full (a message with any other field is malformed). A signed message is then
accepted only within ``DURABLE_CANCEL_MAX_AGE_MS`` of its ``ts`` and only once
(``ReplayGuard``): a captured message published again is refused. From a shell, without a
secret::

    redis-cli PUBLISH dx:cancel '{"run":"r1","reason":"user","scope":"run","ts":0}'

Messages that fail to parse, carry a wrong signature, are too old or replayed change nothing;
each subscriber counts them and reports them once per interval (``durable.backend.subscriber``), in
``dx:stats`` as ``cancel_malformed`` / ``cancel_forged`` / ``cancel_stale`` /
``cancel_replayed``.

The run's log holds the fact; recording it and ending a cancel are
``durable.controls.cancellation``'s, the token a tool sees ``durable.agents.cancel_token``'s.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from dataclasses import dataclass
from typing import Any

from durable.errors import BadCancelMessage
from durable.log.keys import RUN_ID_RE
from durable.log.store import now_ms

__all__ = ["FIELDS", "MAX_REASON", "CancelMessage", "ReplayGuard", "decode_message",
           "encode_message", "sign"]


@dataclass(frozen=True)
class CancelMessage:
    run: str
    reason: str = ""
    scope: str = "run"
    ts: int = 0
    #: The signature it arrived with ("" when unsigned).
    sig: str = ""


#: The fields a message may hold; the signature covers all of them but ``sig``.
FIELDS = frozenset({"run", "reason", "scope", "ts", "sig"})

#: Longest reason kept in the log (the signature covers the reason in full).
MAX_REASON = 500


def _payload(msg: CancelMessage) -> bytes:
    return f"{msg.run}|{msg.scope}|{msg.reason}|{msg.ts}".encode()


def sign(msg: CancelMessage, secret: str) -> str:
    return hmac.new(secret.encode(), _payload(msg), hashlib.sha256).hexdigest()


def encode_message(msg: CancelMessage, secret: str | None) -> str:
    body: dict[str, Any] = {"run": msg.run, "reason": msg.reason, "scope": msg.scope,
                            "ts": msg.ts}
    if secret:
        body["sig"] = sign(msg, secret)
    return json.dumps(body, separators=(",", ":"))


def decode_message(data: bytes | str, secret: str | None) -> CancelMessage:
    """Parse and authenticate a published cancel; raises ``BadCancelMessage``."""
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadCancelMessage("malformed", str(exc)) from None
    if not isinstance(body, dict):
        raise BadCancelMessage("malformed", "not a JSON object")
    run, scope = body.get("run"), body.get("scope", "run")
    reason, ts = body.get("reason", ""), body.get("ts", 0)
    if not isinstance(run, str) or not RUN_ID_RE.match(run):
        raise BadCancelMessage("malformed", "missing or invalid 'run'")
    if scope not in ("run", "call") or not isinstance(reason, str) or \
            not isinstance(ts, int) or isinstance(ts, bool):
        raise BadCancelMessage("malformed", "invalid 'scope', 'reason' or 'ts'")
    unknown = set(body) - FIELDS
    if unknown:
        raise BadCancelMessage("malformed", f"unknown fields {', '.join(sorted(unknown))}")
    msg = CancelMessage(run=run, reason=reason, scope=scope, ts=ts)
    sig = body.get("sig", "")
    if secret:
        # Over the message as received (the reason in full), never over a shortened copy.
        if not isinstance(sig, str) or not hmac.compare_digest(sig, sign(msg, secret)):
            raise BadCancelMessage("forged", f"bad signature for run {run}")
    return CancelMessage(run=run, reason=reason[:MAX_REASON], scope=scope, ts=ts,
                         sig=sig if isinstance(sig, str) else "")


class ReplayGuard:
    """Signed messages are accepted once, and only within ``max_age_ms`` of their ``ts``.

    Each subscriber has its own guard (the worker's and the reconciler's listeners must
    both act on one message): it remembers the signatures it accepted until their
    messages are too old anyway, so a replay is refused whether it comes in the window
    (``replayed``) or after it (``stale``). Nothing is written to Redis. A process that
    restarts forgets; the window bounds what a replay to it could do.
    """

    def __init__(self, max_age_ms: int, limit: int = 100_000) -> None:
        self.max_age_ms = max_age_ms
        self.limit = limit
        self._seen: dict[str, int] = {}  # signature -> when it may be forgotten (ms)
        self._next_purge = 0
        self._lock = threading.Lock()

    def admit(self, msg: CancelMessage, now: int | None = None) -> None:
        """Accept ``msg`` (signed) or raise ``BadCancelMessage`` ("stale" | "replayed")."""
        now = now_ms() if now is None else now
        if abs(now - msg.ts) > self.max_age_ms:
            raise BadCancelMessage("stale", f"message for run {msg.run} is "
                                   f"{(now - msg.ts) / 1000:.1f} s old (ts {msg.ts}); "
                                   f"accepted within {self.max_age_ms} ms")
        with self._lock:
            if msg.sig in self._seen:
                raise BadCancelMessage("replayed", f"message for run {msg.run} "
                                       f"(ts {msg.ts}) was received already")
            if now >= self._next_purge or len(self._seen) >= self.limit:
                self._forget(now)
                self._next_purge = now + self.max_age_ms
            self._seen[msg.sig] = msg.ts + self.max_age_ms

    def _forget(self, now: int) -> None:
        for sig, until in list(self._seen.items()):
            if until < now:
                del self._seen[sig]
        while len(self._seen) >= self.limit:  # all still fresh: drop the oldest
            del self._seen[min(self._seen, key=self._seen.__getitem__)]
