"""Releasing a quarantined run once the code can read and drive it again."""

from __future__ import annotations

from typing import Any

from durable.errors import ConflictError, DecodeError, Refused
from durable.log import events as ev
from durable.log import keys
from durable.log.store import Spec, continuity


def release(client: Any, run_id: str, by: str = "operator") -> str:
    """Refold the log with the current code; if it reads, append ``released`` and enqueue.

    Returns the run's state afterwards (still ``quarantined`` when the log is unreadable).
    A log that is not one continuous sequence (an entry written around the append script,
    such as a forged ``completed`` next to a real one) is never adopted: ``Refused``.
    """
    broken = continuity(client.log.read(run_id))
    if broken is not None:
        raise Refused(run_id, f"the log is not continuous ({broken}); not released: "
                              "inspect it with `durable verify` and `durable log`")
    for _ in range(5):
        try:
            handle = client.log.load(run_id, actor=by)
        except DecodeError:
            return "quarantined"
        if handle.state.state != "quarantined":
            return str(handle.state.state)
        try:
            client.log.commit(handle, [Spec(ev.Released, {"by": by})], extra={"reason": ""})
        except ConflictError:
            continue
        client.redis.hdel(keys.QUARANTINE, run_id)
        if not (handle.state.terminal or handle.state.waiting):
            client.enqueue(run_id)
        return str(handle.state.state)
    return "quarantined"
