"""An A2A message as a run's input, or as the answer to a run's wait; and data as parts.

A message starting a task carries the input as one data part (a JSON object matching the
agent's input schema), or as text, which fills the schema's one string field
(``cards.text_field``). A message answering a task that waits for input carries the answer
as one data part (any JSON value) or as text (a string). The input of a run is JSON: a file
part (``raw`` or ``url``), a text part whose ``mediaType`` is not ``text/*``, a data part whose
``mediaType`` is not JSON are refused with ``ContentTypeNotSupportedError`` (-32005, as A2A
1.0's 3.1.1 says of a media type the agent does not take); a part with no content is an
invalid parameter (-32602).

Limits, checked before anything is written: every part at most ``DURABLE_MAX_PAYLOAD_BYTES``
(the input limit of a start), at most ``MAX_PARTS`` parts.
"""

from __future__ import annotations

import json
from typing import Any

from a2a.types import Message, Part
from a2a.utils.errors import ContentTypeNotSupportedError, InvalidParamsError
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Value

from .cards import text_field

MAX_PARTS = 16


def _parts(message: Message, max_bytes: int) -> tuple[list[Any], list[str]]:
    """The message's data values and texts, each checked against ``max_bytes``."""
    if len(message.parts) > MAX_PARTS:
        raise InvalidParamsError(message=f"a message of {len(message.parts)} parts: at most "
                                 f"{MAX_PARTS}; nothing was started")
    data: list[Any] = []
    texts: list[str] = []
    for i, part in enumerate(message.parts):
        kind = part.WhichOneof("content")
        if kind is None:
            raise InvalidParamsError(message=f"part {i} is empty: a part holds text or data; "
                                     "nothing was started", data={"field": f"parts[{i}]"})
        _media_type_ok(i, kind, part.media_type)
        size = len(part.text.encode()) if kind == "text" else part.data.ByteSize()
        if size > max_bytes:
            raise InvalidParamsError(
                message=f"part {i} is {size} bytes, over the limit of {max_bytes} "
                "(DURABLE_MAX_PAYLOAD_BYTES); nothing was started",
                data={"part": str(i), "bytes": str(size), "limit": str(max_bytes)})
        if kind == "text":
            texts.append(part.text)
        else:
            data.append(_ints(MessageToDict(part.data)))
    return data, texts


def _media_type_ok(i: int, kind: str, media_type: str) -> None:
    """Refuse a part this agent cannot take: a file, or a media type that is not text (a
    text part) or JSON (a data part)."""
    base = media_type.partition(";")[0].strip().lower()
    if kind in ("raw", "url"):
        why = f"part {i} is a file ({kind} part{f', {base}' if base else ''})"
    elif base and kind == "text" and not base.startswith("text/"):
        why = f"part {i} is a text part of media type {base!r}"
    elif base and kind == "data" and base != "application/json" and not base.endswith("+json"):
        why = f"part {i} is a data part of media type {base!r}"
    else:
        return
    raise ContentTypeNotSupportedError(
        message=f"{why}: this agent takes application/json (a data part) or text/plain; "
        "nothing was started", data={"part": str(i), "mediaType": base or kind})


def _ints(value: Any) -> Any:
    """``value`` with its whole numbers as ints: a data part is a protobuf ``Value``, whose
    numbers are all doubles (``3`` arrives as ``3.0``); JSON does not tell them apart, an
    input schema's ``integer`` and the agent's code do."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


def run_input(message: Message, schema: dict[str, Any] | None, max_bytes: int) -> Any:
    """The input of the run a message starts, or ``InvalidParamsError``."""
    data, texts = _parts(message, max_bytes)
    if len(data) == 1 and not texts:
        if not isinstance(data[0], dict):
            raise InvalidParamsError(message="the data part must be a JSON object: the "
                                     "agent's input")
        return data[0]
    if not data and texts:
        field = text_field(schema)
        if field is not None:
            return {field: "\n".join(texts)}
        raise InvalidParamsError(message="this agent's input has no single text field: "
                                 "send the input as one data part (its schema is in the "
                                 "agent card)")
    raise InvalidParamsError(message=f"a message of {len(data)} data and {len(texts)} text "
                             "parts: send one data part (the input) or text")


def answer(message: Message, max_bytes: int) -> Any:
    """The answer a message gives to a run waiting for input."""
    data, texts = _parts(message, max_bytes)
    if len(data) == 1 and not texts:
        return data[0]
    if not data and texts:
        return "\n".join(texts)
    raise InvalidParamsError(message="an answer is one data part or text")


def part(data: Any) -> Part:
    """``data`` as a part: text for a string, else a data part (a JSON round trip)."""
    if isinstance(data, str):
        return Part(text=data)
    return Part(data=ParseDict(json.loads(json.dumps(data, default=str)), Value()))
