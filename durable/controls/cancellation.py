"""Cancellation: the token tools see, the pub/sub hint format, and the events that record a
cancel (``record_cancel``) and end one (``finish_specs``), shared by every process.

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
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from durable.contention import InPlace, RedisCalls, update_run_async
from durable.errors import (
    BadCancelMessage,
    DecodeError,
    RunContended,
    RunNotFound,
    Signal,
    Terminal,
)
from durable.log import events as ev
from durable.log.batching import drive
from durable.log.keys import CANCEL_CHANNEL, RUN_ID_RE
from durable.log.state import RunState
from durable.log.store import EventLog, RunHandle, Spec, now_ms

log = logging.getLogger("durable.cancellation")


class Cancelled(Signal):
    """Raised inside a tool that checks its token after a cancel.

    A ``BaseException``, like ``KeyboardInterrupt``: a tool's ``except Exception`` does
    not swallow it.
    """


class Overrun(Cancelled):
    """Raised inside a tool call that ran past its deadline, or past its cancel's grace
    period: the worker stops it and records its outcome as unknown."""


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


async def record_cancel_async(io: RedisCalls, elog: EventLog, msg: CancelMessage,
                              actor: str) -> RunHandle | None:
    """Make sure the log holds a cancel request for ``msg.run``; returns the folded run.

    A published message is only a hint: this is what turns it into a fact (or finds that the
    fact is already there) before anyone acts on it. None when the run is gone, unreadable
    or terminal; ``RunContended`` when other writers kept appending meanwhile.
    """
    async def write(handle: RunHandle) -> RunHandle | None:
        state = handle.state
        if state.terminal or state.cancel is not None:
            return handle
        if msg.scope == "call" and await io.elsewhere(lambda: _recorded(elog, msg)):
            return handle  # recorded by its sender, and consumed since: its call has ended
        try:
            await elog.commit_async(handle, [Spec(ev.CancelRequested, {
                "reason": msg.reason, "scope": msg.scope, "requested_ts": msg.ts or now_ms(),
                "by": actor})])
        except Terminal:
            return None
        return handle

    try:
        return await update_run_async(io, elog, msg.run, actor, write)
    except (RunNotFound, DecodeError):
        return None


def record_cancel(elog: EventLog, msg: CancelMessage, actor: str) -> RunHandle | None:
    """``record_cancel_async`` on this thread."""
    return drive(record_cancel_async(InPlace(elog.redis), elog, msg, actor))


#: How long before a message's ``ts`` its sender may have recorded its request (ms).
RECORDED_WINDOW_MS = 60_000


def _recorded(elog: EventLog, msg: CancelMessage) -> bool:
    """Whether the log holds the request ``msg`` announces: its sender records it, then
    publishes (``requested_ts`` no later than the message's ``ts``). A call-scoped request
    ends with its call, so a listener that reads the message after that finds no pending
    cancel, and must not record the same request again for the next call."""
    for entry in reversed(elog.read(msg.run)):
        e = entry.event
        if isinstance(e, ev.CancelRequested) and e.scope == msg.scope \
                and e.reason[:500] == msg.reason[:500] \
                and msg.ts - RECORDED_WINDOW_MS <= e.requested_ts <= msg.ts:
            return True
    return False


def finish_specs(state: RunState, reason: str, requested_ts: int) -> list[Spec]:
    """The events that end a run-scoped cancel: the open call's fate, then ``canceled``.

    A call decided but not sent is canceled. A call dispatched by a worker that is gone is
    *interrupted*: nobody knows whether it applied, and the reconciler asks its ``lookup``
    once the deadline has passed. A call whose outcome is already unknown stays so.
    """
    specs: list[Spec] = []
    for act in state.open_actions:  # several while a parallel group runs
        if act.status in ("decided", "not_applied"):
            specs.append(Spec(ev.CallCanceled, {"step": act.step, "key": act.key,
                                                "reason": reason}))
        elif act.status == "dispatched":
            specs.append(Spec(ev.ActionInterrupted, {
                "step": act.step, "key": act.key,
                "reason": "canceled; the worker that dispatched it was lost"}))
    specs.append(Spec(ev.Canceled, {"reason": reason,
                                    "latency_ms": max(0, now_ms() - requested_ts)}))
    return specs


async def cancel_children_async(io: RedisCalls, elog: EventLog, parent: RunState,
                                reason: str, actor: str,
                                secret: str | None = None) -> list[str]:
    """Ask every live child of ``parent`` to cancel (scope ``run``): the request recorded
    in its log, then the hint published. Returns the children asked.

    A child whose log other writers kept appending to (``RunContended``) is not asked: it
    is logged, and the others are asked still."""
    asked = []
    for run_id in parent.children:
        msg = CancelMessage(run=run_id, reason=f"parent {parent.run_id} canceled: {reason}",
                            scope="run")
        try:
            handle = await record_cancel_async(io, elog, msg, actor)
        except RunContended as exc:
            log.warning("run %s: child %s not asked to cancel: %s", parent.run_id, run_id, exc)
            continue
        if handle is None or handle.state.terminal:
            continue
        await io.publish(CANCEL_CHANNEL, encode_message(msg, secret))
        asked.append(run_id)
    return asked


def cancel_children(elog: EventLog, client: redis.Redis, parent: RunState, reason: str,
                    actor: str, secret: str | None = None) -> list[str]:
    """``cancel_children_async`` on this thread (``client`` publishes the hints)."""
    return drive(cancel_children_async(InPlace(client), elog, parent, reason, actor, secret))
