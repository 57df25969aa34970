"""The operation backend of ``RedisDurability``: every durable operation pydantic-ai's base
hands it (a model request, a tool call, an MCP server's tool list, an event shown to the
handler, a ``@durable_operation`` of a capability...) is one step of the run's code agent.

pydantic-ai's ``CallableOperationBackend`` owns naming, configuration and the result's JSON;
this backend implements ``execute``: the function takes the step (``ctx.call``), handing the
operation's body to the step tool that runs it (``durable.integrations.base.LiveRequests``),
and gets back the recorded JSON (``JSON_CODEC``), from the log when the function is executed
again. What a step is called is ``StepNamer``'s (persisted compatibility data, pinned by
``tests/test_pydantic_ai_names.py``); what it is checked by on re-execution, its arguments,
is ``step_args``'s: the tool's arguments, or a digest of a request's messages, never their
timestamps.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, Literal, TypeVar

from pydantic_ai.durable_exec import (
    BoundDurableOperation,
    CallableOperationBackend,
    CapabilityOperationId,
    DurableOperation,
    DurableOperationId,
    DynamicToolsetCallToolParams,
    EventStreamHandlerId,
    EventStreamHandlerParams,
    JournalOperationNamer,
    ModelCancelSuspendedResponseId,
    ModelCompactMessagesId,
    ModelCompactMessagesParams,
    ModelCountTokensId,
    ModelRequestId,
    ModelRequestParams,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
    ToolsetCallToolParams,
    ToolsetGetInstructionsId,
    ToolsetGetToolsId,
    ToolsetValidateToolArgumentsId,
)
from pydantic_ai.toolsets.abstract import AGENT_TOOLSET_ID

from durable.call_identity import digest_placeholder
from durable.code import StepFailed
from durable.errors import DurableError
from durable.integrations.base import current_step, stable
from durable.integrations.pydantic_ai import compat
from durable.integrations.pydantic_ai.identity import identity
from durable.integrations.pydantic_ai.run import Binding, Shared, binding

P = TypeVar("P")
W = TypeVar("W")
R = TypeVar("R")

__all__ = ["Live", "Rejected", "StepBackend", "StepConfig", "StepNamer", "model_step"]


# The names of the steps ---------------------------------------------------------------------


def model_step(name: str, operation_id: DurableOperationId) -> str | None:
    """The step of a model operation of the agent ``name`` (None for any other operation)."""
    match operation_id:
        case ModelRequestId():
            return f"{name}.model"  # streamed or not, by any model: one step
        case ModelCompactMessagesId():
            return f"{name}.model.compact"
        case ModelCountTokensId():
            return f"{name}.model.count_tokens"
        case ModelCancelSuspendedResponseId():
            return f"{name}.model.cancel_suspended"
    return None


class StepNamer(JournalOperationNamer):
    """The step each operation of the agent ``name`` is, named as this integration's steps
    were before it stood on pydantic-ai's base: ``<name>.model``, ``<name>.tool.<tool>``
    (``<name>.tool.<toolset id>.<tool>`` for another toolset), ``<name>.tool.<id>.call`` for
    a dynamic toolset, ``<name>.mcp.<id>.call`` (and ``.read``, ``.tools``) for an MCP
    server; and for what pydantic-ai made durable since: ``<name>.events`` (an event shown
    to the handler), ``<name>.capability`` (a capability's ``@durable_operation``, named in
    its arguments), ``<name>.tool.<id>.tools`` (a
    dynamic toolset's tools), ``<name>.mcp.<id>.instructions``, ``...validate``."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def operation_name(self, operation_id: DurableOperationId) -> str:
        n = self.name
        model = model_step(n, operation_id)
        if model is not None:
            return model
        match operation_id:
            case EventStreamHandlerId():
                return f"{n}.events"
            case CapabilityOperationId():
                return f"{n}.capability"  # which one: in its arguments
            case ToolsetGetToolsId(toolset_kind="mcp", toolset_id=ident):
                return f"{n}.mcp.{ident}.tools"
            case ToolsetGetToolsId(toolset_id=ident):
                return f"{n}.tool.{ident}.tools"
            case ToolsetGetInstructionsId(toolset_id=ident):
                return f"{n}.mcp.{ident}.instructions"
            case ToolsetValidateToolArgumentsId(toolset_kind="dynamic", toolset_id=ident):
                return f"{n}.tool.{ident}.validate"
            case ToolsetValidateToolArgumentsId(toolset_id=ident):
                return f"{self.tool_prefix(ident)}*.validate"
            case ToolsetCallToolId(toolset_kind="mcp", toolset_id=ident):
                return f"{n}.mcp.{ident}.call"
            case ToolsetCallToolId(toolset_kind="dynamic", toolset_id=ident):
                return f"{n}.tool.{ident}.call"
            case ToolsetCallToolId(toolset_id=ident):
                return f"{self.tool_prefix(ident)}*"
        # A kind of operation this release does not know (pydantic-ai's union grows in
        # minor releases): a step of its own, refused at registration (no step tool).
        return f"{n}.operation.{type(operation_id).__name__}"

    def tool_prefix(self, toolset_id: str) -> str:
        """What a function toolset's tools' steps are named with, before the tool's name."""
        if toolset_id == AGENT_TOOLSET_ID:
            return f"{self.name}.tool."
        return f"{self.name}.tool.{toolset_id}."

    def invocation_name(self, operation_id: DurableOperationId, *,
                        label: str | None) -> Any:  # pydantic-ai's DurableInvocationName
        named = super().invocation_name(operation_id, label=label)
        step = self.operation_name(operation_id)
        if "*" in step:  # a function tool's step: named after the tool
            step = step.replace("*", label or "")
        return replace(named, operation_name=step, display_name=step)


# Configuration: which calls are steps ------------------------------------------------------


@dataclass(frozen=True)
class StepConfig:
    """What an operation's step needs beyond its name: ``read_only`` for an MCP tool the
    server marks read-only (its step is ``.read``, effect-free)."""

    read_only: bool = False


#: The configuration of every operation but the calls that need their own.
PLAIN = StepConfig()


# Handing the body over ----------------------------------------------------------------------


@dataclass
class Live:
    """The live body of an operation's step, handed from the function to its step tool."""

    body: Callable[[], Awaitable[object]]
    operation_id: DurableOperationId


class Rejected(DurableError):
    """A tool call whose approval was rejected: told to the model as a denied call."""


#: The parameters of the operation being dispatched (``execute`` is not given them).
_PARAMS: ContextVar[object] = ContextVar("durable_pydantic_ai_params", default=None)


class _Bound(BoundDurableOperation[P, W, R]):
    """A bound operation that makes its parameters known to ``execute``."""

    def __init__(self, inner: BoundDurableOperation[P, W, R]) -> None:
        self._inner = inner

    @property
    def operation(self) -> DurableOperation[P, W, R]:
        return self._inner.operation

    async def __call__(self, params: P, *, config: object | None = None) -> R:
        token = _PARAMS.set(params)
        try:
            return await self._inner(params, config=config)
        finally:
            _PARAMS.reset(token)


class StepBackend(CallableOperationBackend[StepConfig]):
    """Runs each operation of the agent ``name`` as one step of its run (see the module)."""

    def __init__(self, shared: Shared, name: str,
                 resolve_tool: Callable[[DurableOperationId, object | None, str],
                                        StepConfig | Literal[False]],
                 *, shows_events: bool = True) -> None:
        super().__init__(namer=StepNamer(name), config=RoleBasedOperationConfig(
            model=PLAIN, event=PLAIN, capability=PLAIN, tool=PLAIN, resolve_tool=resolve_tool))
        self.shared = shared
        #: False when no handler of the user's sees the events (``stream=True`` alone): they
        #: are drained where they are raised, not recorded as ``.events`` steps of nothing.
        self.shows_events = shows_events

    def bind(self, operation: DurableOperation[P, W, R]) -> BoundDurableOperation[P, W, R]:
        return _Bound(super().bind(operation))

    def execution_attempt(self) -> int:
        step = current_step()
        return step.attempt if step is not None else 1

    async def execute(self, *, operation_id: DurableOperationId, name: str,
                      body: Callable[[], Awaitable[object]], cache_key: tuple[object, ...],
                      config: StepConfig) -> object:
        b = binding.get()
        if b is None or b.shared is not self.shared:  # not this agent's durable run
            return await body()
        if isinstance(operation_id, EventStreamHandlerId) and not self.shows_events:
            return await body()
        if config.read_only and name.endswith(".call"):
            name = name[: -len("call")] + "read"
        pinned = isinstance(operation_id, ToolsetGetToolsId | ToolsetGetInstructionsId) \
            and getattr(operation_id, "toolset_kind", "mcp") == "mcp"
        if pinned and name in b.pinned:  # an MCP server's tools: recorded once per run
            return b.pinned[name]
        try:
            recorded = await b.step(name, step_args(operation_id, _PARAMS.get(), b),
                                    Live(body, operation_id))
        except StepFailed as exc:
            if exc.status == "rejected":
                raise Rejected(f"The tool call was denied: {exc.error}.") from None
            raise
        payload = compat.payload(operation_id, recorded)
        if pinned:
            b.pinned[name] = payload
        return payload


# The arguments a step is checked by ---------------------------------------------------------


def step_args(operation_id: DurableOperationId, params: object, b: Binding) -> dict[str, Any]:
    """The arguments of an operation's step: what its identity is checked by when the
    function is executed again (and what an approver sees of a tool call)."""
    match params:
        case ModelRequestParams():
            return b.request_args(params.messages, params.model_settings,
                                  params.model_request_parameters)
        case ToolsetCallToolParams() if isinstance(operation_id, ToolsetCallToolId) \
                and operation_id.toolset_kind == "function":
            return dict(stable(params.tool_args))
        case ToolsetCallToolParams() | DynamicToolsetCallToolParams():
            return {"tool": params.name, "args": stable(params.tool_args)}
        case ModelCompactMessagesParams():
            request = params.request_context
            return _digested({"messages": identity(request.messages),
                              "instructions": params.instructions}, "compaction")
        case EventStreamHandlerParams():
            event = params.event
            call = getattr(getattr(event, "part", None), "tool_call_id", None) \
                or getattr(event, "tool_call_id", None)
            return {"event": event.event_kind, **({"call": call} if call else {})}
    if isinstance(operation_id, ToolsetGetToolsId | ToolsetGetInstructionsId):
        return {}
    if isinstance(operation_id, CapabilityOperationId):
        arguments = getattr(params, "arguments", None)
        return {**digest_placeholder(stable(arguments)), "capability":
                operation_id.capability_id, "operation": operation_id.operation}
    return _digested(stable(_without_run_context(params)), type(params).__name__)


def _digested(value: Any, what: str) -> dict[str, Any]:
    """Arguments recorded by their digest, with what they are the arguments of (a field
    besides the digest: the log keeps them so, as it keeps a model request's)."""
    return {**digest_placeholder(value), "of": what}


def _without_run_context(params: object) -> object:
    """An operation's parameters without the run context (the run itself, not its input)."""
    if not is_dataclass(params) or isinstance(params, type):
        return params
    return {f.name: getattr(params, f.name) for f in fields(params)
            if f.name not in ("run_context", "ctx")}
