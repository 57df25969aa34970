"""Faults of Redis and of agent code are ordinary: no worker or reconciler exits on them,
no published cancel is lost, and nothing is applied twice.

Each test runs its own Redis server where it kills it (``appendfsync always``: every
acknowledged write survives the ``kill -9``) and real worker and reconciler processes.
"""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path

import pytest
import redis

from durable.agents import registry
from durable.audit.verify import verify
from durable.client import Client
from durable.log import events as ev
from durable.log import keys
from durable.log.keys import KeyLayout
from durable.log.store import Spec, now_ms
from durable.settings import Settings
from durable.testing import Reconciler, Worker, wait_for
from durable.workers.loop import StepLoop
from tests.agents.basic import applications
from tests.conftest import ServerFactory, WorkerFactory
from tests.runs import cancel_listeners, deaf_listeners_report, is_dispatched, types_of


def _publish_cancel(r: redis.Redis, run: str, reason: str) -> None:
    """A bare pub/sub hint, as any Redis client can send it: nothing is in the log yet."""
    r.publish(keys.CANCEL_CHANNEL, json.dumps({"run": run, "reason": reason, "scope": "run",
                                               "ts": 0}))


def test_a_killed_subscription_comes_back_and_still_interrupts_a_held_run(
    client: Client, worker: WorkerFactory, r: redis.Redis
) -> None:
    """``CLIENT KILL TYPE pubsub`` while a worker holds a run inside a cancellable call: the
    worker resubscribes, and a cancel made afterwards interrupts the call.

    The cancel is ``Client.cancel`` (recorded, then published), not a bare hint: redis-py
    resubscribes a killed pub/sub connection by itself, and a hint that reaches that
    connection just before the listener replaces it is lost with it, by design (a hint is
    only a hint). What must hold is that the listener comes back and acts on a recorded
    cancel, from the message or from the re-read of its held runs that follows every
    resubscription; a listener that never comes back leaves the run ``cancel_requested``."""
    run = client.start("count", {"steps": 3, "sleep_s": 30}, run_id="deaf").run_id
    worker()
    assert wait_for(lambda: is_dispatched(client, run), 15)
    assert wait_for(lambda: cancel_listeners(r) == 1, 5)
    killed = r.client_kill_filter(_type="pubsub")
    assert killed >= 1
    assert wait_for(lambda: cancel_listeners(r) == 1, 3)
    client.cancel(run, reason="after the kill")
    final = client.wait(run, timeout=10)
    assert final.state == "canceled"
    types = types_of(client, run)
    assert types[-3:] == ["cancel_requested", "call_canceled", "canceled"]


def test_redis_killed_and_restarted_mid_runs_loses_no_cancel_and_no_process(
    layout: KeyLayout, make_server: ServerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kill -9`` of Redis while two workers hold runs inside their calls (claims recorded,
    outcomes not), down for two seconds, then restarted: the workers and the reconciler
    are still running, every run with a published cancel ends ``canceled``, the others
    complete, and no key is applied twice in a database that never deduplicates."""
    srv = make_server(fsync="always")
    env = {"DURABLE_AGENTS": "examples.agents,tests.agents.basic", "DURABLE_LEASE_TTL_MS": "1000",
           "TEST_DB": str(tmp_path / "world.sqlite"), "TEST_DB_DEDUPE": "0",
           "TEST_SLOW_S": "0.3"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DURABLE_REDIS_URL", srv.url)
    client = Client(Settings())
    runs = [client.start("writer", {"steps": 12}, run_id=f"outage-{i}").run_id
            for i in range(10)]
    procs: list[Worker | Reconciler] = [Worker(srv.url, log_path=tmp_path / f"w{i}.log")
                                        for i in range(2)]
    procs.append(Reconciler(srv.url, log_path=tmp_path / "rec.log"))
    try:
        assert wait_for(lambda: sum(client.redis.exists(layout.lease(r)) for r in runs) >= 8,
                        20)
        # Every process is up before the outage: this is about processes that lose Redis
        # while they serve (one still importing on a loaded machine would meet a Redis that
        # is down at its start, which it reports and exits on).
        assert all(p.started() for p in procs)
        srv.kill()
        wait_for(lambda: False, 2.0)  # the outage itself: two seconds without Redis
        srv.start()
        r = srv.client()
        # Two workers and the reconciler listen again.
        if not wait_for(lambda: cancel_listeners(r) == 3, 30):
            pytest.fail(deaf_listeners_report(r, procs))
        doomed = runs[:5]
        for run in doomed:
            _publish_cancel(r, run, "published after the restart")

        def settled() -> bool:
            states = [client.redis.hget(client.log.keys.run(run), "state") for run in runs]
            return all(s in (b"completed", b"canceled") for s in states)

        assert wait_for(settled, 90)
        assert all(p.alive() for p in procs), [p.log_path for p in procs if not p.alive()]
    finally:
        for p in procs:
            p.stop()
    for run in runs:
        state = client.status(run).state
        assert state == ("canceled" if run in doomed else "completed"), (run, state)
        assert verify(client.log, run).ok
    applied = applications(str(tmp_path / "world.sqlite"))
    assert applied and max(applied.values()) == 1, applied
    completed = [r for r in runs if r not in doomed]
    assert all(applied.get(f"{run}:{s}") == 1 for run in completed for s in range(1, 13))
    logs = [p.log_path.read_text() for p in procs if p.log_path is not None]
    assert any("Redis unavailable" in text for text in logs)
    assert not any("Traceback" in text for text in logs)  # one line per outage instead


def test_agent_code_that_never_returns_is_quarantined_and_the_worker_goes_on(
    client: Client, worker: WorkerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``decide()`` never returns (window: lease held, nothing decided): past
    ``DURABLE_DECIDE_TIMEOUT_MS`` the run is quarantined with that reason and its lease let
    go; the same worker completes other runs; a cancel then ends the stuck run."""
    monkeypatch.setenv("DURABLE_DECIDE_TIMEOUT_MS", "500")
    stuck = client.start("hang", {"hang": True}, run_id="stuck").run_id
    w = worker(DURABLE_CONCURRENCY="2")
    state = client.wait(stuck, timeout=20)
    assert state.state == "quarantined"
    assert "hang.decide() did not return within 500 ms" in (state.reason or "")
    assert wait_for(lambda: client.redis.get(client.log.keys.lease(stuck)) is None, 5)
    others = [client.start("hang", {"hang": False}, run_id=f"fine-{i}").run_id
              for i in range(4)]
    for run in others:
        assert client.wait(run, timeout=20).state == "completed"
    assert w.alive()
    assert client.cancel(stuck, "operator gave up").state == "canceled"
    assert client.stats().get("user_code_overruns") == 1


def test_a_tool_stuck_in_c_gives_its_run_up_and_the_worker_goes_on(
    client: Client, worker: WorkerFactory, tmp_path: Path
) -> None:
    """Window: step 1 dispatched, its tool blocked in C past its deadline, where the
    interrupt cannot land: the run is handed back (lease released, ready again) and another
    slot continues it, resolving the call with ``lookup`` and sending it again; the stuck
    thread's late return writes nothing, and the worker keeps serving."""
    run = client.start("echo", {"steps": 2, "text": "t"}, run_id="blocked").run_id
    log = tmp_path / "worker.log"
    w = worker(DURABLE_CONCURRENCY="4", ECHO_TOOL="blocker", ECHO_SLEEP="4", log_path=log)
    final = client.wait(run, timeout=30)
    assert final.state == "completed"
    entries = client.log.read(run)
    types = [e.event.__struct_config__.tag for e in entries if e.event]
    assert types.count("action_dispatched") == 3, types  # step 1 twice, step 2 once
    assert "action_reconciled" in types
    assert client.stats().get("stuck_calls") == 1
    length = len(entries)
    others = [client.start("echo", {"steps": 1, "text": "x"}, run_id=f"after-{i}").run_id
              for i in range(3)]
    for other in others:
        assert client.wait(other, timeout=20).state == "completed"
    # The stuck call returns (4 s after it began), and the worker says so; once the worker
    # has stopped, nothing more can be written: the log is what the late return left.
    assert wait_for(lambda: "given up as stuck" in log.read_text(), 15), log.read_text()
    assert w.alive()
    w.stop()
    assert w.wait(10) == 0
    assert len(client.log.read(run)) == length
    assert verify(client.log, run).ok


def test_a_worker_carrying_too_many_stuck_calls_restarts_in_place(
    client: Client, worker: WorkerFactory, tmp_path: Path
) -> None:
    """Window: two tool calls are stuck in C at once (``DURABLE_MAX_STUCK_CALLS=2``), each
    holding its thread for a minute: the worker hands its runs back and replaces its own
    image (same pid, so a process manager sees nothing; the stuck threads end with the old
    image). Both runs complete, their first call resolved by ``lookup`` and sent again, and
    the new image serves new runs."""
    ids = [client.start("echo", {"steps": 2, "text": "t"}, run_id=f"stuck-{i}").run_id
           for i in range(2)]
    log = tmp_path / "worker.log"
    w = worker(DURABLE_CONCURRENCY="4", DURABLE_MAX_STUCK_CALLS="2", ECHO_TOOL="blocker",
               ECHO_SLEEP="60", log_path=log)
    for run in ids:
        final = client.wait(run, timeout=40)
        assert final.state == "completed", (final.state, log.read_text())
        assert verify(client.log, run).ok
    assert client.stats().get("stuck_calls") == 2
    # The runs were handed back before the restart was asked for: the image may complete
    # them before it is replaced, so the restart is waited for, not assumed done.
    assert wait_for(lambda: "restarting in place" in log.read_text(), 20), log.read_text()
    # The fresh image starts (same pid); it may take runs before it logs that it started.
    assert wait_for(lambda: log.read_text().count(" started: queue") == 2, 15), \
        log.read_text()
    assert w.alive()
    after = client.start("echo", {"steps": 1, "text": "x"}, run_id="after-restart").run_id
    assert client.wait(after, timeout=20).state == "completed"


def test_scripts_flushed_under_a_busy_worker_are_loaded_again(
    client: Client, worker: WorkerFactory, tmp_path: Path
) -> None:
    """Window: the server forgets its scripts (``SCRIPT FLUSH``, as after a restart without
    persistence of the script cache) while a worker's batched appends are in flight: each
    refused call (``NOSCRIPT``: it did not run) is sent again after a reload, every run
    completes, and nothing is applied twice."""
    ids = [f"flush-{i}" for i in range(40)]
    client.start_many("count", [{"steps": 6, "sleep_s": 0.05}] * len(ids), run_ids=ids)
    log = tmp_path / "worker.log"
    w = worker(DURABLE_CONCURRENCY="40", log_path=log)
    for _ in range(15):
        client.redis.script_flush()
        time.sleep(0.05)
    for run in ids:
        try:
            final = client.wait(run, timeout=30)
        except TimeoutError as exc:  # say what the worker saw
            pytest.fail(f"{exc}; worker alive: {w.alive()}; its log:\n{log.read_text()}")
        assert final.state == "completed", (run, final.state, final.reason)
        assert verify(client.log, run).ok
        steps = [e.event.step for e in client.log.read(run)
                 if isinstance(e.event, ev.ActionSucceeded)]
        assert steps == [1, 2, 3, 4, 5, 6], steps
    refused = client.redis.info("errorstats").get("errorstat_NOSCRIPT", {})
    assert int(refused.get("count", 0)) > 0  # the refusals did happen, and were sent again


def test_a_pickled_job_and_a_garbage_job_leave_the_worker_serving(
    client: Client, worker: WorkerFactory, r: redis.Redis
) -> None:
    """Jobs RQ cannot decode with the queue's JSON serializer: refused and counted before
    anything is unpickled; the worker keeps running and serves the next run."""
    w = worker()
    marker = Path("/nonexistent-durable-test-marker")
    evil = pickle.dumps(("os.system", None, (f"touch {marker}",), {}))
    for job_id, data in (("pickled", evil), ("garbage", b"\x00\xffnot a job")):
        r.hset(f"rq:job:{job_id}", mapping={"data": data, "status": "queued",
                                            "origin": client.queue.name,
                                            "created_at": "2026-01-01T00:00:00.000000Z"})
        r.rpush(f"rq:queue:{client.queue.name}", job_id)
    assert wait_for(lambda: client.stats().get("poison_jobs") == 2, 15)
    run = client.start("count", {"steps": 2}, run_id="after-poison").run_id
    assert client.wait(run, timeout=15).state == "completed"
    assert w.alive()
    assert not marker.exists()


def test_a_redis_error_while_reobserving_is_not_taken_for_an_agent_bug(
    client: Client, settings: Settings, r: redis.Redis
) -> None:
    """Window: a worker resumes a run whose step 1 was decided and dispatched (no outcome)
    and re-observes it; a Redis call of the re-observing fails (here a real refusal: the
    worker's Redis user may not run HINCRBY). The error goes to the driver, which takes the
    run again once Redis answers; it is not an agent bug, so the run is not quarantined."""
    run = client.start("writer", {"steps": 2}, enqueue=False).run_id
    handle = client.log.load(run, actor="w:gone")
    client.log.commit(handle, [
        Spec(ev.StepDecided, {"step": 1, "tool": "sqlwrite", "args": {"n": 1},
                              "key": f"{run}:1"}),
        Spec(ev.ActionDispatched, {"step": 1, "key": f"{run}:1", "deadline": now_ms()})])
    r.acl_setuser("no-counters", enabled=True, nopass=True, categories=["+@all"],
                  commands=["-hincrby"], keys=["*"], channels=["*"])
    assert settings.redis.url is not None
    url = settings.redis.url.replace("redis://", "redis://no-counters:x@", 1)
    registry.load(settings.worker.agents)
    loop = StepLoop(settings, redis.Redis.from_url(url), registry, "w:denied")
    with pytest.raises(redis.RedisError, match="hincrby"):
        loop.advance(run)
    state = client.status(run)
    assert state.state != "quarantined", state.reason
    assert state.actions[1].status == "dispatched"
