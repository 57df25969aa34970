"""A pydantic-ai ``Agent``, unchanged, as a durable run: its model requests and tool calls are
the run's steps (``pip install 'durable-agents[pydantic-ai]'``).

::

    from pydantic_ai import Agent
    from durable.integrations.pydantic_ai import DurableAgent, StepOptions

    support = Agent("openai:gpt-4o", instructions="Answer about orders.")

    @support.tool_plain
    def find_order(order_id: str) -> dict: ...

    @support.tool_plain(requires_approval=True)
    def refund(order_id: str, cents: int) -> str: ...      # idempotency key: step_context().key

    DurableAgent(support, name="support", tools={
        "refund": StepOptions(approver_role="finance", lookup=refund_lookup)})

    Client().start("support", {"prompt": "Refund order 42"})   # a worker drives it

The shape is that of pydantic-ai's own durable integrations (Temporal, DBOS, Prefect): a
wrapper around the agent; a wrapped model whose ``request`` is a step; wrapped function
toolsets whose ``call_tool`` is a step; message history carried as JSON
(``ModelMessagesTypeAdapter``). Here:

- ``DurableAgent(agent, name=...)`` registers a code agent (``durable.code``) named ``name``
  whose function runs ``agent.run(prompt)`` with the model and toolsets swapped for their
  durable wrappers (``agent.override``), tool calls one at a time, and the pydantic-ai run id
  set to the durable run id. Input: ``{"prompt": ..., "message_history": [...]}``; result:
  the run's output as JSON (and its messages with ``return_messages=True``).
- Each model request is the step ``<name>.model``: ``effect_free`` (sent again at once after
  a crash), ``model`` (counted against the "model_calls" budget), its arguments logged as a
  digest (the conversation is not copied into the log at every turn). Its recorded result is
  the ``ModelResponse`` and its ``usage``, so the "tokens" budget counts it.
- Each tool call is the step ``<name>.tool.<tool>`` (``<name>.tool.<toolset id>.<tool>`` for
  a toolset other than the agent's own): an ordinary step whose arguments are logged, claimed
  with an idempotency key the tool reads with ``step_context()``, resolved after a crash by
  the ``lookup`` given in its ``StepOptions``. A tool pydantic-ai marks
  ``requires_approval=True`` is a step with ``requires_approval = True``: the run waits in
  ``waiting_approval`` for an approver whose decision is bound to the call's digest; a
  rejection is told to the model as a denied tool call (as pydantic-ai's ``ToolDenied``).

Recovery re-executes the function: every step in the log returns its recorded outcome, so no
recorded model request is sent again and no recorded tool call runs again. The step tools are
registered globally by name; they reach the live request (the messages, the tool's
``RunContext`` and validated arguments) through a hand-off keyed by run and step, filled by
the function just before it takes the step: the worker only ever runs a code agent's step
while its function waits at that very call. A step's identity, checked on re-execution, is
its arguments as JSON, with message and part timestamps left out (they are not replay-stable).

Steps run their coroutines on one event loop per process (a daemon thread), so a model's
cached HTTP client is never reused across event loops.

Limits: only function toolsets are made durable (MCP servers and dynamic toolsets are refused
when the ``DurableAgent`` is built; external tools stay deferred); the agent's instructions,
history processors and output functions run in the function, and are re-executed on
recovery, so they must be deterministic and without effects; a tool that raises
``ApprovalRequired`` itself (rather than being declared ``requires_approval=True``) is
deferred the pydantic-ai way, ending the run with ``DeferredToolRequests`` as its output.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, TypeAdapter
from pydantic_core import to_jsonable_python

try:
    from pydantic_ai import (
        ApprovalRequired,
        CallDeferred,
        FunctionToolset,
        ModelMessagesTypeAdapter,
        ModelRetry,
        ToolFailed,
    )
    from pydantic_ai.agent import Agent as PydanticAgent
    from pydantic_ai.durable_exec import (
        conversation_id_from_run_id,
        record_durable_unit,
        replay_scope,
    )
    from pydantic_ai.messages import ModelMessage, ModelResponse, ToolReturn, ToolReturnContent
    from pydantic_ai.models import (
        CompletedStreamedResponse,
        Model,
        ModelRequestParameters,
        StreamedResponse,
        infer_model,
    )
    from pydantic_ai.models.wrapper import WrapperModel
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.tools import RunContext, ToolDenied
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool, WrapperToolset
    from pydantic_ai.toolsets.abstract import AGENT_TOOLSET_ID
    from pydantic_ai.toolsets.external import ExternalToolset
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError("durable.integrations.pydantic_ai needs pydantic-ai: "
                      "pip install 'durable-agents[pydantic-ai]'") from exc

from durable.agents import Lookup, Tool, ToolContext, registry
from durable.cancellation import Cancelled
from durable.code import AsyncRunContext, StepFailed
from durable.code import agent as code_agent

__all__ = ["DurableAgent", "PromptInput", "StepOptions", "step_context"]


class PromptInput(BaseModel):
    """A ``DurableAgent`` run's input: the user prompt and, to continue a conversation, the
    earlier messages (``ModelMessagesTypeAdapter.dump_python(messages, mode="json")``).
    Subclass it to carry what ``deps`` builds the agent's dependencies from."""

    model_config = ConfigDict(extra="forbid")

    prompt: str | None = None
    message_history: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class StepOptions:
    """How one tool's calls are run as steps (``DurableAgent(tools={name: StepOptions()})``).

    ``lookup(key, args)`` asks the system the tool acts on whether the call keyed ``key``
    happened (``Lookup.applied(the tool's result)``, ``not_applied()`` or ``unknown()``), plain
    or ``async``: it resolves a call whose outcome a crash or a timeout left unknown. Without
    one, such a call waits for an operator. ``requires_approval`` overrides what pydantic-ai
    says of the tool."""

    timeout_s: float = 60.0
    retryable: tuple[type[BaseException], ...] = ()
    cancellable: bool = False
    effect_free: bool = False
    lookup: Callable[[str, dict[str, Any]], Lookup | Awaitable[Lookup]] | None = None
    requires_approval: bool | None = None
    approver_role: str = "approver"
    approval_ttl_s: float = 86400.0


_step: ContextVar[ToolContext | None] = ContextVar("durable_pydantic_ai_step", default=None)


def step_context() -> ToolContext:
    """The step a ``DurableAgent``'s tool (or model) runs in: ``key`` (its idempotency key,
    to pass downstream), ``deadline_ms``, ``token``, ``attempt``. Raises ``LookupError``
    outside a step."""
    ctx = _step.get()
    if ctx is None:
        raise LookupError("not inside a durable step of a DurableAgent")
    return ctx


# The steps' event loop -------------------------------------------------------------------


class _StepLoop:
    """One event loop per process, on a daemon thread, for every step's coroutine: a model
    keeps its HTTP client on the loop it was first used on."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def _get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="pydantic-ai-steps",
                                 daemon=True).start()
                self._loop = loop
            return self._loop

    def run(self, make: Callable[[], Awaitable[Any]], ctx: ToolContext,
            cancellable: bool) -> Any:
        """Run the coroutine ``make()`` returns, with ``step_context()`` set, and wait for it
        on the calling (tool) thread. A cancel of a cancellable step cancels it; a thread
        interrupted by the worker (deadline, grace spent) cancels it too."""

        async def body() -> Any:
            _step.set(ctx)
            return await make()

        fut = asyncio.run_coroutine_threadsafe(body(), self._get())
        try:
            # Polled, not a blocking wait: the worker interrupts a tool thread by raising in
            # it, which only lands while it runs Python.
            while not concurrent.futures.wait([fut], timeout=0.05).done:
                if cancellable and ctx.token.cancelled:
                    fut.cancel()
                    raise Cancelled(ctx.token.reason or "cancelled")
            try:
                return fut.result()
            except concurrent.futures.CancelledError:
                raise Cancelled(ctx.token.reason or "cancelled") from None
        except BaseException:
            fut.cancel()
            raise


_LOOP = _StepLoop()


# Encodings ---------------------------------------------------------------------------------


def _opaque(value: Any) -> str:
    """A value JSON cannot carry, in a step's identity: its type (stable across runs)."""
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def _plain(value: Any) -> Any:
    return to_jsonable_python(value, fallback=_opaque)


def _identity(messages: list[ModelMessage]) -> list[Any]:
    """The messages of a request as JSON, without their timestamps: what the step's digest is
    taken over, the same when the function is executed again."""
    data: list[Any] = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
    for message in data:
        message.pop("timestamp", None)
        for part in message.get("parts") or ():
            if isinstance(part, dict):
                part.pop("timestamp", None)
    return data


def _encode_response(response: ModelResponse) -> dict[str, Any]:
    usage = response.usage
    return {
        "response": ModelMessagesTypeAdapter.dump_python([response], mode="json")[0],
        "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                  "total_tokens": usage.total_tokens},
    }


def _decode_response(data: Any) -> ModelResponse:
    (message,) = ModelMessagesTypeAdapter.validate_python([data["response"]])
    if not isinstance(message, ModelResponse):
        raise TypeError(f"a model step recorded a {type(message).__name__}, not a response")
    return message


_CONTENT: TypeAdapter[Any] = TypeAdapter(ToolReturnContent)
_TOOL_RETURN: TypeAdapter[ToolReturn[Any]] = TypeAdapter(ToolReturn)


def _encode_return(value: Any) -> dict[str, Any]:
    if isinstance(value, ToolReturn):
        return {"tool_return": _TOOL_RETURN.dump_python(value, mode="json")}
    return {"return": _CONTENT.dump_python(value, mode="json", fallback=_opaque)}


async def _tool_outcome(call: Awaitable[Any]) -> dict[str, Any]:
    """A tool call's outcome as JSON: its return, or the control-flow signal it raised
    (pydantic-ai's tools ask for a retry, fail or defer by raising)."""
    try:
        value = await call
    except ModelRetry as exc:
        return {"retry": exc.message}
    except ToolFailed as exc:
        return {"failed": exc.message}
    except ApprovalRequired as exc:
        return {"approval_required": _plain(exc.metadata)}
    except CallDeferred as exc:
        return {"deferred": _plain(exc.metadata), "kind": exc.kind}
    return _encode_return(value)


def _decode_outcome(data: Any) -> Any:
    if not isinstance(data, dict):
        raise TypeError(f"a tool step recorded {data!r}")
    if "return" in data:
        return _CONTENT.validate_python(data["return"])
    if "tool_return" in data:
        return _TOOL_RETURN.validate_python(data["tool_return"])
    if "retry" in data:
        raise ModelRetry(data["retry"])
    if "failed" in data:
        raise ToolFailed(data["failed"])
    if "approval_required" in data:
        raise ApprovalRequired(data["approval_required"])
    if "deferred" in data:
        raise CallDeferred(data["deferred"], kind=data.get("kind", "external"))
    raise TypeError(f"a tool step recorded {data!r}")


def _applied(found: Lookup) -> Lookup:
    """A user's lookup answers with the tool's own result: recorded as the step's outcome."""
    if found.status == "applied":
        return Lookup.applied(_encode_return(found.result))
    return found


def _primary(group: BaseExceptionGroup[Any]) -> BaseException:
    """What ended a run inside a task group: the worker letting go of the run (not an
    ``Exception``) first, then a failed step, else the group itself."""
    leaves = list(_leaves(group))
    for leaf in leaves:
        if not isinstance(leaf, Exception):
            return leaf
    for leaf in leaves:
        if isinstance(leaf, StepFailed):
            return leaf
    return group


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


# The function's side: the wrapped model and toolsets -----------------------------------------


@dataclass
class _Binding:
    """The durable run a ``DurableAgent``'s function is executing (a context variable)."""

    owner: DurableAgent
    ctx: AsyncRunContext

    async def step(self, tool: str, args: dict[str, Any], live: Any) -> Any:
        """Take a step, handing the live request to the step tool that will perform it."""
        key = (self.ctx.run_id, self.ctx.step + 1)
        replayed = self.ctx.replaying  # the step is in the log already
        self.owner._live[key] = live
        try:
            result = await self.ctx.call(tool, args)
        finally:
            self.owner._live.pop(key, None)
        record_durable_unit(executed=not replayed)
        return result


_binding: ContextVar[_Binding | None] = ContextVar("durable_pydantic_ai_run", default=None)


def _bound(owner: DurableAgent) -> _Binding | None:
    b = _binding.get()
    return b if b is not None and b.owner is owner else None


@dataclass
class _ModelCall:
    messages: list[ModelMessage]
    settings: ModelSettings | None
    parameters: ModelRequestParameters


@dataclass
class _ToolCall:
    toolset: AbstractToolset[Any]
    name: str
    args: dict[str, Any]
    ctx: RunContext[Any]
    tool: ToolsetTool[Any]


class _DurableModel(WrapperModel):
    """The agent's model inside a durable run: ``request`` is the step ``<name>.model``.
    Outside one (the same agent run directly), it is the model itself."""

    def __init__(self, wrapped: Model, owner: DurableAgent) -> None:
        super().__init__(wrapped)
        self._owner = owner

    async def __aenter__(self) -> Self:
        # In a run, the model is only used by its steps, on the steps' loop: not entered here.
        if _bound(self._owner) is None:
            await super().__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc_val: BaseException | None,
                        exc_tb: TracebackType | None) -> bool | None:
        if _bound(self._owner) is None:
            return await super().__aexit__(exc_type, exc_val, exc_tb)
        return None

    def _run_scope(self) -> AbstractAsyncContextManager[None]:
        if _bound(self._owner) is not None:
            return nullcontext()
        return super()._run_scope()

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        b = _bound(self._owner)
        if b is None:
            return await super().request(messages, model_settings, model_request_parameters)
        args = {"messages": _identity(messages), "settings": _plain(model_settings),
                "parameters": _plain(model_request_parameters)}
        result = await b.step(self._owner.model_step, args,
                              _ModelCall(messages, model_settings, model_request_parameters))
        return _decode_response(result)

    @asynccontextmanager
    async def request_stream(
        self, messages: list[ModelMessage], model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        if _bound(self._owner) is None:
            async with super().request_stream(messages, model_settings, model_request_parameters,
                                              run_context) as streamed:
                yield streamed
            return
        # In a run, a stream is a completed request replayed as events (a step's outcome is
        # recorded whole).
        response = await self.request(messages, model_settings, model_request_parameters)
        yield CompletedStreamedResponse(response, model_request_parameters=model_request_parameters,
                                        replay_events=True)


@dataclass
class _DurableToolset(WrapperToolset[Any]):
    """A function toolset inside a durable run: ``call_tool`` is the step of its tool."""

    owner: DurableAgent | None = None
    #: Tool name (as the toolset holds it) -> step tool name.
    steps: dict[str, str] = field(default_factory=dict)
    #: Tools whose approval this system asks for (pydantic-ai is told they need none).
    approved_here: frozenset[str] = frozenset()

    def _original(self, name: str, tool: ToolsetTool[Any]) -> str:
        original = getattr(tool, "original_name", None)
        return original if isinstance(original, str) and original else name

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        tools = await super().get_tools(ctx)
        if self.owner is None or _bound(self.owner) is None:
            return tools
        out: dict[str, ToolsetTool[Any]] = {}
        for name, tool in tools.items():
            if tool.tool_def.kind == "unapproved" and \
                    self._original(name, tool) in self.approved_here:
                tool = replace(tool, tool_def=replace(tool.tool_def, kind="function"))
            out[name] = tool
        return out

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        b = _bound(self.owner) if self.owner is not None else None
        if b is None:
            return await super().call_tool(name, tool_args, ctx, tool)
        original = self._original(name, tool)
        step = self.steps.get(original)
        if step is None:
            raise LookupError(f"tool {original!r} was not in its toolset when "
                              f"DurableAgent({b.owner.name!r}) was built")
        try:
            outcome = await b.step(step, _plain(tool_args),
                                   _ToolCall(self.wrapped, name, tool_args, ctx, tool))
        except StepFailed as exc:
            if exc.status == "rejected":
                return ToolDenied(f"The tool call was denied: {exc.error}.")
            raise
        return _decode_outcome(outcome)


# The step tools (the worker's side) ----------------------------------------------------------


class _ModelStep(Tool):
    """``<name>.model``: one model request, performed by the real model."""

    effect_free = True
    model = True
    log_args = "digest"
    cancellable = True
    owner: ClassVar[DurableAgent]

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        call = self.owner._handed(ctx, _ModelCall)
        model = self.owner.durable_model.wrapped

        async def request() -> dict[str, Any]:
            response = await model.request(call.messages, call.settings, call.parameters)
            return _encode_response(response)

        return _LOOP.run(request, ctx, cancellable=True)

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()  # never asked: an effect-free step is sent again


class _ToolStep(Tool):
    """``<name>.tool.<tool>``: one call of a pydantic-ai tool, by its own toolset."""

    owner: ClassVar[DurableAgent]
    options: ClassVar[StepOptions]

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        call = self.owner._handed(ctx, _ToolCall)
        run_ctx = call.ctx
        if self.requires_approval:  # approved by this system: the tool may know it
            run_ctx = replace(run_ctx, tool_call_approved=True)

        async def invoke() -> dict[str, Any]:
            return await _tool_outcome(
                call.toolset.call_tool(call.name, call.args, run_ctx, call.tool))

        return _LOOP.run(invoke, ctx, cancellable=self.cancellable)

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup | Awaitable[Lookup]:
        fn = self.options.lookup
        if fn is None:
            return Lookup.unknown()
        found = fn(key, args)
        if inspect.isawaitable(found):
            pending = found

            async def wrapped() -> Lookup:
                return _applied(await pending)

            return wrapped()
        return _applied(found)


# The wrapper ------------------------------------------------------------------------------


class DurableAgent:
    """Runs the pydantic-ai ``agent`` as the durable agent ``name`` (registered on
    construction, with its step tools; import the module that builds it in the workers,
    through ``DURABLE_AGENTS``).

    ``model``: the model to use instead of the agent's. ``tools``: ``StepOptions`` per tool
    name (``"<toolset id>.<tool>"`` for a toolset other than the agent's own).
    ``input_model``: a ``PromptInput`` subclass; ``deps(input)`` builds the agent's
    dependencies from it, in the worker. ``return_messages``: the result is
    ``{"output": ..., "messages": [...]}`` instead of the output alone. ``version``,
    ``budgets`` and ``options`` are the registered agent's (``durable.code.agent``).
    """

    def __init__(
        self,
        agent: PydanticAgent[Any, Any],
        *,
        name: str | None = None,
        model: Model | str | None = None,
        tools: Mapping[str, StepOptions] | None = None,
        model_timeout_s: float = 120.0,
        model_retryable: tuple[type[BaseException], ...] = (),
        input_model: type[PromptInput] = PromptInput,
        deps: Callable[[Any], Any] | None = None,
        return_messages: bool = False,
        version: str = "1",
        budgets: Mapping[str, int] | None = None,
        **options: Any,
    ) -> None:
        resolved = name or agent.name
        if not resolved:
            raise ValueError("a DurableAgent needs a name: DurableAgent(agent, name=...) or "
                             "Agent(..., name=...)")
        model_ref = model if model is not None else agent.model
        if model_ref is None:
            raise ValueError(f"DurableAgent({resolved!r}): the agent has no model; pass model=")
        self.name: str = resolved
        self.agent = agent
        self.deps = deps
        self.return_messages = return_messages
        self._model_ref = model_ref
        self._model: _DurableModel | None = None
        self._lock = threading.Lock()
        #: (run id, step) -> the live request of the step the function waits at.
        self._live: dict[tuple[str, int], Any] = {}
        self._options = dict(tools or {})
        self._used: set[str] = set()

        self.model_step = f"{resolved}.model"
        self._steps: list[Tool] = [type(f"{resolved}_model", (_ModelStep,), {
            "name": self.model_step, "timeout_s": model_timeout_s,
            "retryable": tuple(model_retryable), "owner": self})()]
        self.tool_steps: list[str] = []
        self.toolsets = [ts.visit_and_replace(self._durable_toolset) for ts in agent.toolsets]
        unknown = sorted(set(self._options) - self._used)
        if unknown:
            raise ValueError(f"DurableAgent({resolved!r}): options for unknown tools {unknown}")
        for step in self._steps:  # nothing is registered for an agent refused above
            registry.add_tool(step)

        async def run(ctx: AsyncRunContext, inp: PromptInput) -> Any:
            return await self._run(ctx, inp)

        run.__name__ = run.__qualname__ = resolved
        self.code_agent = _register(resolved, input_model, self.model_step, self.tool_steps,
                                   version, budgets, options)(run)

    # Registration ---------------------------------------------------------------------

    def _durable_toolset(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any]:
        if isinstance(toolset, ExternalToolset):
            return toolset  # its calls are deferred to the caller, never run here
        if not isinstance(toolset, FunctionToolset):
            raise TypeError(f"DurableAgent({self.name!r}): {toolset.label} is not a function "
                            "toolset; only function toolsets' calls can be made durable steps")
        if toolset.id == AGENT_TOOLSET_ID:
            prefix, scope = f"{self.name}.tool.", ""
        elif toolset.id:
            prefix, scope = f"{self.name}.tool.{toolset.id}.", f"{toolset.id}."
        else:
            raise ValueError(f"DurableAgent({self.name!r}): {toolset.label} needs an id "
                             "(FunctionToolset(..., id=...)): its steps are named after it")
        steps: dict[str, str] = {}
        approved_here: set[str] = set()
        for tool_name, tool in toolset.tools.items():
            opts = self._options.get(scope + tool_name, StepOptions())
            self._used.add(scope + tool_name)
            needs = tool.requires_approval if opts.requires_approval is None \
                else opts.requires_approval
            step = prefix + tool_name
            self._steps.append(type(f"{self.name}_{scope}{tool_name}", (_ToolStep,), {
                "name": step, "timeout_s": opts.timeout_s, "retryable": opts.retryable,
                "cancellable": opts.cancellable, "effect_free": opts.effect_free,
                "requires_approval": needs, "approver_role": opts.approver_role,
                "approval_ttl_s": opts.approval_ttl_s, "owner": self, "options": opts})())
            steps[tool_name] = step
            self.tool_steps.append(step)
            if needs:
                approved_here.add(tool_name)
        return _DurableToolset(wrapped=toolset, owner=self, steps=steps,
                               approved_here=frozenset(approved_here))

    @property
    def durable_model(self) -> _DurableModel:
        """The model wrapper (built on first use: a model named by a string is resolved,
        and its provider's credentials read, only where a run needs it)."""
        with self._lock:
            if self._model is None:
                self._model = _DurableModel(infer_model(self._model_ref), self)
            return self._model

    def _handed(self, ctx: ToolContext, kind: type[Any]) -> Any:
        live = self._live.get((ctx.run_id, ctx.step))
        if not isinstance(live, kind):
            raise RuntimeError(f"step {ctx.step} of {ctx.run_id}: no live request was handed "
                               f"to {self.name!r} (is its function waiting at this step?)")
        return live

    # The run ---------------------------------------------------------------------------

    @staticmethod
    def prompt_input(prompt: str | None, message_history: list[ModelMessage] | None = None,
                     **fields: Any) -> dict[str, Any]:
        """A run's input: ``client.start(name, DurableAgent.prompt_input("...", messages))``."""
        out: dict[str, Any] = {"prompt": prompt, **fields}
        if message_history:
            out["message_history"] = ModelMessagesTypeAdapter.dump_python(message_history,
                                                                           mode="json")
        return out

    async def _run(self, ctx: AsyncRunContext, inp: PromptInput) -> Any:
        history = (ModelMessagesTypeAdapter.validate_python(inp.message_history)
                   if inp.message_history else None)
        # Replay-stable ids: the conversation's own, or one derived from the run id.
        conversation = next((m.conversation_id for m in reversed(history or [])
                             if m.conversation_id), None) or conversation_id_from_run_id(ctx.run_id)
        token = _binding.set(_Binding(self, ctx))
        try:
            with self.agent.override(model=self.durable_model, toolsets=self.toolsets, tools=[]), \
                    self.agent.parallel_tool_call_execution_mode("sequential"), replay_scope():
                result = await self.agent.run(
                    inp.prompt, message_history=history, run_id=ctx.run_id,
                    conversation_id=conversation,
                    deps=self.deps(inp) if self.deps is not None else None)
        except BaseExceptionGroup as group:
            raise _primary(group) from None
        finally:
            _binding.reset(token)
        output = _plain(result.output)
        if self.return_messages:
            return {"output": output, "messages": ModelMessagesTypeAdapter.dump_python(
                result.all_messages(), mode="json")}
        return output


def _register(name: str, input_model: type[PromptInput], model_step: str, tool_steps: list[str],
             version: str, budgets: Mapping[str, int] | None,
             options: Mapping[str, Any]) -> Callable[[Callable[..., Any]], Any]:
    """The ``durable.code.agent`` registration of a ``DurableAgent``'s function."""
    register = code_agent(name, input_model=input_model, tools=(model_step, *tool_steps),
                     version=version, budgets=budgets, **options)

    def wrap(fn: Callable[..., Any]) -> Any:
        return register(fn).agent  # type: ignore[attr-defined]

    return wrap
