"""Cancellation: the token tools see, and the pub/sub hint format.

A cancel is first an event in the run's log (``cancel_requested``), then a message on the
channel ``dx:cancel``. The message is only a hint: whoever receives it records the request
in the log (if it is not there yet) before anything acts on it.

Message format (UTF-8 JSON, one object)::

    {"run": "<run id>", "reason": "<text>", "scope": "run" | "call",
     "ts": <ms since epoch>, "sig": "<hex>"}

``sig`` is required when ``DURABLE_CANCEL_SECRET`` is set: the hex HMAC-SHA256, keyed with
the secret, of ``"<run>|<scope>|<reason>|<ts>"``. From a shell::

    redis-cli PUBLISH dx:cancel '{"run":"r1","reason":"user","scope":"run","ts":0}'

Messages that fail to parse, or whose signature is wrong, change nothing and are counted
in ``dx:stats`` as ``cancel_malformed`` / ``cancel_forged``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from durable.keys import RUN_ID_RE


class Cancelled(BaseException):
    """Raised inside a tool that checks its token after a cancel.

    A ``BaseException``, like ``KeyboardInterrupt``: a tool's ``except Exception`` does
    not swallow it.
    """


class CancelToken:
    def __init__(self) -> None:
        self._event = threading.Event()
        self._listeners: list[Callable[[], object]] = []
        self.reason = ""

    def cancel(self, reason: str = "") -> None:
        self.reason = reason
        self._event.set()
        for listener in list(self._listeners):
            listener()

    def add_listener(self, fn: Callable[[], object]) -> None:
        self._listeners.append(fn)
        if self._event.is_set():
            fn()

    def remove_listener(self, fn: Callable[[], object]) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        """Raise ``Cancelled`` if a cancel was signalled."""
        if self._event.is_set():
            raise Cancelled(self.reason)

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; True (early) when cancelled."""
        return self._event.wait(timeout)


@dataclass(frozen=True)
class CancelMessage:
    run: str
    reason: str = ""
    scope: str = "run"
    ts: int = 0


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


class BadMessage(ValueError):
    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind  # "malformed" or "forged"
        super().__init__(f"{kind} cancel message: {detail}")


def decode_message(data: bytes | str, secret: str | None) -> CancelMessage:
    """Parse and authenticate a published cancel; raises ``BadMessage``."""
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadMessage("malformed", str(exc)) from None
    if not isinstance(body, dict):
        raise BadMessage("malformed", "not a JSON object")
    run, scope = body.get("run"), body.get("scope", "run")
    reason, ts = body.get("reason", ""), body.get("ts", 0)
    if not isinstance(run, str) or not RUN_ID_RE.match(run):
        raise BadMessage("malformed", "missing or invalid 'run'")
    if scope not in ("run", "call") or not isinstance(reason, str) or not isinstance(ts, int):
        raise BadMessage("malformed", "invalid 'scope', 'reason' or 'ts'")
    msg = CancelMessage(run=run, reason=reason[:500], scope=scope, ts=ts)
    if secret:
        sig = body.get("sig")
        if not isinstance(sig, str) or not hmac.compare_digest(sig, sign(msg, secret)):
            raise BadMessage("forged", f"bad signature for run {run}")
    return msg
