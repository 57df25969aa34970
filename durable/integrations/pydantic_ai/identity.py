"""A model request's identity, taken incrementally: what the step ``<name>.model`` is checked
by when the function is executed again.

A request's arguments are its messages as JSON without their timestamps (``identity``), its
settings and its parameters (``parameters_identity``); the log keeps their digest, the
SHA-256 of their canonical encoding (``durable.call_identity.digest_placeholder``). The
messages are the whole conversation, which grows by a reply and a tool result a turn:
encoding and digesting it whole at every request costs the square of the conversation's
length. ``RequestDigest`` takes the same digest one new message at a time
(``durable.request_digest``): a request hashes only the messages it adds, then its
parameters and settings. The digest is the one the whole encoding has: logs recorded before
replay unchanged.

A message already digested is known by identity (the same object at the same place), else
by its encoding. pydantic-ai may change a message in place after it was sent (a capability's
metadata): the digest keeps the message as it was first digested, the same on every
execution of the function (it meets the messages in the same order). Where a recorded digest
differs from the one taken here (a log recorded before, a message changed in place since),
``RequestDigest.reset`` makes the next request encode the conversation whole again.
"""

from __future__ import annotations

import re
from dataclasses import fields, is_dataclass
from typing import Any

from pydantic_ai import ModelMessagesTypeAdapter
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models import ModelRequestParameters

from durable.integrations.base import stable
from durable.request_digest import ListDigest, around, canonical

__all__ = ["RequestDigest", "identity", "parameters_identity"]


def identity(messages: list[ModelMessage]) -> list[Any]:
    """The messages of a request as JSON, without their timestamps: what the step's digest is
    taken over, the same when the function is executed again."""
    data: list[Any] = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
    for message in data:
        message.pop("timestamp", None)
        for part in message.get("parts") or ():
            if isinstance(part, dict):
                part.pop("timestamp", None)
    return data


#: The id pydantic-ai gives a capability that has none (``<thinking:3f9a1c>``): random in
#: each run, on purpose ("a run-local handle"), and carried by the tool definitions that
#: capability contributes.
_SYNTHETIC_ID = re.compile(r"<([A-Za-z0-9_]+):[0-9a-f]{6}>")


def parameters_identity(parameters: ModelRequestParameters) -> Any:
    """A request's parameters as JSON, each synthetic capability id in them without its
    random part (``<thinking>``): the tools a capability without an ``id`` contributes are
    the same tools when the function is executed again, under another id. Their sets (the
    tools a search revealed, deferred capabilities' ids...) are listed in one order, that of
    their items' encodings: Python iterates a set of strings in an order its hashing draws
    anew in each process, and a run recovered by another worker must digest its requests as
    the first one did."""
    return _sets_in_order(parameters, _without_synthetic_ids(stable(parameters)))


def _sets_in_order(parameters: ModelRequestParameters, data: Any) -> Any:
    if not isinstance(data, dict) or not is_dataclass(parameters):
        return data
    for f in fields(parameters):
        if isinstance(getattr(parameters, f.name, None), set | frozenset) \
                and isinstance(data.get(f.name), list):
            data[f.name] = sorted(data[f.name], key=canonical)
    return data


def _without_synthetic_ids(value: Any) -> Any:
    if isinstance(value, str):
        return _SYNTHETIC_ID.sub(r"<\1>", value) if "<" in value else value
    if isinstance(value, dict):
        return {k: _without_synthetic_ids(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_synthetic_ids(v) for v in value]
    return value


def _encoded(message: ModelMessage) -> bytes:
    return canonical(identity([message])[0])


class RequestDigest:
    """The digest of each model request of a run's function, taken incrementally
    (``durable.request_digest.ListDigest``); one per execution of the function
    (``run.Binding``).

    A run's requests mostly carry the same settings and parameters (its tools' definitions,
    their JSON schemas): their part of the encoding (``around``) is kept with the canonical
    encoding of what they were as JSON, and taken again only when that differs. Compared as
    bytes, not as values (``1 == 1.0 == True``), and after ``stable``, not by the objects'
    identity (pydantic-ai may change them in place)."""

    def __init__(self) -> None:
        self.messages = ListDigest(_encoded)
        #: The canonical encoding of the last request's settings and parameters as JSON, and
        #: the head and tail ``around`` gave them.
        self._request: tuple[bytes, bytes, bytes, bytes] | None = None

    def reset(self) -> None:
        """Forget every message: the next request encodes the conversation whole."""
        self.messages.reset()
        self._request = None

    @property
    def encoded(self) -> int:
        """Bytes the last request encoded and hashed (its new messages, its parameters and
        settings): what its digest cost, whatever the conversation's length."""
        return self.messages.encoded

    def of(self, messages: list[ModelMessage], settings: Any,
           parameters: ModelRequestParameters) -> tuple[str, int]:
        """The digest and size ``digest_placeholder`` gives the request's arguments
        (``{"messages": identity(messages), "settings": stable(settings), "parameters":
        parameters_identity(parameters)}``)."""
        head, tail = self._around(settings, parameters)
        return self.messages.of(head, messages, tail)

    def _around(self, settings: Any, parameters: ModelRequestParameters) -> tuple[bytes, bytes]:
        """The encoding of the request's arguments before its messages and after them
        (``around``), kept while its settings and parameters are the same as JSON."""
        raw_settings, raw_parameters = stable(settings), stable(parameters)
        settings_key, parameters_key = canonical(raw_settings), canonical(raw_parameters)
        kept = self._request
        if kept is not None and kept[0] == settings_key and kept[1] == parameters_key:
            return kept[2], kept[3]
        head, tail = around({"settings": raw_settings, "parameters": _sets_in_order(
            parameters, _without_synthetic_ids(raw_parameters))}, "messages")
        self._request = (settings_key, parameters_key, head, tail)
        return head, tail
