"""What the run's log holds of LangGraph's checkpointer contract: the JSON of one record (the
result of a ``<name>.checkpoint`` step), made of entries in the order the saver took them:

- ``{"put": ...}``: a checkpoint (its thread, namespace, id, parent, its metadata, the
  checkpoint without its channel values, and the channel values whose version is new);
- ``{"writes": ...}``: a task's pending writes to a checkpoint (``put_writes``), each with its
  index (LangGraph's ``WRITES_IDX_MAP`` for the special channels);
- ``{"delete": thread}``: a thread forgotten (``delete_thread``).

Values are LangGraph's own serialization (the saver's ``serde``, ``JsonPlusSerializer``:
msgpack with LangChain's types) as ``[type, base64]``; a pickled value is never written and
never read back (``pickle`` is refused on load). A channel value that is a list (a
conversation's messages) is kept as what changed since the channel's previous version: the
number of leading items it keeps of it (``keep``) and the items after them (``tail``), each
item serialized alone. A conversation that grows by two messages a turn records two
messages a turn, not the whole conversation again.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

__all__ = [
    "RECORD_VERSION",
    "Blob",
    "ListBlob",
    "Typed",
    "dump",
    "list_delta",
    "load",
    "load_blob",
    "shown_blob",
]

#: The version of the record's JSON: a record of another version is refused by name.
RECORD_VERSION = 1

#: A value as the serializer gives it: its type and its bytes.
Typed = tuple[str, bytes]


def dump(serde: SerializerProtocol, value: Any) -> Typed:
    """``value`` serialized; a value only pickle could carry is refused (``TypeError``)."""
    typed = serde.dumps_typed(value)
    if typed[0] == "pickle":
        raise TypeError(f"a checkpoint value of type {type(value).__name__} can only be "
                        "pickled, and the run's log never holds a pickle")
    return typed


def load(serde: SerializerProtocol, typed: Typed) -> Any:
    if typed[0] == "pickle":
        raise ValueError("the record holds a pickled value: it is not read back")
    return serde.loads_typed(typed)


def to_json(typed: Typed) -> list[str]:
    return [typed[0], base64.b64encode(typed[1]).decode()]


def from_json(data: Any) -> Typed:
    if not (isinstance(data, list) and len(data) == 2 and all(isinstance(x, str)
                                                              for x in data)):
        raise ValueError(f"not a serialized value: {str(data)[:100]!r}")
    return data[0], base64.b64decode(data[1])


# Channel values, by version -----------------------------------------------------------------


@dataclass(frozen=True)
class Blob:
    """A channel's value at one version, serialized whole (``None``: the channel is empty)."""

    typed: Typed | None

    def as_json(self) -> dict[str, Any]:
        return {"empty": True} if self.typed is None else {"t": to_json(self.typed)}


@dataclass(frozen=True)
class ListBlob:
    """A channel's list value at one version: the first ``keep`` items of its value at
    version ``base`` (``None``: no base), then ``tail``, each item serialized alone."""

    base: str | int | float | None
    keep: int
    tail: tuple[Typed, ...]

    def as_json(self) -> dict[str, Any]:
        return {"base": self.base, "keep": self.keep, "tail": [to_json(t) for t in self.tail]}


def load_blob(data: Any) -> Blob | ListBlob:
    if not isinstance(data, dict):
        raise ValueError(f"not a channel value: {str(data)[:100]!r}")
    if data.get("empty"):
        return Blob(None)
    if "t" in data:
        return Blob(from_json(data["t"]))
    return ListBlob(data.get("base"), int(data["keep"]),
                    tuple(from_json(t) for t in data["tail"]))


@dataclass
class Latest:
    """A list channel's newest version as the saver last stored it: the version, its items
    (a copy of the list: the channel may change its own later) and each item's bytes."""

    version: str | int | float
    items: list[Any]
    typed: list[Typed]


def list_delta(serde: SerializerProtocol, value: list[Any],
               latest: Latest | None) -> tuple[ListBlob, list[Typed]]:
    """``value`` as what changed since ``latest``: the leading items it keeps (the same
    object, or one that serializes the same) and the serialized items after them; with
    every item's bytes (the next version's ``latest``). A conversation that grew by a
    message serializes that message only."""
    keep = 0
    typed: list[Typed] = []
    first: Typed | None = None
    if latest is not None:
        limit = min(len(value), len(latest.items))
        while keep < limit:
            item = value[keep]
            if item is not latest.items[keep]:
                first = dump(serde, item)
                if first != latest.typed[keep]:
                    break
                first = None
            typed.append(latest.typed[keep])
            keep += 1
    tail: list[Typed] = []
    for i, item in enumerate(value[keep:]):
        got = first if i == 0 and first is not None else dump(serde, item)
        tail.append(got)
    typed.extend(tail)
    base = latest.version if latest is not None and keep else None
    return ListBlob(base, keep, tuple(tail)), typed


def shown_blob(blob: Blob | ListBlob) -> int:
    """The bytes a blob holds (what a record costs)."""
    if isinstance(blob, Blob):
        return 0 if blob.typed is None else len(blob.typed[1])
    return sum(len(t[1]) for t in blob.tail)


def writes_json(writes: Sequence[tuple[int, str, Typed]]) -> list[list[Any]]:
    return [[idx, channel, to_json(typed)] for idx, channel, typed in writes]


def writes_from_json(data: Any) -> list[tuple[int, str, Typed]]:
    return [(int(idx), str(channel), from_json(typed)) for idx, channel, typed in data]


def blobs_json(blobs: Mapping[str, tuple[Any, Blob | ListBlob]]) -> dict[str, Any]:
    return {channel: {"v": version, **blob.as_json()}
            for channel, (version, blob) in blobs.items()}
