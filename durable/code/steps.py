"""What a code agent's steps give its function back, and what the function hands the worker:
a failed step (``StepFailed``; ``ChildFailed`` for a child run), a child run's handle, an
expired wait, a request to end the run (``EndRun``), and the pure functions that turn a
function's return or raise into a decision and a wait into its parameters. Shared by the
two executions (``execution``, ``async_execution``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from durable import clock
from durable.agents import Cancel, Decision, Fail, Finish
from durable.controls.children import CHILD_POLL_MS
from durable.errors import DurableError
from durable.log.keys import CHILD_TOOL
from durable.log.state import Action


class StepFailed(DurableError):
    """Raised by ``ctx.call`` when the step failed, was canceled or its approval rejected.
    Not caught, it fails the run with this message."""

    def __init__(self, act: Action) -> None:
        self.step, self.tool, self.status = act.step, act.tool, act.status
        self.error, self.error_type = act.error or act.status, act.error_type
        #: Raised by ``ctx.parallel``: every call's result, a ``StepFailed`` for each failure.
        self.outcomes: list[Any] | None = None
        super().__init__(f"step {act.step} ({act.tool}) {act.status}: {self.error}")


class ChildFailed(StepFailed):
    """Raised by ``ctx.child`` / ``ctx.join`` when the child run did not complete (it
    failed, was canceled or expired): ``child`` is its run id, ``status`` its state."""

    def __init__(self, child: str, state: str, error: str | None) -> None:
        self.child, self.step, self.tool, self.status = child, 0, CHILD_TOOL, state
        self.error, self.error_type = error or state, "ChildFailed"
        self.outcomes = None
        Exception.__init__(self, f"child run {child} {state}: {self.error}")


class ChildRun:
    """A child run started by ``ctx.start_child``: ``ctx.join(child)`` waits for it."""

    def __init__(self, run_id: str, agent: str, detached: bool = False) -> None:
        self.run_id, self.agent, self.detached = run_id, agent, detached

    def __repr__(self) -> str:
        return f"ChildRun({self.run_id!r}, agent={self.agent!r})"


#: How long a parent waits for a child by default before the wait expires (s): a week.
CHILD_TIMEOUT_S = 7 * 86400.0


class WaitExpired(DurableError):
    """Raised by ``ctx.wait`` when the wait expired and the agent continues
    (``on_wait_expired = "continue"``)."""


class EndRun(DurableError):
    """Raised by a code agent's function to end its run with ``decision`` (``Fail`` with a
    reason, ``Cancel``) rather than as an agent bug."""

    def __init__(self, decision: Fail | Cancel) -> None:
        self.decision = decision
        super().__init__(str(decision))


def finished(value: Any) -> Finish:
    """What a function that returned ``value`` decides: to finish with it."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return Finish(value)


def raised(exc: BaseException) -> Decision | BaseException:
    """What a function that raised ``exc`` hands over: a failed step not caught fails the
    run, ``EndRun`` ends it as it says; anything else (an agent bug, a nondeterminism) is
    for the worker to decide."""
    if isinstance(exc, StepFailed):
        return Fail(str(exc)[:2000])
    if isinstance(exc, EndRun):
        return exc.decision
    return exc


def decision_of(item: Any) -> Decision:
    """What a function handed over: its decision, or what it raised (raised here)."""
    if isinstance(item, BaseException):
        raise item
    decision: Decision = item
    return decision


def join_wait(child: ChildRun, timeout_s: float) -> tuple[str, str, float, Any]:
    """The wait of ``ctx.join(child)``: (kind, reason, poll time, data)."""
    expires = clock.now_ms() + int(timeout_s * 1000)
    return ("child", f"child run {child.run_id} ({child.agent})", CHILD_POLL_MS / 1000,
            {"child": child.run_id, "expires": expires})


def joined(child: ChildRun, outcome: Any) -> Any:
    """The result of a child run from its wait's outcome, or ``ChildFailed``."""
    if not isinstance(outcome, dict) or outcome.get("state") != "completed":
        state = outcome.get("state", "?") if isinstance(outcome, dict) else "?"
        error = outcome.get("error") if isinstance(outcome, dict) else None
        raise ChildFailed(child.run_id, str(state), error)
    return outcome.get("result")


def sleep_wait(seconds: float) -> tuple[str, str, float, Any]:
    """The wait of ``ctx.sleep(seconds)``."""
    if not seconds >= 0:
        raise ValueError(f"ctx.sleep takes seconds >= 0, not {seconds!r}")
    return "timer", f"sleep {seconds:g} s", float(seconds), None
