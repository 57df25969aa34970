"""What the function and the step tools of a durable pydantic-ai run share: the options of a
tool's steps, the step a tool runs in (``step_context()``), the event loop every step's
coroutine runs on, and the binding of the function to the durable run it executes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic_ai.durable_exec import record_durable_unit

from durable.agents import Lookup, ToolContext
from durable.cancellation import Cancelled
from durable.code import AsyncRunContext

if TYPE_CHECKING:
    from durable.integrations.pydantic_ai.capability import RedisDurability


@dataclass(frozen=True)
class StepOptions:
    """How one tool's calls are run as steps (``tools={name: StepOptions()}``).

    ``lookup(key, args)`` asks the system the tool acts on whether the call keyed ``key``
    happened (``Lookup.applied(the tool's result)``, ``not_applied()`` or ``unknown()``), plain
    or ``async``: it resolves a call whose outcome a crash or a timeout left unknown. Without
    one, such a call waits in ``waiting_external`` for an operator (``durable settle``): mark a
    tool that only reads ``effect_free`` and it is simply sent again. ``requires_approval``
    overrides what pydantic-ai says of the tool. ``step=False``: the tool is not a step at all;
    it runs inside the agent's function and is executed again on recovery (for pure, cheap
    tools only)."""

    timeout_s: float = 60.0
    retryable: tuple[type[BaseException], ...] = ()
    cancellable: bool = False
    effect_free: bool = False
    lookup: Callable[[str, dict[str, Any]], Lookup | Awaitable[Lookup]] | None = None
    requires_approval: bool | None = None
    approver_role: str = "approver"
    approval_ttl_s: float = 86400.0
    step: bool = True


_step: ContextVar[ToolContext | None] = ContextVar("durable_pydantic_ai_step", default=None)


def step_context() -> ToolContext:
    """The step a durable pydantic-ai agent's tool (or model) runs in: ``key`` (its
    idempotency key, to pass downstream), ``deadline_ms``, ``token``, ``attempt``. Raises
    ``LookupError`` outside a step."""
    ctx = _step.get()
    if ctx is None:
        raise LookupError("not inside a durable step of a pydantic-ai agent")
    return ctx


class StepLoop:
    """One event loop per process, on a daemon thread, for every step's coroutine: a model
    keeps its HTTP client on the loop it was first used on, and an MCP client its session."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="pydantic-ai-steps",
                                 daemon=True).start()
                self._loop = loop
            return self._loop

    def run(self, make: Callable[[], Awaitable[Any]], ctx: ToolContext | None,
            cancellable: bool) -> Any:
        """Run the coroutine ``make()`` returns, with ``step_context()`` set, and wait for it
        on the calling (tool) thread. A cancel of a cancellable step cancels it; a thread
        interrupted by the worker (deadline, grace spent) cancels it too."""

        async def body() -> Any:
            _step.set(ctx)
            return await make()

        fut = asyncio.run_coroutine_threadsafe(body(), self.get())
        try:
            # Polled, not a blocking wait: the worker interrupts a tool thread by raising in
            # it, which only lands while it runs Python.
            while not concurrent.futures.wait([fut], timeout=0.05).done:
                if cancellable and ctx is not None and ctx.token.cancelled:
                    fut.cancel()
                    raise Cancelled(ctx.token.reason or "cancelled")
            try:
                return fut.result()
            except concurrent.futures.CancelledError:
                reason = ctx.token.reason if ctx is not None else ""
                raise Cancelled(reason or "cancelled") from None
        except BaseException:
            fut.cancel()
            raise


LOOP = StepLoop()


@dataclass
class Binding:
    """The durable run a capability's function is executing (a context variable)."""

    owner: RedisDurability
    ctx: AsyncRunContext
    #: Steps handed to the run and not answered yet (several at once: parallel tool calls).
    inflight: set[int] = field(default_factory=set)
    #: What was recorded once per run and is read again from the binding (MCP tool lists).
    pinned: dict[str, Any] = field(default_factory=dict)

    async def step(self, tool: str, args: dict[str, Any], live: Any) -> Any:
        """Take a step, handing the live request to the step tool that will perform it.

        Calls started together (pydantic-ai's parallel tool calls) join one parallel
        decision, numbered in the order they join; the number is taken in the same
        synchronous stretch as the join, so it is the one the run gives the call."""
        n = max(self.ctx.step, *self.inflight) + 1 if self.inflight else self.ctx.step + 1
        replayed = self.ctx.replaying  # the step is in the log already
        key = (self.ctx.run_id, n)
        self.owner.live[key] = live
        self.inflight.add(n)
        try:
            result = await self.ctx.call(tool, args)
        finally:
            self.inflight.discard(n)
            self.owner.live.pop(key, None)
        record_durable_unit(executed=not replayed)
        return result


binding: ContextVar[Binding | None] = ContextVar("durable_pydantic_ai_run", default=None)


def bound(owner: RedisDurability) -> Binding | None:
    b = binding.get()
    return b if b is not None and b.owner is owner else None
