"""The durable graph: ``DurableGraph`` registers a code agent whose function runs a compiled
LangGraph graph (a ``StateGraph``'s, or an ``@entrypoint``'s) with the run's log as its
checkpointer (``saver.LogSaver``), resumes it from its latest checkpoint when the function is
executed again, and turns the graph's interrupts into durable waits.

A graph stops with work left when a node (of the graph or of a subgraph) called
``interrupt(value)``. The run then waits for input (``waiting_input``, no worker held) with
the data ``{"interrupts": [{"id": <interrupt id>, "value": <its value>}, ...]}``. The answer
(``durable respond RUN ANSWER``, ``Client.respond``):

- with one interrupt pending: any JSON, the value ``interrupt()`` returns;
- with several (nodes of one superstep that each interrupted): an object mapping interrupt
  ids to their answers; those it leaves out are asked again. An answer of another shape is
  not lost: the run waits again, its data saying why (``"error"``).

The graph is then resumed as LangGraph resumes it: ``Command(resume={id: answer, ...})``.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import EmptyInputError, GraphRecursionError, InvalidUpdateError
from langgraph.prebuilt import ToolNode
from langgraph.pregel import Pregel
from langgraph.types import Command, Interrupt, StateSnapshot, StreamMode

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
from durable.integrations.langgraph import tools as tool_steps
from durable.integrations.langgraph.binding import RUNS, Binding
from durable.integrations.langgraph.run import GraphInput, RecordStep, live_key, outcome_of

#: LangGraph's own outcomes that fail the run with their message (besides a node's error).
GRAPH_ERRORS: tuple[type[BaseException], ...] = (GraphRecursionError, InvalidUpdateError,
                                                 EmptyInputError)

#: How long an interrupt waits for its answer by default (s): a week.
INTERRUPT_TIMEOUT_S = 7 * 86400.0

#: What the function streams of the graph: its state (the result), its nodes' updates and
#: the chunks of ``get_stream_writer()`` (to the run's followers).
STREAM_MODES: list[StreamMode] = ["values", "updates", "custom"]

#: Threads of the event loop's default executor, where LangGraph runs synchronous nodes and
#: tasks (and LangChain's async calls their synchronous callbacks). Each synchronous node
#: waiting for its step holds one; Python's default (CPU count + 4) would let a few of them
#: take every thread, and the model requests they wait for would wait for a thread too.
SYNC_THREADS = 256

_sized: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()

T = TypeVar("T")


def _size_default_executor(loop: asyncio.AbstractEventLoop) -> None:
    """Give ``loop`` a default executor of ``SYNC_THREADS`` threads (once)."""
    if loop not in _sized:
        _sized.add(loop)
        loop.set_default_executor(ThreadPoolExecutor(SYNC_THREADS,
                                                     thread_name_prefix="langgraph-sync"))


class DurableGraph:
    """Runs the compiled LangGraph graph ``graph`` as the durable agent ``name``, registered
    on construction with its step tools (import the module that builds it in the workers,
    through ``DURABLE_AGENTS``).

    ``tools``: ``StepOptions`` per LangChain tool name. Every tool of a ``ToolNode`` of the
    graph is a step; a tool a node calls directly must be named here. ``stream``: model
    requests are streamed, their text published to the run's followers. ``model_timeout_s``
    and ``model_retryable``: the model step's deadline and the exceptions it is retried on
    (default ``MODEL_RETRYABLE``: a 429, a 5xx, no connection; ``()``: never).
    ``interrupt_timeout_s``: how long an interrupt (or a breakpoint) waits for its answer.
    ``recursion_limit``: LangGraph's limit on supersteps per invocation, by default room for
    two per model call of the "model_calls" budget (a model node and a tools node), so that
    the budget ends the run first (``budget_exhausted``), else LangGraph's default (25).
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
                             "after) are not supported; call interrupt() in the node instead "
                             "(a durable wait)")
        _refuse_own_savers(name, graph)
        model_steps.install()
        tool_steps.install()
        self.name, self.stream = name, stream
        limit = (budgets or {}).get("model_calls")
        self.interrupt_timeout_s = interrupt_timeout_s
        self.recursion_limit = recursion_limit or (max(25, 2 * limit + 5) if limit else None)
        self.live = LiveRequests()
        self.model_step, self.record_step = f"{name}.model", f"{name}.checkpoint"
        found = _tool_nodes_tools(graph)
        opts = dict(tools or {})
        self._tools = {t: f"{name}.tool.{t}" for t in sorted({*found, *opts})}
        steps: list[Tool] = [
            make_step(model_steps.ModelStep, self.model_step, owner=self,
                      timeout_s=model_timeout_s, retryable=tuple(model_retryable)),
            make_step(RecordStep, self.record_step, owner=self)]
        for tool, tool_step in self._tools.items():
            o = opts.get(tool, StepOptions())
            steps.append(make_step(tool_steps.ToolStep, tool_step, owner=self, **o.step_attrs(),
                                   requires_approval=bool(o.requires_approval)))
        self.graph = graph
        for made in steps:
            registry.add_tool(made)

        async def run(ctx: AsyncRunContext, inp: GraphInput) -> Any:
            return await self._run(ctx, inp)

        run.__name__ = run.__qualname__ = name
        schemas = {t.name: t.description for t in found.values()}
        nodes = sorted(n for n in graph.nodes if n != "__start__")
        register = code_agent(name, input_model=GraphInput,
                              tools=tuple(s.name for s in steps), version=version,
                              budgets=budgets, configuration=configured_by(lambda: {
                                  "prompt": nodes, "tools": schemas}),
                              **options)
        self.code_agent = register(run).agent  # type: ignore[attr-defined]
        self.max_parallel = int(self.code_agent.max_parallel)

    def tool_step(self, tool: str) -> str | None:
        return self._tools.get(tool)

    def handed(self, ctx: ToolContext, step: str, args: dict[str, Any], kind: type[T]) -> T:
        """What the graph's function handed to the step tool ``step`` running ``ctx``."""
        key = live_key(ctx.run_id, step, args)
        return self.live.take(key, kind, ctx, step)

    # The run ---------------------------------------------------------------------------

    async def _run(self, ctx: AsyncRunContext, inp: GraphInput) -> Any:
        _size_default_executor(asyncio.get_running_loop())
        b = Binding(self, ctx, asyncio.get_running_loop())
        token = RUNS.var.set(b)
        config: RunnableConfig = {"configurable": {"thread_id": ctx.run_id}}
        if self.recursion_limit:
            config["recursion_limit"] = self.recursion_limit
        graph = self.graph.copy({"checkpointer": b.saver})
        try:
            b.load()
            for _ in range(b.applied):  # answers the recorded checkpoints already hold
                await b.wait("interrupt", None, self.interrupt_timeout_s)
            b.answered = b.applied
            started = b.saver.get_tuple(config) is not None
            given: Any = None if started else inp.input
            # Stopped at interrupts not answered yet: the answer resumes it (running it on
            # would run the interrupted nodes again only to ask again).
            stop = stopped(await graph.aget_state(config)) if started else None
            while True:
                if stop is None:
                    out, asked = await self._stream(b, graph, given, config, inp.context)
                    if not asked:
                        return jsonable(out)
                    stop = stopped(await graph.aget_state(config))
                    if stop is None:
                        return jsonable(out)
                    await b.idle()  # every entry recorded before the run waits
                error: str | None = None
                while True:
                    answer = await b.wait(stop.reason, stop.data(error),
                                          self.interrupt_timeout_s)
                    b.answered += 1
                    given, error = resume_of(stop, answer)
                    if error is None:
                        break
                stop = None
        except BaseException as exc:
            raise outcome_of(exc, GRAPH_ERRORS) from None
        finally:
            RUNS.var.reset(token)

    async def _stream(self, b: Binding, graph: Pregel[Any, Any, Any, Any], given: Any,
                      config: RunnableConfig, context: Any) -> tuple[Any, bool]:
        """Run the graph from ``given`` (its input, a ``Command(resume=...)``, or ``None``:
        on from its latest checkpoint) until it ends or stops: its last state and whether
        it stopped at an interrupt, its updates and custom chunks published to the run's
        followers."""
        b.reset()
        last: Any = None
        asked = False
        stream = graph.astream(given, config, context=context, stream_mode=STREAM_MODES,
                               subgraphs=True, durability="sync")
        async for ns, mode, data in stream:
            where = {"ns": "|".join(ns)} if ns else {}
            if mode == "values" and not ns:
                last = {k: v for k, v in data.items() if k != "__interrupt__"} \
                    if isinstance(data, dict) else data
            elif mode == "custom":
                b.ctx.emit({"custom": jsonable(data), **where})
            elif mode == "updates" and isinstance(data, dict):
                for node, update in data.items():
                    if node != "__interrupt__":
                        b.ctx.emit({"node": node, "update": jsonable(update), **where})
                    elif not ns:
                        asked = True
        return last, asked


# What a graph that stopped asks for, and how an answer resumes it ---------------------------


@dataclass(frozen=True)
class Stop:
    """Why a graph stopped: its pending interrupts, and the nodes they are in."""

    interrupts: tuple[Interrupt, ...]
    next: tuple[str, ...]

    def data(self, error: str | None = None) -> dict[str, Any]:
        """The wait's data."""
        data: dict[str, Any] = {"interrupts": [{"id": i.id, "value": jsonable(i.value)}
                                               for i in self.interrupts]}
        if error:
            data["error"] = error
        return data

    @property
    def reason(self) -> str:
        return f"interrupt in {', '.join(self.next)}" if self.next else "interrupt"


def stopped(snapshot: StateSnapshot) -> Stop | None:
    """Why the graph stopped, or ``None``: no interrupt is pending."""
    if not snapshot.interrupts:
        return None
    return Stop(tuple(snapshot.interrupts), tuple(snapshot.next))


def resume_of(stop: Stop, answer: Any) -> tuple[Command[Any] | None, str | None]:
    """What resumes the graph with ``answer``, or why the answer cannot (the run asks
    again)."""
    ids = [i.id for i in stop.interrupts]
    if len(ids) == 1:
        return Command(resume={ids[0]: answer}), None
    if isinstance(answer, dict) and answer and set(answer) <= set(ids):
        return Command(resume=dict(answer)), None
    return None, (f"{len(ids)} interrupts are pending: answer with an object mapping some "
                  f"of their ids ({', '.join(ids)}) to their answers")


def _refuse_own_savers(name: str, graph: Pregel[Any, Any, Any, Any]) -> None:
    """A subgraph compiled with a checkpointer of its own would keep its state there, out
    of the run's log: refused."""
    for sub, pregel in graph.get_subgraphs(recurse=True):
        saver = getattr(pregel, "checkpointer", None)
        if saver not in (None, True, False):
            raise ValueError(f"DurableGraph({name!r}): the subgraph {sub!r} has a checkpointer "
                             f"of its own ({type(saver).__name__}); compile it without one "
                             "(it then keeps its state in the run's log, as the graph does)")


def _tool_nodes_tools(graph: Pregel[Any, Any, Any, Any]) -> dict[str, BaseTool]:
    """The tools of the ``ToolNode``s of the graph and of its subgraphs, by name."""
    found: dict[str, BaseTool] = {}
    graphs = [graph, *(sub for _, sub in graph.get_subgraphs(recurse=True))]
    for each in graphs:
        for node in getattr(each, "nodes", {}).values():
            if isinstance(node.bound, ToolNode):
                found.update(node.bound.tools_by_name)
    return found


__all__ = ["GRAPH_ERRORS", "INTERRUPT_TIMEOUT_S", "STREAM_MODES", "DurableGraph", "Stop",
           "resume_of", "stopped"]
