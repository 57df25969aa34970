"""What must still hold when a run resumes after a wait: the facts an agent checks itself
(``Agent.revalidate`` returning ``Stale``) and the evidence references its steps recorded.

A tool records what its result rests on while it runs::

    def run(self, args, ctx):
        row = crm.get(args["id"])
        ctx.evidence("crm", args["id"], row.version)   # source, id, version
        return row.as_dict()

The references go into the step's outcome event (``action_succeeded.evidence``; an outcome
without any is as long as before) and into the fold (``state.evidence``: the latest per
source and id, each naming its step). A checker is registered per source::

    @register
    class CrmChecker(EvidenceChecker):
        source = "crm"

        def check(self, ref):
            row = crm.get(ref.id)
            if row is None:
                return Current.gone()
            return Current.at(row.version)      # or Current.denied()

and an agent names the sources its tools record (``Agent.evidence_sources``: a source with
no registered checker is refused when the agent is registered) and what a resume does when
a reference no longer holds (``Agent.on_evidence_change``, ``POLICIES``):

- ``refresh`` (the default): the agent reads again: it sees ``state.refresh`` (as after a
  ``Stale`` fact) and ``state.evidence_failed``, until its next intent;
- ``replan``: it sees ``state.evidence_failed`` (each reference with ``why``), nothing else;
- ``expire``: the run ends ``expired``, its reason naming the references.

Every resume after a wait checks every reference (the checks of one resume run at once,
each bounded by its checker's ``timeout_s``) and records one ``evidence_checked`` event:
``held``, or the policy applied with the references that failed. A reference fails when
its record is gone, access to it is denied, its version changed, its checker raised or
timed out, or no checker is registered for its source: a checker's failure is the run's
recorded failure, never the worker's.

Nothing here knows a run's log: ``durable.agents`` registers checkers and the worker's gates
(``workers.gates``) call ``check_all`` with plain data.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from durable.errors import UsageError
from durable.eventloop import EVENT_LOOP
from durable.log.fold import evidence_reason
from durable.log.state import EvidenceRef

Policy = Literal["refresh", "replan", "expire"]
#: What ``on_evidence_change`` may say.
POLICIES: tuple[Policy, ...] = ("refresh", "replan", "expire")

__all__ = ["POLICIES", "Current", "EvidenceChecker", "EvidenceRef", "Policy", "Stale",
           "check_all", "checked_sources", "describe"]


@dataclass(frozen=True)
class Stale:
    """Returned by ``Agent.revalidate`` when a fact no longer holds after a wait.

    ``then``: ``refresh`` (the agent is told through ``state.refresh`` and re-gathers),
    ``reapprove`` (the open action must be approved again) or ``expire``.
    """

    reason: str
    then: Literal["refresh", "reapprove", "expire"] = "refresh"


@dataclass(frozen=True)
class Current:
    """What a source says of a reference now: whether the record exists, whether this
    deployment may still read it, and its version ("" when the source has none)."""

    exists: bool = True
    access: bool = True
    version: str = ""

    @classmethod
    def at(cls, version: Any) -> Current:
        return cls(version=str(version))

    @classmethod
    def gone(cls) -> Current:
        return cls(exists=False)

    @classmethod
    def denied(cls) -> Current:
        return cls(access=False)


class EvidenceChecker:
    """Subclass, set ``source`` and implement ``check``; register with ``@register``."""

    source: ClassVar[str]
    #: Longest one check may take; past it the reference counts as failed ("timed out").
    timeout_s: ClassVar[float] = 5.0

    def check(self, ref: EvidenceRef) -> Current | Awaitable[Current]:
        """What the source says of ``ref`` now; a plain method or ``async def``. An
        exception is recorded as the reference's failure."""
        raise NotImplementedError


def checked_sources(agent: str, sources: Iterable[str], policy: str,
                    checkers: Mapping[str, EvidenceChecker]) -> None:
    """Refuse an agent whose ``on_evidence_change`` is no policy, or that names a source
    no registered checker answers for (``UsageError`` naming it)."""
    if policy not in POLICIES:
        raise UsageError(f"agent {agent!r}: on_evidence_change is {policy!r}; expected one "
                         f"of {', '.join(POLICIES)} (the agent was not registered)")
    unknown = [s for s in sources if s not in checkers]
    if unknown:
        raise UsageError(
            f"agent {agent!r}: evidence_sources names {', '.join(map(repr, unknown))}, for "
            f"which no EvidenceChecker is registered (registered: "
            f"{', '.join(sorted(checkers)) or 'none'}); register the checker before the "
            "agent (the agent was not registered)")


def why_failed(ref: EvidenceRef, now: Current) -> str:
    """Why ``ref`` does not hold given what its source says ``now`` ("" when it does)."""
    if not now.exists:
        return "gone"
    if not now.access:
        return "access denied"
    if now.version != ref.version:
        return f"version {ref.version or '(none)'} -> {now.version or '(none)'}"
    return ""


class _Check(threading.Thread):
    """One reference's check on a thread of its own: a checker that hangs past its
    timeout is left behind (daemon), and its reference counts as failed."""

    def __init__(self, checker: EvidenceChecker, ref: EvidenceRef) -> None:
        super().__init__(name=f"evidence:{ref.source}", daemon=True)
        self.checker, self.ref = checker, ref
        self.why = "timed out"

    def run(self) -> None:
        try:
            now = self.checker.check(self.ref)
            if inspect.isawaitable(now):
                now = EVENT_LOOP.wait(_bounded(now, self.checker.timeout_s))
            if not isinstance(now, Current):
                raise TypeError(f"check() returned {type(now).__name__}, not Current")
            self.why = why_failed(self.ref, now)
        except Exception as exc:  # the checker's bug: the reference fails, not the worker
            self.why = f"checker raised {type(exc).__name__}: {exc}"[:300]


async def _bounded(awaitable: Awaitable[Any], timeout: float) -> Any:
    return await asyncio.wait_for(awaitable, timeout)


def check_all(refs: Sequence[EvidenceRef],
              checkers: Mapping[str, EvidenceChecker]) -> list[EvidenceRef]:
    """Check every reference with its source's checker, all at once; the ones that do not
    hold, each with ``why``, in the order of ``refs``."""
    checks: list[tuple[EvidenceRef, float, _Check | None]] = []
    for ref in refs:
        checker = checkers.get(ref.source)
        check = _Check(checker, ref) if checker is not None else None
        if check is not None:
            check.start()
        until = time.monotonic() + (checker.timeout_s if checker is not None else 0.0)
        checks.append((ref, until, check))
    failed = []
    for ref, until, check in checks:
        if check is None:
            why = f"no checker registered for source {ref.source!r}"
        else:
            check.join(max(0.0, until - time.monotonic()))
            why = "timed out" if check.is_alive() else check.why
        if why:
            failed.append(_failed(ref, why))
    return failed


def _failed(ref: EvidenceRef, why: str) -> EvidenceRef:
    return EvidenceRef(source=ref.source, id=ref.id, version=ref.version, step=ref.step,
                       why=why)


def describe(failed: Sequence[EvidenceRef]) -> str:
    """``evidence no longer holds: crm/42 (gone), ...``: a reason naming the references."""
    return evidence_reason(list(failed))
