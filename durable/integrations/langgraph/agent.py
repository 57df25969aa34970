"""The durable graph: ``DurableGraph`` wraps each node of a compiled LangGraph graph (a
``StateGraph``'s, or an ``@entrypoint``'s) so that its execution is recorded as a step and
its ``interrupt()`` is a durable wait, and registers a code agent whose function invokes
the wrapped graph."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, TypeVar

from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool
from langgraph.errors import (
    EmptyInputError,
    GraphRecursionError,
    InvalidUpdateError,
)
from langgraph.prebuilt import ToolNode
from langgraph.pregel import Pregel

from durable.agents import Tool, ToolContext, registry
from durable.code import AsyncRunContext
from durable.code import agent as code_agent
from durable.integrations.base import (
    LiveRequests,
    StepOptions,
    configured_by,
    jsonable,
    make_step,
)
from durable.integrations.langgraph import model as model_steps
from durable.integrations.langgraph import nodes
from durable.integrations.langgraph import tools as tool_steps
from durable.integrations.langgraph.nodes import (
    INTERRUPT_TIMEOUT_S,
    NodeStep,
    NodeUpdate,
    attempts,
    replayed,
)
from durable.integrations.langgraph.run import RUNS, Binding, GraphInput, live_key, outcome_of

#: LangGraph's own outcomes that fail the run with their message.
GRAPH_ERRORS: tuple[type[BaseException], ...] = (GraphRecursionError, InvalidUpdateError,
                                                 EmptyInputError)

T = TypeVar("T")


class DurableGraph:
    """Runs the compiled LangGraph graph ``graph`` as the durable agent ``name``, registered
    on construction with its step tools (import the module that builds it in the workers,
    through ``DURABLE_AGENTS``).

    ``tools``: ``StepOptions`` per LangChain tool name. Every tool of a ``ToolNode`` of the
    graph is a step; a tool a node calls directly must be named here. ``stream``: model
    requests are streamed, their text published to the run's followers. ``model_timeout_s``
    and ``model_retryable``: the model step's deadline and the exceptions it is retried on
    (default ``MODEL_RETRYABLE``: a 429, a 5xx, no connection; ``()``: never).
    ``interrupt_timeout_s``: how long an ``interrupt()`` waits for its answer.
    ``recursion_limit``: LangGraph's limit on supersteps, by default room for two per
    model call of the "model_calls" budget (a model node and a tools node), so that the
    budget ends the run first (``budget_exhausted``), else LangGraph's default (25).
    ``version``, ``budgets`` and ``options`` are the registered agent's
    (``durable.code.agent``).
    """

    def __init__(
        self,
        graph: Pregel[Any, Any, Any, Any],
        *,
        name: str,
        tools: Mapping[str, StepOptions] | None = None,
        stream: bool = True,
        model_timeout_s: float = 120.0,
        model_retryable: tuple[type[BaseException], ...] = model_steps.MODEL_RETRYABLE,
        interrupt_timeout_s: float = INTERRUPT_TIMEOUT_S,
        recursion_limit: int | None = None,
        version: str = "1",
        budgets: Mapping[str, int] | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(graph, Pregel):
            raise TypeError(f"DurableGraph({name!r}): a compiled graph (StateGraph.compile() "
                            f"or an @entrypoint) is needed, not {type(graph).__name__}")
        if graph.interrupt_before_nodes or graph.interrupt_after_nodes:
            raise ValueError(f"DurableGraph({name!r}): static breakpoints (interrupt_before/"
                             "after) need LangGraph's checkpointer; call interrupt() in the "
                             "node instead (a durable wait)")
        model_steps.install()
        tool_steps.install()
        nodes.install()
        self.name, self.stream = name, stream
        limit = (budgets or {}).get("model_calls")
        self.interrupt_timeout_s = interrupt_timeout_s
        self.recursion_limit = recursion_limit or (max(25, 2 * limit + 5) if limit else None)
        self.live = LiveRequests()
        self.model_step = f"{name}.model"
        found = _tool_nodes_tools(graph)
        opts = dict(tools or {})
        self._tools = {t: f"{name}.tool.{t}" for t in sorted({*found, *opts})}
        self.node_steps = {n: f"{name}.node.{n}" for n in graph.nodes if n != "__start__"}
        steps: list[Tool] = [make_step(model_steps.ModelStep, self.model_step, owner=self,
                                       timeout_s=model_timeout_s,
                                       retryable=tuple(model_retryable))]
        self.task_step = f"{name}.task"
        steps += [make_step(NodeStep, step, owner=self)
                  for step in (*self.node_steps.values(), self.task_step)]
        for tool, tool_step in self._tools.items():
            o = opts.get(tool, StepOptions())
            steps.append(make_step(tool_steps.ToolStep, tool_step, owner=self, **o.step_attrs(),
                                   requires_approval=bool(o.requires_approval)))
        self.graph = graph.copy({"checkpointer": None, "nodes": {
            n: node.copy({"bound": self._wrap(n, node.bound)}) if n in self.node_steps
            else node for n, node in graph.nodes.items()}})
        for made in steps:
            registry.add_tool(made)

        async def run(ctx: AsyncRunContext, inp: GraphInput) -> Any:
            return await self._run(ctx, inp)

        run.__name__ = run.__qualname__ = name
        schemas = {t.name: t.description for t in found.values()}
        register = code_agent(name, input_model=GraphInput,
                              tools=tuple(s.name for s in steps), version=version,
                              budgets=budgets, configuration=configured_by(lambda: {
                                  "prompt": sorted(self.node_steps), "tools": schemas}),
                              **options)
        self.code_agent = register(run).agent  # type: ignore[attr-defined]

    def tool_step(self, tool: str) -> str | None:
        return self._tools.get(tool)

    def handed(self, ctx: ToolContext, step: str, args: dict[str, Any], kind: type[T]) -> T:
        """What the graph's function handed to the step tool ``step`` running ``ctx``."""
        key = live_key(ctx.run_id, step, args)
        return self.live.take(key, kind, ctx, step)

    # The nodes -------------------------------------------------------------------------

    def _wrap(self, node: str, bound: Runnable[Any, Any]) -> Runnable[Any, Any]:
        """The node ``node`` inside a durable run: its execution a node task whose steps an
        attempt after an ``interrupt()``'s answer gets again, its update recorded."""
        owner = self

        async def durable_node(state: Any, config: RunnableConfig) -> Any:
            b = RUNS.bound(owner)
            if b is None:
                return await bound.ainvoke(state, config)
            meta = config.get("metadata") or {}
            path = meta.get("langgraph_path") or ()
            ident = f"{meta.get('langgraph_step', 0)}:{node}"
            if path and path[0] != "__pregel_pull":  # a Send or a task: its place too
                ident += ":" + "/".join(str(p) for p in path[1:])
            step = owner.node_steps[node]
            found, update = replayed(b, step, ident)
            if found:  # recorded by an earlier execution: not run again
                return update
            first, task = b.ctx.step + 1, b.task(ident)
            b.running.add(ident)
            b.crowded.update(b.running if len(b.running) > 1 else ())
            try:
                out = await attempts(b, f"node {node!r}",
                                     lambda: bound.ainvoke(state, config), config, task)
            finally:
                b.running.discard(ident)
            await b.step(step, {"task": ident}, NodeUpdate(
                node, out, first=first, alone=ident not in b.crowded, waits=task.waits))
            b.tasks.pop(ident, None)  # done: its outcomes are not asked for again
            return out

        def refused(state: Any) -> Any:
            raise RuntimeError(f"DurableGraph({owner.name!r}): the graph runs with ainvoke")

        return RunnableLambda(refused, afunc=durable_node, name=node)

    # The run ---------------------------------------------------------------------------

    async def _run(self, ctx: AsyncRunContext, inp: GraphInput) -> Any:
        token = RUNS.var.set(Binding(self, ctx, asyncio.get_running_loop()))
        config: RunnableConfig = {"configurable": {"thread_id": ctx.run_id}}
        if self.recursion_limit:
            config["recursion_limit"] = self.recursion_limit
        try:
            out = await self.graph.ainvoke(inp.input, config, context=inp.context)
        except BaseException as exc:
            raise outcome_of(exc, GRAPH_ERRORS) from None
        finally:
            RUNS.var.reset(token)
        return jsonable(out)


def _tool_nodes_tools(graph: Pregel[Any, Any, Any, Any]) -> dict[str, BaseTool]:
    """The tools of the ``ToolNode``s of the graph, by name."""
    found: dict[str, BaseTool] = {}
    for node in graph.nodes.values():
        if isinstance(node.bound, ToolNode):
            found.update(node.bound.tools_by_name)
    return found
