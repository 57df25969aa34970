"""Evidence outlives context: an ended run's model context removed, its evidence kept.

A run's **evidence** is what it intended and what happened: intents, idempotency keys,
digests, outcomes, approvals, settles, compensations. Its **model context** is what a
model read and wrote on the way: replies, conversations, the results of tools marked
``context = True`` (``durable.agents.Tool``). Context is large and often personal, and
nobody needs it once the run has ended and its conversation has been continued, so
``DURABLE_CONTEXT_RETENTION`` removes it earlier than ``DURABLE_RETENTION`` removes the run.

The log is append-only and hash-chained, so nothing is cut out of it. Instead, with the
setting, a context result is never written into the log: it is kept beside the run, in its
``dx:{R}:blobs`` hash (``durable.log.blobs``), whatever its size, and the outcome records a
reference with the value's SHA-256 and size, marked ``context`` (and a model call's token
count, ``tokens``, which the fold would otherwise read from the reply). A model request's
messages are never in the log at all (``log_args = "digest"``).

``trim`` removes them: one ``append.lua`` call, on the keys of one run (one slot, on a
cluster), that deletes the fields and appends one ``context_trimmed`` event naming them,
their bytes, the setting and when the run last wrote before it. The removal is therefore
itself in the log, chained and (with ``DURABLE_SEAL_KEY``) sealed again, and there is never a
value gone without the entry that says so. ``verify`` accepts a reference whose value is
gone only when a ``context_trimmed`` names it, and still fails one missing without record.
The call writes under the version it read: of two reconcilers trimming one run, one
writes, the other's call is refused and, read again, finds nothing left to trim.

The run's keys keep their expiry (the trim is not a new start for ``DURABLE_RETENTION``).
Readers that fold a trimmed run see those results as ``None`` with ``Action.trimmed`` set;
``durable log`` and ``replay`` show them removed, and when.
"""

from __future__ import annotations

from dataclasses import dataclass

from durable.errors import ConflictError, Terminal
from durable.log import blobs
from durable.log import events as ev
from durable.log.fold import apply
from durable.log.handle import Entry, RunHandle, Spec, text
from durable.log.state import BlobRef, RunState
from durable.log.store import EventLog

#: Who a trim is recorded as, when the caller does not say.
ACTOR = "context-retention"


@dataclass(frozen=True)
class Trimmed:
    """What ``trim`` removed: the run, the fields, their bytes and the entry recording it."""

    run_id: str
    refs: tuple[str, ...]
    bytes: int
    entry: str


@dataclass
class Removed:
    """A removal as the log records it: when, by which setting, the entry."""

    at: int
    setting: str
    entry: str


def context_refs(entries: list[Entry]) -> list[BlobRef]:
    """The context values kept beside the run, by the outcomes of ``entries`` (and its
    input, when the run's input is kept beside it)."""
    out = []
    for entry in entries:
        ref = blobs.ref_of(entry.event) if entry.event is not None else None
        if ref is not None and ref.context:
            out.append(ref)
    return out


def removed(entries: list[Entry]) -> dict[str, Removed]:
    """Each field a ``context_trimmed`` of ``entries`` names -> its removal."""
    out: dict[str, Removed] = {}
    for entry in entries:
        e = entry.event
        if isinstance(e, ev.ContextTrimmed):
            for name in e.refs:
                out.setdefault(name, Removed(e.ts, e.setting, entry.id))
    return out


def trim(elog: EventLog, run_id: str, setting: str, *, actor: str = ACTOR,
         tries: int = 3) -> Trimmed | None:
    """Remove the model context of the ended run ``run_id`` (see the module doc); None when
    there is none left (or the run has not ended, or is gone). ``setting``: what removed it,
    as recorded (``DURABLE_CONTEXT_RETENTION=7d``)."""
    for _ in range(tries):
        version = elog.redis.hget(elog.keys.run(run_id), "version")
        if version is None:
            return None
        entries = elog.read(run_id)
        state = RunState()
        for entry in entries:
            if entry.event is None:
                return None  # unreadable: the reconciler's other sweeps quarantine it
            apply(state, entry.event, elog.window)
        if not state.terminal or not entries or state.version != int(text(version)):
            return None
        gone = removed(entries)
        refs = [r for r in context_refs(entries) if r.field not in gone]
        if not refs:
            return None
        fields = tuple(dict.fromkeys(r.field for r in refs))
        size = sum({r.field: r.size for r in refs}.values())
        handle = RunHandle(run_id, state, actor=actor, base_version=state.version,
                           base_state=state.state, ckpt_seq=state.version)
        handle.last_id, handle.tail_actor = entries[-1].id, entries[-1].event.actor \
            if entries[-1].event is not None else None
        spec = Spec(ev.ContextTrimmed, {"refs": list(fields), "bytes": size,
                                        "setting": setting, "ended": state.updated})
        try:
            entry_id = elog.commit(handle, [spec], allow_terminal=True, drop_blobs=fields,
                                   keep_expiry=True)
        except (ConflictError, Terminal):
            continue  # another writer (another reconciler's trim): read it again
        return Trimmed(run_id, fields, size, entry_id)
    return None
