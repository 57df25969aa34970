"""What ties a ``DurableAgent``'s clone to the durable run executing it: the binding (a
context variable) through which its model, tools and handoffs take steps, and how what ended
``Runner.run`` becomes the run's outcome."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agents.exceptions import AgentsException

from durable.code import AsyncRunContext, StepFailed
from durable.code.execution import Unwind
from durable.errors import causes
from durable.integrations.base import Bindings
from durable.integrations.openai_agents.steps import AgentOwner, live_key


class AgentRunFailed(StepFailed):
    """Fails the run with the SDK's own outcome (``MaxTurnsExceeded``, a guardrail's tripwire,
    a model's malformed reply): never retried, never quarantined."""

    def __init__(self, exc: BaseException) -> None:
        self.step, self.tool, self.status = 0, "", "failed"
        self.error, self.error_type = f"{type(exc).__name__}: {exc}", type(exc).__name__
        self.outcomes = None
        Exception.__init__(self, self.error)


@dataclass
class Binding:
    """The durable run a ``DurableAgent``'s function is executing (a context variable)."""

    owner: AgentOwner
    ctx: AsyncRunContext
    unwound: bool = False
    #: What was recorded once per run and is read again from the binding (MCP tool lists).
    pinned: dict[str, Any] = field(default_factory=dict)

    async def step(self, tool: str, args: dict[str, Any], live: Any) -> Any:
        """Take a step, handing the live request to the step tool that performs it."""
        if self.unwound:  # the worker let go of the run: nothing more is taken
            raise Unwind
        try:
            with self.owner.live.handing(live_key(self.ctx.run_id, tool, args), live):
                return await self.ctx.call(tool, args)
        except Unwind:
            self.unwound = True
            raise

    async def child(self, agent: str, input: Any) -> Any:
        """Run ``agent`` as a child run of this one and return its result."""
        if self.unwound:
            raise Unwind
        try:
            return await self.ctx.child(agent, input)
        except Unwind:  # the run waits for its child, holding no worker
            self.unwound = True
            raise


RUNS: Bindings[Binding] = Bindings("durable_openai_agents_run")
binding = RUNS.var
bound = RUNS.bound


def primary(exc: BaseException) -> BaseException:
    """What to raise out of the function for what ended ``Runner.run``: the worker letting go
    of the run (``Unwind``) first, then a failed step, then the SDK's own outcome (the run
    fails); anything else as it is (an agent bug, for the worker to judge)."""
    chain = list(causes(exc))
    for kind in (Unwind, StepFailed, AgentsException):
        for found in chain:
            if isinstance(found, kind):
                return AgentRunFailed(found) if kind is AgentsException else found
    return next((e for e in chain if not isinstance(e, Exception)), exc)
