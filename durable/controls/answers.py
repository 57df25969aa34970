"""Answers to waiting runs: responses, external events and approval decisions.

Each is written with optimistic concurrency (``durable.contention.update_run``); a late
duplicate (the run no longer waits for it) returns the current state and writes nothing.
"""

from __future__ import annotations

from typing import Any

from durable.contention import update_run
from durable.controls.approvals import check_decision
from durable.controls.approvers import Approvers
from durable.errors import Refused, UsageError
from durable.log import events as ev
from durable.log.state import RunState
from durable.log.store import EventLog, RunHandle, Spec, now_ms


def respond(elog: EventLog, run_id: str, response: Any, *, kind: str = "input",
            request: str | None = None, by: str = "operator") -> tuple[RunState, bool]:
    """Answer a ``waiting_input`` (or ``waiting_external``) run. Returns (state, resumed)."""
    def write(handle: RunHandle) -> tuple[RunState, bool]:
        wait = handle.state.wait
        if wait is None or wait.kind != kind or (request and wait.request != request):
            return handle.state, False
        unsettled = [a.step for a in handle.state.actions.values()
                     if kind == "external" and a.key == wait.request and a.status == "unknown"]
        if unsettled:  # an answer would be ignored: the worker would ask the lookup again
            raise Refused(run_id, f"it waits for an operator to settle the unknown outcome "
                          f"of step {unsettled[0]}: `durable settle {run_id} --step "
                          f"{unsettled[0]} --applied|--not-applied --evidence TEXT "
                          "--signer NAME --key FILE`; nothing written")
        elog.commit(handle, [Spec(ev.WaitResolved, {
            "kind": kind, "request": wait.request, "response": response, "by": by})])
        return handle.state, True

    return update_run(elog, run_id, by, write)


def decide_approval(elog: EventLog, approvers: Approvers, run_id: str, request: str,
                    decision: str, approver: str, signature: str,
                    note: str = "") -> tuple[RunState, bool]:
    """Record an approver's signed decision. Returns (state, whether anything was written).

    Refused (nothing written): a signature that is not the registered key of ``approver``
    over this run, request, digest, decision and expiry; an unknown or revoked key; an
    approver without the request's role; a decision the request does not allow; an
    unknown, closed or expired request. The caller's environment grants nothing.
    """
    def write(handle: RunHandle) -> tuple[RunState, bool]:
        state = handle.state
        appr = state.approvals.get(request)
        if appr is None:
            raise Refused(run_id, f"no approval request {request!r}")
        if appr.decision is not None:
            return state, False  # a late duplicate: the first decision stands
        if state.terminal or state.state == "quarantined":
            raise Refused(run_id, f"the run is {state.state}; request {request} is closed")
        if decision not in appr.decisions:
            raise UsageError(f"decision must be one of {', '.join(appr.decisions)}")
        entry = approvers.get(approver)
        problem = check_decision(entry, approver, run_id, appr, decision, signature,
                                 now=now_ms())
        if problem is not None or entry is None:
            raise Refused(run_id, problem or f"unknown approver {approver!r}")
        specs = [Spec(ev.ApprovalDecided, {"request": request, "decision": decision,
                                           "approver": approver, "note": note,
                                           "key": entry.fingerprint, "sig": signature})]
        if state.wait is not None and state.wait.kind == "approval" \
                and state.wait.request == request:
            specs.append(Spec(ev.WaitResolved, {"kind": "approval", "request": request,
                                                "response": decision, "by": approver}))
        elog.commit(handle, specs)
        return handle.state, True

    return update_run(elog, run_id, approver, write)
