"""The function's side of an OpenAI Agents SDK run: ``DurableAgent`` clones the agent graph
with durable models, function tools and handoffs, and registers a code agent whose function
runs ``Runner.run`` on the clone."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, TypeVar

import openai
from agents import (
    Agent,
    CodeInterpreterTool,
    FileSearchTool,
    Handoff,
    HostedMCPTool,
    ImageGenerationTool,
    ModelResponse,
    ModelSettings,
    RunConfig,
    RunHooks,
    Runner,
    WebSearchTool,
)
from agents.mcp import MCPServer
from agents.models.interface import Model, ModelProvider, ModelTracing
from agents.models.multi_provider import MultiProvider
from agents.tool import DEFAULT_APPROVAL_REJECTION_MESSAGE, FunctionTool
from agents.tool_context import ToolContext as SdkToolContext
from pydantic import BaseModel, ConfigDict

from durable import conversations
from durable.agents import Tool, ToolContext, registry
from durable.code import AsyncRunContext, StepFailed
from durable.code import agent as code_agent
from durable.integrations.base import LiveRequests, StepOptions, jsonable, make_step, stable
from durable.integrations.openai_agents import children, handoffs, mcp
from durable.integrations.openai_agents import steps as st
from durable.integrations.openai_agents.binding import (
    Binding,
    binding,
    bound,
    primary,
)

#: Tools the model's provider runs itself (their calls are part of the model step).
HOSTED = (FileSearchTool, WebSearchTool, CodeInterpreterTool, ImageGenerationTool, HostedMCPTool)
#: What a model step retries by default: the request did not reach the model, or the
#: provider said to come back (429, 5xx). Bounded by the step's attempts; never a bad request.
MODEL_RETRYABLE: tuple[type[BaseException], ...] = (
    openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError)
#: ``max_turns`` when the run has no "model_calls" budget: high, never a hidden ceiling.
MAX_TURNS = 1000

T = TypeVar("T")


class AgentInput(BaseModel):
    """A ``DurableAgent`` run's input: what ``Runner.run`` takes as ``input`` (text, or the
    input items of a conversation to continue: ``result.to_input_list()``). Subclass it to
    carry what ``context`` builds the run's context object from."""

    model_config = ConfigDict(extra="forbid")

    input: str | list[dict[str, Any]]


class _DurableModel(Model):
    """An agent's model inside a durable run: ``get_response`` is the step ``<name>.model``;
    the real model (the agent's, or the provider's for its name) is resolved on first use."""

    def __init__(self, owner: DurableAgent, agent: str, ref: str | Model | None) -> None:
        self.owner, self.agent, self.ref = owner, agent, ref
        self._real: Model | None = None
        self._lock = threading.Lock()

    @property
    def real(self) -> Model:
        with self._lock:
            if self._real is None:
                self._real = self.ref if isinstance(self.ref, Model) else \
                    self.owner.model_provider.get_model(self.ref)
            return self._real

    async def get_response(self, system_instructions: str | None, input: Any,
                           model_settings: ModelSettings, tools: list[Any], output_schema: Any,
                           handoffs: list[Handoff[Any, Any]], tracing: ModelTracing,
                           **extra: Any) -> ModelResponse:
        b = bound(self.owner)
        if b is None:
            return await self.real.get_response(system_instructions, input, model_settings,
                                                tools, output_schema, handoffs, tracing, **extra)
        args = stable({
            "agent": self.agent, "instructions": system_instructions, "input": input,
            "tools": [getattr(t, "name", type(t).__name__) for t in tools],
            "handoffs": [h.tool_name for h in handoffs],
            "output": output_schema.name() if output_schema is not None else None,
            "settings": model_settings.to_json_dict(), **extra})
        call = st.ModelCall(self.real, system_instructions, input, model_settings, tools,
                            output_schema, handoffs, tracing, extra)
        return st.decode_response(await b.step(self.owner.model_step, args, call))

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        if bound(self.owner) is not None:  # Runner.run never streams; followers get tokens
            raise RuntimeError("a DurableAgent runs its agent with Runner.run; the model "
                               "step streams to the run's followers")
        return self.real.stream_response(*args, **kwargs)


class DurableAgent:
    """Runs the OpenAI Agents SDK ``agent`` (and every agent it hands off to) as the durable
    agent ``name``, registered on construction with its step tools (import the module that
    builds it in the workers, through ``DURABLE_AGENTS``).

    ``tools``: ``StepOptions`` per function tool name, and ``"<server>.*"`` for every tool
    of an MCP server (``durable.integrations.openai_agents.mcp``). ``model_retryable``: the
    exceptions a model step is retried on (default ``MODEL_RETRYABLE``; ``()``: never).
    ``model_provider`` resolves the models agents name by a string (default the SDK's
    ``MultiProvider``).
    ``stream``: model requests are streamed, their text deltas published to the run's
    followers. ``context(input)`` builds the run context object from the run's input (an
    ``input_model``, an ``AgentInput`` subclass). ``max_turns``: the SDK's limit, by default
    the "model_calls" budget + 1 (the budget ends the run first, ``budget_exhausted``), else
    1000. ``return_items``: the result is ``{"output", "items", "last_agent"}`` (``items``
    the conversation to continue with) instead of the final output alone. ``version``,
    ``budgets`` and ``options`` are the registered agent's (``durable.code.agent``).
    """

    def __init__(
        self,
        agent: Agent[Any],
        *,
        name: str | None = None,
        tools: Mapping[str, StepOptions] | None = None,
        model_provider: ModelProvider | None = None,
        model_timeout_s: float = 120.0,
        model_retryable: tuple[type[BaseException], ...] = MODEL_RETRYABLE,
        stream: bool = True,
        input_model: type[AgentInput] = AgentInput,
        context: Callable[[Any], Any] | None = None,
        hooks: RunHooks[Any] | None = None,
        run_config: RunConfig | None = None,
        max_turns: int | None = None,
        return_items: bool = False,
        version: str = "1",
        budgets: Mapping[str, int] | None = None,
        **options: Any,
    ) -> None:
        resolved = name or agent.name
        if run_config is not None and run_config.model is not None:
            raise ValueError(f"DurableAgent({resolved!r}): run_config.model would replace the "
                             "durable models; give each agent its model instead")
        self.name, self.stream, self.context, self.hooks = resolved, stream, context, hooks
        self.return_items = return_items
        self.model_provider = model_provider or MultiProvider()
        self.run_config = run_config or RunConfig()
        limit = (budgets or {}).get("model_calls")
        self.max_turns = max_turns or (limit + 1 if limit else MAX_TURNS)
        #: (run id, step tool, digest of the arguments) -> the live request of that step.
        self.live = LiveRequests()
        self._options = dict(tools or {})
        self.model_step, self.handoff_step = f"{resolved}.model", f"{resolved}.handoff"
        self._steps: list[Tool] = [
            make_step(st.ModelStep, self.model_step, owner=self, timeout_s=model_timeout_s,
                      retryable=tuple(model_retryable)),
            make_step(handoffs.HandoffStep, self.handoff_step, owner=self)]
        self._tools: dict[str, FunctionTool] = {}
        self._mcp: dict[str, mcp.DurableMCPServer] = {}
        self.clones: dict[str, Agent[Any]] = {}
        originals = list(_graph(agent))
        for original in originals:
            self.clones[original.name] = self._clone(original)
        for original in originals:
            self.clones[original.name].handoffs = [
                handoffs.durable_handoff(self, h) for h in original.handoffs]
        unknown = sorted(set(self._options) - set(self._tools)
                         - {f"{name}.*" for name in self._mcp})
        if unknown:
            raise ValueError(f"DurableAgent({resolved!r}): options for unknown tools {unknown}")
        self.root = self.clones[agent.name]
        for step in self._steps:  # nothing is registered for an agent refused above
            registry.add_tool(step)

        async def run(ctx: AsyncRunContext, inp: AgentInput) -> Any:
            return await self._run(ctx, inp)

        run.__name__ = run.__qualname__ = resolved
        register = code_agent(resolved, input_model=input_model,
                              tools=(*(s.name for s in self._steps), *conversations.TOOLS),
                              version=version,
                              budgets=budgets, **options)
        self.code_agent = register(run).agent  # type: ignore[attr-defined]

    def as_child_tool(self, name: str | None = None,
                      description: str | None = None) -> FunctionTool:
        """This agent as a tool of another ``DurableAgent``'s agents, each call a child run
        of the caller's run (``durable.integrations.openai_agents.children``)."""
        return children.child_tool(self, name, description)

    # The clone ------------------------------------------------------------------------

    def _clone(self, agent: Agent[Any]) -> Agent[Any]:
        servers = [self._mcp_server(server) for server in agent.mcp_servers]
        tools: list[Any] = []
        for tool in agent.tools:
            if isinstance(tool, HOSTED):
                tools.append(tool)  # run by the model's provider, inside the model step
            elif isinstance(tool, FunctionTool) and \
                    isinstance(child := getattr(tool, children.MARK, None), DurableAgent):
                tools.append(children.durable_child(self, tool, child))
            elif isinstance(tool, FunctionTool):
                tools.append(self._function_tool(tool))
            else:
                raise TypeError(f"DurableAgent({self.name!r}): {type(tool).__name__} "
                                f"{getattr(tool, 'name', '')!r} of agent {agent.name!r} runs "
                                "locally outside a function tool; it cannot be made a step")
        return agent.clone(model=_DurableModel(self, agent.name, agent.model), tools=tools,
                           mcp_servers=servers)

    def _mcp_server(self, server: MCPServer) -> MCPServer:
        """The durable stand-in of one MCP server (one per server, however many agents of the
        graph list it), with its step tools."""
        made = self._mcp.get(server.name)
        if made is not None:
            if made.real is not server:
                raise ValueError(f"DurableAgent({self.name!r}): two MCP servers are named "
                                 f"{server.name!r}; their steps would share names")
            return made
        steps, names = mcp.mcp_steps(self, server, self._options.get(f"{server.name}.*"))
        self._steps.extend(steps)
        made = mcp.DurableMCPServer(self, server, names)
        self._mcp[server.name] = made
        return made

    def _function_tool(self, tool: FunctionTool) -> FunctionTool:
        seen = self._tools.get(tool.name)
        if seen is not None and seen is not tool:
            raise ValueError(f"DurableAgent({self.name!r}): two different tools are named "
                             f"{tool.name!r}; their steps would share a name")
        self._tools[tool.name] = tool
        opts = self._options.get(tool.name, StepOptions())
        needs = tool.needs_approval if opts.requires_approval is None else opts.requires_approval
        step = f"{self.name}.tool.{tool.name}"
        approval = f"{step}.approval" if callable(needs) else None
        if not opts.step:
            raise ValueError(f"DurableAgent({self.name!r}): StepOptions(step=False) for "
                             f"{tool.name!r}: every function tool of a DurableAgent is a step")
        if seen is None:
            base = opts.step_attrs(tool.timeout_seconds)
            self._steps.append(make_step(st.FunctionStep, step, owner=self, **base,
                                         requires_approval=needs is True))
            if approval is not None:
                self._steps.append(make_step(st.FunctionStep, approval, owner=self, **base,
                                             requires_approval=True))
        owner = self

        async def invoke(tctx: SdkToolContext[Any], arguments: str) -> Any:
            b = bound(owner)
            if b is None:
                return await tool.on_invoke_tool(tctx, arguments)
            parsed = _parsed(arguments)
            name = step
            if approval is not None and callable(needs) and \
                    await needs(tctx, parsed if isinstance(parsed, dict) else {},
                                tctx.tool_call_id):
                name = approval
            args = stable({"call_id": tctx.tool_call_id, "arguments": parsed})
            try:
                out = await b.step(name, args, st.ToolCall(tool, tctx, arguments))
            except StepFailed as exc:
                if exc.status == "rejected":
                    return f"{DEFAULT_APPROVAL_REJECTION_MESSAGE} ({exc.error})"
                raise
            return st.decode_output(out)

        # This system asks for the approval: the SDK is told the call needs none.
        return dataclasses.replace(tool, on_invoke_tool=invoke, needs_approval=False,
                                   timeout_seconds=None)

    def handed(self, ctx: ToolContext, step: str, args: dict[str, Any], kind: type[T]) -> T:
        """The live request of the step ``step`` its function waits at, by its arguments."""
        return self.live.take(st.live_key(ctx.run_id, step, args), kind, ctx, step)

    # The run ---------------------------------------------------------------------------

    async def _run(self, ctx: AsyncRunContext, inp: AgentInput) -> Any:
        items = await continued_items(ctx, inp.input)
        token = binding.set(Binding(self, ctx))
        try:
            result = await Runner.run(
                self.root, items,  # type: ignore[arg-type]
                context=self.context(inp) if self.context is not None else None,
                max_turns=self.max_turns, hooks=self.hooks, run_config=self.run_config)
        except BaseException as exc:
            raise primary(exc) from None
        finally:
            binding.reset(token)
        if ctx.continues or ctx.session_name:  # kept for the run that continues this one
            await conversations.asave(ctx, jsonable(result.to_input_list()))
        output = jsonable(result.final_output)
        if self.return_items:
            return {"output": output, "items": jsonable(result.to_input_list()),
                    "last_agent": result.last_agent.name}
        return output


async def continued_items(ctx: AsyncRunContext, given: str | list[dict[str, Any]]
                          ) -> str | list[dict[str, Any]]:
    """The run's input: for a run that continues another (``continue_from`` or a named
    session), the items that run kept (the step ``conversation.load``) then the input's,
    text becoming a user message; else the input as given."""
    if not ctx.continues:
        return given
    earlier = await conversations.aload(ctx)
    new = [{"role": "user", "content": given}] if isinstance(given, str) else list(given)
    return [*earlier, *new]


def _graph(root: Agent[Any]) -> Iterator[Agent[Any]]:
    """The agent and every agent it can hand off to, once each, refusing two agents with one
    name (a handoff's outcome is recorded as the name)."""
    seen: dict[str, Agent[Any]] = {}
    todo = [root]
    while todo:
        agent = todo.pop(0)
        if agent.name in seen:
            if seen[agent.name] is not agent:
                raise ValueError(f"two different agents are named {agent.name!r}")
            continue
        seen[agent.name] = agent
        yield agent
        for item in agent.handoffs:
            target = item if isinstance(item, Agent) else _handoff_target(item)
            if target is not None:
                todo.append(target)


def _handoff_target(item: Handoff[Any, Any]) -> Agent[Any] | None:
    ref = getattr(item, "_agent_ref", None)
    target = ref() if ref is not None else None
    return target if isinstance(target, Agent) else None


def _parsed(arguments: str) -> Any:
    try:
        return json.loads(arguments) if arguments else {}
    except ValueError:
        return arguments  # the tool's own validation tells the model
