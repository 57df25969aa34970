"""A model step's arguments digested incrementally: the digest and size
``durable.call_identity.digest_placeholder`` gives them, taken one new message at a time.

A model request carries the whole conversation, which grows by a reply and a tool result a
turn: encoding and digesting it whole at every request costs the square of the
conversation's length. The canonical encoding (sorted keys) of arguments holding a list of
messages is the encoding of the other keys sorted before the list (``head``: ending with
``"messages":[``), the encodings of the messages joined by commas, and that of the keys after
it (``tail``: opening with ``]``). ``ListDigest`` keeps the SHA-256 state of the head and the
messages so far after each message, so a request encodes and hashes only the messages it
adds, then its tail. The digest is the one the whole encoding has: logs recorded before
replay unchanged.

A message already digested is known by identity (the same object at the same place; for a
dict, holding the same values: a key given another value in place is seen), or as an equal
copy of it (a framework that builds its input anew at each request), else by its encoding's
fingerprint. A message changed in place deeper down keeps the digest it was
first taken with, the same on every execution of the function (it meets the messages in the
same order). Where a recorded digest differs from the one taken here (a log recorded
before, a message changed in place since), the caller ``reset``s the digest, and the next
request encodes the conversation whole again (``Incremental.of``).

Framework-neutral: the built-in ``chat`` step (``durable.models``) and the integrations'
model steps (``durable.integrations.pydantic_ai.identity``,
``durable.integrations.openai_agents.model``) use it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from operator import is_
from typing import Any, Protocol

import msgspec

__all__ = ["ListDigest", "around", "canonical", "digested"]


def canonical(value: Any) -> bytes:
    """The canonical encoding (sorted-key JSON) the log's digests are taken over."""
    return msgspec.json.encode(value, order="sorted")


def around(fields: Mapping[str, Any], key: str) -> tuple[bytes, bytes]:
    """The canonical encoding of ``{**fields, key: [...]}`` before the list's items (the head)
    and after them (the tail); ``fields`` are JSON data without ``key``."""
    head = b"{" + b"".join(canonical(k) + b":" + canonical(fields[k]) + b","
                           for k in sorted(k for k in fields if k < key))
    tail = b"".join(b"," + canonical(k) + b":" + canonical(fields[k])
                    for k in sorted(k for k in fields if k > key))
    return head + canonical(key) + b":[", b"]" + tail + b"}"


def _mark(data: bytes) -> bytes:
    """A message's fingerprint: its encoding's, to know it again without keeping it."""
    return hashlib.blake2b(data, digest_size=16).digest()


def _values(item: Any) -> tuple[Any, ...] | None:
    """What a dict message holds at its top level (the values themselves, compared by
    identity), to see a key given another value in place; None for other messages."""
    return tuple(item.items()) if isinstance(item, dict) else None


def _same(item: Any, values: tuple[Any, ...] | None) -> bool:
    if values is None:
        return True
    if len(item) != len(values):
        return False
    return all(item.get(k, _same) is v for k, v in values)


def _equal(item: Any, seen: Any, held: tuple[Any, ...] | None) -> bool:
    """Whether ``item`` is a copy of the message ``seen``, which holds what it held when it
    was digested (a framework that builds its input anew at each request: the OpenAI Agents
    SDK): compared without encoding either."""
    if type(item) is not type(seen) or not _same(seen, held):
        return False
    try:
        return bool(item == seen)
    except Exception:  # a value that does not compare (an array): encode and see
        return False


class ListDigest:
    """The digest of arguments holding a growing list (see the module's docstring): one per
    execution of a run's function, for the requests of one kind it takes."""

    def __init__(self, encode: Callable[[Any], bytes] = canonical) -> None:
        #: A message's canonical encoding.
        self.encode = encode
        self.reset()

    def reset(self) -> None:
        """Forget every message: the next request encodes the conversation whole."""
        #: The messages digested, in order, what each held, and each one's fingerprint.
        self._seen: list[Any] = []
        self._held: list[tuple[Any, ...] | None] = []
        self._marks: list[bytes] = []
        self._head = b""
        #: The hash, and the size, of the head and the first ``i`` messages.
        self._states: list[Any] = [hashlib.sha256()]
        self._sizes: list[int] = [0]
        #: Bytes the last request encoded and hashed (its new messages, its head and tail):
        #: what its digest cost, whatever the conversation's length.
        self.encoded = 0

    def of(self, head: bytes, items: Sequence[Any], tail: bytes) -> tuple[str, int]:
        """The digest and size of ``head``, the encodings of ``items`` joined by commas,
        and ``tail`` (``around``): what ``digest_placeholder`` gives the whole arguments."""
        if head != self._head:
            self.reset()
            self._head = head
            self._states[0].update(head)
            self._sizes[0] = len(head)
        encoded = len(head) + len(tail)
        keep, limit = 0, min(len(items), len(self._seen))
        if self._held.count(None) == len(self._held) and all(map(is_, items, self._seen)):
            keep = limit  # the same objects in the same places, none a dict: known at once
        changed: bytes | None = None  # the encoding of the first message not the same
        while keep < limit:
            item, seen, held = items[keep], self._seen[keep], self._held[keep]
            if not (_same(item, held) if item is seen else _equal(item, seen, held)):
                data = self.encode(item)
                encoded += len(data)
                if _mark(data) != self._marks[keep]:
                    changed = data
                    break
                self._seen[keep], self._held[keep] = item, _values(item)  # known from now on
            keep += 1
        del self._seen[keep:], self._held[keep:], self._marks[keep:]
        del self._states[keep + 1:], self._sizes[keep + 1:]
        for item in items[keep:]:
            if changed is None:
                data = self.encode(item)
                encoded += len(data)
            else:
                data, changed = changed, None
            state = self._states[-1].copy()
            comma = b"," if self._seen else b""
            state.update(comma + data)
            self._states.append(state)
            self._sizes.append(self._sizes[-1] + len(comma) + len(data))
            self._seen.append(item)
            self._held.append(_values(item))
            self._marks.append(_mark(data))
        final = self._states[-1].copy()
        final.update(tail)
        self.encoded = encoded
        return final.hexdigest(), self._sizes[-1] + len(tail)


class _Recorded(Protocol):
    def recorded_digest(self, step: int) -> str | None: ...


class _Resettable(Protocol):
    def reset(self) -> None: ...


def digested(digest: _Resettable, ctx: _Recorded, step: int,
             take: Callable[[], tuple[str, int]]) -> tuple[str, int]:
    """The digest and size ``take`` gives with ``digest``; taken again over the whole
    conversation, the way it was taken before, where the log keeps another digest for
    ``step`` (a run recorded before, a message changed in place since it was digested)."""
    got = take()
    recorded = ctx.recorded_digest(step)
    if recorded is not None and recorded != got[0]:
        digest.reset()
        got = take()
    return got
