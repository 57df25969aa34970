"""A durable LangGraph run: its input (``GraphInput``), what the graph's function and the step
tools share (what they know of their ``DurableGraph``, ``GraphOwner``; the binding of the
function to the durable run it executes), the node task a call belongs to, and what ended
the graph's run.

Every step the graph takes from inside a node (a chat model request, a tool call) is named
by the node task it belongs to and its place among that task's calls (``NodeTask``): a node
that LangGraph runs again within one execution of the function (after an ``interrupt()``
was answered, or by its ``RetryPolicy``) gets the outcomes its earlier attempt was given,
in order, instead of taking those steps again (but a failed step: a retry takes it again,
as a new step with its own key). So answering an interrupt re-runs the node's code, as
LangGraph does, but none of the requests or effects it already made.

A step from a synchronous node (which LangGraph runs on a thread of its own) is taken on the
run's event loop and waited for on that thread (``Binding.take_blocking``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from contextlib import ExitStack
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from durable.call_identity import args_digest
from durable.code import AsyncRunContext, StepFailed
from durable.code.execution import Unwind
from durable.errors import UsageError, causes
from durable.integrations.base import Bindings, LiveRequests, Owner
from durable.log.state import Action

__all__ = [
    "RUNS",
    "Binding",
    "GraphInput",
    "GraphOwner",
    "GraphRunFailed",
    "NodeTask",
    "bound_run",
    "live_key",
    "node_task",
    "outcome_of",
]


class GraphInput(BaseModel):
    """A ``DurableGraph`` run's input: what the graph is invoked with (its input state, or
    an ``@entrypoint``'s argument), and optionally its ``context`` (LangGraph's runtime
    context, for a graph built with a ``context_schema``)."""

    model_config = ConfigDict(extra="forbid")

    input: Any = None
    context: dict[str, Any] | None = None


class GraphOwner(Owner, Protocol):
    """What the step tools and the graph's wrappers know of their ``DurableGraph``."""

    live: LiveRequests
    #: The name of the model step tool.
    model_step: str
    #: Model requests are streamed, their text published to the run's followers.
    stream: bool
    #: The name of the step recording a ``@task``'s output.
    task_step: str
    #: How long an ``interrupt()`` waits for its answer (s).
    interrupt_timeout_s: float

    def tool_step(self, tool: str) -> str | None:
        """The step tool of a LangChain tool named ``tool`` (``None``: not a step)."""
        ...


def live_key(run_id: str, tool: str, args: dict[str, Any]) -> tuple[str, str]:
    """What names a step's live request between the function and the step tool: the run,
    and the step tool with its arguments' digest (a node task's call carries its place)."""
    return run_id, f"{tool}#{args_digest(args)}"


# The node task a step is taken from --------------------------------------------------------


@dataclass
class NodeTask:
    """One execution of a node (or an ``@task``) by LangGraph's loop, named by its superstep
    and path: the outcomes of the steps it took, by their place among its calls."""

    ident: str
    #: (step tool, digest of the arguments, outcome or the ``StepFailed`` raised) by place.
    made: dict[int, tuple[str, str, Any]] = field(default_factory=dict)
    cursor: int = 0
    #: Durable waits (answered ``interrupt()``s) its attempts took.
    waits: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def restart(self) -> None:
        """Another attempt of the task begins: its calls are counted from the first."""
        with self.lock:
            self.cursor = 0

    def place(self) -> int:
        """The place of the call being made among the task's calls (in the order made)."""
        with self.lock:
            self.cursor += 1
            return self.cursor - 1

    def kept(self, place: int, tool: str, digest: str) -> tuple[bool, Any]:
        """What an earlier attempt of the task was given for the same call at ``place``."""
        with self.lock:
            found = self.made.get(place)
            if found is not None and found[:2] == (tool, digest):
                return True, found[2]
        return False, None

    def keep(self, place: int, tool: str, digest: str, outcome: Any) -> None:
        with self.lock:
            self.made[place] = (tool, digest, outcome)


#: Loop iterations a batch of steps waits for the calls started with its first one.
GATHER_TICKS = 3

_task: ContextVar[NodeTask | None] = ContextVar("durable_langgraph_task", default=None)


def node_task() -> ContextVar[NodeTask | None]:
    """The node task the running code belongs to (set by the node's wrapper)."""
    return _task


# The binding of the function to its durable run ---------------------------------------------


@dataclass
class Binding:
    """The durable run a ``DurableGraph``'s function is executing (a context variable)."""

    owner: GraphOwner
    ctx: AsyncRunContext
    loop: asyncio.AbstractEventLoop
    #: Node tasks by their identity, kept across LangGraph's attempts of one task.
    tasks: dict[str, NodeTask] = field(default_factory=dict)
    unwound: bool = False
    #: Steps asked for and not yet handed over, and the task handing them over.
    queue: list[tuple[str, dict[str, Any], Any, asyncio.Future[Any]]] = field(
        default_factory=list)
    issuer: asyncio.Task[None] | None = None
    #: Nodes running now, and those that ran beside another (their steps interleave).
    running: set[str] = field(default_factory=set)
    crowded: set[str] = field(default_factory=set)

    def task(self, ident: str) -> NodeTask:
        found = self.tasks.get(ident)
        if found is None:
            found = self.tasks[ident] = NodeTask(ident)
        return found

    async def step(self, tool: str, args: dict[str, Any], live: Any) -> Any:
        """Take the step ``tool``, handing ``live`` to the step tool that performs it. Steps
        asked for together (the tool calls of a ``ToolNode``, the nodes of a superstep) are
        one parallel decision; one asked for while a decision is in flight waits for it."""
        if self.unwound:  # the worker let go of the run: nothing more is taken
            raise Unwind
        future: asyncio.Future[Any] = self.loop.create_future()
        self.queue.append((tool, args, live, future))
        if self.issuer is None or self.issuer.done():
            self.issuer = self.loop.create_task(self._issue())
        return await future

    async def _issue(self) -> None:
        """Hand the steps asked for to the run, a batch at a time, in the order asked."""
        while self.queue:
            for _ in range(GATHER_TICKS):  # let the calls started together join
                await asyncio.sleep(0)
            batch, self.queue = self.queue, []
            try:
                with ExitStack() as stack:
                    for tool, args, live, _ in batch:
                        stack.enter_context(self.owner.live.handing(
                            live_key(self.ctx.run_id, tool, args), live))
                    if len(batch) == 1:
                        got: list[Any] = [await _settled(self.ctx.call(batch[0][0],
                                                                       batch[0][1]))]
                    else:
                        got = await self.ctx.parallel([(t, a) for t, a, *_ in batch],
                                                      return_exceptions=True)
            except BaseException as exc:  # Unwind, a nondeterminism: every caller gets it
                if isinstance(exc, Unwind):
                    self.unwound = True
                for *_, future in [*batch, *self.queue]:
                    if not future.done():
                        future.set_exception(exc)
                self.queue = []
                return
            for (*_, future), outcome in zip(batch, got, strict=True):
                if future.done():
                    continue
                if isinstance(outcome, StepFailed):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)

    async def take(self, tool: str, args: dict[str, Any], live: Any) -> Any:
        """A step of the current node task: ``args`` named by the task and the call's place
        in it; the outcome an earlier attempt of the task got for it, if any."""
        task = _task.get() or self.task("-")
        place = task.place()
        named = {"task": task.ident, "call": place, **args}
        digest = args_digest(named)
        seen, outcome = task.kept(place, tool, digest)
        if not seen:
            try:
                outcome = await self.step(tool, named, live)
            except StepFailed as exc:
                if exc.status == "rejected":  # a human's decision: given again
                    task.keep(place, tool, digest, exc)
                raise  # a failure is not: LangGraph's RetryPolicy takes the call again
            task.keep(place, tool, digest, outcome)
        if isinstance(outcome, StepFailed):
            raise outcome
        return outcome

    def take_blocking(self, tool: str, args: dict[str, Any], live: Any) -> Any:
        """``take`` from a synchronous node's thread: taken on the run's loop."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise UsageError(f"run {self.ctx.run_id}: a synchronous model or tool call on the "
                             "event loop of the run; call it with ainvoke in an async node")
        return asyncio.run_coroutine_threadsafe(self.take(tool, args, live), self.loop).result()

    async def wait(self, reason: str, data: Any, timeout_s: float) -> Any:
        """A durable wait for input (``durable respond``): the response, from the log when
        it was given; the worker lets go of the run until then."""
        if self.unwound:
            raise Unwind
        try:
            return await self.ctx.wait("input", reason, timeout_s, data)
        except Unwind:
            self.unwound = True
            raise


async def _settled(call: Awaitable[Any]) -> Any:
    """A step's outcome, its ``StepFailed`` returned as ``ctx.parallel`` returns it."""
    try:
        return await call
    except StepFailed as exc:
        return exc


RUNS: Bindings[Binding] = Bindings("durable_langgraph_run")


def bound_run() -> Binding | None:
    """The durable run the current code executes, whatever its ``DurableGraph``."""
    return RUNS.var.get()


# What ended the run -------------------------------------------------------------------------


class GraphRunFailed(StepFailed):
    """Fails the run with LangGraph's own outcome (a recursion limit, an invalid update):
    never retried, never quarantined."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(Action(step=0, tool="langgraph", key="", status="failed",
                                error=f"{type(exc).__name__}: {exc}",
                                error_type=type(exc).__name__))


def outcome_of(exc: BaseException, graph_errors: tuple[type[BaseException], ...],
               ) -> BaseException:
    """What to raise out of the function for what ended the graph: the worker letting go
    (``Unwind``) first, then a failed step, then LangGraph's own error (the run fails);
    anything else as it is (a bug in the graph, for the worker to judge)."""
    chain = list(causes(exc))
    for kind in (Unwind, StepFailed):
        first = next((e for e in chain if isinstance(e, kind)), None)
        if first is not None:
            return first
    own = next((e for e in chain if isinstance(e, graph_errors)), None)
    if own is not None:
        return GraphRunFailed(own)
    return next((e for e in chain if not isinstance(e, Exception)), exc)
