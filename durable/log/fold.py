"""The fold: ``RunState`` as a pure function of a run's events.

``apply(state, event)`` advances a state by one event in place; ``fold(events)`` starts from
nothing (or from a checkpoint's snapshot) and applies them all. The two agree by
construction, and a property test checks it on random valid histories.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

from durable.log import events as ev
from durable.log.keys import CHILD_TOOL, child_id
from durable.log.state import (
    TERMINAL,
    Action,
    Approval,
    CancelInfo,
    Cost,
    EvidenceRef,
    RunState,
    SettleInfo,
    WaitInfo,
    copy_state,
)

#: Settled actions kept in the state (older ones are evicted; the log keeps them all).
DEFAULT_WINDOW = 32


def fold(
    events: Iterable[ev.Event], start: RunState | None = None, window: int = DEFAULT_WINDOW
) -> RunState:
    state = copy_state(start) if start is not None else RunState()
    for event in events:
        apply(state, event, window)
    return state


def from_checkpoint(checkpoint: ev.Checkpoint) -> RunState:
    """The state right after a checkpoint event."""
    state = copy_state(checkpoint.state)
    state.version = checkpoint.seq
    state.updated = checkpoint.ts
    return state


def _active(state: RunState) -> str:
    return "cancel_requested" if state.cancel is not None else "pending"


def _count_settled(state: RunState, window: int) -> None:
    """One more action settled: count it, and keep only the ``window`` latest settled."""
    state.settled += 1
    settled = [s for s, a in state.actions.items() if a.settled]
    excess = len(settled) - window
    for step in sorted(settled)[: max(excess, 0)]:
        del state.actions[step]


def _count_child_use(state: RunState, outcome: object) -> None:
    """A child that shared this run's budgets reports what it used when it ends."""
    use = outcome.get("usage") if isinstance(outcome, dict) else None
    if not isinstance(use, dict):
        return
    for kind in ("model_calls", "tokens"):
        n = use.get(kind, 0)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            setattr(state, kind, getattr(state, kind) + n)


def _count_cost(state: RunState, cost: Cost | None) -> None:
    """A model call's money: its price added up, or counted as unknown (never as 0). An
    outcome recorded before costs were (no ``cost``) is unknown too."""
    if cost is not None and cost.usd:
        state.cost_usd = str(Decimal(state.cost_usd or "0") + Decimal(cost.usd))
    else:
        state.uncosted += 1


def tokens_of(result: object) -> int:
    """Tokens a model call used, from the OpenAI-style ``usage`` of its recorded result."""
    usage = result.get("usage") if isinstance(result, dict) else None
    total = usage.get("total_tokens", 0) if isinstance(usage, dict) else 0
    return total if isinstance(total, int) and total > 0 else 0


def apply(state: RunState, e: ev.Event, window: int = DEFAULT_WINDOW) -> None:
    state.version = e.seq
    state.updated = e.ts
    match e:
        case ev.RunStarted():
            state.run_id = e.run
            state.agent = e.agent
            state.agent_version = e.agent_version
            state.input = e.input
            state.tools = list(e.tools)
            state.parent = e.parent
            state.parent_step = e.parent_step
            state.budgets = dict(e.budgets)
            state.shared_budgets = e.shared_budgets
            state.trace = e.trace
            state.tenant, state.owner, state.priority = e.tenant, e.owner, e.priority
            state.continue_from, state.session = e.continue_from, e.session
            state.config = dict(e.config)
            state.input_blob = e.input_blob
            state.overrides = dict(e.overrides)
            state.hold_effects, state.reuse_replies = e.hold_effects, e.reuse_replies
            if e.input_blob is not None:
                state.blob_bytes += e.input_blob.size
            state.state = "pending"
            state.created = e.ts
        case ev.StepDecided():
            state.step = e.step
            state.refresh = None
            state.resumed = False
            state.config_changes = {}
            state.evidence_failed = []
            state.actions[e.step] = Action(step=e.step, tool=e.tool, args=e.args, key=e.key,
                                           model=e.model, group=e.group,
                                           context=e.context or e.model, undoes=e.undoes)
            if e.model:
                state.model_calls += 1
            if e.tool == CHILD_TOOL and not (isinstance(e.args, dict) and e.args.get("detached")):
                state.children.append(child_id(e.run, e.step))
        case ev.ActionDispatched():
            act = state.actions[e.step]
            act.status = "dispatched"
            act.attempts += 1
            if act.model and act.attempts > 1:  # a request sent again: paid for again
                state.model_calls += 1
            act.deadline = e.deadline
            act.dispatched_at = e.ts
            act.unknown_reason = None
            state.resumed = False
        case ev.ActionSucceeded():
            act = state.actions[e.step]
            act.status, act.result, act.blob = "succeeded", e.result, e.blob
            if e.blob is not None:
                state.blob_bytes += e.blob.size
            if act.model:
                state.tokens += e.tokens or tokens_of(e.result)
                _count_cost(state, e.cost)
            if e.evidence:
                _record_evidence(state, e.step, e.evidence)
            _count_settled(state, window)
        case ev.ActionFailed():
            act = state.actions[e.step]
            act.error, act.error_type, act.retryable = e.error, e.error_type, e.retryable
            if e.retry_at:
                act.status = "not_applied"  # refused, safe to send again with the same key
            else:
                act.status = "failed"
                _count_settled(state, window)
        case ev.ActionTimedOut() | ev.ActionInterrupted():
            act = state.actions[e.step]
            act.status = "unknown"
            act.unknown_reason = "timed_out" if isinstance(e, ev.ActionTimedOut) else "interrupted"
            if state.state not in TERMINAL:
                state.state = "outcome_unknown"
            _consume_call_cancel(state)
        case ev.ActionReconciled():
            act = state.actions[e.step]
            act.resolution = e.resolution
            if e.by == "operator":
                act.settle = SettleInfo(by=e.operator, key=e.operator_key, sig=e.sig,
                                        evidence=e.evidence, digest=e.result_digest,
                                        attempt=e.attempt, at=e.ts, resolution=e.resolution)
            if e.resolution == "applied":
                act.status, act.result, act.blob = "succeeded", e.result, e.blob
                if e.blob is not None:
                    state.blob_bytes += e.blob.size
                _count_settled(state, window)
            elif e.resolution == "not_applied":
                act.status = "not_applied"
            else:
                act.status = "unknown"
            if state.state == "outcome_unknown" and not any(
                    a.status == "unknown" for a in state.actions.values()):
                state.state = _active(state)
        case ev.CallCanceled():
            act = state.actions[e.step]
            act.status, act.error = "canceled", e.reason or "canceled"
            _count_settled(state, window)
            _consume_call_cancel(state)
            if state.state not in TERMINAL and state.state != "outcome_unknown":
                state.state = _active(state)
        case ev.CancelRequested():
            if state.state not in TERMINAL and state.cancel is None:
                state.cancel = CancelInfo(
                    reason=e.reason, scope=e.scope, requested_ts=e.requested_ts, seq=e.seq,
                    by=e.by, compensate=e.compensate,
                )
                if state.state != "quarantined":
                    state.state = "cancel_requested"
        case ev.Canceled():
            state.state = "canceled"
            state.reason = e.reason
            state.wait = None
            state.compensated, state.not_undone = list(e.compensated), list(e.not_undone)
        case ev.WaitEntered():
            state.wait = WaitInfo(
                kind=e.kind, reason=e.reason, until=e.until, request=e.request, data=e.data
            )
            state.state = f"waiting_{e.kind}"
        case ev.WaitResolved():
            if e.kind == "child":
                _count_child_use(state, e.response)
            if state.wait is not None:
                state.wait.response, state.wait.by = e.response, e.by
                state.wait.outcome = "resolved"
            state.last_wait = state.wait
            state.wait = None
            state.state = _active(state)
            state.resumed = True
        case ev.WaitExpiry():
            if state.wait is not None:
                state.wait.outcome = "expired"
            state.last_wait = state.wait
            state.wait = None
            if e.outcome == "expired":
                state.state = "expired"
                state.reason = f"{e.kind} wait expired"
            else:
                state.state = _active(state)
                state.resumed = True
        case ev.ApprovalRequested():
            state.approvals[e.request] = Approval(
                request=e.request, step=e.step, digest=e.digest, role=e.role,
                decisions=list(e.decisions), evidence=list(e.evidence), expires=e.expires,
                kind=e.kind,
            )
            if e.kind == "action" and e.step in state.actions:
                state.actions[e.step].approval = e.request
        case ev.ApprovalDecided():
            appr = state.approvals.get(e.request)
            if appr is not None:
                appr.decision, appr.approver, appr.decided_at = e.decision, e.approver, e.ts
                appr.key, appr.sig = e.key, e.sig
                target = state.actions.get(appr.step)
                if e.decision == "reject" and appr.kind == "action" and target is not None \
                        and not target.settled:
                    target.status, target.error = "rejected", f"rejected by {e.approver}"
                    target.error_type = "ApprovalRejected"
                    _count_settled(state, window)
        case ev.Checkpoint() | ev.LeaseAcquired() | ev.RetiredLeaseLost():
            pass
        case ev.Completed():
            state.state, state.result = "completed", e.result
        case ev.Failed():
            state.state, state.error = "failed", e.error
            if e.reason:
                state.reason = e.reason
        case ev.Expired():
            state.state, state.reason = "expired", e.reason
        case ev.Quarantined():
            if state.state != "quarantined":
                state.prior_state = state.state
            state.state, state.reason = "quarantined", e.reason
            state.traceback = e.traceback or None
        case ev.Released():
            state.state = state.prior_state or "pending"
            state.prior_state = None
            state.reason = state.traceback = None
        case ev.RevalidationFailed():
            state.resumed = False
            if e.then == "expire":
                state.state, state.reason = "expired", f"revalidation failed: {e.reason}"
            elif e.then == "refresh":
                state.refresh = e.reason
            else:
                current = state.current
                if current is not None and current.approval:
                    state.approvals[current.approval].decision = None
                    current.approval = None
        case ev.AgentUpgraded():
            state.agent_version = e.to_version
            state.tools = list(e.tools)
        case ev.ContextTrimmed():
            state.context_trimmed = e.ts
            state.context_values_trimmed += len(e.refs)
            gone = set(e.refs)
            for act in state.actions.values():
                if act.blob is not None and act.blob.field in gone:
                    act.trimmed, act.result = e.ts, None
            if state.input_blob is not None and state.input_blob.field in gone:
                state.input, state.input_blob = None, None  # nothing left to read back
        case ev.ResumeValidated():
            if e.config:
                state.config = dict(e.config)
            if e.outcome == "replanned":
                state.config_changes = {f: list(v) for f, v in e.changes.items()}
        case ev.EvidenceChecked():
            state.resumed = False
            failed = {(r.source, r.id, r.version, r.step) for r in e.failed}
            state.evidence = [r for r in state.evidence
                              if (r.source, r.id, r.version, r.step) not in failed]
            if e.outcome in ("refresh", "replan"):
                state.evidence_failed = list(e.failed)
            if e.outcome == "refresh":
                state.refresh = evidence_reason(e.failed)


def _record_evidence(state: RunState, step: int, refs: list[EvidenceRef]) -> None:
    """A step's references replace earlier ones of the same source and id: the latest
    read of a record is the one a resume checks."""
    new = {(r.source, r.id): EvidenceRef(source=r.source, id=r.id, version=r.version,
                                         step=step) for r in refs}
    state.evidence = [r for r in state.evidence if (r.source, r.id) not in new]
    state.evidence.extend(new.values())


def evidence_reason(failed: list[EvidenceRef]) -> str:
    """``evidence no longer holds: crm/42 (version 1 -> 2), ...``"""
    return "evidence no longer holds: " + ", ".join(f"{r.source}/{r.id} ({r.why})"
                                                     for r in failed)


def _consume_call_cancel(state: RunState) -> None:
    """A ``call``-scoped cancel ends once the call it targeted has stopped."""
    if state.cancel is not None and state.cancel.scope == "call":
        state.cancel = None
        if state.state == "cancel_requested":
            state.state = "pending"
