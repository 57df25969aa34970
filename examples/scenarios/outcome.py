"""What a scenario found: its checks (expected vs actual) and the evidence behind them.

Evidence is read from the run's log, the ledger and the world, never from a process's
memory: the timeline (``replay.trajectory``), the effects (one row per key: what the log
says, what the ledger says, how many times the world applied it), the recovery trajectory
(the log from the point where recovery began, with ``replay.summary`` of the end state).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from durable.audit.replay import replay, summary, trajectory
from durable.audit.verify import verify
from durable.log import events as ev
from durable.log.state import RunState
from durable.log.store import Entry
from examples.scenarios.stack import Scene
from examples.world import Applications

E = TypeVar("E", bound=ev.Event)

#: Which system of the world each of the examples' tools touches.
SYSTEM_OF = {"fetch": "source", "transform": "-", "write": "db", "notify": "api",
             "publish": "api", "chat": "model"}


@dataclass
class Check:
    name: str
    expected: Any
    actual: Any

    @property
    def ok(self) -> bool:
        return bool(self.expected == self.actual)


@dataclass
class Outcome:
    scenario: str
    title: str
    #: The crash window or the fault this scenario puts the run through.
    window: str
    run_id: str = ""
    checks: list[Check] = field(default_factory=list)
    state: str = ""
    final: dict[str, Any] = field(default_factory=dict)
    applications: dict[str, dict[str, int]] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    effects: list[dict[str, Any]] = field(default_factory=list)
    recovery: list[dict[str, Any]] = field(default_factory=list)
    #: Approval requests (from the log) and the decisions tried on them (with what each
    #: wrote), for the scenarios that wait for an approver.
    approvals: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0
    started: float = field(default_factory=time.monotonic)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.ok for c in self.checks)

    def expect(self, name: str, expected: Any, actual: Any) -> bool:
        check = Check(name, expected, actual)
        self.checks.append(check)
        return check.ok

    def failures(self) -> list[str]:
        out = [f"{c.name}: expected {c.expected!r}, got {c.actual!r}"
               for c in self.checks if not c.ok]
        if self.error:
            out.append(f"error: {self.error}")
        if not self.checks and not self.error:
            out.append("no checks ran")
        return out

    def assert_ok(self) -> None:
        if not self.ok:
            raise AssertionError(f"scenario {self.scenario} (run {self.run_id}) failed:\n  "
                                 + "\n  ".join(self.failures()))

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k not in ("started", "checks")}
        data["ok"] = self.ok
        data["checks"] = [{"name": c.name, "expected": c.expected, "actual": c.actual,
                           "ok": c.ok} for c in self.checks]
        return dict(msgspec.to_builtins(data))


def of_type(entries: list[Entry], cls: type[E], **match: Any) -> list[E]:
    """The events of one type whose fields equal ``match``."""
    return [e.event for e in entries if isinstance(e.event, cls)
            and all(getattr(e.event, k) == v for k, v in match.items())]


def first_after(entries: list[Entry], ts_ms: int) -> tuple[str, ev.Event] | None:
    """The id and event of the first entry written after ``ts_ms``."""
    for entry in entries:
        if entry.event is not None and entry.event.ts > ts_ms:
            return entry.id, entry.event
    return None


def recovery_rows(scene: Scene, run_id: str, start: str) -> list[dict[str, Any]]:
    """The trajectory of the run from ``start`` (an entry id) to its end."""
    return replay(scene.client.log, run_id, start=start).rows


def effects(entries: list[Entry], ledger: dict[str, str],
            apps: Applications) -> list[dict[str, Any]]:
    """One row per key: the log's story of it, the ledger's, and the world's count."""
    rows: dict[str, dict[str, Any]] = {}
    for entry in entries:
        e = entry.event
        if isinstance(e, ev.StepDecided):
            system = SYSTEM_OF.get(e.tool, "?")
            world = {"api": apps.api, "db": apps.db, "source": apps.reads,
                     "model": apps.model}.get(system, {})
            rows[e.key] = {"step": e.step, "tool": e.tool, "key": e.key, "system": system,
                           "dispatches": 0, "log": [], "ledger": ledger.get(e.key, "-"),
                           "applied": world.get(e.key, 0) if system != "-" else "-"}
        elif isinstance(e, ev.ActionDispatched) and e.key in rows:
            rows[e.key]["dispatches"] += 1
        elif isinstance(e, ev.ActionReconciled) and e.key in rows:
            rows[e.key]["log"].append(f"reconciled:{e.resolution}")
        elif e is not None and hasattr(e, "key") and e.key in rows and not isinstance(
                e, ev.ActionDispatched | ev.StepDecided):
            rows[e.key]["log"].append(str(e.__struct_config__.tag).removeprefix("action_"))
    for row in rows.values():
        row["log"] = " -> ".join(row["log"]) or "(no outcome)"
    return list(rows.values())


def collect(out: Outcome, scene: Scene, run_id: str,
            state: RunState) -> tuple[list[Entry], Applications]:
    """Gather the evidence of a finished run into ``out``; returns the log and the counts.

    The recovery trajectory is the scenario's to set (it knows where recovery began)."""
    out.run_id, out.state = run_id, state.state
    out.final = msgspec.to_builtins({"state": state.state, "step": state.step,
                                     "version": state.version, "result": state.result,
                                     "error": state.error, "reason": state.reason})
    entries = scene.client.events(run_id)
    apps = scene.world.applications(run_id)
    out.applications = {"api": apps.api, "db": apps.db, "source reads": apps.reads}
    if apps.model:
        out.applications["model requests"] = apps.model
    out.timeline = trajectory(entries)
    raw = scene.client.redis.hgetall(scene.client.log.keys.ledger(run_id))
    ledger = {k.decode(): v.decode() for k, v in raw.items()}
    out.effects = effects(entries, ledger, apps)
    out.summary = summary(state)
    return entries, apps


def recover(out: Outcome, scene: Scene, run_id: str, killed_at: int,
            timeout: float = 30) -> tuple[RunState, list[Entry], Applications]:
    """After a worker was killed: a fresh worker and the reconciler bring the run back.
    Records how (``recovery by``), how soon after the kill the log moved again, and the
    trajectory from there; returns the final state, the log and the world's applications."""
    scene.worker()
    rec = scene.recovery()
    out.figures["recovery by"] = rec.mode
    final = scene.wait(run_id, timeout)
    entries, apps = collect(out, scene, run_id, final)
    resumed = first_after(entries, killed_at)
    if resumed is not None:
        out.recovery = recovery_rows(scene, run_id, resumed[0])
        out.figures["recovered in ms"] = resumed[1].ts - killed_at
    out.figures["completed in ms"] = final.updated - killed_at
    return final, entries, apps


def expect_common(out: Outcome, scene: Scene, run_id: str, apps: Applications, *, state: str,
                  final: RunState, api: dict[str, int], db: dict[str, int]) -> None:
    """The checks every scenario makes: end state, applications per key, ``verify``."""
    out.expect("final state", state, final.state)
    out.expect("notification API applications per key", api, apps.api)
    out.expect("database applications per key", db, apps.db)
    out.expect("duplicates in the world", {}, apps.duplicates)
    report = verify(scene.client.log, run_id)
    out.expect("verify (log invariants)", "ok", "ok" if report.ok else
               {k: v for k, v in report.checks.items() if v != "ok"})
