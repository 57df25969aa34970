"""Stream entries to events and back: decoding in order, sealing and opening fields.

A v4 entry may leave out its actor when the entry before it has the same one
(``durable.log.events``), so entries are decoded in order, each given the actor of the one
before; ``actor_before`` finds it for a read that starts at an offset.
"""

from __future__ import annotations

from typing import Any

import msgspec
import redis
import redis.asyncio

from durable.errors import DecodeError, SealError
from durable.log import events as ev
from durable.log import keys
from durable.log.handle import Entry, text
from durable.security.sealing import TAG, Keyring, contains_envelope, open_all, seal_payloads

#: Every envelope's bytes hold its tag (msgpack keeps map keys as they are).
TAG_BYTES = TAG.encode()

#: Events whose payload may hold sensitive fields (``durable.security.sealing.PAYLOAD_FIELDS``).
SEALABLE: frozenset[type[ev.Event]] = frozenset({
    ev.RunStarted, ev.StepDecided, ev.ActionSucceeded, ev.ActionReconciled, ev.WaitEntered,
    ev.WaitResolved, ev.Completed, ev.Checkpoint})


def decode_entry(entry_id: Any, fields: dict[Any, Any], run_id: str = "",
                 actor: str = "") -> Entry:
    """One entry of ``run_id``'s stream; ``actor``: the previous entry's."""
    eid = text(entry_id)
    data = fields.get(b"e")
    if data is None:
        return Entry(eid, None, "entry has no 'e' field")
    try:
        return Entry(eid, ev.decode(data, eid, run_id, actor))
    except DecodeError as exc:
        return Entry(eid, None, exc.reason)


def actor_before(client: redis.Redis, layout: keys.KeyLayout, run_id: str, raw: Any) -> str:
    """The actor in effect just before the first entry of ``raw`` (read from an offset),
    when that entry leaves its own out ("" when it names it)."""
    if not raw or ev.named_actor(raw[0][1].get(b"e") or b""):
        return ""
    return actor_at(client, layout, run_id, f"({text(raw[0][0])}")


def actor_at(client: redis.Redis, layout: keys.KeyLayout, run_id: str, end: str) -> str:
    """The actor of the entry at ``end`` (an XREVRANGE bound: an id, or ``(id``): that of
    the latest entry up to it that names its own. A checkpoint always does, so this looks
    back at most one checkpoint interval."""
    while True:
        batch = client.xrevrange(layout.log(run_id), end, "-", count=_PAGE)
        found = _named(batch, run_id)
        if found is not None or len(batch) < _PAGE:
            return found or ""
        end = f"({text(batch[-1][0])}"


async def aactor_at(client: redis.asyncio.Redis, layout: keys.KeyLayout, run_id: str,
                    end: str) -> str:
    """``actor_at``, on an asyncio client."""
    while True:
        batch = await client.xrevrange(layout.log(run_id), end, "-", count=_PAGE)
        found = _named(batch, run_id)
        if found is not None or len(batch) < _PAGE:
            return found or ""
        end = f"({text(batch[-1][0])}"


_PAGE = 64


def _named(batch: Any, run_id: str) -> str | None:
    for entry_id, fields in batch:
        data = fields.get(b"e")
        if data and ev.named_actor(data):
            event = decode_entry(entry_id, fields, run_id).event
            return event.actor if event is not None else ""
    return None


def open_entry(entry: Entry, blob: Any, keyring: Keyring, names: set[str]) -> Entry:
    """The entry with its sealed fields opened; one that cannot be opened is an
    undecodable entry (the run is quarantined, never guessed). ``blob``: the entry's
    bytes, to skip at once the entries without an envelope. ``names`` learns the fields
    found sealed, so that what is written next seals them again."""
    event = entry.event
    if event is None or type(event) not in SEALABLE:
        return entry
    if isinstance(blob, bytes) and TAG_BYTES not in blob:
        return entry
    data = msgspec.to_builtins(event)
    if not contains_envelope(data):
        return entry
    try:
        opened = open_all(data, keyring, names)
    except SealError as exc:
        return Entry(entry.id, None, str(exc))
    return Entry(entry.id, msgspec.convert(opened, type(event)))


def encode_event(event: ev.Event, names: set[str], keyring: Keyring, *,
                 same_actor: bool = False) -> bytes:
    """The event as written: its sensitive fields (``names``) sealed."""
    if not names or type(event) not in SEALABLE:
        return ev.encode(event, same_actor=same_actor)
    data = msgspec.to_builtins(event)
    seal_payloads(data, names, keyring)
    return ev.encode(msgspec.convert(data, type(event)), same_actor=same_actor)
