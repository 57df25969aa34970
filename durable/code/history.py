"""What the log records of a code agent's function, read back when the function is
executed again (on recovery, a hand-back, after a wait, on another worker): every step it
took with its outcome (no window), the values it drew from its context (``Values``) and
the waits it made, in order, with how each ended (``waits_of``).

``durable.code.execution`` checks the function's re-execution against these: the same steps,
the same number of values drawn before each, the same waits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from durable.log import events as ev
from durable.log.fold import fold
from durable.log.state import Action, RunState, WaitInfo

if TYPE_CHECKING:
    from durable.log.store import EventLog

#: Every action of the run is kept when its history is rebuilt (no window).
ALL_ACTIONS = 1 << 62

#: The waits a code agent's function makes itself (``ctx.wait``, ``ctx.sleep``,
#: ``ctx.join``).
CODE_WAITS = ("input", "external", "timer", "child")


class Values:
    """The values a run's function drew from its context, as the log records them: in the
    order drawn (``[kind, value]``), and how many were drawn before each recorded step
    (``("step", n)``) and each wait of the function (``("wait", i)``, counted from 1)."""

    def __init__(self) -> None:
        self.drawn: list[list[Any]] = []
        self.marks: dict[tuple[str, int], int] = {}

    @classmethod
    def of(cls, events: list[Any]) -> Values:
        found = cls()
        waits = 0
        for e in events:
            if isinstance(e, ev.StepDecided):
                found.drawn.extend(e.values)
                found.marks[("step", e.step)] = len(found.drawn)
            elif isinstance(e, ev.WaitEntered) and e.kind in CODE_WAITS:
                waits += 1
                found.drawn.extend(e.values)
                found.marks[("wait", waits)] = len(found.drawn)
        return found


def waits_of(events: list[Any]) -> list[WaitInfo]:
    """The waits of a run's function, in order, with how each ended."""
    waits: list[WaitInfo] = []
    for e in events:
        if isinstance(e, ev.WaitEntered) and e.kind in CODE_WAITS:
            waits.append(WaitInfo(kind=e.kind, reason=e.reason, request=e.request))
        elif isinstance(e, ev.WaitResolved) and waits and waits[-1].request == e.request:
            waits[-1].response, waits[-1].outcome = e.response, "resolved"
        elif isinstance(e, ev.WaitExpiry) and waits and waits[-1].request == e.request:
            waits[-1].outcome = "expired"
    return [w for w in waits if w.outcome]


#: What executing the function again re-observes: its steps by number, its ended waits and
#: the values it drew (``read_history``).
History = tuple[dict[int, Action], list[WaitInfo], Values]


def history_of(events: list[Any]) -> History:
    """The history of a run whose events are at hand (a saved run's file): every step with
    its outcome, the waits and the values, as ``read_history`` reads them from a log."""
    return fold(events, window=ALL_ACTIONS).actions, waits_of(events), Values.of(events)


def needs_history(state: RunState) -> bool:
    """Whether executing the function again for ``state`` reads the run's log: not for a
    run that has taken no step and made no wait yet (nothing to re-observe, no value drawn:
    values are recorded with a step's intent or a wait)."""
    return bool(state.step or state.wait is not None or state.last_wait is not None)


def read_history(log: EventLog | None, state: RunState) -> History:
    """The run's steps (by step number), waits and drawn values, from its log (when there
    is one to read and ``needs_history``) and the outcomes ``state`` holds that are newer
    than the log (staged), with results kept beside the run read back whole."""
    actions: dict[int, Action] = {}
    waits: list[WaitInfo] = []
    values = Values()
    if log is not None and needs_history(state):
        actions, waits, values = history_of(
            [e.event for e in log.read(state.run_id) if e.event is not None])
    for step, act in state.actions.items():  # newer than the log: staged outcomes
        actions[step] = msgspec.structs.replace(act)
    if log is not None:  # results kept beside the run, read back whole
        log.resolve(state.run_id, actions.values())
    return actions, waits, values
