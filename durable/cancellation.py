"""Cancellation: the token tools see, the pub/sub hint format, and the events that record a
cancel (``record_cancel``) and end one (``finish_specs``), shared by every process.

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

from durable.errors import BadCancelMessage, ConflictError, DecodeError, RunNotFound, Terminal
from durable.log import events as ev
from durable.log.keys import RUN_ID_RE
from durable.log.state import RunState
from durable.log.store import EventLog, RunHandle, Spec, now_ms


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
    if scope not in ("run", "call") or not isinstance(reason, str) or not isinstance(ts, int):
        raise BadCancelMessage("malformed", "invalid 'scope', 'reason' or 'ts'")
    msg = CancelMessage(run=run, reason=reason[:500], scope=scope, ts=ts)
    if secret:
        sig = body.get("sig")
        if not isinstance(sig, str) or not hmac.compare_digest(sig, sign(msg, secret)):
            raise BadCancelMessage("forged", f"bad signature for run {run}")
    return msg


def record_cancel(elog: EventLog, msg: CancelMessage, actor: str) -> RunHandle | None:
    """Make sure the log holds a cancel request for ``msg.run``; returns the folded run.

    A published message is only a hint: this is what turns it into a fact (or finds that the
    fact is already there) before anyone acts on it. None when the run is gone, unreadable
    or terminal.
    """
    for _ in range(5):
        try:
            handle = elog.load(msg.run, actor=actor)
        except (RunNotFound, DecodeError):
            return None
        state = handle.state
        if state.terminal or state.cancel is not None:
            return handle
        try:
            elog.commit(handle, [Spec(ev.CancelRequested, {
                "reason": msg.reason, "scope": msg.scope, "requested_ts": msg.ts or now_ms(),
                "by": actor})])
            return handle
        except ConflictError:
            continue
        except Terminal:
            return None
    return None


def finish_specs(state: RunState, reason: str, requested_ts: int) -> list[Spec]:
    """The events that end a run-scoped cancel: the open call's fate, then ``canceled``.

    A call decided but not sent is canceled. A call dispatched by a worker that is gone is
    *interrupted*: nobody knows whether it applied, and the reconciler asks its ``lookup``
    once the deadline has passed. A call whose outcome is already unknown stays so.
    """
    specs: list[Spec] = []
    act = state.current
    if act is not None and act.status in ("decided", "not_applied"):
        specs.append(Spec(ev.CallCanceled, {"step": act.step, "key": act.key,
                                            "reason": reason}))
    elif act is not None and act.status == "dispatched":
        specs.append(Spec(ev.ActionInterrupted, {
            "step": act.step, "key": act.key,
            "reason": "canceled; the worker that dispatched it was lost"}))
    specs.append(Spec(ev.Canceled, {"reason": reason,
                                    "latency_ms": max(0, now_ms() - requested_ts)}))
    return specs
