"""A durable pydantic-ai run's conversation across runs: the ``message_history`` of a run
that continues another (``start(..., continue_from=RUN)`` or a named session,
``durable.controls.sessions``) is the conversation that run kept, read by the step
``conversation.load``; the messages a run ends with are kept by ``conversation.save`` for
the run that continues it (``durable.conversations``).

A run that neither continues a run nor belongs to a session takes neither step. The
messages are kept as pydantic-ai's JSON (``ModelMessagesTypeAdapter``), the timestamps of
requests left out: they are drawn afresh when the function is executed again, and the
saved value must be the same then (its digest is the step's identity); the responses'
timestamps, recorded with them, are kept.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic_ai import ModelMessagesTypeAdapter
from pydantic_ai.messages import ModelMessage

from durable import conversations
from durable.agents import Fail
from durable.code import AsyncRunContext, EndRun


def keeps(ctx: AsyncRunContext) -> bool:
    """Whether the run keeps its conversation: it continues one, or is a session's turn."""
    return bool(ctx.continues or ctx.session_name)


async def load(ctx: AsyncRunContext, given: list[ModelMessage] | None
               ) -> list[ModelMessage] | None:
    """The run's ``message_history``: the conversation it continues (a step), then the
    messages its input gives; ``given`` alone for a run that continues none."""
    if not ctx.continues:
        return given
    earlier = await conversations.aload(ctx)
    try:
        messages = ModelMessagesTypeAdapter.validate_python(earlier)
    except ValidationError as exc:
        raise EndRun(Fail(f"the conversation this run continues ({ctx.continues!r}) is not "
                          f"pydantic-ai messages: {exc.error_count()} errors, the first: "
                          f"{exc.errors()[0]['msg']}")) from None
    return [*messages, *(given or [])] or None


async def save(ctx: AsyncRunContext, messages: list[ModelMessage]) -> None:
    """Keep ``messages`` as the run's conversation (a step)."""
    await conversations.asave(ctx, kept_form(messages))


def kept_form(messages: list[ModelMessage]) -> list[dict[str, Any]]:
    """The messages as JSON, the requests' timestamps left out (see the module)."""
    data: list[dict[str, Any]] = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
    for message in data:
        if message.get("kind") == "request":
            message.pop("timestamp", None)
            for part in message.get("parts") or ():
                if isinstance(part, dict):
                    part.pop("timestamp", None)
    return data
