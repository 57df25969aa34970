"""A durable LangGraph run: its input (``GraphInput``), what the graph's function and its step
tools share (``GraphOwner``: what they know of their ``DurableGraph``), the step that records
the checkpointer's entries (``RecordStep``, ``<name>.checkpoint``), and what ended the graph's
run (``outcome_of``: LangGraph's own errors and a node's fail the run; the worker letting go,
a nondeterminism and a misuse keep their meaning)."""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from durable.agents import ToolContext
from durable.call_identity import args_digest
from durable.code import StepFailed
from durable.code.execution import Unwind
from durable.errors import DurableError, causes
from durable.integrations.base import EffectFreeStep, LiveRequests, Owner
from durable.log.state import Action

__all__ = ["GraphInput", "GraphOwner", "GraphRunFailed", "RecordStep", "Records", "live_key",
           "outcome_of"]


class GraphInput(BaseModel):
    """A ``DurableGraph`` run's input: what the graph is invoked with (its input state, or
    an ``@entrypoint``'s argument), and optionally its ``context`` (LangGraph's runtime
    context, for a graph built with a ``context_schema``)."""

    model_config = ConfigDict(extra="forbid")

    input: Any = None
    context: dict[str, Any] | None = None


class GraphOwner(Owner, Protocol):
    """What the step tools and the graph's function know of their ``DurableGraph``."""

    live: LiveRequests
    #: The name of the model step tool.
    model_step: str
    #: The name of the step recording the checkpointer's entries.
    record_step: str
    #: Model requests are streamed, their text published to the run's followers.
    stream: bool
    #: The most steps one decision takes at once (the code agent's ``max_parallel``).
    max_parallel: int

    def tool_step(self, tool: str) -> str | None:
        """The step tool of a LangChain tool named ``tool`` (``None``: not a step)."""
        ...


def live_key(run_id: str, tool: str, args: dict[str, Any]) -> tuple[str, str]:
    """What names a step's live request between the function and the step tool: the run,
    and the step tool with its arguments' digest (a call's arguments carry its task)."""
    return run_id, f"{tool}#{args_digest(args)}"


class Records:
    """What a ``<name>.checkpoint`` step records, handed to it by the function: the
    checkpointer's entries (``durable.integrations.langgraph.records``) and how many of
    the run's interrupts had been answered and given to the graph when they were taken."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data


class RecordStep(EffectFreeStep):
    """``<name>.checkpoint``: entries of LangGraph's checkpointer (checkpoints, a task's
    writes), recorded as the step's result. Effect-free: sent again after a crash, with the
    entries the graph made again."""

    owner: ClassVar[GraphOwner]
    context = True

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return self.owner.handed(ctx, self.name, args, Records).data


# What ended the run -------------------------------------------------------------------------


class GraphRunFailed(StepFailed):
    """Fails the run with LangGraph's own outcome (a recursion limit, an invalid update, a
    node that raised, its ``RetryPolicy`` spent): never retried, never quarantined."""

    def __init__(self, exc: BaseException) -> None:
        node = _node_of(exc)
        where = f"node {node!r}: " if node else ""
        super().__init__(Action(step=0, tool="langgraph", key="", status="failed",
                                error=f"{where}{type(exc).__name__}: {exc}",
                                error_type=type(exc).__name__))


def _node_of(exc: BaseException) -> str | None:
    """The node a LangGraph task's error came from: LangGraph notes it on the exception
    ("During task with name 'x' and id '...'")."""
    for note in getattr(exc, "__notes__", None) or ():
        if isinstance(note, str) and note.startswith("During task with name '"):
            return note.split("'", 2)[1]
    return None


def outcome_of(exc: BaseException, graph_errors: tuple[type[BaseException], ...],
               ) -> BaseException:
    """What to raise out of the function for what ended the graph: the worker letting go
    (``Unwind``) first, then a failed step, then the integration's own refusals and a
    nondeterminism (the run waits for an operator), then LangGraph's own error or a node's
    (the run fails, as ``invoke`` raises it); anything else as it is (a bug of the
    integration, for the worker to judge)."""
    chain = list(causes(exc))
    for kind in (Unwind, StepFailed, DurableError):
        first = next((e for e in chain if isinstance(e, kind)), None)
        if first is not None:
            return first
    own = next((e for e in chain if isinstance(e, graph_errors)), None)
    if own is not None:
        return GraphRunFailed(own)
    node = next((e for e in chain if isinstance(e, Exception) and _node_of(e)), None)
    if node is not None:
        return GraphRunFailed(node)
    return next((e for e in chain if not isinstance(e, Exception)), exc)
