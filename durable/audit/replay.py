"""Replay: the state at any point of a run's stream and the trajectory (forks:
``durable.audit.forks``, re-exported here).

The state at an entry is rebuilt from the nearest checkpoint at or before it, so its cost
depends on the events since that checkpoint, not on the log's length.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from durable.agents import Call, Parallel
from durable.audit.forks import fork as fork  # re-exported: where it was first defined
from durable.call_identity import call_difference, call_signature, given_digest, is_placeholder
from durable.errors import DecodeError, NondeterminismError, RunNotFound, UsageError
from durable.log import blobs, context, keys
from durable.log import events as ev
from durable.log.entries import decode_entry
from durable.log.fold import apply, from_checkpoint
from durable.log.handle import text
from durable.log.state import BlobRef, Cost, RunState
from durable.log.store import Entry, EventLog, RunHandle, Spec


@dataclass
class Replay:
    run_id: str
    state: RunState
    entries: list[Entry]
    #: Entry id of the checkpoint the fold started from ("" = from the beginning).
    started_from: str = ""
    rows: list[dict[str, Any]] = field(default_factory=list)


def _decoded(entry: Entry) -> ev.Event:
    if entry.event is None:
        raise DecodeError(entry.id, entry.error or "undecodable")
    return entry.event


def state_at(elog: EventLog, run_id: str, end: str = "+") -> tuple[RunState, str]:
    """Fold up to ``end`` (inclusive) from the nearest checkpoint at or before it."""
    if not elog.exists(run_id):
        raise RunNotFound(run_id)
    ckpt_id = ""
    start = "-"
    cursor = end
    base: RunState | None = None
    while base is None:
        batch = elog.redis.xrevrange(elog.keys.log(run_id), cursor, "-", count=256)
        if not batch:
            break
        for raw_id, fields in batch:
            entry = decode_entry(raw_id, fields, run_id)
            if isinstance(entry.event, ev.Checkpoint):
                base, ckpt_id = from_checkpoint(entry.event), entry.id
                start = f"({entry.id}"
                break
        else:
            cursor = f"({text(batch[-1][0])}"
    state = base if base is not None else RunState()
    for entry in elog.read(run_id, start, end):
        apply(state, _decoded(entry), elog.window)
    return state, ckpt_id


def replay(elog: EventLog, run_id: str, start: str = "-", end: str = "+") -> Replay:
    """The state at ``end`` and the trajectory of the entries from ``start`` to ``end``."""
    state, ckpt = state_at(elog, run_id, end)
    entries = elog.read(run_id, start, end)
    # A removal of context is recorded after the run's end: look for it past the range too.
    whole = entries if (start, end) == ("-", "+") else elog.read(run_id)
    return Replay(run_id, state, entries, ckpt, trajectory(entries, context.removed(whole)))


def _large(ref: BlobRef) -> str:
    what = "model context" if ref.context else "large value"
    return f"{what} of {ref.size} bytes beside the run ({ref.field}, sha256 {ref.sha256})"


def _removed(ref: BlobRef, removal: context.Removed) -> str:
    return (f"model context of {ref.size} bytes REMOVED at {removal.at} ms by "
            f"{removal.setting or 'policy'} (entry {removal.entry}; it was {ref.field}, "
            f"sha256 {ref.sha256})")


def describe(event: ev.Event) -> str:
    match event:
        case ev.RunStarted() if event.parent and event.parent_step:
            return f"started {event.agent} v{event.agent_version} (child of " \
                   f"{event.parent}, its step {event.parent_step})"
        case ev.RunStarted():
            return f"started {event.agent} v{event.agent_version}" + (
                f" (fork of {event.parent} at {event.forked_at})" if event.parent else "") + (
                f", its input: {_large(event.input_blob)}" if event.input_blob else "")
        case ev.StepDecided() if event.tool == keys.CHILD_TOOL:
            return f"intends step {event.step}: start child run " \
                   f"{keys.child_id(event.run, event.step)} ({_short(event.args)})"
        case ev.StepDecided() if event.undoes:
            return f"intends step {event.step}: undoes step {event.undoes} with " \
                   f"{event.tool}({_short(event.args)}) key={event.key}"
        case ev.StepDecided():
            return f"intends step {event.step}: {event.tool}({_short(event.args)}) key={event.key}"
        case ev.ActionDispatched():
            return f"dispatched {event.key}, deadline {event.deadline}"
        case ev.ActionSucceeded() if event.reused:
            return f"step {event.step} reuses the outcome of {event.reused} (the same call " \
                   f"at the same step; nothing sent): {_short(event.result)}"
        case ev.ActionSucceeded() if event.simulated:
            return f"step {event.step} held, simulated (nothing sent): {_short(event.result)}"
        case ev.ActionSucceeded() if event.blob is not None:
            return f"step {event.step} succeeded: {_large(event.blob)}" + _cost(event.cost)
        case ev.ActionSucceeded():
            return f"step {event.step} succeeded: {_short(event.result)}" + _cost(event.cost)
        case ev.ActionFailed():
            return f"step {event.step} failed: {event.error_type} {event.error}"
        case ev.ActionTimedOut():
            return f"step {event.step} timed out: outcome unknown"
        case ev.ActionInterrupted():
            return f"step {event.step} interrupted mid-flight ({event.reason}): outcome unknown"
        case ev.ActionReconciled():
            if event.by == "effect_free":
                return f"step {event.step} has no outcome; effect-free, so sent again"
            return f"step {event.step} reconciled by lookup: {event.resolution}" + (
                f", {_large(event.blob)}" if event.blob is not None else "")
        case ev.CallCanceled():
            return f"step {event.step} call canceled ({event.reason})"
        case ev.CancelRequested():
            return f"cancel requested ({event.scope}): {event.reason}"
        case ev.Canceled():
            return f"canceled after {event.latency_ms} ms: {event.reason}"
        case ev.WaitEntered():
            return f"waits ({event.kind}) until {event.until}: {event.reason}"
        case ev.WaitResolved():
            return f"wait ({event.kind}) resolved by {event.by or '?'}"
        case ev.WaitExpiry():
            return f"wait ({event.kind}) expired -> {event.outcome}"
        case ev.ApprovalRequested():
            return f"approval {event.request} requested for step {event.step} (role {event.role})"
        case ev.ApprovalDecided():
            return f"approval {event.request}: {event.decision} by {event.approver}"
        case ev.LeaseAcquired():
            owns = f"; region {event.region} owns the run (epoch {event.region_epoch})" \
                if event.region else ""
            return f"lease epoch {event.epoch} taken by {event.owner}{owns}"
        case ev.RetiredLeaseLost():
            return f"lease epoch {event.epoch} lost by {event.owner}"
        case ev.Checkpoint():
            return f"checkpoint (state {event.state.state}, step {event.state.step})"
        case ev.Completed():
            return f"completed: {_short(event.result)}"
        case ev.Failed():
            return f"failed: {event.error}"
        case ev.Expired():
            return f"expired: {event.reason}"
        case ev.Quarantined():
            return f"quarantined: {event.reason}"
        case ev.Released():
            return f"released from quarantine by {event.by}"
        case ev.ResumeValidated():
            return _resume_validated(event)
        case ev.EvidenceChecked() if not event.failed:
            return f"evidence checked on resume: all {event.checked} still hold"
        case ev.EvidenceChecked():
            failed = ", ".join(f"{r.source}/{r.id} (step {r.step}): {r.why}"
                               for r in event.failed)
            return f"evidence checked on resume: {len(event.failed)} of {event.checked} " \
                   f"no longer hold, {failed} -> {event.outcome}"
        case ev.RevalidationFailed():
            return f"a fact no longer holds on resume: {event.reason} -> {event.then}"
        case ev.AgentUpgraded():
            return f"goes on under {event.to_version} (was {event.from_version})"
        case ev.ContextTrimmed():
            return (f"model context removed: {len(event.refs)} values, {event.bytes} bytes "
                    f"({event.setting or 'policy'}; the run last wrote at {event.ended} ms); "
                    "the outcomes keep their digests")
    return type(event).__name__


#: What each outcome of a resume's configuration check did, for people.
RESUME_OUTCOMES = {
    "continued": "continued under it", "replanned": "the agent replans",
    "reapprove": "waits for an approval of the change", "approved": "the change was approved",
    "expired": "the run expires"}


def _resume_validated(event: ev.ResumeValidated) -> str:
    if event.outcome == "pinned":
        return "configuration pinned: " + (", ".join(sorted(event.config)) or "nothing")
    changed = ", ".join(f"{field} {_short(was, 24)} -> {_short(now, 24)}"
                        for field, (was, now) in sorted(event.changes.items()))
    then = RESUME_OUTCOMES.get(event.outcome, event.outcome)
    asked = f" (request {event.request})" if event.request else ""
    return f"configuration changed on resume ({changed or 'nothing named'}): {then}{asked}"


def _cost(cost: Cost | None) -> str:
    if cost is None:
        return ""
    if not cost.usd:
        return f"; cost unknown ({cost.unknown})"
    return f"; cost ${cost.usd} ({cost.model}, {cost.provider}, {cost.prices})"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def trajectory(entries: list[Entry], gone: dict[str, context.Removed] | None = None
               ) -> list[dict[str, Any]]:
    """A row per entry. ``gone``: the context values removed (``durable.log.context``),
    from the whole log; by default, those the ``context_trimmed`` of ``entries`` name."""
    gone = context.removed(entries) if gone is None else gone
    rows: list[dict[str, Any]] = []
    for entry in entries:
        e = entry.event
        if e is None:
            rows.append({"id": entry.id, "seq": None, "type": "undecodable", "what": entry.error})
            continue
        row = {"id": entry.id, "seq": e.seq, "type": e.__struct_config__.tag,
               "ts": e.ts, "actor": e.actor, "what": describe(e)}
        ref = blobs.ref_of(e)
        if ref is not None and ref.field in gone:
            removal = gone[ref.field]
            row["what"] = f"step {getattr(e, 'step', '?')} {e.__struct_config__.tag}: " \
                          f"{_removed(ref, removal)}" if ref.field != blobs.INPUT else \
                          f"started {getattr(e, 'agent', '?')}, its input: " \
                          f"{_removed(ref, removal)}"
            row["removed"] = {"at": removal.at, "setting": removal.setting,
                              "entry": removal.entry}
        rows.append(row)
    return rows


def summary(state: RunState) -> dict[str, Any]:
    """Intended, happened, stopped: the three answers, from a folded state."""
    act = state.last
    out: dict[str, Any] = {
        "state": state.state,
        "version": state.version,
        "steps": state.step,
        "intended": f"{act.tool}({_short(act.args)}) key={act.key}" if act else None,
        "happened": (f"{act.status}" + (f": {_short(act.result)}" if act.result is not None
                                        else f" (model context removed at {act.trimmed} ms)"
                                        if act.trimmed else "")) if act else None,
        "stopped": state.reason or state.error or (state.wait.reason if state.wait else None),
    }
    return out


def redecide(run_id: str, agent: Any, before: RunState, step: int, tool: str,
             args: Any, group: int = 0) -> Call:
    """Re-decide from ``before`` (the state before ``step``'s intent); the agent must decide
    the call the log recorded, else ``NondeterminismError``. Returns the call decided again
    (its arguments are the live ones when the log kept only their digest)."""
    return matching_call(run_id, agent.decide(before), step, tool, args, group)


def matching_call(run_id: str, decision: Any, step: int, tool: str, args: Any,
                  group: int = 0) -> Call:
    """The call of ``decision`` for ``step`` (in a parallel decision: the member at its
    position, ``group`` being the group's first step), checked against the recorded one."""
    if isinstance(decision, list):
        decision = Parallel(list(decision))
    if isinstance(decision, Parallel):
        first = decision.steps[0] if decision.steps else (group or step)
        if 0 <= step - first < len(decision.calls):
            decision = decision.calls[step - first]
    by_digest = is_placeholder(args) or (isinstance(decision, Call)
                                         and given_digest(decision.args) is not None)
    recorded = call_signature(tool, args, digest=by_digest)
    now = (call_signature(decision.tool, decision.args, digest=by_digest)
           if isinstance(decision, Call) else type(decision).__name__)
    if now != recorded or not isinstance(decision, Call):
        detail = call_difference(tool, args, decision.tool, decision.args) \
            if isinstance(decision, Call) else ""
        raise NondeterminismError(run_id, step, recorded, now, detail)
    return decision


def check_determinism(elog: EventLog, run_id: str, agent: Any) -> int:
    """Re-decide every recorded step from the state before it; raise on a difference.

    Returns the number of intents re-observed. A worker checks the open intent the same way
    (``redecide``) when it re-drives a run; this applies it to the whole log (audits,
    fixtures, upgrades).
    """
    state = RunState()
    checked = 0
    for entry in elog.read(run_id):
        event = _decoded(entry)
        # A parallel group is re-decided once, from the state before its first step.
        if isinstance(event, ev.StepDecided) and event.group in (0, event.step):
            redecide(run_id, agent, state, event.step, event.tool, event.args,
                           event.group)
            checked += 1
        apply(state, event, elog.window)
        if elog.open_sealed and blobs.ref_of(event) is not None:  # the agent reads values
            elog.resolve(run_id, state.actions.values(), [state])
    return checked


def import_log(elog: EventLog, run_id: str, events: list[dict[str, Any]]) -> None:
    """Write recorded events (plain data, e.g. a fixture) as a new run's log."""
    handle = RunHandle(run_id, RunState(), actor="import")
    specs = []
    for data in events:
        if data.get("type") == "checkpoint":
            continue  # derived: the commit writes its own
        event = ev.from_builtins({**data, "run": run_id})
        fields = {k: v for k, v in ev.to_builtins(event).items()
                  if k not in ("v", "run", "seq", "ts", "actor", "attempt", "type")}
        specs.append(Spec(type(event), fields))
    first = specs[0].fields
    elog.commit(handle, specs, extra={"agent": str(first.get("agent", ""))})


_ENTRY_ID = re.compile(r"^[0-9]{1,20}(-[0-9]{1,20})?$")


def check_entry_id(entry_id: str, *special: str) -> None:
    """Refuse (``UsageError``) what is not a log entry id, unless one of ``special``."""
    if entry_id not in special and not _ENTRY_ID.match(entry_id):
        raise UsageError(f"{entry_id!r} is not a log entry id (like 1700000000000-0)")
