"""Releasing a quarantined run once the code can read and drive it again."""

from __future__ import annotations

from typing import Any

from durable.contention import update_run
from durable.errors import DecodeError, Refused
from durable.log import events as ev
from durable.log import keys
from durable.log.state import RunState
from durable.log.store import RunHandle, Spec, continuity


def release(client: Any, run_id: str, by: str = "operator") -> str:
    """Refold the log with the current code; if it reads, append ``released`` and enqueue.

    Returns the run's state afterwards (still ``quarantined`` when the log is unreadable).
    ``RunContended`` when other writers kept appending meanwhile (nothing released).
    A log that is not one continuous sequence (an entry written around the append script,
    such as a forged ``completed`` next to a real one) is never adopted: ``Refused``.
    """
    broken = continuity(client.log.read(run_id))
    if broken is not None:
        raise Refused(run_id, f"the log is not continuous ({broken}); not released: "
                              "inspect it with `durable verify` and `durable log`")
    def write(handle: RunHandle) -> RunState | None:
        if handle.state.state != "quarantined":
            return None
        client.log.commit(handle, [Spec(ev.Released, {"by": by})], extra={"reason": ""})
        return handle.state

    try:
        released = update_run(client.log, run_id, by, write)
    except DecodeError:
        return "quarantined"
    if released is None:
        return str(client.status(run_id).state)
    client.redis.hdel(keys.QUARANTINE, run_id)
    if not (released.terminal or released.waiting):
        client.enqueue(run_id)
    return str(released.state)
