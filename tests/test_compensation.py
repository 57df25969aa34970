"""Compensation (``durable.controls.compensation``, ``workers.compensation``): a cancel with
compensation undoes the applied effects newest first, each a step of its own with its own
key, approval, lookup and evidence, and reports what could not be undone. Real worker and
reconciler processes, real SIGKILLs, and the tests' SQLite database as the external system
(no unique key: only the ledger and the lookups stand between a retry and a duplicate)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from pathlib import Path

import msgspec
import pytest

import tests.agents.compensating  # noqa: F401  (registers the tools for the client's plan)
from durable.audit.verify import verify
from durable.client import Client
from durable.errors import Refused
from durable.log import events as ev
from durable.log.store import Spec
from durable.settings import Settings
from tests.agents.basic import applications
from tests.conftest import ApproverFactory, ReconcilerFactory, WorkerFactory, run_durable
from tests.runs import events_of


@pytest.fixture(autouse=True)
def agents(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker processes load the compensating tools and the ``shop`` agent too."""
    monkeypatch.setenv("DURABLE_AGENTS",
                       os.environ["DURABLE_AGENTS"] + ",tests.agents.compensating")


def rows(db: Path) -> list[str]:
    """The keys of the database's rows, in the order they were written."""
    conn = sqlite3.connect(db)
    try:
        return [k for (k,) in conn.execute("SELECT key FROM effects ORDER BY rowid")]
    finally:
        conn.close()


def holding(client: Client, plan: list[str], run_id: str) -> str:
    """Start a ``shop`` run of ``plan`` and wait until it holds, its effects applied."""
    run = client.start("shop", {"plan": plan}, run_id=run_id).run_id
    state = client.wait(run, 30)
    assert state.state == "waiting_input", state
    return run


def undo_steps(client: Client, run: str) -> dict[int, int]:
    """Compensation step -> the step it undoes, from the log."""
    return {e.step: e.undoes for e in events_of(client, run)
            if isinstance(e, ev.StepDecided) and e.undoes}


@pytest.mark.parametrize("command", ["abort", "cancel"])
def test_abort_compensates_each_applied_effect_once_newest_first(
        client: Client, worker: WorkerFactory, world_db: Path, command: str) -> None:
    """Three applied charges, then ``durable abort --compensate`` (or ``cancel
    --compensate``): three refunds, each applied once under its own key, newest first; the
    run ends canceled listing them."""
    worker()
    run = holding(client, ["charge", "charge", "charge"], f"comp-order-{command}")
    began = time.monotonic()
    out = run_durable(command, run, "--compensate", "--reason", "customer left", "--json",
                      env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert shown["compensating"] == [3, 2, 1] and shown["not_undone"] == []
    final = client.wait(run, 30, waiting=False)
    took = time.monotonic() - began
    assert final.state == "canceled", final
    assert final.compensated == [3, 2, 1] and final.not_undone == []
    assert rows(world_db) == [f"{run}:1", f"{run}:2", f"{run}:3",
                              f"{run}:3:undo", f"{run}:2:undo", f"{run}:1:undo"]
    assert undo_steps(client, run) == {4: 3, 5: 2, 6: 1}
    logged = run_durable("log", run, "--json", env=dict(os.environ))
    intents = [r["what"] for r in map(json.loads, logged.stdout.splitlines())
               if r["type"] == "step_decided" and r["step"] > 3]
    assert [w.split(" with ")[0] for w in intents] == [
        "intends step 4: undoes step 3", "intends step 5: undoes step 2",
        "intends step 6: undoes step 1"], intents
    assert final.actions[4].result == {"refunded": 3, "row": f"{run}:3:undo"}
    report = verify(client.log, run)
    assert report.ok, report.checks
    events = events_of(client, run)
    sent = {e.step: e.ts for e in events if isinstance(e, ev.ActionDispatched) and e.step > 3}
    done = {e.step: e.ts for e in events if isinstance(e, ev.ActionSucceeded) and e.step > 3}
    print(f"\ncompensation of 3 effects: request -> canceled {took * 1000:.0f} ms "
          f"(CLI process included); per compensation, dispatch -> outcome recorded: "
          f"{[done[s] - sent[s] for s in sorted(sent)]} ms")


def test_a_tool_without_compensation_is_listed_as_not_undone(
        client: Client, worker: WorkerFactory, world_db: Path) -> None:
    """A sent notification cannot be undone: it is listed on the request and on the run,
    and the effects around it are still compensated."""
    worker()
    run = holding(client, ["charge", "notify", "charge"], "comp-notify")
    asked = client.abort(run, "order canceled")
    assert asked.compensating == [3, 1]
    assert asked.not_undone == {2: "notify has no compensation"}
    final = client.wait(run, 30, waiting=False)
    assert final.state == "canceled"
    assert (final.compensated, final.not_undone) == ([3, 1], [2])
    assert applications(str(world_db)) == {f"{run}:1": 1, f"{run}:2": 1, f"{run}:3": 1,
                                           f"{run}:3:undo": 1, f"{run}:1:undo": 1}
    out = run_durable("status", run, env=dict(os.environ))
    assert "not undone" in out.stdout and "step 2" in out.stdout, out.stdout
    assert verify(client.log, run).ok


@pytest.mark.parametrize("window", ["after_intent", "after_effect"])
def test_a_compensation_killed_in_its_window_is_applied_once(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
        world_db: Path, window: str) -> None:
    """Killed at the first compensation (step 4, undoing step 3): after_intent -- its
    intent, claim and dispatch recorded, nothing sent; after_effect -- the refund applied,
    its outcome not recorded. A new worker looks the key up and applies it exactly once."""
    doomed = worker(kill_at=f"{window}:4")
    run = holding(client, ["charge", "charge", "charge"], f"comp-{window.replace('_', '-')}")
    client.abort(run, "operator")
    assert doomed.wait(30) == -signal.SIGKILL
    assert undo_steps(client, run) == {4: 3}
    assert client.status(run).actions[4].status == "dispatched"
    applied_before = f"{run}:3:undo" in rows(world_db)
    assert applied_before == (window == "after_effect")
    worker()
    reconciler()
    final = client.wait(run, 30, waiting=False)
    assert final.state == "canceled" and final.compensated == [3, 2, 1]
    assert applications(str(world_db)) == {
        **{f"{run}:{n}": 1 for n in (1, 2, 3)}, **{f"{run}:{n}:undo": 1 for n in (1, 2, 3)}}
    assert undo_steps(client, run) == {4: 3, 5: 2, 6: 1}
    reconciled = [e for e in events_of(client, run) if isinstance(e, ev.ActionReconciled)]
    assert [(e.step, e.resolution) for e in reconciled] == [
        (4, "applied" if applied_before else "not_applied")]
    assert verify(client.log, run).ok


def test_a_compensation_waits_for_the_approval_its_tool_requires(
        client: Client, worker: WorkerFactory, approver: ApproverFactory,
        world_db: Path) -> None:
    """A transfer needs a finance approver, and so does undoing it: the refund is its own
    request, bound to its own step and key, and nothing is sent before it is approved."""
    alice = approver("alice", "finance")
    worker()
    run = client.start("shop", {"plan": ["transfer"]}, run_id="comp-approval").run_id
    assert client.wait(run, 30).state == "waiting_approval"
    client.sign_and_approve(run, f"{run}:1:a1", "approve", "alice", alice)
    assert client.wait(run, 30).state == "waiting_input"
    client.abort(run, "refund it")
    waiting = client.wait(run, 30)
    assert waiting.state == "waiting_approval", waiting
    request = next(a for a in waiting.approvals.values() if a.decision is None)
    assert (request.request, request.step, request.role) == (f"{run}:1:undo:a1", 2, "finance")
    assert rows(world_db) == [f"{run}:1"]
    client.sign_and_approve(run, request.request, "approve", "alice", alice)
    final = client.wait(run, 30, waiting=False)
    assert final.state == "canceled" and final.compensated == [1]
    assert rows(world_db) == [f"{run}:1", f"{run}:1:undo"]
    assert verify(client.log, run).ok


def test_the_agent_may_decide_to_compensate(client: Client, worker: WorkerFactory,
                                            world_db: Path) -> None:
    """``Cancel(compensate=True)``: the agent's own decision undoes what it applied."""
    worker()
    run = client.start("shop", {"plan": ["charge", "charge"], "then": "undo"},
                       run_id="comp-agent").run_id
    final = client.wait(run, 30, waiting=False)
    assert final.state == "canceled" and final.compensated == [2, 1]
    assert final.reason == "the order was abandoned"
    assert rows(world_db)[2:] == [f"{run}:2:undo", f"{run}:1:undo"]
    assert verify(client.log, run).ok


def test_compensating_what_was_never_applied_is_refused(
        client: Client, worker: WorkerFactory, world_db: Path) -> None:
    """Nothing applied, or the run over: a clear error, nothing written, the worker and the
    CLI process go on."""
    w = worker()
    idle = holding(client, [], "comp-nothing")
    before = client.events(idle)
    with pytest.raises(Refused, match="nothing to compensate: no step of it applied"):
        client.abort(idle, "try")
    out = run_durable("cancel", idle, "--compensate", env=dict(os.environ))
    assert out.returncode == 1 and "nothing to compensate" in out.stderr, out
    assert client.events(idle) == before
    assert client.status(idle).state == "waiting_input"

    ended = holding(client, ["charge"], "comp-ended")
    client.respond(ended, "go on")
    assert client.wait(ended, 30).state == "completed"
    before = client.events(ended)
    with pytest.raises(Refused, match="already completed: nothing to compensate"):
        client.abort(ended, "too late")
    assert client.events(ended) == before
    assert rows(world_db) == [f"{ended}:1"]
    assert w.alive()


def test_verify_catches_a_compensation_of_a_step_never_applied(
        client: Client, worker: WorkerFactory, world_db: Path) -> None:
    """A compensation entry written around the worker (through the append script, so it
    chains) that undoes a step that never applied, or one already undone, fails verify,
    which names the entry."""
    worker()
    run = holding(client, ["charge", "notify"], "comp-forged")
    handle = client.log.load(run)
    forged = client.log.commit(handle, [Spec(ev.StepDecided, {
        "step": 3, "tool": "charge", "args": {"n": 9}, "key": f"{run}:9:undo", "undoes": 9})])
    report = verify(client.log, run)
    assert not report.ok and "compensations" in report.failed
    assert report.checks["compensations"] == \
        f"{forged}: step 3 compensates step 9, which applied no effect"

    again = holding(client, ["charge"], "comp-twice")
    client.abort(again, "once")
    assert client.wait(again, 30, waiting=False).compensated == [1]
    handle = client.log.load(again)
    twice = client.log.commit(handle, [Spec(ev.StepDecided, {
        "step": 3, "tool": "charge", "args": {"n": 1}, "key": f"{again}:1:undo",
        "undoes": 1})], allow_terminal=True)
    report = verify(client.log, again)
    assert report.checks["compensations"] == \
        f"{twice}: step 3 compensates step 1 again (step 2 did)"


def test_runs_that_never_compensate_write_no_byte_more() -> None:
    """The new fields are defaults, cut from the wire form: an intent, a cancel request
    and a ``canceled`` without compensation are the bytes they were."""
    v = ev.SCHEMA_VERSION
    intent = ev.StepDecided(v=v, run="r", seq=2, ts=1, actor="w", step=1, tool="charge",
                            args={"n": 1}, key="r:1")
    asked = ev.CancelRequested(v=v, run="r", seq=3, ts=1, reason="x", requested_ts=1)
    ended = ev.Canceled(v=v, run="r", seq=4, ts=1, reason="x", latency_ms=5)
    for event, own in ((intent, [1, "charge", {"n": 1}, None]), (asked, ["x", "run", 1]),
                       (ended, ["x", 5])):
        assert msgspec.msgpack.decode(ev.encode(event))[5:] == own


def test_abort_wait_tells_what_could_not_be_undone_and_why(
        client: Client, worker: WorkerFactory, world_db: Path) -> None:
    """``durable abort --compensate --wait``: once the run ended, what could not be undone
    is listed with its reason, as without ``--wait``, and ``status`` says it too."""
    worker()
    run = holding(client, ["charge", "notify", "charge"], "comp-wait-why")
    env = dict(os.environ, COLUMNS="250")
    out = run_durable("abort", run, "--compensate", "--wait", "30", env=env)
    assert out.returncode == 0, out.stderr
    assert "compensated: 3, 1" in out.stdout, out.stdout
    assert "could not be undone: step 2 (notify has no compensation)" in out.stdout, out.stdout
    shown = run_durable("status", run, "--json", env=env)
    assert json.loads(shown.stdout)["not_undone_why"] == {"2": "notify has no compensation"}


def test_a_rejected_compensation_is_reported_with_its_reason(
        client: Client, worker: WorkerFactory, approver: ApproverFactory,
        world_db: Path) -> None:
    """The refund of a transfer needs a finance approver, who rejects it: the run ends
    canceled with nothing compensated, and ``status`` says so ("none", not "none yet") and
    why the transfer was not undone, from the log."""
    alice = approver("alice", "finance")
    worker()
    run = client.start("shop", {"plan": ["transfer"]}, run_id="comp-rejected").run_id
    assert client.wait(run, 30).state == "waiting_approval"
    client.sign_and_approve(run, f"{run}:1:a1", "approve", "alice", alice)
    assert client.wait(run, 30).state == "waiting_input"
    client.abort(run, "refund it")
    assert client.wait(run, 30).state == "waiting_approval"
    client.sign_and_approve(run, f"{run}:1:undo:a1", "reject", "alice", alice)
    final = client.wait(run, 30, waiting=False)
    assert (final.state, final.compensated, final.not_undone) == ("canceled", [], [1])
    assert rows(world_db) == [f"{run}:1"]  # the refund was never sent
    shown = run_durable("status", run, env=dict(os.environ, COLUMNS="250"))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    [done] = [line for line in lines if "compensated" in line]
    assert "none" in done and "none yet" not in done, done
    [left] = [line for line in lines if "not undone" in line]
    assert "step 1 (its compensation (step 2) rejected" in left, left
