"""A run's parent and children, as the step protocol reaches them: reading a child, waking
a parent whose child ended, cancelling the children of a canceled run.

The same optimistic updates as ``durable.children.wake_parent``, ``child_state`` and
``durable.cancellation.cancel_children`` (load, decide, commit, again on a conflict), their
Redis calls awaited (``workers.redis_io``) so that the driver of the run that makes them
goes on with its other runs meanwhile. Each load or commit is on one run's keys: the
parent's and the child's are written by two script calls, made safe by the child's id being
deterministic (a retried write finds its event there, and does nothing).
"""

from __future__ import annotations

from durable.cancellation import CancelMessage, encode_message
from durable.children import WAKE_ATTEMPTS, parent_wake
from durable.errors import ConflictError, DecodeError, RunNotFound, Terminal
from durable.log import events as ev
from durable.log.keys import CANCEL_CHANNEL
from durable.log.state import RunState
from durable.log.store import EventLog, RunHandle, Spec, now_ms

from .redis_io import RedisIO

#: Attempts of an update of another run before it is given up.
CANCEL_ATTEMPTS = 5


async def child_state(io: RedisIO, elog: EventLog, run_id: str) -> RunState | None:
    """The child's folded state, or None when it cannot be read (not started yet)."""
    try:
        return (await io.load(elog, run_id, actor="reader")).state
    except (RunNotFound, DecodeError):
        return None


async def wake_parent(io: RedisIO, elog: EventLog, child: RunState, actor: str) -> str | None:
    """Resolve the wait of ``child``'s parent when it waits for this child and the child
    is terminal. Returns the parent's id when it was woken (it must be made ready)."""
    if not (child.terminal and child.parent and child.parent_step):
        return None
    for _ in range(WAKE_ATTEMPTS):
        try:
            handle = await io.load(elog, child.parent, actor=actor)
        except (RunNotFound, DecodeError):
            return None
        if (wake := parent_wake(child, handle.state)) is None:
            return None
        try:
            await elog.commit_async(handle, [wake])
            return child.parent
        except ConflictError:
            continue
        except Terminal:
            return None
    return None


async def record_cancel(io: RedisIO, elog: EventLog, msg: CancelMessage,
                        actor: str) -> RunHandle | None:
    """``durable.cancellation.record_cancel``: the log of ``msg.run`` holds a cancel
    request once this returns its folded run (None: gone, unreadable or terminal)."""
    for _ in range(CANCEL_ATTEMPTS):
        try:
            handle = await io.load(elog, msg.run, actor=actor)
        except (RunNotFound, DecodeError):
            return None
        state = handle.state
        if state.terminal or state.cancel is not None:
            return handle
        try:
            await elog.commit_async(handle, [Spec(ev.CancelRequested, {
                "reason": msg.reason, "scope": msg.scope, "requested_ts": msg.ts or now_ms(),
                "by": actor})])
            return handle
        except ConflictError:
            continue
        except Terminal:
            return None
    return None


async def cancel_children(io: RedisIO, elog: EventLog, parent: RunState, reason: str,
                          actor: str, secret: str | None = None) -> list[str]:
    """Ask every live child of ``parent`` to cancel (scope ``run``): the request recorded
    in its log, then the hint published. Returns the children asked."""
    asked = []
    for run_id in parent.children:
        msg = CancelMessage(run=run_id, reason=f"parent {parent.run_id} canceled: {reason}",
                            scope="run")
        handle = await record_cancel(io, elog, msg, actor)
        if handle is None or handle.state.terminal:
            continue
        await io.publish(CANCEL_CHANNEL, encode_message(msg, secret))
        asked.append(run_id)
    return asked
