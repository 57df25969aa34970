"""A run's parent and children, as the step protocol reaches them: reading a child, waking
a parent whose child ended, cancelling the children of a canceled run.

The routines are the library's (``durable.controls.children``,
``durable.controls.cancellation``: load, decide, commit, again on a conflict), awaited with
this worker's Redis calls (``workers.redis_io``) so that the driver of the run that makes
them goes on with its other runs meanwhile. Each load or commit is on one run's keys: the
parent's and the child's are written by two script calls, made safe by the child's id being
deterministic (a retried write finds its event there, and does nothing).

What is the worker's own is what it does when a parent cannot be woken because other
writers kept appending to it (``RunContended``): the step that ended the child is done and
stays done; the parent is left to the reconciler, which looks at a parent waiting for a
child every ``CHILD_POLL_MS``.
"""

from __future__ import annotations

import logging

from durable.controls.cancellation import cancel_children_async
from durable.controls.children import CHILD_POLL_MS, child_state_async, wake_parent_async
from durable.errors import RunContended
from durable.log.state import RunState
from durable.log.store import EventLog

from .redis_io import RedisIO

log = logging.getLogger("durable.worker")


async def child_state(io: RedisIO, elog: EventLog, run_id: str) -> RunState | None:
    """The child's folded state, or None when it cannot be read (not started yet)."""
    return await child_state_async(io, elog, run_id)


async def wake_parent(io: RedisIO, elog: EventLog, child: RunState, actor: str) -> str | None:
    """``durable.controls.children.wake_parent_async``: the parent's id when it was woken (it must
    be made ready); None when there was nothing to wake, or when other writers kept
    appending to it (logged: the reconciler wakes it within ``CHILD_POLL_MS``)."""
    try:
        return await wake_parent_async(io, elog, child, actor)
    except RunContended as exc:
        log.warning("run %s ended, its parent %s not woken now (%s): the reconciler wakes "
                    "it within %d ms", child.run_id, child.parent, exc, CHILD_POLL_MS)
        return None


async def cancel_children(io: RedisIO, elog: EventLog, parent: RunState, reason: str,
                          actor: str, secret: str | None = None) -> list[str]:
    """``durable.controls.cancellation.cancel_children_async``: ask every live child of ``parent``
    to cancel; returns the children asked."""
    return await cancel_children_async(io, elog, parent, reason, actor, secret)
