"""The durable agent: ``RedisDurability``, a durability engine built on pydantic-ai's public
base (``pydantic_ai.durable_exec.BaseDurabilityCapability``, the base of its Temporal, DBOS,
Prefect and Hatchet engines), and ``DurableAgent``, the same for an agent built without it.

pydantic-ai's base wraps the agent's model, toolsets, event stream and capabilities'
``@durable_operation`` methods and hands each durable operation to the engine's backend
(``backend``: one step of the run's code agent each). What this class declares is the
engine: its ``engine_spec``, its backend, its durable timer (``durable_sleep``: the run's
``ctx.sleep``, a timer of the reconciler's), how a tool's approval is asked
(``handle_deferred_tool_calls``: by the step), and the registration of the agent as a code
agent (``durable.code``) whose function runs ``agent.run``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Self

from pydantic_ai import ModelMessagesTypeAdapter
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
    DurableOperationId,
    ToolsetCallToolId,
    conversation_id_from_run_id,
)
from pydantic_ai.exceptions import (
    AgentRunError,
    ModelAPIError,
    RunCancelled,
    UsageLimitExceeded,
    UserError,
)
from pydantic_ai.messages import ModelMessage, UserContent
from pydantic_ai.models import Model
from pydantic_ai.tools import (
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolApproved,
    ToolDefinition,
    ToolDenied,
)
from pydantic_ai.toolsets import AbstractToolset

from durable import conversations
from durable.agents import Cancel, Fail, registry
from durable.code import AsyncRunContext, EndRun
from durable.code import agent as code_agent
from durable.errors import NondeterminismError, Signal
from durable.flow import budgets as run_budgets
from durable.integrations.base import StepOptions, configured_by, model_id, named, stable
from durable.integrations.pydantic_ai import mcp
from durable.integrations.pydantic_ai.backend import PLAIN, Rejected, StepBackend, StepConfig
from durable.integrations.pydantic_ai.model import StepModel, streaming_handler
from durable.integrations.pydantic_ai.models import check_buildable, run_model
from durable.integrations.pydantic_ai.run import (
    Binding,
    RunInput,
    Shared,
    binding,
    continued_messages,
    keep_messages,
    keeps,
    primary,
    prompt_input,
)
from durable.integrations.pydantic_ai.steps import AgentSteps, agent_steps

#: This engine, as pydantic-ai's base reads it (each field chosen, see the guide).
ENGINE = DurabilityEngineSpec(
    engine_name="durable-agents",
    durable_unit_noun="step",
    durable_container_noun="run",
    # Steps are recorded as JSON in the run's log: the base reduces every value to JSON
    # inside the step, so what cannot be recorded fails the step that made it.
    codec=JSON_CODEC,
    wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
    # Steps run in the run's process, on its event loop: an MCP session opened by the first
    # step that needs it serves the run's other steps, and the run closes it.
    toolset_lifecycles={"function": "enter-always", "mcp": "enter-in-durable-unit",
                        "dynamic": "enter-never"},
    tool_call_result_upgrade_lenient=False,  # earlier records are upgraded by ``compat``
    journal_discovery=True,  # an MCP server's tools and a dynamic toolset's are steps
    sequential_tools_in_durable_context=False,  # a reply's calls are one parallel group
    # A toolset given to one run has no step tools: the workers register them beforehand.
    unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
    tool_config_key=None,  # a tool's steps are configured by StepOptions, not metadata
    # ``ctx.sleep`` lets the worker go by raising a signal the function must not catch.
    control_flow_error_types=(Signal,),
    nondeterminism_error_types=(NondeterminismError,),
    accepts_cancellation_token=False,
)

#: The key the capability's own model is registered under with the base (``models=``).
OWN_MODEL = "durable-agents:model"


class RedisDurability(BaseDurabilityCapability[Any]):
    """Makes a pydantic-ai agent's runs durable runs of this system, named ``name`` (the
    agent's name by default)::

        durability = RedisDurability(tools={"refund": StepOptions(lookup=refund_lookup)})
        support = Agent("openai:gpt-4o", name="support", capabilities=[durability])

        @support.tool_plain
        def refund(order_id: str, cents: int) -> str: ...

        durability.register()        # in the module the workers import (DURABLE_AGENTS)

    ``register()`` registers the agent and a step tool for each of its tools, once they are
    all declared; ``DurableAgent(agent, ...)`` does the same for an agent built without the
    capability. ``tools``: ``StepOptions`` per tool name (``"<toolset id>.<tool>"`` for a
    toolset other than the agent's own, ``"<toolset id>.*"`` for every tool of an MCP
    server or a dynamic toolset). ``model``: the model of its runs, instead of the agent's;
    ``models``: other models by name, one of which a run's input may choose
    (``{"model": "<name>"}``). ``model_timeout_s``, ``model_retryable``: the model step's
    (pydantic-ai's ``UserError`` and ``UsageLimitExceeded`` are never retried).
    ``input_model``: a ``RunInput`` subclass; ``deps(input)`` builds the agent's
    dependencies from it, in the worker. ``return_messages``: the result is ``{"output":
    ..., "messages": [...]}``. ``stream``: model requests are streamed, their text published
    to the run's followers. ``event_stream_handler``: pydantic-ai's, each event shown to it
    in a step of its own, so once across recoveries. ``version``, ``budgets`` and
    ``options`` are the registered agent's (``durable.code``).
    """

    engine_spec = ENGINE

    def __init__(
        self, *, name: str | None = None, model: Model | str | None = None,
        models: Mapping[str, Model | str] | None = None,
        tools: Mapping[str, StepOptions] | None = None, model_timeout_s: float = 120.0,
        model_retryable: tuple[type[BaseException], ...] = (),
        input_model: type[RunInput] = RunInput, deps: Callable[[Any], Any] | None = None,
        return_messages: bool = False, stream: bool = False,
        event_stream_handler: Callable[..., Any] | None = None, version: str = "1",
        budgets: Mapping[str, int] | None = None, **options: Any,
    ) -> None:
        instances = {k: m for k, m in (models or {}).items() if isinstance(m, Model)}
        if isinstance(model, Model):
            instances[OWN_MODEL] = model
        handler = streaming_handler(event_stream_handler) if stream else event_stream_handler
        super().__init__(models=instances, event_stream_handler=handler, name=name)
        self.id, self.description, self.defer_loading = None, None, False
        self._given_name = name
        self.model, self.models = model, dict(models or {})
        self.options = dict(tools or {})
        self.model_timeout_s, self.model_retryable = model_timeout_s, tuple(model_retryable)
        self.input_model, self.deps = input_model, deps
        self.return_messages, self.stream = return_messages, stream
        self.handles_events = event_stream_handler is not None or stream
        self.shows_events = event_stream_handler is not None
        self.version, self.budgets, self.agent_options = version, budgets, options
        #: Shared with every copy pydantic-ai binds of this capability (``for_agent``).
        self.shared = Shared()
        self.steps = AgentSteps()
        self.attached = False
        self._lock = threading.Lock()

    # The engine -----------------------------------------------------------------------------

    @property
    def in_durable_context(self) -> bool:
        b = binding.get()
        return b is not None and b.shared is self.shared

    def get_durable_operation_backend(self) -> StepBackend:
        return StepBackend(self.shared, self.durable_name, self._tool_config,
                           shows_events=self.shows_events)

    def _tool_config(self, operation_id: DurableOperationId, tool: object | None,
                     tool_name: str) -> StepConfig | Literal[False]:
        if not isinstance(operation_id, ToolsetCallToolId):
            return PLAIN
        if operation_id.toolset_kind == "mcp":
            return StepConfig(read_only=mcp.read_only_tool(tool))
        if (operation_id.toolset_id, tool_name) in self.steps.not_steps:
            return False  # ``StepOptions(step=False)``: run in the function, not a step
        return PLAIN

    async def durable_sleep(self, seconds: float) -> None:
        """A wait of the agent graph's (between polls of a model's background job, before a
        retried model request): the run's durable timer (``ctx.sleep``), so it holds no
        worker and a recovered run does not wait again through time that passed."""
        b = binding.get()
        if b is None:
            await super().durable_sleep(seconds)
            return
        await b.ctx.sleep(seconds)

    def _durable_run_context(self, ctx: RunContext[Any]) -> RunContext[Any]:
        """The run context of code inside a step: pydantic-ai's, whose ``enqueue()`` raises
        (a message enqueued by a recorded step would not be enqueued again on replay), with
        the run's live ``cancel()`` kept. pydantic-ai refuses a cancel inside a durable unit,
        as its replay would not cancel again; here a tool's cancel ends the run, and the
        ``canceled`` event is recorded with the step's outcome, so no replay follows it."""
        guarded = super()._durable_run_context(ctx)
        live = ctx.__dict__.get("_cancellation")
        return dataclasses.replace(guarded, _cancellation=live) if live is not None else guarded

    def get_model(self) -> Any:
        return self.model  # the capability's own model, instead of the agent's

    def get_wrapper_model(self, model: Model) -> Model | None:
        return model if isinstance(model, StepModel) else StepModel(model)

    async def prepare_tools(self, ctx: RunContext[Any],
                            tool_defs: list[ToolDefinition]) -> list[ToolDefinition]:
        """A tool whose approval this system asks runs alone: a parallel group cannot wait
        for an approval."""
        if not self.in_durable_context or not self.steps.approved_here:
            return tool_defs
        return [dataclasses.replace(t, sequential=True) if t.name in self.steps.approved_here
                else t for t in tool_defs]

    async def handle_deferred_tool_calls(self, ctx: RunContext[Any], *,
                                         requests: DeferredToolRequests
                                         ) -> DeferredToolResults | None:
        """A call pydantic-ai holds for an approval goes on to its step, which waits for an
        approver's signed decision (``waiting_approval``); told no, the call is denied."""
        if not self.in_durable_context:
            return None
        ours = self.steps.approved_here | self.steps.approved_anyway
        approved: dict[str, bool | ToolApproved | ToolDenied] = {
            c.tool_call_id: True for c in requests.approvals if c.tool_name in ours}
        return DeferredToolResults(approvals=approved) if approved else None

    async def wrap_tool_execute(self, ctx: RunContext[Any], *, call: Any, tool_def: Any,
                                args: Any, handler: Any) -> Any:
        try:
            return await handler(args)
        except Rejected as exc:
            return ToolDenied(str(exc))

    # Binding and registration ------------------------------------------------------------

    @property
    def durable_name(self) -> str:
        agent = self.shared.agent
        resolved = self._given_name or (agent.name if agent is not None else None)
        if not resolved:
            raise ValueError("a durable pydantic-ai agent needs a name: "
                             "RedisDurability(name=...) or Agent(..., name=...)")
        return resolved

    def for_agent(self, agent: AbstractAgent[Any, Any]) -> AbstractCapability[Any]:
        shared = self.shared
        if shared.agent is not None and shared.agent is not agent:
            raise ValueError(f"RedisDurability({self._given_name!r}) is attached to another "
                             "agent already: give each agent its own")
        if shared.agent is None:
            shared.agent, self.attached = agent, True
        if shared.bound is None:  # bound once: each run of DurableAgent's joins this copy
            shared.bound = super().for_agent(agent)
        bound: AbstractCapability[Any] = shared.bound
        return bound

    def register(self, agent: AbstractAgent[Any, Any] | None = None) -> Self:
        """Register the agent and its step tools (once; refused on a taken name, an unknown
        tool option or a toolset without a unique id, registering nothing then)."""
        with self._lock:
            shared = self.shared
            if agent is not None and shared.agent is None:
                shared.agent = agent  # not attached: the capability joins each of its runs
            elif agent is not None and agent is not shared.agent:
                raise ValueError(f"RedisDurability({self._given_name!r}) is attached to "
                                 "another agent already: give each agent its own")
            if shared.agent is None:
                raise ValueError("RedisDurability.register(): attach it to an agent first "
                                 "(Agent(..., capabilities=[...])) or pass the agent")
            if shared.registered:
                return self
            name = shared.name = self.durable_name
            check_buildable(name, shared.agent, self.model, self.models)
            taken = [n for n in (*registry.agents, *registry.tools)
                     if n == name or n.startswith(f"{name}.")]
            if taken:
                raise ValueError(f"a durable agent named {name!r} is registered already "
                                 f"({', '.join(sorted(taken)[:3])}): give this one another name")
            _check_built_once(name, shared.agent)
            steps = agent_steps(name, shared, shared.agent.toolsets, self.options,
                                self.model_timeout_s, self.model_retryable)
            for toolset in steps.mcp.values():
                mcp.prepare(toolset)
            for step in steps.tools:  # nothing is registered for an agent refused above
                registry.add_tool(step)
            self.steps.__dict__.update(steps.__dict__)  # the bound copies share the object
            self._register_function(name)
            shared.registered = True
            return self

    def _register_function(self, name: str) -> None:
        async def run(ctx: AsyncRunContext, inp: RunInput) -> Any:
            return await self._run(ctx, inp)

        run.__name__ = run.__qualname__ = name
        register = code_agent(name, input_model=self.input_model,
                              tools=(*(s.name for s in self.steps.tools), *conversations.TOOLS),
                              version=self.version, budgets=self.budgets,
                              configuration=configured_by(self.pinned), **self.agent_options)
        register(run)

    def pinned(self) -> dict[str, Any]:
        """What a run pins of pydantic-ai's agent (``configured_by``): its model and its
        instructions and system prompts (texts, or functions' names), so a deploy that
        changes them shows as drift on the runs started before it."""
        agent = self.shared.agent
        model = self.model if self.model is not None else getattr(agent, "model", None)
        prompt = [named(getattr(i, "instruction", i))
                  for i in getattr(agent, "_instructions", None) or ()]
        prompt += [named(p) for p in getattr(agent, "_system_prompts", None) or ()]
        prompt += [named(getattr(f, "function", f))
                   for f in getattr(agent, "_system_prompt_functions", None) or ()]
        return {"model": model_id(model), "prompt": prompt}

    # The run ------------------------------------------------------------------------------

    async def _run(self, ctx: AsyncRunContext, inp: RunInput) -> Any:
        agent = self.shared.agent
        assert agent is not None
        kwargs = inp.run_kwargs()
        history = kwargs["message_history"] = await continued_messages(
            ctx, kwargs["message_history"])
        # Replay-stable ids: the conversation's own, or one derived from the run id.
        conversation = next((m.conversation_id for m in reversed(history or [])
                             if m.conversation_id), None) or conversation_id_from_run_id(ctx.run_id)
        deps = self.deps(inp) if self.deps is not None else None
        chosen = await run_model(agent, None, self.models, inp.model, deps)
        if chosen is not None:
            kwargs["model"] = chosen
        if self.handles_events:
            kwargs["event_stream_handler"] = _ignore_events  # model requests are streamed
        token = binding.set(Binding(self.shared, ctx))
        try:
            result = await agent.run(**kwargs, run_id=ctx.run_id, conversation_id=conversation,
                                     deps=deps, capabilities=None if self.attached else [self])
        except UsageLimitExceeded as exc:
            raise EndRun(Fail(f"{run_budgets.REASON}: {exc}", reason=run_budgets.REASON)) \
                from None
        except RunCancelled as exc:
            raise EndRun(Cancel(str(exc) or "the agent canceled its run")) from None
        except ModelAPIError as exc:
            raise EndRun(Fail(f"the model failed: {exc}")) from None
        except UserError as exc:  # the agent cannot run so (pydantic-ai's reason)
            raise EndRun(Fail(f"pydantic-ai refused the run: {exc}")) from None
        except AgentRunError as exc:  # the model misbehaved, a limit of pydantic-ai's...
            raise EndRun(Fail(f"{type(exc).__name__}: {exc}")) from None
        except BaseExceptionGroup as group:
            raise primary(group) from None
        finally:
            binding.reset(token)
        if keeps(ctx):  # for the run that continues this one
            await keep_messages(ctx, result.all_messages())
        output = stable(result.output)
        if self.return_messages:
            return {"output": output, "messages": ModelMessagesTypeAdapter.dump_python(
                result.all_messages(), mode="json")}
        return output


class DurableAgent:
    """Runs the pydantic-ai ``agent`` as the durable agent ``name`` (registered on
    construction, with its step tools; import the module that builds it in the workers,
    through ``DURABLE_AGENTS``). Takes ``RedisDurability``'s options; an agent that already
    carries a ``RedisDurability`` is registered with that one (and no options)."""

    def __init__(self, agent: AbstractAgent[Any, Any], **options: Any) -> None:
        attached = _attached(agent)
        if attached is not None:
            if options:
                raise ValueError(f"agent {agent.name!r} carries a RedisDurability already: "
                                 "give the options to it, not to DurableAgent")
            self.durability = attached.register()
        else:
            self.durability = RedisDurability(**options).register(agent)
        self.agent = agent
        self.name = self.durability.durable_name
        self.model_step = f"{self.name}.model"
        self.tool_steps = [s.name for s in self.durability.steps.tools]

    @staticmethod
    def prompt_input(prompt: str | Sequence[UserContent] | None,
                     message_history: Sequence[ModelMessage] | None = None,
                     **fields: Any) -> dict[str, Any]:
        """A run's input: ``client.start(name, DurableAgent.prompt_input("...", messages))``."""
        return prompt_input(prompt, message_history, **fields)


def _check_built_once(name: str, agent: AbstractAgent[Any, Any]) -> None:
    """Refuse a capability whose ``get_toolset()`` builds a new toolset each time it is
    asked: pydantic-ai's base makes a toolset durable once, when the agent is built, and
    refuses any other in a run (each run asks the capability again)."""
    anew: list[str] = []

    def visit(capability: AbstractCapability[Any]) -> None:
        first, again = capability.get_toolset(), capability.get_toolset()
        if isinstance(first, AbstractToolset) and first is not again:
            anew.append(str(first.id or first.label))

    agent.root_capability.apply(visit)
    if anew:
        raise ValueError(
            f"durable agent {name!r}: the toolset {anew[0]!r} is built anew each time its "
            "capability's get_toolset() is asked: a toolset's steps are made once, when the "
            "agent is built; return the same toolset each time")


def _attached(agent: AbstractAgent[Any, Any]) -> RedisDurability | None:
    """The ``RedisDurability`` the agent was built with: the copy pydantic-ai bound to it,
    which shares its ``Shared`` and its steps with the user's instance."""
    return RedisDurability.from_agent(agent)


async def _ignore_events(ctx: Any, events: Any) -> None:
    """A run's event-stream handler that makes pydantic-ai stream its model requests."""
    async for _ in events:
        pass


__all__ = ["ENGINE", "DurableAgent", "RedisDurability"]
