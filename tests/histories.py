"""Valid event histories, generated (hypothesis), as workers, the reconciler and operators
write them: every event type of ``durable.log.events`` appears in some history, in the
order the code that writes it would put it (``tests/test_events.py`` checks that each one
can be generated).

A history is a run's start, then chapters until one ends the run: a step (its approval
gate, its dispatch and outcome), a parallel group, a wait for input, a version upgrade, a
new lease, a quarantine that an operator releases, a cancel; a checkpoint may follow any
chapter. A step's result may be model context kept beside the run, which an ended run's
``context_trimmed`` removes. Sequence numbers and times are the run's version and grow by
one per event.
"""

from __future__ import annotations

from typing import Any, TypedDict

import msgspec
from hypothesis import strategies as st

from durable.log import events as ev
from durable.log.fold import fold
from durable.log.state import BlobRef, EvidenceRef

#: Window of settled actions the generated checkpoints fold with (small, so eviction runs).
WINDOW = 4

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=8,
)


class Common(TypedDict):
    v: int
    run: str
    seq: int
    ts: int
    actor: str


def common(seq: int, run: str = "r1") -> Common:
    """The fields every entry carries, for the run's ``seq``-th event."""
    return {"v": ev.SCHEMA_VERSION, "run": run, "seq": seq, "ts": 1000 + seq, "actor": "w"}


class _Writer:
    """Appends events with the next ``seq``; ``ended`` once a terminal event is written."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw
        self.out: list[ev.Event] = []
        self.step = 0
        self.version = 1
        self.epoch = 0
        self.config = 0
        self.ended = False
        #: Fields of the context values kept beside the run (``durable.log.context``).
        self.context: list[str] = []

    def add(self, cls: type[ev.Event], **fields: Any) -> None:
        self.out.append(cls(**common(len(self.out) + 1), **fields))
        if isinstance(self.out[-1], ev.TERMINAL_EVENTS):
            self.ended = True

    def value(self) -> Any:
        return self.draw(json_values)

    def pick(self, *choices: str) -> str:
        return self.draw(st.sampled_from(choices))

    # Chapters --------------------------------------------------------------------------

    def step_chapter(self) -> None:
        self.step += 1
        step, key = self.step, f"r1:{self.step}"
        self.add(ev.StepDecided, step=step, tool="t", args={"x": self.value()}, key=key,
                 model=self.draw(st.booleans()))
        if not self.approval_gate(step, key):
            return
        self.add(ev.ActionDispatched, step=step, key=key, deadline=5000)
        self.outcome(step, key)

    def approval_gate(self, step: int, key: str) -> bool:
        """An approval asked for before the call is sent; whether it may be sent."""
        gate = self.pick("none", "none", "none", "approve", "reject", "expire", "reapprove")
        if gate == "none":
            return True
        request = f"{key}:a1"
        self.ask(request, step)
        if gate == "expire":
            outcome = self.pick("expired", "continue")
            self.add(ev.WaitExpiry, kind="approval", request=request, outcome=outcome)
            if outcome == "expired":
                self.ended = True
                return False
            request = f"{key}:a2"  # the gate asks again
            self.ask(request, step)
        if gate == "reject":
            self.decide(request, "reject")
            return False
        self.decide(request, "approve")
        if gate == "reapprove":  # after the wait, a declared fact no longer holds
            self.add(ev.RevalidationFailed, reason="balance changed", then="reapprove")
            request = f"{key}:a2"
            self.ask(request, step)
            self.decide(request, "approve")
        return True

    def ask(self, request: str, step: int, kind: str = "action") -> None:
        self.add(ev.ApprovalRequested, request=request, step=step, digest=f"d:{request}",
                 role="ops", evidence=["doc:1"], expires=90_000, kind=kind)
        self.add(ev.WaitEntered, kind="approval", reason="requires approval", until=90_000,
                 request=request, data={"tool": "t"})

    def decide(self, request: str, decision: str) -> None:
        self.add(ev.ApprovalDecided, request=request, decision=decision, approver="ann",
                 key="fp", sig="sig")
        self.add(ev.WaitResolved, kind="approval", request=request, response=decision,
                 by="ann")

    def outcome(self, step: int, key: str) -> None:
        kind = self.pick("ok", "ok", "fail", "retry", "timeout", "interrupt", "cancel_call",
                         "settle")
        if kind == "ok" and self.draw(st.integers(0, 3)) == 0:  # model context, by reference
            ref = BlobRef(field=f"{step}.{len(self.out) + 1}", sha256="ab" * 32, size=40,
                          context=True)
            self.context.append(ref.field)
            self.add(ev.ActionSucceeded, step=step, key=key, blob=ref, tokens=7)
        elif kind == "ok":  # perhaps resting on a record (``durable.agents.evidence``)
            refs = [EvidenceRef(source="crm", id=str(step % 3), version=str(step))] \
                if self.draw(st.booleans()) else []
            self.add(ev.ActionSucceeded, step=step, key=key, result=self.value(),
                     evidence=refs)
        elif kind == "fail":
            self.add(ev.ActionFailed, step=step, key=key, error="boom", error_type="E")
        elif kind == "retry":  # a retryable error: the run waits for its timer, same key
            self.add(ev.ActionFailed, step=step, key=key, error="busy", error_type="E",
                     retryable=True, retry_at=7000)
            self.add(ev.WaitEntered, kind="retry", until=7000, reason="E: busy", request=key)
            self.add(ev.WaitResolved, kind="retry", request=key, by="timer")
            self.evidence_checked(may_end=False)
            self.add(ev.ActionDispatched, step=step, key=key, deadline=9000)
            self.add(ev.ActionSucceeded, step=step, key=key, result=self.value())
        elif kind == "cancel_call":
            if self.draw(st.booleans()):
                self.add(ev.CancelRequested, reason="skip it", scope="call", requested_ts=1,
                         by="op")
            self.add(ev.CallCanceled, step=step, key=key, reason="op")
        elif kind == "settle":  # lookup cannot tell: an operator settles it, signed
            self.add(ev.ActionTimedOut, step=step, key=key)
            self.add(ev.ActionReconciled, step=step, key=key, resolution="unknown")
            self.add(ev.ActionReconciled, step=step, key=key, resolution="applied",
                     result=self.value(), by="operator", operator="ann", operator_key="fp",
                     sig="sig", evidence="ticket 7", result_digest="sha", attempt=1)
        else:
            cls = ev.ActionTimedOut if kind == "timeout" else ev.ActionInterrupted
            self.add(cls, step=step, key=key)
            resolution = self.pick("applied", "not_applied")
            self.add(ev.ActionReconciled, step=step, key=key, resolution=resolution, result=1)
            if resolution == "not_applied":
                self.add(ev.ActionDispatched, step=step, key=key, deadline=9000)
                self.add(ev.ActionSucceeded, step=step, key=key, result=2)

    def group_chapter(self) -> None:
        """Two or three calls decided together, dispatched together, settled in any order."""
        first = self.step + 1
        steps = list(range(first, first + self.draw(st.integers(2, 3))))
        self.step = steps[-1]
        for step in steps:
            self.add(ev.StepDecided, step=step, tool="t", args={"i": step}, key=f"r1:{step}",
                     group=first)
        for step in steps:
            self.add(ev.ActionDispatched, step=step, key=f"r1:{step}", deadline=5000)
        for step in self.draw(st.permutations(steps)):
            self.add(ev.ActionSucceeded, step=step, key=f"r1:{step}", result=step)

    def wait_chapter(self) -> None:
        """A wait for input: answered (then perhaps a failed revalidation) or expired."""
        self.add(ev.WaitEntered, kind="input", until=10_000, request="q", values=[["now", 5]])
        end = self.pick("answered", "answered", "expired", "continue")
        if end == "answered":
            self.add(ev.WaitResolved, kind="input", request="q", response=self.value(),
                     by="op")
            then = self.pick("none", "none", "refresh", "expire")
            if then != "none":
                self.add(ev.RevalidationFailed, reason="stale facts", then=then)
                self.ended = then == "expire"
            if not self.ended:
                self.evidence_checked()
        else:
            self.add(ev.WaitExpiry, kind="input", request="q", outcome=end)
            self.ended = end == "expired"

    def evidence_checked(self, may_end: bool = True) -> None:
        """On resume, the references recorded so far checked: all held, or the first
        failed and handled by one of the policies (``expired`` when ``may_end``)."""
        recorded = fold(self.out, window=WINDOW).evidence
        if not recorded:
            return
        outcome = self.pick("held", "refresh", "replan", *(("expired",) if may_end else ()))
        failed = [] if outcome == "held" else [msgspec.structs.replace(recorded[0],
                                                                       why="gone")]
        self.add(ev.EvidenceChecked, outcome=outcome, checked=len(recorded), failed=failed)
        if outcome == "expired":
            self.add(ev.Expired, reason="evidence no longer holds: crm/0 (gone)")
            self.ended = True

    def upgrade_chapter(self) -> None:
        """The run resumes under a new agent version: allowed at once, or approved."""
        old, new = str(self.version), str(self.version + 1)
        self.version += 1
        if self.draw(st.booleans()):
            request = f"r1:v{new}"
            self.ask(request, self.step, kind="version")
            self.decide(request, "approve")
        self.add(ev.AgentUpgraded, from_version=old, to_version=new, tools=["t", f"t{new}"])

    def config_chapter(self) -> None:
        """A job compares the run's pinned configuration with its worker's: pinned (an old
        log), continued, replanned, approved after a wait, or expired."""
        self.config += 1
        new = {"model": f"m{self.config}", "tools": "t"}
        changes = {"model": [f"m{self.config - 1}", new["model"]]}
        outcome = self.pick("pinned", "continued", "replanned", "approved", "expired")
        if outcome == "pinned":
            self.add(ev.ResumeValidated, outcome="pinned", config=new)
        elif outcome == "expired":
            self.add(ev.ResumeValidated, outcome="expired", changes=changes,
                     actions={"model": "expire"})
            self.add(ev.Expired, reason="configuration changed (model)")
        elif outcome == "approved":
            request = f"r1:c{self.config}"
            seen = {"changes": changes, "actions": {"model": "reapprove"}, "request": request}
            self.add(ev.ResumeValidated, outcome="reapprove", **seen)
            self.ask(request, self.step, kind="configuration")
            self.decide(request, "approve")
            self.add(ev.ResumeValidated, outcome="approved", config=new, **seen)
        else:
            self.add(ev.ResumeValidated, outcome=outcome, config=new, changes=changes,
                     actions={"model": outcome.removesuffix("d").removesuffix("ne")})

    def lease_chapter(self) -> None:
        """Another worker takes the run (a retired ``lease_lost`` in logs of old code)."""
        if self.epoch and self.draw(st.integers(0, 3)) == 0:
            self.add(ev.RetiredLeaseLost, owner=f"w{self.epoch}", epoch=self.epoch)
        self.epoch += 1
        self.add(ev.LeaseAcquired, owner=f"w{self.epoch}", epoch=self.epoch)

    def quarantine_chapter(self) -> None:
        self.add(ev.Quarantined, reason="nondeterminism", traceback="Traceback: ...")
        self.add(ev.Released, by="op")

    def end(self) -> None:
        end = self.pick("none", "completed", "failed", "cancel", "expired", "quarantine")
        if end == "completed":
            self.add(ev.Completed, result=self.value())
        elif end == "failed":
            self.add(ev.Failed, error="no", reason=self.pick("", "budget_exhausted"))
        elif end == "cancel":
            self.add(ev.CancelRequested, reason="stop", scope="run", requested_ts=1, by="op")
            self.add(ev.Canceled, reason="stop", latency_ms=3)
        elif end == "expired":
            self.add(ev.Expired, reason="run deadline passed")
        elif end == "quarantine":
            self.add(ev.Quarantined, reason="why")
        if self.ended and self.context and self.draw(st.booleans()):
            self.add(ev.ContextTrimmed, refs=list(self.context), bytes=40 * len(self.context),
                     setting="DURABLE_CONTEXT_RETENTION=1d", ended=1000 + len(self.out))


@st.composite
def histories(draw: st.DrawFn) -> list[ev.Event]:
    """A valid history of run ``r1`` (see the module doc)."""
    w = _Writer(draw)
    w.add(ev.RunStarted, agent="a", agent_version="1", input=draw(json_values), tools=["t"],
          budgets={"steps": 50}, config=draw(st.sampled_from([{}, {"model": "m0"}])))
    w.lease_chapter()
    chapters = {"step": w.step_chapter, "group": w.group_chapter, "wait": w.wait_chapter,
                "upgrade": w.upgrade_chapter, "lease": w.lease_chapter,
                "quarantine": w.quarantine_chapter, "config": w.config_chapter}
    names = st.sampled_from(["step"] * 6 + ["group", "wait", "upgrade", "lease", "quarantine",
                                            "config"])
    for _ in range(draw(st.integers(0, 12))):
        chapters[draw(names)]()
        if w.ended:
            return w.out
        if draw(st.integers(0, 3)) == 0:
            w.add(ev.Checkpoint, state=fold(w.out, window=WINDOW))
    w.end()
    return w.out


def tags(history: list[ev.Event]) -> set[str]:
    return {str(e.__struct_config__.tag) for e in history}
