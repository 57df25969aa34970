"""What a step is made of: the decisions an agent returns (``Call``, ``Parallel``,
``Finish``, ``Fail``, ``Cancel``, ``Wait``), what a tool's ``lookup`` answers
(``Lookup``), what a tool is given besides its arguments (``ToolContext``), and how an
``async def`` tool is driven (``resolve_awaitable``). ``durable.agents`` exports them all.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from durable import clock
from durable.agents.cancel_token import Cancelled, CancelToken, Overrun
from durable.errors import DurableError
from durable.eventloop import EVENT_LOOP
from durable.log.state import EvidenceRef


@dataclass(frozen=True)
class Call:
    """Decide to call ``tool`` with ``args`` (plain JSON-like data)."""

    tool: str
    args: dict[str, Any] = field(default_factory=dict)
    #: Set by a code agent: the values its context drew since its last decision
    #: (``StepDecided.values``).
    values: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class Parallel:
    """Decide several calls at once: each is a step of its own (key, deadline, outcome),
    numbered in this order; their intents are recorded together and they run at once. A
    ``decide()`` agent may return a list of ``Call`` instead."""

    calls: list[Call]
    #: Set by a code agent: the step numbers it gave the calls.
    steps: list[int] = field(default_factory=list)
    #: As ``Call.values``.
    values: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class Finish:
    result: Any = None


@dataclass(frozen=True)
class Fail:
    error: str
    #: Why, when it is not the agent's own failure (``budget_exhausted``).
    reason: str = ""


@dataclass(frozen=True)
class Cancel:
    """End the run ``canceled``: the agent itself asked to stop (a framework's own cancel).
    ``compensate``: its applied effects are compensated first, newest first."""

    reason: str = ""
    compensate: bool = False


@dataclass(frozen=True)
class Wait:
    """Pause the run without holding a worker until a response or an event arrives."""

    kind: Literal["input", "external", "timer", "child"]
    reason: str = ""
    timeout_s: float = 3600.0
    data: Any = None
    #: As ``Call.values``.
    values: list[Any] = field(default_factory=list)


Decision = Call | Parallel | Finish | Fail | Cancel | Wait


class OutcomeUnknown(DurableError):
    """Raised by a tool that sent its effect but cannot tell whether it was applied (the
    reply was lost). Recorded as interrupted, outcome unknown; resolved by ``lookup`` once
    the deadline has passed. Never retried blindly."""


@dataclass(frozen=True)
class Lookup:
    """What the authoritative system says about a key."""

    status: Literal["applied", "not_applied", "unknown"]
    result: Any = None

    @classmethod
    def applied(cls, result: Any = None) -> Lookup:
        return cls("applied", result)

    @classmethod
    def not_applied(cls) -> Lookup:
        return cls("not_applied")

    @classmethod
    def unknown(cls) -> Lookup:
        return cls("unknown")


@dataclass
class ToolContext:
    """What a tool is given besides its arguments."""

    run_id: str
    step: int
    key: str
    #: Absolute deadline, ms since the epoch; pass it downstream with the key.
    deadline_ms: int
    token: CancelToken
    attempt: int = 1
    #: Publishes partial output (tokens, progress) to the run's followers; not logged.
    publish: Callable[[Any], None] = field(default=lambda data: None, repr=False)
    #: What ``evidence`` recorded during the current attempt (``durable.evidence``).
    refs: list[EvidenceRef] = field(default_factory=list, repr=False)

    def evidence(self, source: str, id: Any, version: Any = "") -> None:
        """Record that the result rests on record ``id`` of ``source`` at ``version``: kept
        with the step's outcome and checked again by the source's checker on every resume
        after a wait (``durable.evidence``)."""
        self.refs.append(EvidenceRef(source=source, id=str(id), version=str(version)))

    def emit(self, data: Any) -> None:
        """Partial output for whoever follows the run (``Client.follow``): tokens,
        progress. Only the step's final result enters the log."""
        self.publish(data)

    def remaining(self) -> float:
        return max(0.0, self.deadline_ms / 1000 - clock.time())

    def check(self) -> None:
        self.token.check()


def resolve_awaitable(value: Any, token: CancelToken | None = None,
                      timeout: float | None = None) -> Any:
    """A tool's ``run`` and ``lookup`` may be ``async def``: drive the coroutine to its end
    as a task of the process's event loop (``durable.eventloop``), the loop a worker's hub
    runs them on, and wait for it on the calling thread. One loop whoever calls: what a
    tool keeps across calls (an HTTP client, an MCP session) stays on the loop it was made
    on. A cancel of ``token`` cancels the task, and ``Cancelled`` is raised; past
    ``timeout`` seconds the task is cancelled too, and ``Overrun`` is raised."""
    if not inspect.isawaitable(value):
        return value
    awaitable = value

    async def drive() -> Any:
        task = asyncio.ensure_future(awaitable)
        loop = asyncio.get_running_loop()

        def cancel() -> None:
            loop.call_soon_threadsafe(task.cancel)

        if token is not None:
            token.add_listener(cancel)
        try:
            return await asyncio.wait_for(task, timeout)
        except asyncio.CancelledError:
            raise Cancelled(token.reason if token is not None else "cancelled") from None
        except TimeoutError:
            raise Overrun("deadline") from None
        finally:
            if token is not None:
                token.remove_listener(cancel)

    try:
        return EVENT_LOOP.wait(drive())
    except asyncio.CancelledError:  # cancelled before it began
        raise Cancelled(token.reason if token is not None else "cancelled") from None
