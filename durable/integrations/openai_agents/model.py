"""A model request inside a durable OpenAI Agents SDK run: the function's side (the model of
every agent of the clone, whose ``get_response`` takes the step ``<name>.model``), the
worker's side (the step tool that sends the request with the step's ``Idempotency-Key`` and
deadline, streaming its text and tool calls to the run's followers), and the JSON the step
records (the response's output items, ids and usage).

Every coroutine runs on one event loop per process (``durable.integrations.base``), so a
model's cached HTTP client (``AsyncOpenAI``) is never used from two event loops.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import openai
from agents import Handoff, ModelResponse, ModelSettings, Usage
from agents.models.interface import Model, ModelProvider, ModelTracing
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

from durable.agents import ToolContext
from durable.integrations.base import ModelStepBase, stable
from durable.integrations.openai_agents.run import AgentOwner, Binding, bound
from durable.request_digest import ListDigest, around, canonical, digested
from durable.streams.partials import tool_call_delta

#: What a model step retries by default: the request did not reach the model, or the
#: provider said to come back (429, 5xx). Bounded by the step's attempts; never a bad request.
MODEL_RETRYABLE: tuple[type[BaseException], ...] = (
    openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError)


class ModelOwner(AgentOwner, Protocol):
    """What a run's models and its model step know of their ``DurableAgent``."""

    #: The name of the model step tool.
    model_step: str
    #: Resolves the models agents name by a string.
    model_provider: ModelProvider
    #: Model requests are streamed, their text deltas published to the run's followers.
    stream: bool


# The JSON of a model step -------------------------------------------------------------------


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
                  "output_tokens": usage.output_tokens, "total_tokens": usage.total_tokens,
                  **_cached(usage)},
    }


def _cached(usage: Usage) -> dict[str, Any]:
    """The cached part of a response's input tokens, when it reports one (priced apart)."""
    details = getattr(usage, "input_tokens_details", None)
    cached = getattr(details, "cached_tokens", 0) or 0
    return {"input_tokens_details": {"cached_tokens": cached}} if cached else {}


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


# The function's side ------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelCall:
    """The live request a model step sends: handed from the function to the step tool."""

    model: Model
    instructions: str | None
    input: Any
    settings: ModelSettings
    tools: list[Any]
    output_schema: Any
    handoffs: list[Handoff[Any, Any]]
    tracing: ModelTracing
    extra: dict[str, Any]


class DurableModel(Model):
    """An agent's model inside a durable run: ``get_response`` is the step ``<name>.model``;
    the real model (the agent's, or the provider's for its name) is resolved on first use."""

    def __init__(self, owner: ModelOwner, agent: str, ref: str | Model | None) -> None:
        self.owner, self.agent, self.ref = owner, agent, ref
        self._real: Model | None = None
        self._lock = threading.Lock()

    @property
    def real(self) -> Model:
        with self._lock:
            if self._real is None:
                self._real = self.ref if isinstance(self.ref, Model) else \
                    self.owner.model_provider.get_model(self.ref)
            return self._real

    async def get_response(self, system_instructions: str | None, input: Any,
                           model_settings: ModelSettings, tools: list[Any], output_schema: Any,
                           handoffs: list[Handoff[Any, Any]], tracing: ModelTracing,
                           **extra: Any) -> ModelResponse:
        b = bound(self.owner)
        if b is None:
            return await self.real.get_response(system_instructions, input, model_settings,
                                                tools, output_schema, handoffs, tracing, **extra)
        fields = {
            "agent": self.agent, "instructions": system_instructions,
            "tools": [getattr(t, "name", type(t).__name__) for t in tools],
            "handoffs": [h.tool_name for h in handoffs],
            "output": output_schema.name() if output_schema is not None else None,
            "settings": model_settings.to_json_dict(), **extra}
        args = request_args(b, self.agent, input, fields)
        call = ModelCall(self.real, system_instructions, input, model_settings, tools,
                         output_schema, handoffs, tracing, extra)
        return decode_response(await b.step(self.owner.model_step, args, call))

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        if bound(self.owner) is not None:  # Runner.run never streams; followers get tokens
            raise RuntimeError("a DurableAgent runs its agent with Runner.run; the model "
                               "step streams to the run's followers")
        return self.real.stream_response(*args, **kwargs)


def request_args(b: Binding, agent: str, input: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """The arguments of the model step a request is: the digest and size of ``{"input":
    input, **fields}`` as JSON, taken one new input item at a time
    (``durable.request_digest``: what the whole arguments' would be, as logs recorded before
    keep them), with the agent and the number of input items. Text input (a first request)
    is the arguments itself."""
    if not isinstance(input, list) or "input" in fields:
        return dict(stable({**fields, "input": input}))
    digest = b.digests.setdefault(agent, ListDigest(_encoded))
    head, tail = around(stable(fields), "input")
    got, size = digested(digest, b.ctx, b.ctx.step + 1, lambda: digest.of(head, input, tail))
    return {"_digest": got, "_bytes": size, "agent": agent, "count": len(input)}


def _encoded(item: Any) -> bytes:
    return canonical(stable(item))


# The worker's side --------------------------------------------------------------------------


class ModelStep(ModelStepBase):
    """``<name>.model``: one model request, by the real model, streamed to followers."""

    owner: ClassVar[ModelOwner]
    call_type = ModelCall

    async def request(self, call: ModelCall, ctx: ToolContext) -> dict[str, Any]:
        settings = _keyed(call, ctx)
        if self.owner.stream:
            response = await _streamed(call, settings, ctx)
        else:
            response = await call.model.get_response(
                call.instructions, call.input, settings, call.tools, call.output_schema,
                call.handoffs, call.tracing, **call.extra)
        recorded = encode_response(response)
        model = getattr(call.model, "model", None)  # the model priced (durable.costs)
        if isinstance(model, str) and model:
            recorded["model"] = model
        return recorded


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
