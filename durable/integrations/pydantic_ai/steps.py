"""What the function and the step tools of a durable pydantic-ai run share: what they know
of their ``RedisDurability`` (``Durability``, so that they never import it), and the binding
of the function to the durable run it executes (``StepOptions`` and ``step_context()`` are
the shared ones of ``durable.integrations.base``, as is ``run_in_step``, which every step
tool awaits its work with)."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic_ai.durable_exec import record_durable_unit
from pydantic_ai.messages import ToolCallEvent, ToolResultEvent
from pydantic_ai.toolsets import AbstractToolset

from durable.code import AsyncRunContext
from durable.integrations.base import Bindings, LiveRequests, Owner, StepOptions, step_context


class Durability(Owner, Protocol):
    """What the step tools and wrappers of a run know of its ``RedisDurability``."""

    live: LiveRequests
    model_step: str
    #: Tools that are not steps (``StepOptions(step=False)``).
    not_steps: set[str]
    #: MCP toolset id -> the toolset.
    mcp_toolsets: dict[str, AbstractToolset[Any]]


@dataclass
class Binding:
    """The durable run a capability's function is executing (a context variable)."""

    owner: Durability
    ctx: AsyncRunContext
    #: Steps handed to the run and not answered yet (several at once: parallel tool calls).
    inflight: set[int] = field(default_factory=set)
    #: What was recorded once per run and is read again from the binding (MCP tool lists).
    pinned: dict[str, Any] = field(default_factory=dict)
    #: pydantic-ai's ids of the tool calls an earlier execution of the function was given
    #: the outcome of and went past: their events were reported then (``unseen``).
    reported: set[str] = field(default_factory=set)

    async def step(self, tool: str, args: dict[str, Any], live: Any,
                   call_id: str | None = None) -> Any:
        """Take a step, handing the live request to the step tool that will perform it
        (``call_id``: pydantic-ai's id of the tool call it is).

        Calls started together (pydantic-ai's parallel tool calls) join one parallel
        decision, numbered in the order they join; the number is taken in the same
        synchronous stretch as the join, so it is the one the run gives the call."""
        result, _ = await self.step_seen(tool, args, live, call_id)
        return result

    async def step_seen(self, tool: str, args: dict[str, Any], live: Any,
                        call_id: str | None = None) -> tuple[Any, bool]:
        """``step``, and whether an earlier execution of the function was given this
        outcome and went past it (``RunContext.went_past``): its events were shown then."""
        n = max(self.ctx.step, *self.inflight) + 1 if self.inflight else self.ctx.step + 1
        replayed = self.ctx.replaying  # the step is in the log already
        seen = self.ctx.went_past(n)
        if call_id and seen:
            self.reported.add(call_id)
        self.inflight.add(n)
        try:
            with self.owner.live.handing((self.ctx.run_id, n), live):
                result = await self.ctx.call(tool, args)
        finally:
            self.inflight.discard(n)
        record_durable_unit(executed=not replayed)
        return result, seen


RUNS: Bindings[Binding] = Bindings("durable_pydantic_ai_run")
binding = RUNS.var
bound = RUNS.bound


# What an event-stream handler is shown when the function is executed again ----------
#
# Recovery (and a worker that takes over a run between two turns) executes the agent's
# function again from the start: every recorded step returns its outcome from the log. A
# recorded model request is not streamed again (``durable.integrations.pydantic_ai.model``
# gives pydantic-ai its response without events). A recorded tool call is not made again
# either, but pydantic-ai still reports it: a ``FunctionToolCallEvent`` before the call and a
# ``FunctionToolResultEvent`` after it, which the handler was shown when the call was made.
#
# ``unseen`` drops those. While the function replays, each tool-call event is held until its
# result: a call that an earlier execution was given the outcome of and went past (a step
# was decided after it: ``RunContext.went_past``, ``Binding.reported``) has both its events
# dropped; any other has both shown, in their order: the call a crash interrupted, and the
# last one before the crash (whose result the function may not have been given). Outside a
# replay nothing is held. A handler therefore sees each tool call's events once across
# recoveries, except those around the crash: they are shown again.

Handler = Callable[[Any, AsyncIterable[Any]], Awaitable[None]]


def without_replayed(handler: Handler) -> Handler:
    """``handler`` shown only the events of its run it was not shown before."""

    async def handle(ctx: Any, events: AsyncIterable[Any]) -> None:
        await handler(ctx, unseen(events))

    handle.__name__ = getattr(handler, "__name__", "handler")
    handle.__doc__ = handler.__doc__
    return handle


async def unseen(events: AsyncIterable[Any]) -> AsyncIterator[Any]:
    """``events`` without those of tool calls whose outcome came from the log (see the
    section's comment); outside a durable run, all of them."""
    held: dict[str, Any] = {}
    async for event in events:
        b = binding.get()
        if b is None:
            yield event
            continue
        if isinstance(event, ToolCallEvent) and (b.ctx.replaying or held):
            held[event.part.tool_call_id] = event
            continue
        if isinstance(event, ToolResultEvent):
            call = held.pop(event.tool_call_id, None)
            if event.tool_call_id in b.reported:
                continue
            if call is not None:
                yield call
        yield event
    for call in held.values():  # calls whose result never came: not made here either
        b = binding.get()
        if b is None or call.part.tool_call_id not in b.reported:
            yield call


__all__ = ["RUNS", "Binding", "Durability", "StepOptions", "binding", "bound",
           "step_context", "without_replayed"]
