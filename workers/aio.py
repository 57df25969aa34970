"""User code a run's coroutine waits on without any thread waiting for it: an ``async def``
code agent's next decision, a call of an ``async def`` tool. Both are tasks on the
process's event loop (``durable.eventloop``); the run's coroutine awaits an ``Awaiting``,
and its driver is called back once the task is done:

- a worker's hub starts it and goes on with its other runs; the callback puts the run
  back among those to resume (``workers.hub``);
- a run thread, or RQ's, waits for it in place (``Awaiting.settle``).

The watchdog does not time an ``async def`` agent's decision as it times agent code on a
thread: awaiting wedges no thread, and while one function blocks the loop every other
one waits on it too, so timing them would quarantine its victims. The loop's own monitor
reports the function that blocks it, and interrupts it past its limit
(``durable.eventloop``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from durable.agents import Agent, Tool
from durable.code import CodeAgent
from durable.code.steps import decision_of
from durable.eventloop import Handoff
from durable.log.state import Action, RunState
from durable.log.store import Spec

from .context import StepContext
from .turns import SLOT, Abandoned, Offload, Slot


class Awaiting(Offload):
    """User code on the event loop: ``start`` begins it and returns its future."""

    __slots__ = ("start",)

    def __init__(self, what: str, start: Callable[[], Handoff[Any]]) -> None:
        super().__init__(what, start)
        self.start = start

    def begin(self, done: Callable[[], object]) -> None:
        """Start the code; ``done`` is called (on any thread) once its result is kept."""
        try:
            future = self.start()
        except BaseException as exc:  # raised again in the coroutine that awaits it
            self.error = exc
            done()
            return

        def finished(f: Handoff[Any]) -> None:
            if f.cancelled():
                self.error = Abandoned()
            elif f.exception() is not None:
                self.error = f.exception()
            else:
                self.result = f.result()
            done()

        future.add_done_callback(finished)

    def settle(self) -> None:
        """Wait for it on this thread (a run thread's driver)."""
        over = threading.Event()
        self.begin(over.set)
        while not over.wait(0.1):  # short: the watchdog can interrupt this thread
            pass


async def next_decision(ctx: StepContext, agent: Agent, state: RunState) -> Any:
    """The agent's next decision: a ``decide()`` on a thread (as ``StepContext.user``), an
    ``async def`` function's awaited on the event loop; a plain function's awaited from its
    own thread under a driver that resumes runs later (the hub: ``timed_soon``), else
    waited for on a thread (``StepContext.user``)."""
    what = f"{agent.name}.decide()"
    slot = SLOT.get()
    if not isinstance(agent, CodeAgent) or not (
            agent.is_async or (slot is not None and slot.callbacks.resumes_later)):
        return await ctx.user(what, lambda: agent.decide(state))
    if not agent.has_session(state.run_id) and agent.needs_history(state):
        # Its history is read from the log first, on a thread.
        await ctx.io.elsewhere(lambda: agent.open_session(state))
    if agent.is_async or slot is None:
        return decision_of(await Awaiting(what, lambda: agent.decide_soon(state)))
    return decision_of(await Awaiting(what, lambda: timed_soon(agent, state, slot, what)))


def timed_soon(agent: CodeAgent, state: RunState, slot: Slot, what: str) -> Handoff[Any]:
    """A plain function's next decision, timed by the watchdog from now until the function
    hands it over: past ``DURABLE_DECIDE_TIMEOUT_MS``, ``Abandoned`` is raised in the
    function's own thread (it runs the agent code; no thread of the worker waits on it),
    and the function hands that over as what it raised."""
    session = agent.open_session(state)
    slot.user_code, slot.user_code_since = what, time.monotonic()
    try:
        wanted = session.begin(state)
    except BaseException:
        slot.user_code_since = 0.0
        raise
    thread = session.thread
    if thread is not None and thread.ident is not None:
        slot.thread_id = thread.ident

    def done(_: Handoff[Any]) -> None:
        slot.user_code_since = 0.0

    wanted.add_done_callback(done)  # before the driver's: the timing stops first
    return wanted


def is_async_tool(ctx: StepContext, tool: Tool) -> bool:
    return ctx.dispatcher.is_async(tool)


async def call_tool(ctx: StepContext, run_id: str, tool: Tool, act: Action, slot: Slot,
                    args: Any) -> list[Spec]:
    """Call an ``async def`` tool on the event loop: the events its call observed."""
    slot.in_call = True
    try:
        specs: list[Spec] = await Awaiting(act.tool, lambda: ctx.dispatcher.dispatch_soon(
            run_id, tool, act, slot.token, args))
    finally:
        slot.in_call = False
    if (run_id, act.step) in ctx.limiter.held:
        await ctx.io.elsewhere(lambda: ctx.limiter.release(run_id, act.step, specs))
    return specs
