"""What the function and the step tools of a durable pydantic-ai run share: the options of a
tool's steps, the step a tool runs in (``step_context()``), and the binding of the function to
the durable run it executes. Every step's coroutine runs on the loop of
``durable.integrations.steploop``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic_ai.durable_exec import record_durable_unit

from durable.agents import Lookup, ToolContext
from durable.code import AsyncRunContext
from durable.integrations.steploop import LOOP, current_step

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


def step_context() -> ToolContext:
    """The step a durable pydantic-ai agent's tool (or model) runs in: ``key`` (its
    idempotency key, to pass downstream), ``deadline_ms``, ``token``, ``attempt``. Raises
    ``LookupError`` outside a step."""
    ctx = current_step()
    if ctx is None:
        raise LookupError("not inside a durable step of a pydantic-ai agent")
    return ctx


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


__all__ = ["LOOP", "Binding", "StepOptions", "binding", "bound", "step_context"]
