"""Code agents and time: values drawn from the context (``ctx.now()``, ``ctx.random()``,
``ctx.uuid()``) are recorded and given back on re-execution; ``ctx.sleep`` is a durable
timer; a run's function is executed again only on recovery, not at job boundaries; an
exception in agent code quarantines the run with its traceback. Real Redis, real worker
and reconciler processes; the model is a tool counting its requests per key."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from durable.audit.verify import verify
from durable.client import Client
from durable.log import events as ev
from durable.settings import Settings
from durable.testing import Reconciler, Worker, wait_for
from tests.agents.basic import model_requests
from tests.conftest import ReconcilerFactory, ServerFactory, WorkerFactory, run_durable


@pytest.fixture(autouse=True)
def _model_log(world_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_MODEL_LOG", str(world_db.parent / "model.sqlite"))


def _intents(client: Client, run: str) -> list[ev.StepDecided]:
    return [e.event for e in client.events(run) if isinstance(e.event, ev.StepDecided)]


def test_recorded_values_survive_a_crash_in_a_100_turn_conversation(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path
) -> None:
    """The time, a random number and a UUID in the system prompt at every turn; SIGKILL
    after turn 50's model call returned (its outcome not recorded). The function is
    executed again from the start: every drawn value comes back as recorded, so every
    recorded request matches (no quarantine), and only turn 50's effect-free model call is
    sent twice."""
    turns = 100
    run = client.start("dated_chatter", {"turns": turns, "text_bytes": 200},
                       run_id="dated").run_id
    doomed = worker(kill_at="after_effect:50")
    assert doomed.wait(120) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=120)
    assert final.state == "completed", (final.state, final.reason)
    requests = model_requests(str(tmp_path / "model.sqlite"))
    assert len(requests) == turns
    assert {k: n for k, n in requests.items() if n != 1} == {f"{run}:50": 2}
    intents = _intents(client, run)
    assert [len(i.values) for i in intents] == [3] * turns
    assert [v[0] for v in intents[-1].values] == ["time", "random", "uuid"]
    last = intents[-1].values
    assert f"{last[1][1]:.6f}" in final.result["prompt"] and last[2][1] in final.result["prompt"]
    assert verify(client.log, run).ok


def test_a_held_run_is_not_executed_again_at_job_boundaries(
    client: Client, worker: WorkerFactory, tmp_path: Path
) -> None:
    """``time.time()`` in the prompt (the trap of the issue: quarantined at step 64 of a
    40-turn run, re-executed at the job boundary). One worker holds the run across 3 job
    boundaries (``DURABLE_STEPS_PER_JOB=16``): the function goes on where it was, never
    executed again, and the run completes."""
    run = client.start("clock_chatter", {"turns": 60, "text_bytes": 50}, run_id="clock").run_id
    worker(burst=True, DURABLE_STEPS_PER_JOB="16").wait(120)
    final = client.status(run)
    assert final.state == "completed", (final.state, final.reason)
    assert len(model_requests(str(tmp_path / "model.sqlite"))) == 60
    assert sum(isinstance(e.event, ev.LeaseAcquired) for e in client.events(run)) >= 4


def test_the_clock_trap_after_a_crash_names_what_differs(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory
) -> None:
    """Window: killed after turn 3's intent (recorded, its call not answered). Executed
    again, ``time.time()`` gives another prompt for the recorded turn 1: the quarantine
    names the step, the tool, the argument that differs, and the usual cause."""
    run = client.start("clock_chatter", {"turns": 5, "text_bytes": 10},
                       run_id="trap").run_id
    doomed = worker(kill_at="after_intent:3")
    assert doomed.wait(60) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=60)
    assert final.state == "quarantined"
    reason = final.reason or ""
    assert "step 1" in reason and "echo_model" in reason, reason
    assert "the arguments (the log keeps only their digest)" in reason, reason
    assert "ctx.now()" in reason and "clocks, randomness" in reason, reason


def test_a_sleep_survives_a_restart_of_redis_and_of_every_worker(
    make_server: ServerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ctx.sleep(3)``: the run waits ``waiting_timer`` holding no worker. Window: Redis
    is killed (``kill -9``) and restarted, and every worker with it, while the timer runs.
    The reconciler wakes the run within a second of its time, and the run completes."""
    srv = make_server(fsync="always")
    monkeypatch.setenv("DURABLE_REDIS_URL", srv.url)
    monkeypatch.setenv("DURABLE_AGENTS", "examples.agents,tests.agents.basic")
    client = Client(Settings())
    run = client.start("sleeper", {"seconds": 3}, run_id="nap").run_id
    w = Worker(srv.url, log_path=tmp_path / "w1.log")
    rec = Reconciler(srv.url, log_path=tmp_path / "rec.log")
    try:
        assert wait_for(lambda: client.status(run).state == "waiting_timer", 20)
        assert not client.redis.exists(f"dx:{{{run}}}:lease")  # no worker holds it
        w.stop()
        srv.kill()
        srv.start()
        w = Worker(srv.url, log_path=tmp_path / "w2.log")
        final = client.wait(run, timeout=30, waiting=False)
        assert final.state == "completed", (final.state, final.reason)
    finally:
        w.stop()
        rec.stop()
        client.close()
    events = [e.event for e in Client(Settings()).events(run) if e.event is not None]
    entered = next(e for e in events if isinstance(e, ev.WaitEntered))
    woken = next(e for e in events if isinstance(e, ev.WaitResolved))
    assert entered.kind == "timer" and woken.by == "timer"
    late_ms = woken.ts - entered.until
    assert 0 <= late_ms <= 1000, late_ms
    assert final.result["awake"] - final.result["asleep"] >= 3.0


def test_an_async_agent_sleeps_until_a_time(client: Client, worker: WorkerFactory,
                                            reconciler: ReconcilerFactory) -> None:
    run = client.start("async_sleeper", {}, run_id="anap").run_id
    worker()
    reconciler()
    started = time.time()
    assert wait_for(lambda: client.status(run).state == "waiting_timer", 20)
    final = client.wait(run, timeout=20, waiting=False)
    assert final.state == "completed" and final.result == "rested"
    assert time.time() - started < 10


def test_an_agent_bug_quarantines_with_its_traceback(
    client: Client, worker: WorkerFactory, tmp_path: Path
) -> None:
    """The probe of the issue: ``KeyError('no_such_key')`` and nothing more. Now the
    quarantine event, the run's state, ``durable status`` and the worker's log carry the
    traceback, down to the frame that raised."""
    run = client.start("buggy", {}, run_id="bug").run_id
    worker(burst=True, log_path=tmp_path / "worker.log").wait(60)
    state = client.status(run)
    assert state.state == "quarantined"
    assert state.reason == "agent buggy raised KeyError('no_such_key')"
    tb = state.traceback or ""
    assert "in _lookup_missing" in tb and "tests/agents/code.py" in tb and "KeyError" in tb, tb
    (event,) = [e.event for e in client.events(run) if isinstance(e.event, ev.Quarantined)]
    assert event.traceback == tb
    shown = run_durable("status", run, env=dict(os.environ))
    assert shown.returncode == 0 and "in _lookup_missing" in shown.stdout, shown.stdout
    assert "in _lookup_missing" in (tmp_path / "worker.log").read_text()
    released = client.release(run)
    assert released and client.status(run).traceback is None
