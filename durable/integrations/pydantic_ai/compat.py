"""What a step of a durable pydantic-ai run records, and the records of earlier releases.

A step records the JSON pydantic-ai's base encodes its operation's result as (``JSON_CODEC``:
a ``ModelResponse``, a ``CallToolResult``, an MCP server's tool definitions...), with one
addition: a model step records ``{"response": ..., "usage": ..., "model_name", "provider_name"}``,
the usage beside the response, where the worker reads the tokens a run's budget counts and
the model and provider it prices the call by (``durable.costs``).

Before this integration stood on pydantic-ai's base (release 0.1 of ``durable-agents`` and
earlier), a tool step recorded ``{"return": ...}`` (or ``tool_return``, ``retry``, ``failed``,
``approval_required``, ``deferred``) and an MCP server's tool list a list of definitions:
``payload`` reads those as what the base records now, so a run recorded before goes on
after an upgrade. A model step's record has not changed.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai.durable_exec import (
    DurableOperationId,
    ModelCompactMessagesId,
    ModelRequestId,
    ToolsetCallToolId,
    ToolsetGetToolsId,
)

__all__ = ["payload", "recorded", "tool_return"]

#: The keys of a tool step's record before (see the module).
_EARLIER = frozenset({"return", "tool_return", "retry", "failed", "approval_required",
                      "deferred"})

#: The token kinds a model step's usage keeps beside input and output: what a price is
#: computed from too (``durable.costs``).
_PRICED = ("cache_read_tokens", "cache_write_tokens", "input_audio_tokens",
           "output_audio_tokens")

#: The operations whose result is a model response.
_RESPONSES = (ModelRequestId, ModelCompactMessagesId)


def recorded(operation_id: DurableOperationId, result: Any) -> Any:
    """What the step of ``operation_id`` records of the encoded ``result`` (in the worker)."""
    if isinstance(operation_id, _RESPONSES) and isinstance(result, dict):
        usage = result.get("usage") or {}
        inp, out = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
        kinds = {k: int(usage[k]) for k in _PRICED if usage.get(k)}  # priced apart
        priced = {k: str(result[k]) for k in ("model_name", "provider_name") if result.get(k)}
        return {"response": result, **priced,
                "usage": {"input_tokens": inp, "output_tokens": out, **kinds,
                          "total_tokens": inp + out}}
    return result


def payload(operation_id: DurableOperationId, data: Any) -> Any:
    """The encoded result of ``operation_id`` a step recorded (``recorded``), or an earlier
    release's record of it (see the module)."""
    if isinstance(operation_id, _RESPONSES):
        return data["response"] if isinstance(data, dict) and "response" in data else data
    if isinstance(operation_id, ToolsetCallToolId) and isinstance(data, dict) \
            and not _EARLIER.isdisjoint(data):
        return _earlier_outcome(data)
    if isinstance(operation_id, ToolsetGetToolsId) and isinstance(data, list):
        return {d["name"]: d for d in data if isinstance(d, dict) and "name" in d}
    return data


def tool_return(value: Any) -> dict[str, Any]:
    """The record of a tool call that returned ``value`` (what a ``lookup`` found the call
    returned): the base's ``CallToolResult`` of a plain return."""
    return {"result": value, "kind": "tool_return"}


def _earlier_outcome(data: dict[str, Any]) -> Any:
    if "return" in data:
        return tool_return(data["return"])
    if "tool_return" in data:
        return tool_return(data["tool_return"])
    if "retry" in data:
        return {"message": data["retry"], "kind": "model_retry"}
    if "failed" in data:
        return {"message": data["failed"], "kind": "tool_failed"}
    if "approval_required" in data:
        return {"metadata": data["approval_required"], "kind": "approval_required"}
    if "deferred" in data:
        return {"metadata": data["deferred"], "kind": "call_deferred",
                "call_kind": data.get("kind", "external")}
    return data
