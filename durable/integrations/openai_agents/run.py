"""A durable OpenAI Agents SDK run: what its function gives ``Runner.run`` (``AgentInput``),
what the function and the step tools share (what they know of their ``DurableAgent``,
``AgentOwner``, so that they never import it, the binding of the function to the durable
run it executes, and the key a live request is handed over by), the conversation a run
continues and keeps, and what ended ``Runner.run``. ``StepOptions``, ``step_context()`` and
``run_in_step`` (which every step tool awaits its work with) are the shared ones of
``durable.integrations.base``.

A step tool reaches the live request (the real model and its arguments, the SDK's
``ToolContext``) through a hand-off the agent's function fills just before it takes the
step, keyed by run, step tool and the digest of the step's arguments (``live_key``): the
worker only ever runs a code agent's step while its function waits at that very call, and
the arguments name the call (a tool call's arguments carry the model's ``call_id``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from agents.exceptions import AgentsException
from pydantic import BaseModel, ConfigDict

from durable import conversations
from durable.call_identity import args_digest
from durable.code import AsyncRunContext, StepFailed
from durable.code.execution import Unwind
from durable.errors import causes
from durable.integrations.base import Bindings, LiveRequests, Owner, jsonable
from durable.request_digest import ListDigest

__all__ = ["RUNS", "AgentInput", "AgentOwner", "AgentRunFailed", "Binding", "binding",
           "bound", "continued_items", "keep_items", "keeps", "live_key", "primary"]


class AgentInput(BaseModel):
    """A ``DurableAgent`` run's input: what ``Runner.run`` takes as ``input`` (text, or the
    input items of a conversation to continue: ``result.to_input_list()``). Subclass it to
    carry what ``context`` builds the run's context object from."""

    model_config = ConfigDict(extra="forbid")

    input: str | list[dict[str, Any]]


# The binding of the function to its durable run ---------------------------------------------


class AgentOwner(Owner, Protocol):
    """What the step tools and wrappers of a run know of its ``DurableAgent``."""

    live: LiveRequests


def live_key(run_id: str, tool: str, args: dict[str, Any]) -> tuple[str, str, str]:
    """The key the live request of the step ``tool`` (arguments ``args``) is handed by."""
    return (run_id, tool, args_digest(args))


@dataclass
class Binding:
    """The durable run a ``DurableAgent``'s function is executing (a context variable)."""

    owner: AgentOwner
    ctx: AsyncRunContext
    unwound: bool = False
    #: What was recorded once per run and is read again from the binding (MCP tool lists).
    pinned: dict[str, Any] = field(default_factory=dict)
    #: The digest of each agent's model requests, taken one new input item at a time.
    digests: dict[str, ListDigest] = field(default_factory=dict)

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


# The conversation across runs ---------------------------------------------------------------
#
# A run that continues another (``continue_from`` or a named session's turn,
# ``durable.controls.sessions``) is given the items that run kept (the step
# ``conversation.load``), then its input; a run that keeps its conversation keeps
# ``result.to_input_list()`` (``conversation.save``) for the run that continues it: the
# SDK's ``Session`` role, with the history in the log (``durable.conversations``).


def keeps(ctx: AsyncRunContext) -> bool:
    """Whether the run keeps its conversation: it continues one, or is a session's turn."""
    return bool(ctx.continues or ctx.session_name)


async def continued_items(ctx: AsyncRunContext, given: str | list[dict[str, Any]]
                          ) -> str | list[dict[str, Any]]:
    """The run's input: for a run that continues another, the items that run kept (a step)
    then the input's, text becoming a user message; else the input as given."""
    if not ctx.continues:
        return given
    earlier = await conversations.aload(ctx)
    new = [{"role": "user", "content": given}] if isinstance(given, str) else list(given)
    return [*earlier, *new]


async def keep_items(ctx: AsyncRunContext, items: list[Any]) -> None:
    """Keep ``items`` (``result.to_input_list()``) as the run's conversation (a step)."""
    await conversations.asave(ctx, jsonable(items))


# What ended the run -------------------------------------------------------------------------


class AgentRunFailed(StepFailed):
    """Fails the run with the SDK's own outcome (``MaxTurnsExceeded``, a guardrail's tripwire,
    a model's malformed reply): never retried, never quarantined."""

    def __init__(self, exc: BaseException) -> None:
        self.step, self.tool, self.status = 0, "", "failed"
        self.error, self.error_type = f"{type(exc).__name__}: {exc}", type(exc).__name__
        self.outcomes = None
        Exception.__init__(self, self.error)


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
