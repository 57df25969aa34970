"""Reading a run's log from an entry id on, as its followers do (``durable.streams.streaming``, and
its async twin ``durable.streams.async_streaming``): ``XREAD`` replies decoded in order, where a
follow starts, when it ends, and the faults it retries.
"""

from __future__ import annotations

from typing import Any

import redis

from durable.log import events as ev
from durable.log.entries import decode_entry
from durable.log.handle import Entry

#: Entries read per XREAD.
BATCH = 256

#: Faults a follower retries from the last entry it read (for its ``reconnect_s``).
RETRIED = (redis.ConnectionError, redis.TimeoutError)


def xread_entries(reply: Any, run_id: str, actor: str = "") -> list[Entry]:
    """An XREAD reply for ``run_id``'s log as entries (RESP2: ``[[key, rows]]``; RESP3:
    ``{key: [rows]}``). ``actor``: that of the entry before the first (an entry whose actor
    is the previous one's leaves it out)."""
    if not reply:
        return []
    out = []
    if isinstance(reply, dict):
        groups = [(key, rows) for key, value in reply.items() for rows in value]
    else:
        groups = [(key, rows) for key, rows in reply]
    for _key, rows in groups:
        for entry_id, fields in rows:
            entry = decode_entry(entry_id, fields, run_id, actor)
            actor = entry.event.actor if entry.event is not None else actor
            out.append(entry)
    return out


def last_actor(got: list[Entry], actor: str) -> str:
    """The actor of the last entry of ``got`` that decoded (``actor`` when none did)."""
    return next((e.event.actor for e in reversed(got) if e.event is not None), actor)


def ends(entry: Entry) -> bool:
    """Whether ``entry`` ends the run (completed, failed, canceled, expired)."""
    return isinstance(entry.event, ev.TERMINAL_EVENTS)


def after_arg(after: str) -> str:
    """The XREAD id a follow from ``after`` starts at ("", "0" and "-": the beginning)."""
    return "0-0" if after in ("", "0", "-") else after


class Stop:
    """Marks the end of a follow (a terminal event was read, or the run is gone)."""


END = Stop()
