"""A model request inside its step: what the worker's side adds to pydantic-ai's.

pydantic-ai's base sends the request inside the step (``<name>.model``) on the model it
rebuilds there, wrapped by the agent's capabilities (``get_wrapper_model``). The wrapper this
integration gives (``StepModel``) sends the step's idempotency key as an ``Idempotency-Key``
header (OpenAI-compatible servers dedupe on it) and a timeout no later than the step's
deadline; outside a step (the run's function, or the agent run directly) it adds nothing.
With ``RedisDurability(stream=True)`` the request is streamed and its text and tool calls go
to the run's followers as partial output (``durable.streams.partials``), from the handler
pydantic-ai gives a streamed request's events inside its step (``streaming_handler``).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

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
from pydantic_ai.models import ModelRequestParameters, StreamedResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext

from durable.agents import ToolContext
from durable.integrations.base import current_step, stable
from durable.streams.partials import tool_call_delta

__all__ = ["StepModel", "downstream", "partial_of", "streaming_handler"]

Handler = Callable[[RunContext[Any], AsyncIterable[Any]], Awaitable[None]]


def downstream(settings: ModelSettings | None, ctx: ToolContext) -> ModelSettings:
    """The request's settings with the step's key and deadline for the provider: an
    ``Idempotency-Key`` header and a timeout no later than the step's deadline."""
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


class StepModel(WrapperModel):
    """The model a request is sent with inside its step: the step's key and deadline go
    downstream (``downstream``); outside a step, the model itself."""

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        step = current_step()
        if step is not None:
            model_settings = downstream(model_settings, step)
        return await super().request(messages, model_settings, model_request_parameters)

    @asynccontextmanager
    async def request_stream(
        self, messages: list[ModelMessage], model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        step = current_step()
        if step is not None:
            model_settings = downstream(model_settings, step)
        async with super().request_stream(messages, model_settings, model_request_parameters,
                                          run_context) as streamed:
            yield streamed


# Partial output ------------------------------------------------------------------------------


def partial_of(event: Any) -> Any:
    """What a stream event shows followers (``durable.streams.partials``): the text it adds,
    or the piece of a tool call it adds; ``None`` for anything else."""
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


def streaming_handler(handler: Handler | None) -> Handler:
    """An event-stream handler that publishes a streamed request's text to the run's
    followers while it is in its step (``ctx.emit``), then hands every event to
    ``handler`` (none: they are only drained)."""

    async def published(events: AsyncIterable[Any]) -> AsyncIterator[Any]:
        async for event in events:
            step = current_step()
            shown = partial_of(event) if step is not None else None
            if shown is not None and step is not None:
                step.emit(shown)
            yield event

    async def handle(ctx: RunContext[Any], events: AsyncIterable[Any]) -> None:
        if handler is not None:
            await handler(ctx, published(events))
            return
        async for _ in published(events):
            pass

    handle.__name__ = getattr(handler, "__name__", "streaming")
    return handle
