"""The durable agent: ``DurableAgent`` clones an OpenAI Agents SDK agent graph with durable
models (``model``), function tools (``tools``), handoffs (``handoffs``) and MCP servers
(``mcp``), and registers a code agent whose function runs ``Runner.run`` on the clone."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from agents import (
    Agent,
    CodeInterpreterTool,
    FileSearchTool,
    Handoff,
    HostedMCPTool,
    ImageGenerationTool,
    RunConfig,
    RunHooks,
    Runner,
    WebSearchTool,
)
from agents.mcp import MCPServer
from agents.models.interface import ModelProvider
from agents.models.multi_provider import MultiProvider
from agents.tool import FunctionTool

from durable import conversations
from durable.agents import Tool, ToolContext, registry
from durable.code import AsyncRunContext
from durable.code import agent as code_agent
from durable.integrations.base import (
    LiveRequests,
    StepOptions,
    configured_by,
    jsonable,
    make_step,
    model_id,
    named,
)
from durable.integrations.openai_agents import handoffs, mcp, tools
from durable.integrations.openai_agents.model import MODEL_RETRYABLE, DurableModel, ModelStep
from durable.integrations.openai_agents.run import (
    AgentInput,
    Binding,
    binding,
    continued_items,
    keep_items,
    keeps,
    live_key,
    primary,
)

#: Tools the model's provider runs itself (their calls are part of the model step).
HOSTED = (FileSearchTool, WebSearchTool, CodeInterpreterTool, ImageGenerationTool, HostedMCPTool)
#: ``max_turns`` when the run has no "model_calls" budget: high, never a hidden ceiling.
MAX_TURNS = 1000

T = TypeVar("T")


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
            make_step(ModelStep, self.model_step, owner=self, timeout_s=model_timeout_s,
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
                              version=version, budgets=budgets,
                              configuration=configured_by(lambda: pinned(originals)),
                              **options)
        self.code_agent = register(run).agent  # type: ignore[attr-defined]

    def as_child_tool(self, name: str | None = None,
                      description: str | None = None) -> FunctionTool:
        """This agent as a tool of another ``DurableAgent``'s agents, each call a child run
        of the caller's run (``durable.integrations.openai_agents.tools``)."""
        return tools.child_tool(self, name, description)

    # The clone ------------------------------------------------------------------------

    def _clone(self, agent: Agent[Any]) -> Agent[Any]:
        servers = [self._mcp_server(server) for server in agent.mcp_servers]
        listed: list[Any] = []
        for tool in agent.tools:
            if isinstance(tool, HOSTED):
                listed.append(tool)  # run by the model's provider, inside the model step
            elif isinstance(tool, FunctionTool) and \
                    isinstance(child := getattr(tool, tools.CHILD_MARK, None), DurableAgent):
                listed.append(tools.durable_child(self, tool, child))
            elif isinstance(tool, FunctionTool):
                listed.append(self._function_tool(tool))
            else:
                raise TypeError(f"DurableAgent({self.name!r}): {type(tool).__name__} "
                                f"{getattr(tool, 'name', '')!r} of agent {agent.name!r} runs "
                                "locally outside a function tool; it cannot be made a step")
        return agent.clone(model=DurableModel(self, agent.name, agent.model), tools=listed,
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
        steps, durable = tools.durable_function_tool(
            self, tool, self._options.get(tool.name, StepOptions()))
        if seen is None:
            self._steps.extend(steps)
        return durable

    def handed(self, ctx: ToolContext, step: str, args: dict[str, Any], kind: type[T]) -> T:
        """The live request of the step ``step`` its function waits at, by its arguments."""
        return self.live.take(live_key(ctx.run_id, step, args), kind, ctx, step)

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
        if keeps(ctx):  # kept for the run that continues this one
            await keep_items(ctx, result.to_input_list())
        output = jsonable(result.final_output)
        if self.return_items:
            return {"output": output, "items": jsonable(result.to_input_list()),
                    "last_agent": result.last_agent.name}
        return output


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


def pinned(agents: list[Agent[Any]]) -> dict[str, Any]:
    """What a run pins of the SDK's agents (``configured_by``): each one's model, its
    instructions (text, or a function's name) and its function tools' schemas."""
    models = {a.name: model_id(a.model) for a in agents}
    model = models[agents[0].name] if len(set(models.values())) == 1 else \
        ",".join(f"{name}={m}" for name, m in sorted(models.items()))
    return {"model": model,
            "prompt": {a.name: named(a.instructions) for a in agents},
            "tools": {a.name: {t.name: getattr(t, "params_json_schema", None)
                               for t in a.tools} for a in agents}}
