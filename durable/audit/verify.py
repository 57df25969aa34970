"""Audit: check a run's log against the invariants the system promises.

``approvals_signed`` re-checks every recorded approval decision against the approver
registry (``durable.controls.approvals.check_history``): a registered key, not revoked when it
signed, with the request's role, before the request expired, and a signature over this
run, request, digest, decision and expiry. ``settles_signed`` does the same for every
operator's settle of an unknown outcome (``durable.controls.settling.check_event``): a registered,
trusted key holding the settle role, not revoked when the settle was recorded, whose
signature covers this run, step, key, attempt, resolution, result and evidence.

``ledger``: every key that succeeded was claimed, and every key the ledger holds is in the
log: a claim with no dispatch beside it is the state a worker quarantines rather than send
the call (it cannot tell whether it was sent). Each state a worker quarantines on what the
log holds is a failed check here too: an undecodable entry (``decodable``), a seq gap or
repeat (``contiguous``), an entry written around the append script or a broken chain
(``chain``, ``projection``), a rejection or settle nobody registered signed
(``approvals_signed``, ``settles_signed``).

``compensations``: each compensation (a step that ``undoes`` another,
``durable.controls.compensation``) undoes a step of this run whose effect was applied before
it, under that step's key with ``:undo``, and no step is compensated twice.

``chain`` recomputes the log's hash chain (``durable.log.chain``) and names the first entry
that does not chain: one edited, or the first after entries removed, added or moved, or
the last one written when the tail was cut. A log written before the chain existed is
reported "unchained before" its first chained entry, not failed. ``seal`` checks the
run's seal, a signature over the chain head by a key an admin registered
(``durable.audit.seals``): it catches a log edited *and* rechained. A run without one is
shown "unsealed (chain only)"; ``require_seal`` (``durable verify --require-seal``) fails
it, and a log that goes on past its seal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from durable.audit import seals
from durable.controls.approvals import check_history
from durable.controls.approvers import Approvers
from durable.controls.settling import check_event
from durable.log import blobs, chain, context, keys
from durable.log import events as ev
from durable.log.fold import apply
from durable.log.sealer import Seal
from durable.log.state import BlobRef, RunState
from durable.log.store import EventLog


@dataclass
class Report:
    run_id: str
    ok: bool = True
    checks: dict[str, str] = field(default_factory=dict)
    events: int = 0
    #: The first entry whose place in the hash chain does not hold, if one does not.
    bad_entry: str | None = None
    #: The checks that failed, in order (a check's text may also be a note: "unsealed").
    failed: list[str] = field(default_factory=list)

    def fail(self, name: str, why: str) -> None:
        self.ok = False
        self.checks[name] = why
        if name not in self.failed:
            self.failed.append(name)


def verify(elog: EventLog, run_id: str, *, settle_role: str = "operator",
           require_seal: bool = False) -> Report:
    """``settle_role``: the role a settle's key must hold (``DURABLE_SETTLE_ROLE``);
    ``require_seal``: a run whose whole log is not sealed fails (see above)."""
    report = Report(run_id)
    names = ["decodable", "contiguous", "chain", "seal", "projection", "one_success_per_key",
             "no_effect_after_cancel", "dispatched_have_outcome", "one_terminal", "ledger",
             "approvals_signed", "settles_signed", "large_values", "context", "links",
             "compensations", "evidence"]
    for name in names:
        report.checks[name] = "ok"
    raw, proj, raw_seal = _read(elog, run_id)
    entries = elog.entries(run_id, raw)
    report.events = len(entries)
    if not entries:
        report.fail("contiguous", "no log")
        return report
    sealed = Seal.parse(raw_seal) if raw_seal else None
    found = chain.check(run_id, raw, proj.get("last"), keep=[sealed.entry] if sealed else ())
    _chain(report, found)
    approvers = Approvers(elog.redis, elog.admin_keys)
    seal = seals.check(approvers, run_id, raw_seal, found, entries[-1].id,
                       proj.get("state", ""), require=require_seal)
    if seal.problem is not None:
        report.fail("seal", seal.problem)
    else:
        report.checks["seal"] = seal.shown
    state = RunState()
    successes: dict[str, int] = {}
    open_keys: dict[str, int] = {}
    dispatched: set[str] = set()
    settled: set[str] = set()
    terminals = 0
    large: list[tuple[str, BlobRef]] = []
    undos = _Undos()
    for i, entry in enumerate(entries, start=1):
        e = entry.event
        if e is None:
            report.fail("decodable", f"{entry.id}: {entry.error}")
            return report
        if e.seq != i:
            report.fail("contiguous", f"{entry.id}: seq {e.seq}, expected {i}")
        match e:
            case ev.ActionSucceeded():
                successes[e.key] = successes.get(e.key, 0) + 1
                open_keys.pop(e.key, None)
            case ev.ActionReconciled() if e.resolution == "applied":
                successes[e.key] = successes.get(e.key, 0) + 1
                open_keys.pop(e.key, None)
            case ev.ActionReconciled() if e.resolution == "not_applied":
                open_keys.pop(e.key, None)
            case ev.ActionDispatched():
                open_keys[e.key] = e.seq
                dispatched.add(e.key)
                if (state.cancel is not None and e.key not in undos.keys) or state.terminal:
                    report.fail("no_effect_after_cancel",
                                f"{e.key} dispatched at seq {e.seq} after a cancel request")
            case ev.ActionFailed() | ev.CallCanceled():
                open_keys.pop(e.key, None)
                settled.add(e.key)
            case ev.ActionTimedOut() | ev.ActionInterrupted():
                open_keys[e.key] = -1  # marked unknown: allowed
            case ev.Completed() | ev.Failed() | ev.Canceled() | ev.Expired():
                terminals += 1
        problem = undos.see(e, state)
        if problem is not None:
            report.fail("compensations", f"{entry.id}: {problem}")
        ref = blobs.ref_of(e)
        if ref is not None:
            large.append((entry.id, ref))
        if isinstance(e, ev.ContextTrimmed) and not state.terminal:
            report.fail("context", f"{entry.id}: model context removed before the run ended")
        if isinstance(e, ev.EvidenceChecked):
            problem = _unrecorded(state, e)
            if problem is not None:
                report.fail("evidence", f"{entry.id}: {problem}")
        if isinstance(e, ev.Checkpoint):
            snap = e.state
            if (snap.state, snap.step, snap.version) != (state.state, state.step, state.version):
                report.fail("projection", f"checkpoint {entry.id} differs from the fold")
        try:
            apply(state, e, elog.window)
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            # An entry out of place (an outcome before its intent): a tampered log is
            # reported, never a traceback.
            report.fail("projection", f"{entry.id}: the fold cannot apply it "
                        f"({type(exc).__name__}: {exc})")
            break
        if isinstance(e, ev.ApprovalDecided) and e.request in state.approvals:
            problem = check_history(approvers, run_id, state.approvals[e.request])
            if problem is not None:
                report.fail("approvals_signed", f"{entry.id}: {problem}")
        if isinstance(e, ev.ActionReconciled):
            problem = check_event(approvers, settle_role, run_id, e)
            if problem is not None:
                report.fail("settles_signed", f"{entry.id}: {problem}")
    dup = {k: n for k, n in successes.items() if n > 1}
    if dup:
        report.fail("one_success_per_key", f"keys with several successes: {dup}")
    if terminals > 1:
        report.fail("one_terminal", f"{terminals} terminal events")
    dangling = [k for k, seq in open_keys.items() if seq > 0]
    if dangling and state.terminal:
        report.fail("dispatched_have_outcome", f"dispatched with no outcome: {dangling}")
    got = (proj.get("state"), int(proj.get("version", -1)), int(proj.get("step", -1)))
    want = (state.state, state.version, state.step)
    if got != want:
        report.fail("projection", f"projection {got} != fold {want}")
    raw = elog.redis.hgetall(elog.keys.ledger(run_id))
    ledger = {k.decode(): v.decode() for k, v in raw.items()}
    for key in successes:
        if key not in ledger:
            report.fail("ledger", f"{key} succeeded but was never claimed")
    problem = _ledger_unlogged(ledger, dispatched, settled | set(successes))
    if problem is not None:
        report.fail("ledger", problem)
    _large_values(elog, report, run_id, large, context.removed(entries))
    problem = _links(elog, state)
    if problem is not None:
        report.fail("links", problem)
    return report


class _Undos:
    """What ``compensations`` checks, entry by entry: the steps applied so far, and which
    were compensated by which step."""

    def __init__(self) -> None:
        self.applied: set[int] = set()
        self.by: dict[int, int] = {}
        self.keys: set[str] = set()

    def see(self, e: ev.Event, before: RunState) -> str | None:
        """Why ``e`` (folded onto ``before`` next) breaks the rule, or None."""
        if isinstance(e, ev.ActionSucceeded) or (
                isinstance(e, ev.ActionReconciled) and e.resolution == "applied"):
            self.applied.add(e.step)
        if not isinstance(e, ev.StepDecided) or not e.undoes:
            return None
        self.keys.add(e.key)
        target = before.actions.get(e.undoes)
        if e.undoes not in self.applied or (target is not None and target.undoes):
            return f"step {e.step} compensates step {e.undoes}, which applied no effect"
        if e.undoes in self.by:
            return f"step {e.step} compensates step {e.undoes} again (step " \
                   f"{self.by[e.undoes]} did)"
        self.by[e.undoes] = e.step
        if target is not None and e.key != f"{target.key}:undo":
            return f"step {e.step} compensates step {e.undoes} under key {e.key}, not " \
                   f"{target.key}:undo"
        return None


def _large_values(elog: EventLog, report: Report, run_id: str,
                  large: list[tuple[str, BlobRef]], gone: dict[str, context.Removed]) -> None:
    """Each value kept beside the run is there and matches its digest, or is model context
    a ``context_trimmed`` entry records removed; nothing else may be missing."""
    found = elog.redis.hmget(elog.keys.blobs(run_id), [ref.field for _, ref in large]) \
        if large else []
    trimmed: list[context.Removed] = []
    for (entry_id, ref), data in zip(large, found, strict=True):
        removal = gone.pop(ref.field, None)
        if removal is None:
            problem = blobs.check(ref, data)
            if problem is not None:
                report.fail("large_values", f"{entry_id}: {problem}")
        elif not ref.context:
            report.fail("context", f"{removal.entry}: removes {ref.field}, the result of "
                        f"{entry_id}, which is evidence, not model context")
        elif data is not None:
            report.fail("context", f"{removal.entry}: records {ref.field} removed, but it is "
                        "still there (written around the append script)")
        else:
            trimmed.append(removal)
    if gone:
        report.fail("context", f"context_trimmed names values no outcome refers to: "
                    f"{sorted(gone)[:5]}")
    elif trimmed and report.checks["context"] == "ok":
        last = max(trimmed, key=lambda r: r.at)
        report.checks["context"] = (f"ok; {len(trimmed)} model context values removed by "
                                    f"policy ({last.setting}, entry {last.entry}, at "
                                    f"{last.at} ms)")


def _ledger_unlogged(ledger: dict[str, str], dispatched: set[str],
                     settled: set[str]) -> str | None:
    """A ledger entry the log does not account for: a key claimed with no dispatch in the
    log (the state a worker quarantines rather than send it: ``workers.decisions.claimed``),
    or one recorded settled with neither a dispatch nor an outcome."""
    claimed = sorted(k for k, v in ledger.items() if v.startswith("claimed")
                     and k not in dispatched)
    if claimed:
        return (f"{', '.join(claimed[:5])} claimed in the ledger ({ledger[claimed[0]]}) but "
                "the log has no dispatch for it")
    done = sorted(k for k in ledger if k not in dispatched and k not in settled)
    if done:
        return (f"{', '.join(done[:5])} recorded in the ledger ({ledger[done[0]]}) but the "
                "log has no dispatch or outcome for it")
    return None


def _read(elog: EventLog, run_id: str) -> tuple[list[Any], dict[str, str], Any]:
    """The log, the projection and the seal as of one moment: the projection and the seal
    read before and after the log, again while a writer moved them in between (a live
    run)."""
    def beside() -> tuple[dict[str, str], Any]:
        return elog.projection(run_id), elog.redis.get(elog.keys.seal(run_id))

    proj, seal = beside()
    for _ in range(5):
        raw = elog.redis.xrange(elog.keys.log(run_id))
        again = beside()
        if again == (proj, seal):
            break
        proj, seal = again
    return raw, proj, seal


def _chain(report: Report, found: chain.ChainCheck) -> None:
    if found.problem is not None:
        report.bad_entry = found.bad_entry
        report.fail("chain", found.problem)
    else:
        report.checks["chain"] = chain_shown(found)


def chain_shown(found: chain.ChainCheck) -> str:
    """What the chain check shows when it holds."""
    if not found.unchained:
        return "ok"
    if found.first_chained:
        return (f"ok; unchained before entry {found.first_chained} ({found.unchained} "
                "entries written before the log was chained)")
    return f"unchained: its {found.unchained} entries were written before the log was chained"


def _links(elog: EventLog, state: RunState) -> str | None:
    """A child names the parent step that started it, and that step's log records it; each
    child the run started names the run back (``durable.controls.children``)."""
    if state.parent and state.parent_step:
        started = [e.event for e in elog.read(state.parent)
                   if isinstance(e.event, ev.StepDecided) and e.event.step == state.parent_step]
        if not any(e.tool == keys.CHILD_TOOL for e in started):
            return f"parent {state.parent} has no child step {state.parent_step}"
    for child in state.children:
        first = next(iter(elog.read(child, count=1)), None) if elog.exists(child) else None
        event = first.event if first is not None else None
        if isinstance(event, ev.RunStarted) and (event.parent, event.parent_step) != (
                state.run_id, int(child.rsplit(".", 1)[1])):
            return f"child {child} names parent {event.parent} step {event.parent_step}"
    return None


def _unrecorded(state: RunState, e: ev.EvidenceChecked) -> str | None:
    """An ``evidence_checked`` event must be about references the run's steps recorded
    (``durable.agents.evidence``): each failed one among them, and no more checked than there
    are."""
    recorded = {(r.source, r.id, r.version, r.step) for r in state.evidence}
    stray = [f"{r.source}/{r.id}" for r in e.failed
             if (r.source, r.id, r.version, r.step) not in recorded]
    if stray:
        return f"names references no step recorded: {', '.join(stray)}"
    if e.checked != len(state.evidence):
        return f"checked {e.checked} references; the run had recorded {len(state.evidence)}"
    return None
