"""A run's log as the console shows it: the three columns (what it intended, what happened,
where it stopped), one row per step (key, attempts, deadline, outcome, ledger entry), the
checkpoints, and sensitive fields masked. Pure functions of the log's entries."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from durable.audit.replay import describe
from durable.log import events as ev
from durable.log.store import Entry

#: Which column an event goes in. Intent: what the run (or an operator) set out to do;
#: happened: what was observed; stopped: where the run stopped, for now or for good.
INTENDED = (ev.RunStarted, ev.StepDecided, ev.ApprovalRequested, ev.CancelRequested,
            ev.AgentUpgraded)
STOPPED = (ev.WaitEntered, ev.WaitExpiry, ev.Canceled, ev.Completed, ev.Failed, ev.Expired,
           ev.Quarantined)

#: Argument names whose values are never shown (matched anywhere in the name, any case).
SENSITIVE = re.compile(r"pass|secret|token|api.?key|private|credential|card|cvv|iban|ssn|"
                       r"authorization|cookie", re.IGNORECASE)
MASK = "••••••"


def masked(value: Any) -> Any:
    """``value`` with the values of sensitive-looking keys replaced, at any depth."""
    if isinstance(value, dict):
        return {k: MASK if isinstance(k, str) and SENSITIVE.search(k) else masked(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


@dataclass(frozen=True)
class Row:
    id: str
    seq: int | None
    type: str
    actor: str
    ts: int
    column: str  # "intended" | "happened" | "stopped"
    what: str


def column(event: ev.Event | None) -> str:
    if isinstance(event, INTENDED):
        return "intended"
    if isinstance(event, STOPPED):
        return "stopped"
    return "happened"


def rows(entries: list[Entry]) -> list[Row]:
    out = []
    for entry in entries:
        e = entry.event
        if e is None:
            out.append(Row(entry.id, None, "undecodable", "", 0, "stopped", entry.error or ""))
            continue
        what = describe(e)
        if isinstance(e, ev.StepDecided):
            what = f"intends step {e.step}: {e.tool}({_short(masked(e.args))}) key={e.key}"
        out.append(Row(entry.id, e.seq, str(e.__struct_config__.tag), e.actor, e.ts, column(e),
                       what))
    return out


#: Events that record a step's outcome (known or unknown): they end its duration.
OUTCOMES = (ev.ActionSucceeded, ev.ActionFailed, ev.ActionTimedOut, ev.ActionInterrupted,
            ev.ActionReconciled, ev.CallCanceled)


@dataclass
class Step:
    step: int
    tool: str
    key: str
    args: Any = None
    attempts: int = 0
    deadline: int = 0
    outcome: str = "decided"
    detail: str = ""
    ledger: str = ""
    approval: str = ""
    #: Wall-clock times (ms since the epoch, 0: not yet): decided, first sent, outcome
    #: recorded (cleared by a new dispatch after a retryable failure).
    decided_at: int = 0
    sent_at: int = 0
    ended_at: int = 0

    @property
    def duration_ms(self) -> int | None:
        """From the first dispatch to the outcome (retries included); None while open."""
        if not self.sent_at or not self.ended_at:
            return None
        return max(self.ended_at - self.sent_at, 0)


def steps(entries: list[Entry], ledger: dict[str, str]) -> list[Step]:
    """One row per step in the whole log (the folded state keeps only a window)."""
    by_step: dict[int, Step] = {}
    requests: dict[str, Step] = {}
    for entry in entries:
        e = entry.event
        if isinstance(e, ev.StepDecided):
            by_step[e.step] = Step(e.step, e.tool, e.key, masked(e.args), decided_at=e.ts)
            continue
        if isinstance(e, ev.ApprovalDecided) and e.request in requests:
            requests[e.request].approval = f"{e.request}: {e.decision} by {e.approver}"
            continue
        step = by_step.get(getattr(e, "step", -1))
        if step is None:
            continue
        match e:
            case ev.ActionDispatched():
                step.attempts += 1
                step.deadline = e.deadline
                step.outcome = "dispatched"
                step.sent_at, step.ended_at = step.sent_at or e.ts, 0
            case ev.ActionSucceeded():
                step.outcome, step.detail = "succeeded", _short(e.result)
            case ev.ActionFailed():
                step.outcome = "retrying" if e.retry_at else "failed"
                step.detail = f"{e.error_type} {e.error}".strip()
            case ev.ActionTimedOut():
                step.outcome, step.detail = "unknown", "timed out"
            case ev.ActionInterrupted():
                step.outcome, step.detail = "unknown", f"interrupted: {e.reason}"
            case ev.ActionReconciled():
                step.outcome = {"applied": "succeeded", "not_applied": "not applied"}.get(
                    e.resolution, "unknown")
                step.detail = f"reconciled: {e.resolution}"
            case ev.CallCanceled():
                step.outcome, step.detail = "canceled", e.reason
            case ev.ApprovalRequested():
                step.approval = f"{e.request}: requested"
                requests[e.request] = step
        if isinstance(e, OUTCOMES):
            step.ended_at = e.ts
    for step in by_step.values():
        step.ledger = ledger.get(step.key, "")
    return [by_step[k] for k in sorted(by_step)]


@dataclass(frozen=True)
class Checkpoint:
    id: str
    seq: int
    state: str
    step: int


def checkpoints(entries: list[Entry]) -> list[Checkpoint]:
    return [Checkpoint(e.id, e.event.seq, e.event.state.state, e.event.state.step)
            for e in entries if isinstance(e.event, ev.Checkpoint)]


@dataclass
class Timeline:
    rows: list[Row]
    steps: list[Step]
    checkpoints: list[Checkpoint]
    #: Every entry id, in order (the slider's stops).
    ids: list[str] = field(default_factory=list)
    #: Rows left out of ``rows`` at the start (only the last ``limit`` are shown).
    hidden: int = 0
    #: Steps left out of ``steps`` at the start (only the last ``step_limit``).
    hidden_steps: int = 0
    #: When the run started (its first entry's time, ms; 0 if unknown): rows show their
    #: time since it.
    started: int = 0


def timeline(entries: list[Entry], ledger: dict[str, str], limit: int = 500,
             step_limit: int = 200) -> Timeline:
    all_rows = rows(entries)
    all_steps = steps(entries, ledger)
    return Timeline(all_rows[-limit:], all_steps[-step_limit:], checkpoints(entries),
                    [e.id for e in entries], max(len(all_rows) - limit, 0),
                    max(len(all_steps) - step_limit, 0),
                    next((r.ts for r in all_rows if r.ts), 0))


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
