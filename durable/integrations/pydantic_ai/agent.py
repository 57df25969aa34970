"""The durable agent: ``RedisDurability``, the durability capability of a pydantic-ai
``Agent`` (the peer of ``TemporalDurability`` and ``DBOSDurability``), and ``DurableAgent``,
the same for an agent built without it (a thin wrapper:
``RedisDurability(...).register(agent)``). Attached to the agent, the capability makes each
model request and each tool call of a run a step of the run's log, through pydantic-ai's own
hooks (``get_wrapper_model``, ``get_wrapper_toolset``); registered, it is a code agent of this
system whose function runs ``agent.run``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self, TypeVar

from pydantic_ai import ModelMessagesTypeAdapter
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.durable_exec import conversation_id_from_run_id, replay_scope
from pydantic_ai.exceptions import RunCancelled, UsageLimitExceeded
from pydantic_ai.messages import ModelMessage, UserContent
from pydantic_ai.models import Model
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset, WrapperToolset
from pydantic_ai.toolsets._dynamic import DynamicToolset
from pydantic_ai.toolsets.abstract import AGENT_TOOLSET_ID
from pydantic_ai.toolsets.external import ExternalToolset

from durable import conversations
from durable.agents import Cancel, Fail, Tool, ToolContext, registry
from durable.code import AsyncRunContext, EndRun
from durable.code import agent as code_agent
from durable.flow import budgets as run_budgets
from durable.integrations.base import (
    LiveRequests,
    StepOptions,
    configured_by,
    make_step,
    model_id,
    named,
    stable,
)
from durable.integrations.pydantic_ai.mcp import DurableMCPToolset, is_mcp, mcp_steps
from durable.integrations.pydantic_ai.model import DurableModel, ModelStep, retryable_but_not_usage
from durable.integrations.pydantic_ai.models import check_buildable, run_model
from durable.integrations.pydantic_ai.run import (
    Binding,
    RunInput,
    binding,
    bound,
    continued_messages,
    keep_messages,
    keeps,
    primary,
    prompt_input,
    without_replayed,
)
from durable.integrations.pydantic_ai.tools import (
    DurableDynamicToolset,
    DurableFunctionToolset,
    tool_step,
)

T = TypeVar("T")


class RedisDurability(AbstractCapability[Any]):
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
    server). ``model``: the model of its runs, instead of the agent's; ``models``: other
    models by name, one of which a run's input may choose (``{"model": "<name>"}``, as
    pydantic-ai's peers take ``models=``). ``model_timeout_s``, ``model_retryable``: the
    model step's (pydantic-ai's
    ``UserError`` and ``UsageLimitExceeded`` are never retried). ``input_model``: a
    ``RunInput`` subclass; ``deps(input)`` builds the agent's dependencies from it, in the
    worker. ``return_messages``: the result is ``{"output": ..., "messages": [...]}``.
    ``stream``: model requests are streamed, their text published to the run's followers;
    ``event_stream_handler``: pydantic-ai's, given to each run (streamed too); it sees each
    event once across recoveries: neither a recorded request's events nor a recorded tool
    call's are shown again (``run.without_replayed``), only the result of the call a crash
    interrupted (its call event was shown before the call was decided).
    ``version``, ``budgets`` and ``options`` are the registered agent's (``durable.code``).
    """

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
        self.id, self.description, self.defer_loading = None, None, False
        self._name, self.model, self.models = name, model, dict(models or {})
        self.options = dict(tools or {})
        self.model_timeout_s, self.model_retryable = model_timeout_s, tuple(model_retryable)
        self.input_model, self.deps = input_model, deps
        self.return_messages, self.stream = return_messages, stream
        self.event_stream_handler = event_stream_handler
        self.version, self.budgets, self.agent_options = version, budgets, options
        self.agent: AbstractAgent[Any, Any] | None = None
        self.attached = False
        self.registered = False
        #: (run id, step) -> the live request of the step the function waits at.
        self.live = LiveRequests()
        #: Function toolset id -> {tool: step name}; MCP toolset id -> its steps.
        self.function_steps: dict[str, dict[str, str]] = {}
        self.approved_here: dict[str, frozenset[str]] = {}
        self.mcp: dict[str, dict[str, str]] = {}
        self.mcp_toolsets: dict[str, AbstractToolset[Any]] = {}
        #: Dynamic toolset id -> the step of its calls.
        self.dynamic: dict[str, str] = {}
        #: Tools that are not steps (``StepOptions(step=False)``).
        self.not_steps: set[str] = set()
        self.model_step = ""
        self.tool_steps: list[str] = []
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        resolved = self._name or (self.agent.name if self.agent is not None else None)
        if not resolved:
            raise ValueError("a durable pydantic-ai agent needs a name: "
                             "RedisDurability(name=...) or Agent(..., name=...)")
        return resolved

    # pydantic-ai's hooks ------------------------------------------------------------------

    def for_agent(self, agent: AbstractAgent[Any, Any]) -> AbstractCapability[Any]:
        if self.agent is not None and self.agent is not agent:
            raise ValueError(f"RedisDurability({self._name!r}) is attached to another agent "
                             "already: give each agent its own")
        if self.agent is None:
            self.agent, self.attached = agent, True
        return self

    def get_wrapper_model(self, model: Model) -> Model | None:
        b = bound(self)
        if b is None:
            return None
        wrapper = b.wrappers.get(id(model))
        if wrapper is None or wrapper.wrapped is not model:
            wrapper = b.wrappers[id(model)] = DurableModel(model, self)
        return wrapper

    def get_wrapper_toolset(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any] | None:
        if bound(self) is None:
            return None
        return toolset.visit_and_replace(self._durable_leaf)

    def _durable_leaf(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any]:
        if isinstance(toolset, FunctionToolset) and toolset.id in self.function_steps:
            return DurableFunctionToolset(wrapped=toolset, owner=self,
                                          steps=self.function_steps[toolset.id or ""],
                                          approved_here=self.approved_here[toolset.id or ""])
        if isinstance(toolset, DynamicToolset) and toolset.id in self.dynamic:
            return DurableDynamicToolset(wrapped=toolset, owner=self,
                                         step=self.dynamic[toolset.id or ""])
        if is_mcp(toolset) and toolset.id in self.mcp:
            return DurableMCPToolset(wrapped=toolset, owner=self,
                                     steps=self.mcp[toolset.id or ""])
        return toolset

    # Registration -------------------------------------------------------------------------

    def register(self, agent: AbstractAgent[Any, Any] | None = None) -> Self:
        """Register the agent and its step tools (once; refused on a taken name, an unknown
        tool option or a toolset without a unique id, registering nothing then)."""
        with self._lock:
            if agent is not None and self.agent is None:
                self.agent = agent  # not attached: the capability joins each of its runs
            elif agent is not None and agent is not self.agent:
                raise ValueError(f"RedisDurability({self._name!r}) is attached to another "
                                 "agent already: give each agent its own")
            if self.agent is None:
                raise ValueError("RedisDurability.register(): attach it to an agent first "
                                 "(Agent(..., capabilities=[...])) or pass the agent")
            if self.registered:
                return self
            name = self.name
            check_buildable(name, self.agent, self.model, self.models)
            taken = [n for n in (*registry.agents, *registry.tools)
                     if n == name or n.startswith(f"{name}.")]
            if taken:
                raise ValueError(f"a durable agent named {name!r} is registered already "
                                 f"({', '.join(sorted(taken)[:3])}): give this one another name")
            self.model_step = f"{name}.model"
            steps: list[Tool] = [make_step(
                ModelStep, self.model_step, timeout_s=self.model_timeout_s,
                retryable=retryable_but_not_usage(self.model_retryable), owner=self)]
            used: set[str] = set()
            seen: set[str] = set()
            for leaf in _leaves(self.agent.toolsets):
                steps.extend(self._leaf_steps(leaf, used, seen))
            unknown = sorted(set(self.options) - used)
            if unknown:
                raise ValueError(f"durable agent {name!r}: options for unknown tools {unknown}")
            for step in steps:  # nothing is registered for an agent refused above
                registry.add_tool(step)
            self.tool_steps = [s.name for s in steps[1:]]
            self._register_function()
            self.registered = True
            return self

    def _leaf_steps(self, toolset: AbstractToolset[Any], used: set[str],
                    seen: set[str]) -> list[Tool]:
        if isinstance(toolset, ExternalToolset):
            return []  # its calls are deferred to the caller, never run here
        dynamic = isinstance(toolset, DynamicToolset)
        if not isinstance(toolset, FunctionToolset) and not is_mcp(toolset) and not dynamic:
            raise TypeError(f"durable agent {self.name!r}: {toolset.label} cannot be made "
                            "durable (function, dynamic and MCP toolsets can)")
        ident = toolset.id
        if not ident:
            raise ValueError(f"durable agent {self.name!r}: {toolset.label} needs an id "
                             "(FunctionToolset(..., id=...), or the capability's when a "
                             "capability contributes it: Capability(tools=..., id=...)): "
                             "its steps are named after it")
        if ident in seen:
            raise ValueError(f"durable agent {self.name!r}: two toolsets have the id "
                             f"{ident!r}; their tools' steps would share names")
        seen.add(ident)
        if dynamic:
            used.add(f"{ident}.*")
            opts = self.options.get(f"{ident}.*", StepOptions())
            self.dynamic[ident] = f"{self.name}.tool.{ident}.call"
            return [tool_step(self, self.dynamic[ident], opts, bool(opts.requires_approval))]
        if is_mcp(toolset):
            used.add(f"{ident}.*")
            self.mcp_toolsets[ident] = toolset
            server, self.mcp[ident] = mcp_steps(self, ident, self.options.get(f"{ident}.*"))
            return server
        assert isinstance(toolset, FunctionToolset)
        own = ident == AGENT_TOOLSET_ID
        prefix, scope = ((f"{self.name}.tool.", "") if own
                         else (f"{self.name}.tool.{ident}.", f"{ident}."))
        made: list[Tool] = []
        names: dict[str, str] = {}
        approved: set[str] = set()
        for tool_name, tool in toolset.tools.items():
            opts = self.options.get(scope + tool_name, StepOptions())
            used.add(scope + tool_name)
            if not opts.step:
                self.not_steps.add(tool_name)
                continue
            needs = tool.requires_approval if opts.requires_approval is None \
                else opts.requires_approval
            names[tool_name] = prefix + tool_name
            made.append(tool_step(self, prefix + tool_name, opts, needs))
            if needs:
                approved.add(tool_name)
        self.function_steps[ident], self.approved_here[ident] = names, frozenset(approved)
        return made

    def _register_function(self) -> None:
        async def run(ctx: AsyncRunContext, inp: RunInput) -> Any:
            return await self._run(ctx, inp)

        run.__name__ = run.__qualname__ = self.name
        register = code_agent(self.name, input_model=self.input_model,
                              tools=(self.model_step, *self.tool_steps, *conversations.TOOLS),
                              version=self.version, budgets=self.budgets,
                              configuration=configured_by(self.pinned), **self.agent_options)
        register(run)

    def pinned(self) -> dict[str, Any]:
        """What a run of this agent pins of pydantic-ai's agent (``configured_by``): its
        model and its instructions and system prompts (texts, or functions' names)."""
        agent = self.agent
        model = self.model if self.model is not None else getattr(agent, "model", None)
        prompt = [named(getattr(i, "instruction", i))
                  for i in getattr(agent, "_instructions", None) or ()]
        prompt += [named(p) for p in getattr(agent, "_system_prompts", None) or ()]
        prompt += [named(getattr(f, "function", f))
                   for f in getattr(agent, "_system_prompt_functions", None) or ()]
        return {"model": model_id(model), "prompt": prompt}

    def handed(self, ctx: ToolContext, step: str, args: dict[str, Any], kind: type[T]) -> T:
        """The live request of the step ``ctx`` runs (the function waits at it, by number)."""
        return self.live.take((ctx.run_id, ctx.step), kind, ctx, step)

    # The run ------------------------------------------------------------------------------

    async def _run(self, ctx: AsyncRunContext, inp: RunInput) -> Any:
        agent = self.agent
        assert agent is not None
        kwargs = inp.run_kwargs()
        history = kwargs["message_history"] = await continued_messages(
            ctx, kwargs["message_history"])
        # Replay-stable ids: the conversation's own, or one derived from the run id.
        conversation = next((m.conversation_id for m in reversed(history or [])
                             if m.conversation_id), None) or conversation_id_from_run_id(ctx.run_id)
        deps = self.deps(inp) if self.deps is not None else None
        chosen = await run_model(agent, self.model, self.models, inp.model, deps)
        if chosen is not None:
            kwargs["model"] = chosen
        if self.event_stream_handler is not None:
            kwargs["event_stream_handler"] = without_replayed(self.event_stream_handler)
        elif self.stream:
            kwargs["event_stream_handler"] = _ignore_events
        token = binding.set(Binding(self, ctx))
        try:
            with replay_scope():
                result = await agent.run(
                    **kwargs, run_id=ctx.run_id, conversation_id=conversation,
                    deps=deps,
                    capabilities=None if self.attached else [self])
        except UsageLimitExceeded as exc:
            raise EndRun(Fail(f"{run_budgets.REASON}: {exc}", reason=run_budgets.REASON)) \
                from None
        except RunCancelled as exc:
            raise EndRun(Cancel(str(exc) or "the agent canceled its run")) from None
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
        self.name = self.durability.name
        self.model_step = self.durability.model_step
        self.tool_steps = self.durability.tool_steps

    @staticmethod
    def prompt_input(prompt: str | Sequence[UserContent] | None,
                     message_history: Sequence[ModelMessage] | None = None,
                     **fields: Any) -> dict[str, Any]:
        """A run's input: ``client.start(name, DurableAgent.prompt_input("...", messages))``."""
        return prompt_input(prompt, message_history, **fields)


def _attached(agent: AbstractAgent[Any, Any]) -> RedisDurability | None:
    found: list[RedisDurability] = []

    def visit(cap: Any) -> None:
        if isinstance(cap, RedisDurability):
            found.append(cap)

    root = getattr(agent, "root_capability", None) or getattr(agent, "_root_capability", None)
    if root is not None and hasattr(root, "apply"):
        root.apply(visit)
    return found[0] if found else None


def _leaves(toolsets: Sequence[AbstractToolset[Any]]) -> list[AbstractToolset[Any]]:
    """The leaf toolsets of ``toolsets``, the ones whose calls become steps. pydantic-ai's
    ``apply`` visits leaves, and also a wrapper that visits itself before its wrapped
    toolset: ``CapabilityOwnedToolset``, around each toolset a capability contributes
    (``Capability(tools=...)``, ``Toolset(...)``). Such a wrapper is passed over when every
    leaf under it is visited too (a run's ``visit_and_replace`` reaches them through it);
    one that hides its leaves stays, and is refused."""
    visited: list[AbstractToolset[Any]] = []
    for toolset in toolsets:
        toolset.apply(visited.append)
    out = []
    for toolset in visited:
        if isinstance(toolset, WrapperToolset):
            inner: list[AbstractToolset[Any]] = []
            toolset.wrapped.apply(inner.append)
            if all(any(leaf is v for v in visited) for leaf in inner):
                continue
        out.append(toolset)
    return out


async def _ignore_events(ctx: Any, events: Any) -> None:
    """An event-stream handler that makes pydantic-ai stream its model requests."""
    async for _ in events:
        pass
