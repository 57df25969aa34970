"""A durable pydantic-ai run: what its function gives ``agent.run`` (``RunInput``), what a
``RedisDurability``, the copies pydantic-ai binds of it and its step tools share
(``Shared``), the binding of the function to the durable run it executes, the conversation
a run continues and keeps, and what ended a run inside a task group. ``StepOptions``,
``step_context()`` and ``run_in_step`` (which every step tool awaits its work with) are the
shared ones of ``durable.integrations.base``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
from pydantic_ai.messages import ModelMessage, UserContent
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.tools import DeferredToolResults
from pydantic_ai.usage import UsageLimits

from durable import conversations
from durable.agents import Fail, ToolContext
from durable.code import AsyncRunContext, EndRun, StepFailed
from durable.integrations.base import Bindings, LiveRequests
from durable.integrations.pydantic_ai.identity import RequestDigest, identity
from durable.request_digest import digested
from durable.telemetry.tracing import capturing_content

__all__ = ["RUNS", "Binding", "PromptInput", "RunInput", "Shared", "binding",
           "continued_messages", "keep_messages", "keeps", "primary", "prompt_input"]

T = TypeVar("T")


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


@dataclass
class Shared:
    """What a ``RedisDurability`` and the copies pydantic-ai binds of it to its agent
    (``for_agent``) share: the live requests handed to its step tools (what the step tools
    know of it: an ``Owner``). The binding of a run names it, not a copy."""

    #: The registered agent's name (an ``Owner``'s).
    name: str = ""
    live: LiveRequests = field(default_factory=LiveRequests)
    #: The agent its copies were bound to.
    agent: Any = None
    #: The copy pydantic-ai bound to it (``for_agent``), made once.
    bound: Any = None
    registered: bool = False

    def handed(self, ctx: ToolContext, step: str, args: dict[str, Any], kind: type[T]) -> T:
        """The live request of the step ``ctx`` runs (the function waits at it, by number)."""
        return self.live.take((ctx.run_id, ctx.step), kind, ctx, step)


@dataclass
class Binding:
    """The durable run a capability's function is executing (a context variable)."""

    shared: Shared
    ctx: AsyncRunContext
    #: Steps handed to the run and not answered yet (several at once: parallel tool calls).
    inflight: set[int] = field(default_factory=set)
    #: What was recorded once per run and is read again from the binding (MCP tool lists).
    pinned: dict[str, Any] = field(default_factory=dict)
    #: The digest of the function's model requests, taken one new message at a time.
    digest: RequestDigest = field(default_factory=RequestDigest)

    @property
    def owner(self) -> Shared:
        return self.shared

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

    async def step(self, tool: str, args: dict[str, Any], live: Any) -> Any:
        """Take a step, handing the live request to the step tool that will perform it.

        Calls started together (pydantic-ai's parallel tool calls) join one parallel
        decision, numbered in the order they join; the number is taken in the same
        synchronous stretch as the join, so it is the one the run gives the call."""
        n = self.next_step()
        replayed = self.ctx.replaying  # the step is in the log already
        self.inflight.add(n)
        try:
            with self.shared.live.handing((self.ctx.run_id, n), live):
                result = await self.ctx.call(tool, args)
        finally:
            self.inflight.discard(n)
        record_durable_unit(executed=not replayed)
        return result


RUNS: Bindings[Binding] = Bindings("durable_pydantic_ai_run")
binding = RUNS.var


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
