"""What a graph that stopped asks for, and how an answer resumes it.

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

from dataclasses import dataclass
from typing import Any

from langgraph.types import Command, Interrupt, StateSnapshot

from durable.integrations.base import jsonable

__all__ = ["INTERRUPT_TIMEOUT_S", "Stop", "resume_of", "stopped"]

#: How long an interrupt waits for its answer by default (s): a week.
INTERRUPT_TIMEOUT_S = 7 * 86400.0


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
