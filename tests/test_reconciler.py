"""The reconciler brings runs back from the log alone: crashed workers, unknown outcomes,
expired waits, retry timers and stuck runs."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from durable.agents import registry
from durable.audit.verify import verify
from durable.client import Client
from durable.log import events as ev
from durable.log import keys
from durable.log.state import RunState
from durable.log.store import RunHandle, Spec, now_ms
from durable.reconciler.sweep import Sweeper
from durable.testing import Server, env_for, wait_for
from tests.agents.basic import applications
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.runs import types_of

#: Every test's agents write to a SQLite world with no unique key (``world_db``).
pytestmark = pytest.mark.usefixtures("world_db")


@pytest.mark.cluster
def test_a_killed_worker_s_run_is_brought_back_by_the_reconciler_alone(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
    tmp_path: Path,
) -> None:
    """Worker SIGKILLed after the effect of step 2, before its outcome is recorded; a second
    worker is idle, and only the reconciler notices and re-enqueues: whichever expires
    first, the dead worker's liveness key (its leases released) or the run's lease."""
    run = client.start("writer", {"steps": 3}, run_id="rec1").run_id
    doomed = worker(kill_at="after_effect:2")
    assert doomed.wait(30) == -signal.SIGKILL
    worker()
    reconciler(interval=0.1)
    final = client.wait(run, timeout=40)
    assert final.state == "completed"
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:{i}": 1 for i in (1, 2, 3)}
    stats = client.stats()
    assert stats.get("requeued", 0) + stats.get("dead_worker_leases_released", 0) >= 1, stats
    assert verify(client.log, run).ok


def _unknown_run(client: Client, run: str, *, deadline: int) -> None:
    """A run whose step 1 was dispatched by a worker that vanished (nothing recorded)."""
    client.start("writer", {"steps": 1}, run_id=run, enqueue=False)
    handle = client.log.load(run, actor="w-gone")
    client.log.commit(handle, [
        Spec(ev.StepDecided, {"step": 1, "tool": "sqlwrite", "args": {"n": 1}, "key": f"{run}:1"}),
        Spec(ev.ActionDispatched, {"step": 1, "key": f"{run}:1", "deadline": deadline}),
    ], ledger=[("c", f"{run}:1", f"claimed|{deadline}")])


@pytest.mark.cluster
def test_unknown_outcome_resolved_by_lookup_as_applied(client: Client, tmp_path: Path) -> None:
    """Window after_effect: step 1 dispatched, the row written, the worker gone with
    nothing recorded; past the deadline, lookup says applied and nothing is sent again."""
    from tests.servers.effects import effects_db as _db

    _unknown_run(client, "u1", deadline=now_ms() - 1000)
    conn = _db()
    conn.execute("INSERT INTO effects VALUES (?, 0)", ("u1:1",))  # it did happen
    conn.close()
    rec = Sweeper(client.settings, client.redis, registry)
    rec.reconcile("u1")
    state = client.status("u1")
    assert state.actions[1].status == "succeeded" and state.actions[1].resolution == "applied"
    assert client.stats()["duplicates_suppressed"] == 1
    types = types_of(client, "u1")
    assert "action_reconciled" in types and types[-1] == "checkpoint"


@pytest.mark.cluster
def test_unknown_outcome_not_applied_is_dispatched_again_with_the_same_key(
    client: Client, worker: WorkerFactory, tmp_path: Path
) -> None:
    """Window after_intent (dispatched): step 1 dispatched, nothing sent, the worker gone;
    past the deadline, lookup says not applied and the same key is sent once."""
    _unknown_run(client, "u2", deadline=now_ms() - 1000)
    rec = Sweeper(client.settings, client.redis, registry)
    assert rec.reconcile("u2") == "requeued"
    assert client.status("u2").actions[1].status == "not_applied"
    worker()
    assert client.wait("u2", timeout=20).state == "completed"
    assert applications(str(tmp_path / "world.sqlite")) == {"u2:1": 1}
    assert verify(client.log, "u2").ok


@pytest.mark.cluster
def test_lookup_is_not_trusted_before_the_deadline(client: Client) -> None:
    """Window: step 1 dispatched and timed out, its deadline not passed: a slow first
    attempt could still land, so before its deadline nothing is resolved."""
    _unknown_run(client, "u3", deadline=now_ms() + 60_000)
    handle = client.log.load("u3")
    client.log.commit(handle, [Spec(ev.ActionTimedOut, {"step": 1, "key": "u3:1"})])
    rec = Sweeper(client.settings, client.redis, registry)
    assert rec.reconcile("u3") == "awaiting deadline"
    assert client.status("u3").actions[1].status == "unknown"


def test_a_wait_past_its_deadline_expires(client: Client, r: redis.Redis) -> None:
    client.start("asker", {"text": "x"}, run_id="w1", enqueue=False)
    handle = client.log.load("w1")
    client.log.commit(handle, [Spec(ev.WaitEntered, {"kind": "input", "until": now_ms() - 1,
                                                     "request": "q"})])
    assert r.zscore(keys.DUE, "w1") is not None
    report = Sweeper(client.settings, client.redis, registry).tick()
    assert report.actions["w1"] == "expired"
    assert client.status("w1").state == "expired"
    assert r.zscore(keys.DUE, "w1") is None


def test_a_retry_timer_wakes_the_run(client: Client, r: redis.Redis) -> None:
    client.start("writer", {"steps": 1}, run_id="t1", enqueue=False)
    handle = client.log.load("t1")
    client.log.commit(handle, [Spec(ev.WaitEntered, {"kind": "retry", "until": now_ms() - 1,
                                                     "request": "t1:1"})])
    rec = Sweeper(client.settings, client.redis, registry)
    assert rec.tick().actions["t1"] == "requeued"
    assert client.status("t1").state == "pending"
    assert client.stats()["retry_timers_woken"] == 1


def test_a_stuck_run_is_found_and_counted(client: Client, r: redis.Redis) -> None:
    """Started, but its advance command was lost (nothing queued, no lease)."""
    client.start("writer", {"steps": 1}, run_id="s1", enqueue=False)
    rec = Sweeper(client.settings, client.redis, registry)
    assert rec.tick(now=now_ms() + 60_000).actions["s1"] == "requeued"
    assert client.stats()["stuck_runs"] == 1
    assert client.queue.count == 1
    # Several reconcilers at once: a due run is handed to one of them only.
    other = Sweeper(client.settings, client.redis, registry)
    assert other.tick(now=now_ms() + 60_000).examined == 0


def test_reconcile_command_for_one_run(client: Client, server: Server) -> None:
    client.start("writer", {"steps": 1}, run_id="one", enqueue=False)
    out = subprocess.run([sys.executable, "-m", "durable", "reconcile", "one", "--json"],
                         env=env_for(server.url), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert '"done":"requeued"' in out.stdout


def test_handles_a_run_with_nothing_to_do(client: Client) -> None:
    handle = RunHandle("done1", RunState(), actor="t")
    client.log.commit(handle, [Spec(ev.RunStarted, {"agent": "writer", "input": {"steps": 0}}),
                               Spec(ev.Completed, {"result": None})])
    rec = Sweeper(client.settings, client.redis, registry)
    assert rec.reconcile("done1") == "terminal"


@pytest.mark.cluster
def test_a_lost_reply_is_recorded_unknown_and_resolved_by_lookup_not_resent(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Window after_effect: the tool sent its effect and lost the reply (OutcomeUnknown);
    while the lookup itself fails, nothing is decided and it is asked again; then it says
    applied."""
    down = tmp_path / "down"
    down.write_text("x")
    monkeypatch.setenv("TEST_LOOKUP_DOWN", str(down))
    run = client.start("unsure", {"steps": 1}, run_id="lost").run_id
    worker()
    reconciler(interval=0.1)
    assert wait_for(lambda: client.stats().get("lookup_errors", 0) >= 2, 20)
    state = client.status(run)
    assert state.state == "outcome_unknown" and state.actions[1].status == "unknown"
    down.unlink()
    final = client.wait(run, 30)
    assert final.state == "completed"
    assert final.actions[1].resolution == "applied"
    assert applications(str(tmp_path / "world.sqlite")) == {"lost:1": 1}
    types = types_of(client, run)
    assert types.count("action_dispatched") == 1 and "action_interrupted" in types
    assert verify(client.log, run).ok


def test_a_run_whose_queued_command_was_lost_is_requeued(client: Client,
                                                         r: redis.Redis) -> None:
    """The marker says queued, but the run id is on no ready list (a worker died after
    taking it): the reconciler does not wait for the marker to expire."""
    client.start("writer", {"steps": 1}, run_id="lostq")
    assert r.lpop(keys.ready(client.queue.name, "writer")) == b"lostq"  # a worker died with it
    assert r.exists(client.log.keys.queued("lostq"))
    rec = Sweeper(client.settings, client.redis, registry)
    assert rec.reconcile("lostq", now_ms() + 60_000) == "requeued"
    assert r.lrange(keys.ready(client.queue.name, "writer"), 0, -1) == [b"lostq"]


def test_a_cancel_ends_a_run_whose_outcome_nobody_can_tell(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step that timed out and whose lookup cannot tell sends its run to an operator
    (waiting_external); an operator's cancel then ends the run ``canceled``, the outcome
    left unknown for an operator to settle. The sweep used to ask the lookup again and
    enter the same wait at every pass, so the cancel never ended the run."""
    from durable.agents import Lookup

    _unknown_run(client, "u5", deadline=now_ms() - 1000)
    handle = client.log.load("u5", actor="w-gone")  # its worker saw the deadline pass
    client.log.commit(handle, [Spec(ev.ActionTimedOut, {"step": 1, "key": "u5:1"})])
    monkeypatch.setattr(registry.tool("sqlwrite"), "lookup", lambda key, args: Lookup.unknown())
    rec = Sweeper(client.settings, client.redis, registry)
    rec.reconcile("u5")
    assert client.status("u5").state == "waiting_external"
    client.cancel("u5", "operator gave up")
    assert rec.reconcile("u5") == "canceled"
    state = client.status("u5")
    assert state.state == "canceled" and state.reason == "operator gave up"
    assert state.actions[1].status == "unknown"  # never assumed either way
    assert verify(client.log, "u5").ok


def test_an_outcome_nobody_can_tell_waits_for_an_operator_and_is_listed(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lookup answers "cannot tell": the run waits (waiting_external) with the reason, and
    `durable runs` lists it with that reason."""
    from durable.agents import Lookup

    _unknown_run(client, "u4", deadline=now_ms() - 1000)
    monkeypatch.setattr(registry.tool("sqlwrite"), "lookup", lambda key, args: Lookup.unknown())
    Sweeper(client.settings, client.redis, registry).reconcile("u4")
    (row,) = client.runs("waiting_external")
    assert row.run_id == "u4" and "u4:1" in row.reason and "cannot tell" in row.reason
