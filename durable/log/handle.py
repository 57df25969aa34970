"""A writer's view of one run, and the values a read of its log hands out.

A :class:`RunHandle` holds the folded state at a version and the lease it writes under (if
any); :class:`Spec` is an event not yet stamped with its sequence number; :class:`Entry`
is one stream entry read back. ``check_seq`` and ``continuity`` say whether entries are
the unbroken sequence the append script writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from durable.clock import now_ms as now_ms  # the time every writer records
from durable.errors import DecodeError
from durable.log import events as ev
from durable.log.state import Action, RunState


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class Entry:
    """One stream entry: its id and the event, or the reason it could not be decoded."""

    id: str
    event: ev.Event | None
    error: str | None = None


@dataclass
class Spec:
    """An event not yet stamped with its sequence number: the type and its own fields."""

    cls: type[ev.Event]
    fields: dict[str, Any]


@dataclass
class RunHandle:
    run_id: str
    state: RunState
    last_id: str = "0-0"
    ckpt_seq: int = 0
    lease: str = ""
    actor: str = ""
    #: State just before the last ``step_decided`` read from the log (for replay checks).
    pre_intent: RunState | None = None
    #: Version of the last event known to be in Redis; the state may be ahead (staged).
    base_version: int = 0
    #: Events stamped and folded, not yet sent: (their time in ms, the event; a checkpoint
    #: as its bytes, encoded when staged since the state moves on).
    staged: list[tuple[int, ev.Event | bytes]] = field(default_factory=list)
    base_state: str = ""
    staged_ops: list[tuple[str, str, str]] = field(default_factory=list)
    #: What the staged events add to the shared counters (``durable.log.counters``).
    staged_counts: list[tuple[str, int]] = field(default_factory=list)
    #: Arguments of steps whose log entry keeps only their digest (``Tool.log_args``), as
    #: the agent gave them: what is sent. Never written anywhere.
    live_args: dict[int, Any] = field(default_factory=dict)
    #: Large values of the staged outcomes (hash field, bytes): written with them.
    staged_blobs: list[tuple[str, bytes]] = field(default_factory=list)
    #: The actor of the log's last entry (staged ones included), when known: an entry
    #: written by the same actor leaves its actor out (``durable.log.events``). None:
    #: unknown, so the next entry names its actor.
    tail_actor: str | None = None
    #: The version and time (ms) this handle's run was last sealed at, or loaded
    #: (``durable.log.sealer.Sealer.due``: a running run is sealed every N entries or T ms).
    sealed_version: int = 0
    sealed_ms: int = field(default_factory=now_ms)
    #: The next seal checks the chain from the run's first entry, not from its last seal
    #: (which this handle's sealer could not vouch for).
    seal_from_start: bool = False
    #: The signature of the seal this handle wrote last, and of the one it is writing: a
    #: seal checked from its own last one needs no signature check.
    own_seal: str = ""
    sealing: str = ""


class CommitOptions(TypedDict, total=False):
    """How ``EventLog.commit`` writes its batch."""

    #: Ledger operations (op, key, value) made in the same script call.
    ledger: Iterable[tuple[str, str, str]]
    #: The batch dispatches a call (its key's claim is checked).
    dispatch: bool
    #: Written even to a terminal run.
    allow_terminal: bool
    #: Appended after the others only when no lease is held.
    if_free: Sequence[Spec]
    #: A checkpoint goes with the batch.
    checkpoint: bool
    #: Fields set on the run's projection.
    extra: dict[str, str] | None
    #: The batch also lets go of the lease.
    release: bool
    #: The batch quarantines the run, and is written even then.
    quarantine: bool
    #: Fields of the run's large values deleted with the batch (``durable.log.context``).
    drop_blobs: Sequence[str]
    #: A terminal run's keys keep the expiry they have (``DURABLE_RETENTION`` is not
    #: counted again from this write).
    keep_expiry: bool


def check_seq(entry_id: str, event: ev.Event, version: int, *, first: bool) -> None:
    """Every entry the append script writes carries the next sequence number: a gap or a
    repeat is an entry written some other way (a raw ``XADD``), and the log is not
    trusted (``DecodeError``: the run is quarantined). The first entry read is the
    checkpoint a load starts from, or the run's first event."""
    if first and isinstance(event, ev.Checkpoint):
        return
    if event.seq != version + 1:
        what = "repeats" if event.seq <= version else "skips to"
        raise DecodeError(entry_id, f"seq {event.seq} {what} after seq {version}: an entry "
                          "not written by the append script (log not continuous)")


def continuity(entries: Sequence[Entry]) -> str | None:
    """Why a whole log is not one continuous sequence 1, 2, 3... (None when it is). An
    undecodable entry is taken to hold its place (whether it can be read is another
    question, which a load answers)."""
    for expected, entry in enumerate(entries, start=1):
        if entry.event is not None and entry.event.seq != expected:
            return f"entry {entry.id} has seq {entry.event.seq} where seq {expected} belongs"
    return None


def latest_actions(state: RunState) -> dict[int, Action]:
    """The actions of the run's latest decision (its step, or its whole parallel group)
    and every open one: what a lean checkpoint keeps."""
    last = state.actions.get(state.step)
    first = (last.group or last.step) if last is not None else state.step
    return {step: act for step, act in state.actions.items()
            if step >= first or not act.settled}
