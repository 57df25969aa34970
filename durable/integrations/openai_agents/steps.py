"""The worker's side of an OpenAI Agents SDK run: the step tools that perform a model request
and a function tool call, and the JSON their outcomes are recorded as (a handoff's step is
``durable.integrations.openai_agents.handoffs``).

A step tool reaches the live request (the real model and its arguments, the SDK's
``ToolContext``) through a hand-off the agent's function fills just before it
takes the step, keyed by run, step tool and the digest of the step's arguments: the worker
only ever runs a code agent's step while its function waits at that very call, and the
arguments name the call (a tool call's arguments carry the model's ``call_id``).

Every coroutine runs on one event loop per process (``durable.integrations.base``), so a
model's cached HTTP client (``AsyncOpenAI``) is never used from two event loops. The tools
know their ``DurableAgent`` as an ``AgentOwner``; ``StepOptions`` and ``step_context()`` are
the shared ones of ``durable.integrations.base``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from agents import Handoff, ModelResponse, ModelSettings, Usage
from agents.models.interface import Model, ModelTracing
from agents.tool import FunctionTool, maybe_invoke_function_tool_failure_error_function
from agents.tool_context import ToolContext as SdkToolContext
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseOutputItem,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseTextDeltaEvent,
)
from pydantic import TypeAdapter

from durable.agents import Lookup, OutcomeUnknown, Tool, ToolContext
from durable.call_identity import args_digest
from durable.integrations.base import (
    LiveRequests,
    ModelStepBase,
    Owner,
    StepOptions,
    jsonable,
    recorded_lookup,
    run_in_step,
)
from durable.streams.partials import tool_call_delta


class AgentOwner(Owner, Protocol):
    """What the step tools and wrappers of a run know of its ``DurableAgent``."""

    live: LiveRequests
    #: Model requests are streamed, their text deltas published to the run's followers.
    stream: bool


# Encodings ---------------------------------------------------------------------------------


_OUTPUT_ITEMS: TypeAdapter[list[ResponseOutputItem]] = TypeAdapter(list[ResponseOutputItem])


def encode_response(response: ModelResponse) -> dict[str, Any]:
    """A model response as recorded: its output items, ids and usage (``usage.total_tokens``
    is what the run's "tokens" budget counts)."""
    usage = response.usage
    return {
        "output": [item.model_dump(mode="json", exclude_none=True) for item in response.output],
        "response_id": response.response_id,
        "request_id": response.request_id,
        "usage": {"requests": usage.requests, "input_tokens": usage.input_tokens,
                  "output_tokens": usage.output_tokens, "total_tokens": usage.total_tokens},
    }


def decode_response(data: Any) -> ModelResponse:
    if not isinstance(data, dict) or not isinstance(data.get("output"), list):
        raise TypeError(f"a model step recorded {str(data)[:200]!r}, not a response")
    usage = data.get("usage") or {}
    return ModelResponse(
        output=_OUTPUT_ITEMS.validate_python(data["output"]),
        usage=Usage(requests=int(usage.get("requests", 1)),
                    input_tokens=int(usage.get("input_tokens", 0)),
                    output_tokens=int(usage.get("output_tokens", 0)),
                    total_tokens=int(usage.get("total_tokens", 0))),
        response_id=data.get("response_id"), request_id=data.get("request_id"))


def encode_output(value: Any) -> dict[str, Any]:
    """A function tool's return as recorded: JSON data as it is, anything else as its ``str``
    (what the SDK tells the model of it)."""
    if isinstance(value, str | int | float | bool | type(None) | list | dict):
        return {"return": jsonable(value)}
    return {"text": str(value)}


def decode_output(data: Any) -> Any:
    if isinstance(data, dict) and "return" in data:
        return data["return"]
    if isinstance(data, dict) and "text" in data:
        return str(data["text"])
    raise TypeError(f"a tool step recorded {str(data)[:200]!r}")


# What the function hands to the step it takes ----------------------------------------------


@dataclass(frozen=True)
class ModelCall:
    model: Model
    instructions: str | None
    input: Any
    settings: ModelSettings
    tools: list[Any]
    output_schema: Any
    handoffs: list[Handoff[Any, Any]]
    tracing: ModelTracing
    extra: dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    tool: FunctionTool
    context: SdkToolContext[Any]
    arguments: str


def live_key(run_id: str, tool: str, args: dict[str, Any]) -> tuple[str, str, str]:
    return (run_id, tool, args_digest(args))


# The step tools ----------------------------------------------------------------------------


class ModelStep(ModelStepBase):
    """``<name>.model``: one model request, by the real model, streamed to followers."""

    owner: ClassVar[AgentOwner]
    call_type = ModelCall

    async def request(self, call: ModelCall, ctx: ToolContext) -> dict[str, Any]:
        settings = _keyed(call, ctx)
        if self.owner.stream:
            return encode_response(await _streamed(call, settings, ctx))
        response = await call.model.get_response(
            call.instructions, call.input, settings, call.tools, call.output_schema,
            call.handoffs, call.tracing, **call.extra)
        return encode_response(response)


def _keyed(call: ModelCall, ctx: ToolContext) -> ModelSettings:
    """The request's settings with the step's idempotency key as an ``Idempotency-Key``
    header, and its deadline as the OpenAI client's timeout (the models of this SDK pass
    ``extra_args`` to the client)."""
    headers = {**(call.settings.extra_headers or {}), "Idempotency-Key": ctx.key}
    changes: dict[str, Any] = {"extra_headers": headers}
    if type(call.model).__module__.startswith("agents.models.openai"):
        changes["extra_args"] = {**(call.settings.extra_args or {}),
                                 "timeout": max(0.1, ctx.remaining())}
    return dataclasses.replace(call.settings, **changes)


async def _streamed(call: ModelCall, settings: ModelSettings, ctx: ToolContext) -> ModelResponse:
    """Stream the request: each text delta is partial output (``{"delta": text}``) for the
    run's followers, and each function call's name and argument deltas too
    (``durable.streams.partials.tool_call_delta``); the completed response is the step's result.

    The request asks for the stream's usage (``include_usage``, Chat Completions'
    ``stream_options``), which the SDK asks only of OpenAI's own server: without it vLLM,
    LiteLLM or Ollama end the stream without usage and the reply would count no tokens
    against the run's "tokens" budget. (The Responses API always sends it.) An explicit
    ``ModelSettings(include_usage=False)``, for a server that refuses ``stream_options``,
    is kept: its streamed replies count no tokens."""
    if settings.include_usage is None:
        settings = dataclasses.replace(settings, include_usage=True)
    done: list[Any] = []
    completed = None
    calls: dict[int, int] = {}  # output index -> the tool call's place among the reply's calls
    async for event in call.model.stream_response(
            call.instructions, call.input, settings, call.tools, call.output_schema,
            call.handoffs, call.tracing, **call.extra):
        if isinstance(event, ResponseTextDeltaEvent):
            ctx.emit({"delta": event.delta})
        elif isinstance(event, ResponseOutputItemAddedEvent) and \
                isinstance(event.item, ResponseFunctionToolCall):
            place = calls.setdefault(event.output_index, len(calls))
            ctx.emit(tool_call_delta(place, call_id=event.item.call_id, name=event.item.name,
                                     args=event.item.arguments or ""))
        elif isinstance(event, ResponseFunctionCallArgumentsDeltaEvent):
            place = calls.setdefault(event.output_index, len(calls))
            ctx.emit(tool_call_delta(place, args=event.delta))
        elif isinstance(event, ResponseOutputItemDoneEvent):
            done.append(event.item)
        elif isinstance(event, ResponseCompletedEvent):
            completed = event.response
        elif isinstance(event, ResponseFailedEvent | ResponseIncompleteEvent | ResponseErrorEvent):
            raise RuntimeError(f"the model's stream ended with {event.type}")
    if completed is None:
        raise RuntimeError("the model's stream ended without a completed response")
    usage = completed.usage
    return ModelResponse(
        output=list(completed.output or done),
        usage=Usage(requests=1, input_tokens=usage.input_tokens if usage else 0,
                    output_tokens=usage.output_tokens if usage else 0,
                    total_tokens=usage.total_tokens if usage else 0),
        response_id=completed.id)


class FunctionStep(Tool):
    """``<name>.tool.<tool>``: one call of a function tool, by the tool itself (its own error
    handling included: an exception it turns into a message for the model is recorded as
    that message, except ``OutcomeUnknown`` and the step's ``retryable``, see ``_invoke``)."""

    owner: ClassVar[AgentOwner]
    options: ClassVar[StepOptions]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        call = self.owner.handed(ctx, self.name, args, ToolCall)

        async def invoke() -> dict[str, Any]:
            return encode_output(await _invoke(call, self.retryable))

        return await run_in_step(invoke, ctx)

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup | Awaitable[Lookup]:
        arguments = args.get("arguments")
        return recorded_lookup(self.options.lookup, key,
                               arguments if isinstance(arguments, dict) else {}, encode_output)


async def _invoke(call: ToolCall, retryable: tuple[type[BaseException], ...]) -> Any:
    """The tool's own call, with the SDK's error handling (an exception told to the model as
    a message) except for what this system must see: ``OutcomeUnknown`` (the effect may have
    happened: resolved by ``lookup``, never told to the model as a failure it would retry
    under a new key) and the step's ``retryable`` exceptions (retried with the same key)."""
    invoker = call.tool.on_invoke_tool
    impl = getattr(invoker, "_invoke_tool_impl", None)
    if impl is None:  # not the SDK's failure-handling wrapper: the tool as it is
        return await invoker(call.context, call.arguments)
    passthrough: tuple[type[BaseException], ...] = (OutcomeUnknown, *retryable)
    try:
        return await impl(call.context, call.arguments)
    except passthrough:
        raise
    except Exception as exc:
        tool = getattr(invoker, "_function_tool", None) or call.tool
        message = await maybe_invoke_function_tool_failure_error_function(
            function_tool=tool, context=call.context, error=exc)
        if message is None:
            raise
        handled = getattr(invoker, "_on_handled_error", None)
        if callable(handled):
            handled(tool, exc, call.arguments, call.context)
        return message
