"""The event schema: a versioned, tagged union of frozen msgspec structs, and its codec.

Every log entry is one event encoded with MessagePack (measured against JSON in
``bench/codec.py``: smaller and faster to decode) and stored in the stream field ``e``.

The wire form since v4 (``encode``) is an array, not a map, and leaves out what the entry's
place already says: ``[code, v, seq, attempt, actor, *fields]``, where ``code`` is the
type's number in ``CODES``, ``fields`` are the type's own fields in declaration order with
the trailing defaults cut off, and

- ``run`` is the stream's (the reader passes it in);
- ``ts`` is the entry id's milliseconds (the append script writes each entry under the id
  of its writer's time);
- ``actor`` is nil when it is the previous entry's (a checkpoint always names it);
- a step's ``key`` is nil when it is the run's default ``<run>:<step>``;
- ``deadline`` of ``action_dispatched`` is counted from ``ts``.

Entries of v1-v3 are maps holding every field by name; they are read as before.

The types and the schema-change rules are in ``durable.log.schema``.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from durable.errors import DecodeError
from durable.log.migrations import upcast
from durable.log.schema import (
    EVENT_TYPES,
    TERMINAL_EVENTS,
    ActionDispatched,
    ActionFailed,
    ActionInterrupted,
    ActionReconciled,
    ActionSucceeded,
    ActionTimedOut,
    AgentUpgraded,
    AnyEvent,
    ApprovalDecided,
    ApprovalRequested,
    CallCanceled,
    Canceled,
    CancelRequested,
    Checkpoint,
    Completed,
    ContextTrimmed,
    Event,
    EvidenceChecked,
    Expired,
    Failed,
    LeaseAcquired,
    Quarantined,
    Released,
    ResumeValidated,
    RetiredLeaseLost,
    RevalidationFailed,
    RunStarted,
    StepDecided,
    WaitEntered,
    WaitExpiry,
    WaitResolved,
)

#: Version written into every new event (field ``v``). v2 added runtime identity: the
#: ``agent_upgraded`` and ``revalidation_failed`` events and the approval ``kind``; v3 the
#: ``blob`` reference of an outcome whose result is kept beside the run (older code would
#: read such a step's result as None); v4 the positional wire form (above). Older entries
#: are upcast by ``durable.log.migrations``.
SCHEMA_VERSION = 4

__all__ = [
    "CODES", "ENVELOPE", "EVENT_TYPES", "SCHEMA_VERSION", "TERMINAL_EVENTS",
    "ActionDispatched", "ActionFailed", "ActionInterrupted", "ActionReconciled",
    "ActionSucceeded", "ActionTimedOut", "AgentUpgraded", "AnyEvent", "ApprovalDecided",
    "ApprovalRequested", "CallCanceled", "CancelRequested", "Canceled", "Checkpoint",
    "Completed", "ContextTrimmed", "Event", "EvidenceChecked", "Expired", "Failed", "LeaseAcquired",
    "Quarantined", "Released", "ResumeValidated",
    "RetiredLeaseLost", "RevalidationFailed", "RunStarted", "StepDecided", "WaitEntered",
    "WaitExpiry", "WaitResolved", "decode", "encode", "entry_ms", "from_builtins",
    "named_actor", "to_builtins",
]


#: The wire code of each type (v4 on): never renumbered, never reused.
CODES: dict[str, int] = {
    "run_started": 1, "step_decided": 2, "action_dispatched": 3, "action_succeeded": 4,
    "action_failed": 5, "action_timed_out": 6, "action_interrupted": 7,
    "action_reconciled": 8, "call_canceled": 9, "cancel_requested": 10, "canceled": 11,
    "wait_entered": 12, "wait_resolved": 13, "wait_expired": 14, "approval_requested": 15,
    "approval_decided": 16, "lease_acquired": 17, "lease_lost": 18, "checkpoint": 19,
    "completed": 20, "failed": 21, "expired": 22, "quarantined": 23, "released": 24,
    "revalidation_failed": 25, "agent_upgraded": 26, "context_trimmed": 27,
    "resume_validated": 28, "evidence_checked": 29,
}

#: The fields every event has: in the wire form, given by the entry's place or its head.
ENVELOPE = ("v", "run", "seq", "ts", "actor", "attempt")
_HEAD = 5  # code, v, seq, attempt, actor


class _Layout:
    """A type's own fields in wire order, their defaults, and where the derived ones are."""

    __slots__ = ("cls", "code", "deadline", "defaults", "index", "key", "names", "step",
                 "wire")

    def __init__(self, cls: type[Event]) -> None:
        self.cls = cls
        self.code = CODES[cls.__struct_config__.tag]  # type: ignore[index]
        info = [f for f in msgspec.structs.fields(cls) if f.name not in ENVELOPE]
        self.names = tuple(f.name for f in info)
        self.index = tuple(cls.__struct_fields__.index(n) for n in self.names)
        self.defaults = tuple(
            f.default if f.default is not msgspec.NODEFAULT
            else f.default_factory() if f.default_factory is not msgspec.NODEFAULT
            else _REQUIRED for f in info)
        self.key = self.names.index("key") if {"key", "step"} <= set(self.names) else -1
        self.step = self.names.index("step") if self.key >= 0 else -1
        self.deadline = self.names.index("deadline") if cls.__struct_config__.tag == \
            "action_dispatched" else -1
        #: The entry as decoded (typed, positional, tagged by ``code``): the head's fields,
        #: then the type's own, a derived key being None.
        head: list[Any] = [("v", int), ("seq", int), ("attempt", int), ("actor", str | None)]
        own: list[Any] = [
            (f.name, f.type | None if f.name == "key" and self.key >= 0 else f.type,
             msgspec.field(default_factory=f.default_factory)
             if f.default_factory is not msgspec.NODEFAULT else f.default)
            if not f.required else (f.name, f.type | None if f.name == "key" and self.key >= 0
                                    else f.type)
            for f in info]
        self.wire: type[Any] = msgspec.defstruct(
            f"Wire{cls.__name__}", head + own, array_like=True, kw_only=True, tag=self.code,
            frozen=True, forbid_unknown_fields=True)


_REQUIRED = object()
_LAYOUTS: dict[type[Event], _Layout] = {cls: _Layout(cls) for cls in AnyEvent.__args__}
_BY_CODE: dict[int, _Layout] = {lay.code: lay for lay in _LAYOUTS.values()}
_BY_WIRE: dict[type, _Layout] = {lay.wire: lay for lay in _LAYOUTS.values()}
_wire_decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(
    Union[tuple(_BY_WIRE)])  # noqa: UP007
#: Every type's fields start with the envelope, in this order (``encode`` relies on it).
_BODY = len(ENVELOPE)
if any(cls.__struct_fields__[:_BODY] != ENVELOPE for cls in _LAYOUTS):
    raise TypeError("every event's fields must start with the envelope's")

_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(AnyEvent)
_raw_decoder = msgspec.msgpack.Decoder()


def encode(event: Event, *, same_actor: bool = False) -> bytes:
    """The entry's bytes (the v4 wire form). ``same_actor``: the previous entry of the log
    has this event's actor, which is then left out."""
    lay = _LAYOUTS[type(event)]
    values = msgspec.structs.astuple(event)
    body: Any = values[_BODY:]
    if lay.key >= 0:
        body = list(body)
        if body[lay.key] == f"{values[1]}:{body[lay.step]}":
            body[lay.key] = None
        if lay.deadline >= 0 and body[lay.deadline]:
            body[lay.deadline] -= values[3]
    defaults = lay.defaults
    n = len(body)
    while n and body[n - 1] == defaults[n - 1]:
        n -= 1
    return _encoder.encode((lay.code, SCHEMA_VERSION, values[2], values[5],
                            None if same_actor else values[4], *body[:n]))


def entry_ms(entry_id: str) -> int:
    """The milliseconds of a stream entry id (0 when it is not one)."""
    head = entry_id.split("-", 1)[0]
    return int(head) if head.isdigit() else 0


def decode(data: bytes, entry_id: str = "?", run: str = "", actor: str = "") -> Event:
    """Decode one entry, upcasting older versions; raise ``DecodeError`` otherwise.

    ``run``: the run whose stream holds the entry; ``actor``: the previous entry's actor
    (the one an entry that leaves its own out has).
    """
    if (data[:1] and 0x90 <= data[0] <= 0x9F) or data[:1] in (b"\xdc", b"\xdd"):
        return _decode_array(data, entry_id, run, actor)
    try:
        event: Event = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        raw = _peek(data)
        if isinstance(raw, dict) and isinstance(raw.get("v"), int):
            if raw["v"] <= SCHEMA_VERSION and raw.get("type") not in EVENT_TYPES:
                raise DecodeError(entry_id, f"unknown event type {raw.get('type')!r}") from None
            if raw["v"] > SCHEMA_VERSION:
                raise DecodeError(entry_id, _future(raw["v"])) from None
            if raw["v"] < SCHEMA_VERSION:
                return _upcast(raw, entry_id)
        raise DecodeError(entry_id, f"undecodable entry: {exc}") from None
    if event.v != SCHEMA_VERSION:
        if event.v > SCHEMA_VERSION:
            raise DecodeError(entry_id, _future(event.v))
        return _upcast(_raw_decoder.decode(data), entry_id)
    if not isinstance(event, Event):
        raise DecodeError(entry_id, "not an event")
    return event


def _decode_array(data: bytes, entry_id: str, run: str, actor: str) -> Event:
    try:
        wire = _wire_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DecodeError(entry_id, _why_not(data, exc)) from None
    if wire.v > SCHEMA_VERSION:
        raise DecodeError(entry_id, _future(wire.v))
    lay = _BY_WIRE[type(wire)]
    fields = msgspec.structs.asdict(wire)
    ts = entry_ms(entry_id)
    if lay.key >= 0 and fields["key"] is None:
        fields["key"] = f"{run}:{fields['step']}"
    if lay.deadline >= 0 and fields["deadline"]:
        fields["deadline"] += ts
    fields["run"], fields["ts"] = run, ts
    if fields["actor"] is None:
        fields["actor"] = actor
    event: Event = lay.cls(**fields)
    return event


def _why_not(data: bytes, exc: Exception) -> str:
    """Why a wire entry does not decode, said the way a reader can act on it."""
    raw = _peek(data)
    if not (isinstance(raw, list) and len(raw) >= _HEAD and type(raw[0]) is int
            and type(raw[1]) is int):
        return "undecodable entry: not an event"
    code, v = raw[0], raw[1]
    if v > SCHEMA_VERSION:
        return _future(v)
    lay = _BY_CODE.get(code)
    if lay is None:
        return f"unknown event type code {code}"
    if len(raw) - _HEAD > len(lay.names):
        return f"{len(raw) - _HEAD} fields, more than a {lay.cls.__struct_config__.tag} has"
    return f"invalid entry: {exc}"


def named_actor(data: bytes) -> bool:
    """Whether the entry names its actor (not one that has the previous entry's)."""
    raw = _peek(data)
    return not (isinstance(raw, list) and len(raw) >= _HEAD and raw[4] is None)


def to_builtins(event: Event) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(event)
    return out


def from_builtins(data: dict[str, Any], entry_id: str = "?") -> Event:
    """Build an event from plain data (used by upcasters and fixtures)."""
    try:
        event: Event = msgspec.convert(data, AnyEvent)
    except msgspec.ValidationError as exc:
        raise DecodeError(entry_id, f"invalid entry: {exc}") from None
    return event


def _future(v: int) -> str:
    return f"written by a newer schema version {v} (this code reads up to {SCHEMA_VERSION})"


def _peek(data: bytes) -> Any:
    try:
        return _raw_decoder.decode(data)
    except (msgspec.DecodeError, ValueError):
        return None


def _upcast(raw: dict[str, Any], entry_id: str) -> Event:
    return from_builtins(upcast(raw, SCHEMA_VERSION, entry_id), entry_id)
