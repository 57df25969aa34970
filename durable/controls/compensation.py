"""Compensation: undoing a run's applied effects as new authorized actions, never a rollback.

A tool may define ``compensate(args, outcome, ctx)`` (``durable.agents.Tool``). A cancel
with compensation -- ``client.abort(run)`` / ``client.cancel(run, compensate=True)``,
``durable cancel RUN --compensate``, the console, or an agent's ``Cancel(compensate=True)``
-- records ``cancel_requested`` with ``compensate``; the worker that takes the run
(``workers.compensation``) then

1. stops new work and resolves what is in flight as a cancel does, except that an effect
   whose outcome is unknown is resolved with its ``lookup`` first (the reconciler's or the
   worker's): nothing is compensated that is not known to be applied;
2. compensates each applied effect, newest first: a step of its own (``step_decided`` with
   ``undoes`` = the step it undoes) with the key ``<key of that step>:undo``, claimed in the
   ledger, dispatched with a deadline, approved first when the tool requires approval,
   resolved with the tool's ``lookup_compensation`` after a crash, its outcome recorded;
3. ends the run ``canceled``, the event listing the steps compensated and those that could
   not be undone (a tool without ``compensate``, a compensation that failed or was
   rejected).

Effect-free steps (model calls, reads) changed nothing and are neither. ``verify`` checks
that each compensation undoes an applied effect of its run, and that no effect is
compensated twice (``durable.audit.verify``).

This module holds the plan (what is applied, compensated, left) read from the log, and the
client's request; the worker's side is ``workers.compensation``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import redis

from durable.agents import Registry
from durable.backend.cancel_messages import CancelMessage, encode_message
from durable.call_identity import is_placeholder
from durable.contention import update_run
from durable.errors import Refused
from durable.log import events as ev
from durable.log import keys
from durable.log.fold import fold
from durable.log.state import Action, RunState
from durable.log.store import EventLog, RunHandle, Spec, now_ms
from durable.queue import make_ready
from durable.settings import Settings

if TYPE_CHECKING:
    from rq import Queue

#: The fold's window when the whole history is wanted (no settled action evicted).
WHOLE = 1 << 30


def undo_key(key: str) -> str:
    """The idempotency key of the compensation of the step keyed ``key``."""
    return f"{key}:undo"


@dataclass
class Plan:
    """A run's applied effects as compensation sees them, newest first.

    ``todo``: applied, compensable, with no compensation ended yet (the first is next);
    ``compensated``: compensated; ``not_undone``: cannot be or were not undone, ``why``
    says why; ``unresolved``: effects whose outcome is still unknown (resolved first).
    """

    todo: list[Action] = field(default_factory=list)
    compensated: list[int] = field(default_factory=list)
    not_undone: list[int] = field(default_factory=list)
    unresolved: list[int] = field(default_factory=list)
    why: dict[int, str] = field(default_factory=dict)
    #: The compensation step of each step that has one.
    undo_of: dict[int, Action] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """Nothing applied, nothing that may have been: nothing to compensate."""
        return not (self.todo or self.compensated or self.not_undone or self.unresolved)


def plan_of(state: RunState, registry: Registry) -> Plan:
    """The plan of a run whose ``state`` holds its whole history (``whole_state``)."""
    plan = Plan()
    for act in state.actions.values():
        if act.undoes:
            plan.undo_of[act.undoes] = act
    for act in sorted(state.actions.values(), key=lambda a: a.step, reverse=True):
        tool = registry.tools.get(act.tool)
        if act.undoes or (tool is not None and tool.effect_free) or act.model:
            continue
        if act.status in ("dispatched", "unknown"):
            plan.unresolved.append(act.step)
            continue
        if act.status != "succeeded":
            continue
        undo = plan.undo_of.get(act.step)
        if tool is None or not tool.compensable:
            plan.not_undone.append(act.step)
            plan.why[act.step] = f"{act.tool} has no compensation"
        elif is_placeholder(act.args):
            plan.not_undone.append(act.step)
            plan.why[act.step] = "its arguments were kept out of the log"
        elif undo is None or not undo.settled:
            plan.todo.append(act)
        elif undo.status == "succeeded":
            plan.compensated.append(act.step)
        else:
            plan.not_undone.append(act.step)
            plan.why[act.step] = f"its compensation (step {undo.step}) {undo.status}" + (
                f": {undo.error}" if undo.error else "")
    return plan


def not_undone_why(state: RunState) -> dict[int, str]:
    """Why each step a canceled run lists as not undone (``state.not_undone``) was not,
    from its log alone (``state`` of ``whole_state``): its compensation failed or was
    rejected (with the reason recorded), its arguments were kept out of the log, or its
    tool has none. What ``abort`` said when it was asked, told again once the run ended."""
    undo_of = {a.undoes: a for a in state.actions.values() if a.undoes}
    why: dict[int, str] = {}
    for step in state.not_undone:
        undo, act = undo_of.get(step), state.actions.get(step)
        if undo is not None:
            why[step] = f"its compensation (step {undo.step}) {undo.status}" + (
                f": {undo.error}" if undo.error else "")
        elif act is not None and is_placeholder(act.args):
            why[step] = "its arguments were kept out of the log"
        else:
            why[step] = f"{act.tool if act else 'its tool'} has no compensation"
    return why


def whole_state(events: Iterable[ev.Event]) -> RunState:
    """The fold of a run's whole log with no action evicted from the window."""
    return fold(events, window=WHOLE)


def read_whole(elog: EventLog, run_id: str) -> RunState:
    """``whole_state`` of ``run_id``, read from its log."""
    return whole_state(e.event for e in elog.read(run_id) if e.event is not None)


def read_plan(elog: EventLog, run_id: str, registry: Registry) -> Plan:
    """The plan of ``run_id`` read from its whole log."""
    return plan_of(read_whole(elog, run_id), registry)


def summary_specs(state: RunState, plan: Plan) -> list[Spec]:
    """The event that ends a cancel with compensation once nothing is left to do."""
    cancel = state.cancel
    assert cancel is not None
    return [Spec(ev.Canceled, {"reason": cancel.reason,
                               "latency_ms": max(0, now_ms() - cancel.requested_ts),
                               "compensated": plan.compensated,
                               "not_undone": plan.not_undone})]


@dataclass(frozen=True)
class Aborted:
    """What ``abort`` recorded: the run's state after the request, the steps whose effects
    will be compensated (newest first), those that cannot be undone and why, and those
    whose outcome is resolved first."""

    state: RunState
    compensating: list[int]
    not_undone: dict[int, str]
    unresolved: list[int]


class Compensations:
    """A part of :class:`durable.client.Client`: the cancel with compensation."""

    settings: Settings
    redis: redis.Redis
    log: EventLog
    registry: Registry

    if TYPE_CHECKING:
        @property
        def queue(self) -> Queue: ...

        def cancel(self, run_id: str, reason: str = "", scope: str = "run",
                   by: str = "operator") -> RunState: ...

    def abort(self, run_id: str, reason: str = "", *, compensate: bool = True,
              by: str = "operator") -> Aborted:
        """Cancel ``run_id``; with ``compensate``, a worker first compensates its applied
        effects, newest first (see the module doc). Refused (``Refused``, nothing written)
        when the run has ended, is quarantined, is being canceled already, or applied no
        effect."""
        if not compensate:
            state = self.cancel(run_id, reason, by=by)
            return Aborted(state, [], {}, [])
        requested = now_ms()

        def write(handle: RunHandle) -> tuple[RunState, Plan]:
            state = handle.state
            if state.terminal:
                raise Refused(run_id, f"it is already {state.state}: nothing to compensate")
            if state.state == "quarantined":
                raise Refused(run_id, "it is quarantined: release it (durable quarantine "
                              "release) before compensating it")
            if state.cancel is not None and state.cancel.scope == "run":
                raise Refused(run_id, "a cancel is already requested")
            plan = read_plan(self.log, run_id, self.registry)
            if plan.empty:
                raise Refused(run_id, "nothing to compensate: no step of it applied an effect")
            self.log.commit(handle, [Spec(ev.CancelRequested, {
                "reason": reason, "scope": "run", "requested_ts": requested, "by": by,
                "compensate": True})])
            return handle.state, plan

        state, plan = update_run(self.log, run_id, by, write)
        make_ready(self.redis, self.log.keys, self.queue, run_id, force=True, route=state.agent)
        self.redis.publish(keys.CANCEL_CHANNEL, encode_message(
            CancelMessage(run=run_id, reason=reason, scope="run", ts=now_ms()),
            self.settings.cancel.secret))
        return Aborted(state, [a.step for a in plan.todo],
                       {s: plan.why[s] for s in plan.not_undone}, plan.unresolved)
