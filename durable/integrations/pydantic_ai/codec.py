"""The JSON a durable pydantic-ai run records: a model request's identity (its messages
without timestamps), a model response with its usage, a tool call's outcome (its return, or
the control-flow signal it raised), and what ends a run inside a task group."""

from __future__ import annotations

from collections.abc import Awaitable, Iterator
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai import (
    ApprovalRequired,
    CallDeferred,
    ModelMessagesTypeAdapter,
    ModelRetry,
    ToolFailed,
)
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolReturn, ToolReturnContent

from durable.code import StepFailed
from durable.integrations.base import opaque, stable


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


def encode_response(response: ModelResponse) -> dict[str, Any]:
    usage = response.usage
    return {
        "response": ModelMessagesTypeAdapter.dump_python([response], mode="json")[0],
        "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                  "total_tokens": usage.total_tokens},
    }


def decode_response(data: Any) -> ModelResponse:
    if not isinstance(data, dict) or "response" not in data:
        raise TypeError(f"a model step recorded {type(data).__name__} without a response")
    (message,) = ModelMessagesTypeAdapter.validate_python([data["response"]])
    if not isinstance(message, ModelResponse):
        raise TypeError(f"a model step recorded a {type(message).__name__}, not a response")
    return message


CONTENT: TypeAdapter[Any] = TypeAdapter(ToolReturnContent)
TOOL_RETURN: TypeAdapter[ToolReturn[Any]] = TypeAdapter(ToolReturn)


def encode_return(value: Any) -> dict[str, Any]:
    if isinstance(value, ToolReturn):
        return {"tool_return": TOOL_RETURN.dump_python(value, mode="json")}
    return {"return": CONTENT.dump_python(value, mode="json", fallback=opaque)}


async def tool_outcome(call: Awaitable[Any]) -> dict[str, Any]:
    """A tool call's outcome as JSON: its return, or the control-flow signal it raised
    (pydantic-ai's tools ask for a retry, fail or defer by raising)."""
    try:
        value = await call
    except ModelRetry as exc:
        return {"retry": exc.message}
    except ToolFailed as exc:
        return {"failed": exc.message}
    except ApprovalRequired as exc:
        return {"approval_required": stable(exc.metadata)}
    except CallDeferred as exc:
        return {"deferred": stable(exc.metadata), "kind": exc.kind}
    return encode_return(value)


def decode_outcome(data: Any) -> Any:
    if not isinstance(data, dict):
        raise TypeError(f"a tool step recorded {data!r}")
    if "return" in data:
        return CONTENT.validate_python(data["return"])
    if "tool_return" in data:
        return TOOL_RETURN.validate_python(data["tool_return"])
    if "retry" in data:
        raise ModelRetry(data["retry"])
    if "failed" in data:
        raise ToolFailed(data["failed"])
    if "approval_required" in data:
        raise ApprovalRequired(data["approval_required"])
    if "deferred" in data:
        raise CallDeferred(data["deferred"], kind=data.get("kind", "external"))
    raise TypeError(f"a tool step recorded {data!r}")


def primary(group: BaseExceptionGroup[Any]) -> BaseException:
    """What ended a run inside a task group: the worker letting go of the run (not an
    ``Exception``) first, then a failed step, else the group itself."""
    found = list(leaves(group))
    for leaf in found:
        if not isinstance(leaf, Exception):
            return leaf
    for leaf in found:
        if isinstance(leaf, StepFailed):
            return leaf
    return group


def leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc
