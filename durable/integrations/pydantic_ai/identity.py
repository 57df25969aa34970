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
    the same tools when the function is executed again, under another id."""
    return _without_synthetic_ids(stable(parameters))


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
    (``run.Binding``)."""

    def __init__(self) -> None:
        self.messages = ListDigest(_encoded)

    def reset(self) -> None:
        """Forget every message: the next request encodes the conversation whole."""
        self.messages.reset()

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
        head, tail = around({"settings": stable(settings),
                             "parameters": parameters_identity(parameters)}, "messages")
        return self.messages.of(head, messages, tail)
