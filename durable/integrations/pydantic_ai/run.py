"""A durable pydantic-ai run: what its function gives ``agent.run`` (``RunInput``), what the
function and the step tools share (what they know of their ``RedisDurability``,
``Durability``, so that they never import it, and the binding of the function to the
durable run it executes), the conversation a run continues and keeps, what an event-stream
handler is shown when the function is executed again, and what ended a run inside a task
group. ``StepOptions``, ``step_context()`` and ``run_in_step`` (which every step tool awaits
its work with) are the shared ones of ``durable.integrations.base``."""

from __future__ import annotations

from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_ai import ModelMessagesTypeAdapter
from pydantic_ai.durable_exec import record_durable_unit
from pydantic_ai.messages import ModelMessage, ToolCallEvent, ToolResultEvent, UserContent
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.tools import DeferredToolResults
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.usage import UsageLimits

from durable import conversations
from durable.agents import Fail
from durable.code import AsyncRunContext, EndRun, StepFailed
from durable.integrations.base import Bindings, LiveRequests, Owner
from durable.integrations.pydantic_ai.identity import RequestDigest, identity
from durable.request_digest import digested
from durable.telemetry.tracing import capturing_content

__all__ = ["RUNS", "Binding", "Durability", "PromptInput", "RunInput", "binding", "bound",
           "continued_messages", "keep_messages", "keeps", "primary", "prompt_input",
           "without_replayed"]


# The run's input ----------------------------------------------------------------------------
#
# What ``agent.run`` takes, as data (JSON a producer can send without importing the agent),
# checked when the run starts.


_PROMPT: TypeAdapter[list[UserContent]] = TypeAdapter(list[UserContent])
_DEFERRED: TypeAdapter[DeferredToolResults] = TypeAdapter(DeferredToolResults)
_LIMITS: TypeAdapter[UsageLimits] = TypeAdapter(UsageLimits)
#: The fields of ``RunInput`` checked when a run starts, by what reads them.
_CHECKED: dict[str, TypeAdapter[Any]] = {
    "prompt": _PROMPT, "message_history": ModelMessagesTypeAdapter,
    "deferred_tool_results": _DEFERRED, "usage_limits": _LIMITS}


class RunInput(BaseModel):
    """A durable pydantic-ai run's input, each field what ``agent.run`` takes of that name:

    - ``prompt``: text, or a list of user content parts (text, ``image-url``, ``binary``...:
      ``TypeAdapter(list[UserContent]).dump_python(parts, mode="json")``);
    - ``message_history``: the earlier messages
      (``ModelMessagesTypeAdapter.dump_python(messages, mode="json")``);
    - ``deferred_tool_results``: the answers to a run that ended with
      ``DeferredToolRequests`` (``{"approvals": {call id: true}, "calls": {call id: value}}``);
    - ``usage_limits``: pydantic-ai's ``UsageLimits`` fields; none by default (the run's
      budgets bound it, not pydantic-ai's default of 50 requests);
    - ``model``: the name of a model registered with ``models=``, or a model id
      (``"openai:gpt-4o"``), instead of the agent's;
    - ``metadata``: the run's metadata, as JSON.

    Subclass it to carry what ``deps`` builds the agent's dependencies from."""

    model_config = ConfigDict(extra="forbid")

    prompt: str | list[Any] | None = None
    message_history: list[dict[str, Any]] | None = None
    deferred_tool_results: dict[str, Any] | None = None
    usage_limits: dict[str, Any] | None = None
    model: str | None = None
    metadata: dict[str, Any] | None = None

    @field_validator("prompt", "message_history", "deferred_tool_results", "usage_limits")
    @classmethod
    def _checked(cls, value: Any, info: ValidationInfo) -> Any:
        """Each field as pydantic-ai reads it (a text prompt is any text), kept as JSON."""
        if value is not None and not isinstance(value, str):
            _CHECKED[info.field_name or ""].validate_python(value)
        return value

    def run_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``agent.run`` this input stands for."""
        prompt: Any = self.prompt
        if isinstance(prompt, list):
            prompt = _PROMPT.validate_python(prompt)
        limits = dict(self.usage_limits or {})
        limits.setdefault("request_limit", None)
        out: dict[str, Any] = {
            "user_prompt": prompt,
            "message_history": _messages(self.message_history),
            "usage_limits": _LIMITS.validate_python(limits),
        }
        if self.deferred_tool_results is not None:
            out["deferred_tool_results"] = _DEFERRED.validate_python(self.deferred_tool_results)
        if self.model is not None:
            out["model"] = self.model
        if self.metadata is not None:
            out["metadata"] = self.metadata
        return out


#: The name of earlier releases.
PromptInput = RunInput


def _messages(data: list[dict[str, Any]] | None) -> list[ModelMessage] | None:
    return ModelMessagesTypeAdapter.validate_python(data) if data else None


def prompt_input(prompt: str | Sequence[UserContent] | None,
                 message_history: Sequence[ModelMessage] | None = None,
                 **fields: Any) -> dict[str, Any]:
    """A run's input as JSON: ``client.start(name, prompt_input("...", messages))``;
    ``fields`` are the other ``RunInput`` fields (``usage_limits=UsageLimits(...)`` and
    ``deferred_tool_results=DeferredToolResults(...)`` are turned into JSON)."""
    out: dict[str, Any] = {"prompt": prompt if isinstance(prompt, str) or prompt is None
                           else _PROMPT.dump_python(list(prompt), mode="json"), **fields}
    if message_history:
        out["message_history"] = ModelMessagesTypeAdapter.dump_python(list(message_history),
                                                                       mode="json")
    if isinstance(out.get("usage_limits"), UsageLimits):
        out["usage_limits"] = _LIMITS.dump_python(out["usage_limits"], mode="json")
    if isinstance(out.get("deferred_tool_results"), DeferredToolResults):
        out["deferred_tool_results"] = _DEFERRED.dump_python(out["deferred_tool_results"],
                                                             mode="json")
    return out


# The binding of the function to its durable run ---------------------------------------------


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
    #: pydantic-ai's ids of the tool calls an earlier execution decided the step of: their
    #: call events were reported then, before the step was decided (``unseen``).
    decided: set[str] = field(default_factory=set)
    #: The digest of the function's model requests, taken one new message at a time.
    digest: RequestDigest = field(default_factory=RequestDigest)
    #: id(model) -> the wrapper of that model in this run (pydantic-ai asks for it at each
    #: request); each holds its model, so the id is not another's while it is here.
    wrappers: dict[int, Any] = field(default_factory=dict)

    def next_step(self) -> int:
        """The number the next step taken will have (after those in flight)."""
        return max(self.ctx.step, *self.inflight) + 1 if self.inflight else self.ctx.step + 1

    def request_args(self, messages: list[ModelMessage], settings: Any,
                     parameters: ModelRequestParameters) -> dict[str, Any]:
        """The arguments of the model step a request is: its digest and size, taken
        incrementally (``identity.RequestDigest``: what the whole arguments' would be), and
        the number of its messages; with them the messages themselves only when model
        content goes on spans (``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``). A
        digest that differs from the one the log has for the step (a run recorded before,
        a message pydantic-ai changed in place since it was digested) is taken again over
        the whole conversation, the way it was taken before."""
        digest, size = digested(self.digest, self.ctx, self.next_step(),
                                lambda: self.digest.of(messages, settings, parameters))
        args: dict[str, Any] = {"_digest": digest, "_bytes": size, "count": len(messages)}
        if capturing_content():
            args["messages"] = identity(messages)
        return args

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
        n = self.next_step()
        replayed = self.ctx.replaying  # the step is in the log already
        seen = self.ctx.went_past(n)
        if call_id and seen:
            self.reported.add(call_id)
        if call_id and self.ctx.decided(n):
            self.decided.add(call_id)
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


# What an event-stream handler is shown when the function is executed again ------------------
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
# dropped. A call whose step an earlier execution decided (``RunContext.decided``,
# ``Binding.decided``) has its call event dropped: pydantic-ai reports a call before making
# it, and the handler's taking that event is what lets the call go on to its step. Its
# result is shown: the call a crash interrupted, and the last one before the crash (whose
# result the function may not have been given). Any other call has both shown, in order.
# Outside a replay nothing is held. A handler therefore sees each tool call's events once
# across recoveries, except a result the crash may have cut off after it was shown, and a
# call event the crash cut off before its step was decided.


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
            if call is not None and event.tool_call_id not in b.decided:
                yield call
        yield event
    for call in held.values():  # calls whose result never came: not made here either
        b = binding.get()
        if b is None or not ({call.part.tool_call_id} & (b.reported | b.decided)):
            yield call


# The conversation across runs ---------------------------------------------------------------
#
# The ``message_history`` of a run that continues another (``start(..., continue_from=RUN)``
# or a named session, ``durable.controls.sessions``) is the conversation that run kept, read
# by the step ``conversation.load``; the messages a run ends with are kept by
# ``conversation.save`` for the run that continues it (``durable.conversations``).
#
# A run that neither continues a run nor belongs to a session takes neither step. The
# messages are kept as pydantic-ai's JSON (``ModelMessagesTypeAdapter``), the timestamps of
# requests left out: they are drawn afresh when the function is executed again, and the
# saved value must be the same then (its digest is the step's identity); the responses'
# timestamps, recorded with them, are kept.


def keeps(ctx: AsyncRunContext) -> bool:
    """Whether the run keeps its conversation: it continues one, or is a session's turn."""
    return bool(ctx.continues or ctx.session_name)


async def continued_messages(ctx: AsyncRunContext, given: list[ModelMessage] | None
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


async def keep_messages(ctx: AsyncRunContext, messages: list[ModelMessage]) -> None:
    """Keep ``messages`` as the run's conversation (a step)."""
    await conversations.asave(ctx, kept_form(messages))


def kept_form(messages: list[ModelMessage]) -> list[dict[str, Any]]:
    """The messages as JSON, the requests' timestamps left out (see the section's comment)."""
    data: list[dict[str, Any]] = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
    for message in data:
        if message.get("kind") == "request":
            message.pop("timestamp", None)
            for part in message.get("parts") or ():
                if isinstance(part, dict):
                    part.pop("timestamp", None)
    return data


# What ended the run -------------------------------------------------------------------------


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
