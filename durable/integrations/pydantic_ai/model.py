"""A model request inside a durable run: the function's side (a wrapper model whose
``request`` and ``request_stream`` take the step ``<name>.model``), the worker's side (the
step tool that sends the request with the step's ``Idempotency-Key`` and deadline, streaming
its text and tool calls to the run's followers when the agent streams), and the JSON the step
is made of (the request's identity, taken incrementally: ``identity``; the response with
its usage)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Self

from pydantic_ai import ModelMessagesTypeAdapter
from pydantic_ai.exceptions import UsageLimitExceeded, UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ToolCallPart,
    ToolCallPartDelta,
)
from pydantic_ai.models import (
    CompletedStreamedResponse,
    Model,
    ModelRequestParameters,
    StreamedResponse,
)
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext

from durable.agents import ToolContext
from durable.integrations.base import ModelStepBase, stable
from durable.integrations.pydantic_ai.run import Durability, bound
from durable.streams.partials import tool_call_delta

#: pydantic-ai's errors that no retry can fix (the peers never retry them either).
NOT_RETRYABLE: tuple[type[BaseException], ...] = (UserError, UsageLimitExceeded)


class _RetryableMeta(type):
    """``isinstance(exc, cls)``: one of ``cls.named``, and not one of ``NOT_RETRYABLE``."""

    named: tuple[type[BaseException], ...]

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, cls.named) and not isinstance(obj, NOT_RETRYABLE)


def retryable_but_not_usage(named: tuple[type[BaseException], ...]) \
        -> tuple[type[BaseException], ...]:
    """The errors a model step retries: those named, less pydantic-ai's non-retryable ones
    (a broad ``Exception`` would otherwise re-send a request pydantic-ai refused itself)."""
    if not named:
        return ()
    marker = _RetryableMeta("Retryable", (Exception,), {"named": tuple(named)})
    return (marker,)  # type: ignore[return-value]  # a class of Exception, by its metaclass


# The JSON of a model step -------------------------------------------------------------------


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


@dataclass
class ModelCall:
    """The live request a model step sends: handed from the function to the step tool."""

    model: Model
    messages: list[ModelMessage]
    settings: ModelSettings | None
    parameters: ModelRequestParameters
    stream: bool = False
    run_context: RunContext[Any] | None = None


class DurableModel(WrapperModel):
    """The model of a request inside a durable run: ``request`` is the step
    ``<name>.model``. Outside one (the same agent run directly), it is the model itself."""

    def __init__(self, wrapped: Model, owner: Durability) -> None:
        super().__init__(wrapped)
        self._owner = owner

    async def __aenter__(self) -> Self:
        # In a run, the model is only used by its steps, on the worker's loop: not entered here.
        if bound(self._owner) is None:
            await super().__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc_val: BaseException | None,
                        exc_tb: TracebackType | None) -> bool | None:
        if bound(self._owner) is None:
            return await super().__aexit__(exc_type, exc_val, exc_tb)
        return None

    def _run_scope(self) -> AbstractAsyncContextManager[None]:
        if bound(self._owner) is not None:
            return nullcontext()
        return super()._run_scope()

    async def _step(self, messages: list[ModelMessage], settings: ModelSettings | None,
                    parameters: ModelRequestParameters, stream: bool,
                    run_context: RunContext[Any] | None = None) -> tuple[ModelResponse, bool]:
        """The response, and whether an earlier execution of the function was given it and
        went on (its event-stream handler saw its events already). A response recorded
        just before a crash is shown again: the function may not have been given it."""
        b = bound(self._owner)
        assert b is not None
        call = ModelCall(self.wrapped, messages, settings, parameters, stream, run_context)
        response, seen = await b.step_seen(self._owner.model_step,
                                           b.request_args(messages, settings, parameters), call)
        return decode_response(response), seen

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        if bound(self._owner) is None:
            return await super().request(messages, model_settings, model_request_parameters)
        response, _ = await self._step(messages, model_settings, model_request_parameters, False)
        return response

    @asynccontextmanager
    async def request_stream(
        self, messages: list[ModelMessage], model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        if bound(self._owner) is None:
            async with super().request_stream(messages, model_settings, model_request_parameters,
                                              run_context) as streamed:
                yield streamed
            return
        # The step streams the request (its text reaches the run's followers as it comes);
        # the function gets the completed response, replayed as events, except when an
        # earlier execution went past it: the handler saw those events then.
        response, seen = await self._step(messages, model_settings,
                                          model_request_parameters, True, run_context)
        yield CompletedStreamedResponse(response, model_request_parameters=model_request_parameters,
                                        replay_events=not seen)


def _downstream(settings: ModelSettings | None, ctx: ToolContext) -> ModelSettings:
    """The request's settings with the step's key and deadline for the provider: an
    ``Idempotency-Key`` header (OpenAI-compatible servers dedupe on it) and a timeout no
    later than the step's deadline."""
    out: dict[str, Any] = dict(settings or {})
    headers = dict(out.get("extra_headers") or {})
    headers.setdefault("Idempotency-Key", ctx.key)
    out["extra_headers"] = headers
    left = max(0.1, ctx.deadline_ms / 1000 - time.time())
    timeout = out.get("timeout")
    if not isinstance(timeout, int | float) or timeout > left:
        out["timeout"] = left
    made: ModelSettings = ModelSettings(**out)  # type: ignore[typeddict-item]
    return made


def partial_of(event: Any) -> Any:
    """What a stream event shows followers (``durable.streams.partials``): the text it adds, or the
    piece of a tool call it adds; ``None`` for anything else."""
    if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
        return event.part.content or None
    if isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
        return event.delta.content_delta or None
    if isinstance(event, PartStartEvent) and isinstance(event.part, ToolCallPart):
        part = event.part
        return tool_call_delta(event.index, call_id=part.tool_call_id, name=part.tool_name,
                               args=_args_text(part.args))
    if isinstance(event, PartDeltaEvent) and isinstance(event.delta, ToolCallPartDelta):
        delta = event.delta
        return tool_call_delta(event.index, call_id=delta.tool_call_id,
                               name=delta.tool_name_delta, args=_args_text(delta.args_delta))
    return None


def _args_text(args: Any) -> str:
    if args is None or args == {} or args == "":
        return ""
    return args if isinstance(args, str) else json.dumps(stable(args))


class ModelStep(ModelStepBase):
    """``<name>.model``: one model request, performed by the real model."""

    owner: ClassVar[Durability]
    call_type = ModelCall

    async def request(self, call: ModelCall, ctx: ToolContext) -> dict[str, Any]:
        settings = _downstream(call.settings, ctx)
        if not call.stream:
            response = await call.model.request(call.messages, settings, call.parameters)
            return encode_response(response)
        async with call.model.request_stream(call.messages, settings, call.parameters,
                                             call.run_context) as streamed:
            async for event in streamed:
                shown = partial_of(event)
                if shown is not None:
                    ctx.emit(shown)
        return encode_response(streamed.get())
