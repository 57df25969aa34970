"""Cancellation as the run's log records it: the request a published hint turns into a fact
(``record_cancel``), the events that end a cancel (``finish_specs``), and a parent's cancel
passed on to its children (``cancel_children``), shared by every process.

A cancel is first an event in the run's log (``cancel_requested``), then a message on the
channel ``dx:cancel`` (``durable.backend.cancel_messages``: its format, signature and replay
guard). The message is only a hint: whoever receives it records the request in the log (if
it is not there yet) before anything acts on it. The token a tool sees is
``durable.agents.cancel_token``'s.
"""

from __future__ import annotations

import logging

import redis

from durable.backend.cancel_messages import CancelMessage, encode_message
from durable.contention import InPlace, RedisCalls, update_run_async
from durable.errors import (
    DecodeError,
    RunContended,
    RunNotFound,
    Terminal,
)
from durable.log import events as ev
from durable.log.batching import drive
from durable.log.keys import CANCEL_CHANNEL
from durable.log.state import RunState
from durable.log.store import EventLog, RunHandle, Spec, now_ms

log = logging.getLogger("durable.cancellation")


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
