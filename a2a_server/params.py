"""What a request's parameters must be, checked before anything is read or started.

A2A 1.0 (3.3.2): servers MUST validate all input parameters before processing; a bad one is
``InvalidParamsError`` (-32602) naming the parameter (its ``field`` in the error's
``ErrorInfo`` metadata), never an internal error, and nothing is started or written.

The SDK parses params into protobuf messages, reading an enum name it does not know as the
enum's zero value ("unset"): ``"status": "TASK_STATE_BOGUS"`` would list every task, a
``"role": "ROLE_BOGUS"`` would look like no role at all. ``refusal`` checks those names in
the JSON body itself, before the SDK parses it; the rest is checked on the parsed request
(``history_length``, ``page_size``, ``check_message``), for 1.0's methods and 0.3's alike (the
SDK's 0.3 adapter hands the same requests to the same handler).
"""

from __future__ import annotations

from typing import Any

from a2a.types import Message, Role, TaskState
from a2a.utils.errors import InvalidParamsError

#: ListTasks' page size when the request gives none, and its bounds (the proto's).
DEFAULT_PAGE_SIZE, MIN_PAGE_SIZE, MAX_PAGE_SIZE = 50, 1, 100

_STATES = frozenset([*TaskState.keys(), *TaskState.values()])
_ROLES = frozenset([*Role.keys(), *Role.values()])


def invalid(field: str, why: str) -> InvalidParamsError:
    """The refusal of the parameter ``field`` (its JSON name), saying ``why``."""
    return InvalidParamsError(message=f"invalid {field}: {why}; nothing was started",
                              data={"field": field})


def _enum(value: Any, known: frozenset[str | int], field: str, kind: str) -> None:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise invalid(field, f"expected a {kind} name, got {json_type(value)}")
    if value not in known:
        names = sorted(n for n in known if isinstance(n, str))
        raise invalid(field, f"{value!r} is not a {kind}: one of {', '.join(names)}")


def json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def refusal(body: Any) -> InvalidParamsError | None:
    """The refusal of a JSON-RPC request ``body`` (already parsed) for an enum name that
    the SDK would read as unset; None when there is nothing to refuse here (a malformed
    request is the SDK's to refuse)."""
    if not isinstance(body, dict) or not isinstance(body.get("params"), dict):
        return None
    method, params = body.get("method"), body["params"]
    try:
        if method == "ListTasks" and "status" in params:
            _enum(params["status"], _STATES, "status", "task state")
        message = params.get("message")
        if method in ("SendMessage", "SendStreamingMessage") and isinstance(message, dict) \
                and "role" in message:
            _enum(message["role"], _ROLES, "message.role", "role")
    except InvalidParamsError as exc:
        return exc
    return None


def history_length(request: Any, field: str = "historyLength") -> int | None:
    """The request's ``history_length``: None when unset; refused when negative."""
    if not request.HasField("history_length"):
        return None
    if request.history_length < 0:
        raise invalid(field, f"{request.history_length} is negative: 0 for no history, "
                      "a positive number for at most that many messages, unset for all")
    return int(request.history_length)


def page_size(request: Any) -> int:
    """ListTasks' page size: ``DEFAULT_PAGE_SIZE`` when unset; refused out of bounds."""
    if not request.HasField("page_size"):
        return DEFAULT_PAGE_SIZE
    if not MIN_PAGE_SIZE <= request.page_size <= MAX_PAGE_SIZE:
        raise invalid("pageSize", f"{request.page_size} is out of range: from "
                      f"{MIN_PAGE_SIZE} to {MAX_PAGE_SIZE} (unset: {DEFAULT_PAGE_SIZE})")
    return int(request.page_size)


def check_message(msg: Message) -> None:
    """A caller's message: an id, the user's role, at least one part."""
    if not msg.message_id:
        raise invalid("message.messageId", "a message needs a message id (a new one per "
                      "message: a retry sends the same one)")
    if msg.role != Role.ROLE_USER:
        given = "none" if msg.role == Role.ROLE_UNSPECIFIED else \
            Role.Name(msg.role) if msg.role in Role.values() else str(msg.role)
        raise invalid("message.role", f"a caller's message has the role ROLE_USER (0.3: "
                      f"\"user\"); this one has {given}")
    if not msg.parts:
        raise invalid("message.parts", "a message needs at least one part")
