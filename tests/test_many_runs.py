"""One worker process drives many runs at once and hands them back on shutdown; a crash of
a worker holding many runs loses and repeats nothing.

The external system is a real SQLite database without a unique key (``TEST_DB_DEDUPE=0``):
it applies every request it gets, so only the ledger, the leases and ``lookup`` stand
between a recovery and a duplicate row.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import redis

from durable.audit.verify import verify
from durable.client import Client
from durable.log import events as ev
from durable.log.keys import KeyLayout
from durable.settings import Settings
from durable.testing import Server, wait_for
from tests.agents.basic import applications
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.runs import types_of

RUNS = 50


#: Every test's agents write to a SQLite world with no unique key (``world_db``).
pytestmark = pytest.mark.usefixtures("world_db")


def _start(client: Client, prefix: str, steps: int) -> list[str]:
    return [client.start("writer", {"steps": steps}, run_id=f"{prefix}-{i}").run_id
            for i in range(RUNS)]


def _held(layout: KeyLayout, r: redis.Redis, runs: list[str]) -> int:
    pipe = r.pipeline(transaction=False)
    for run in runs:
        pipe.exists(layout.lease(run))
    return int(sum(pipe.execute()))


def _states(layout: KeyLayout, r: redis.Redis, runs: list[str]) -> list[str]:
    pipe = r.pipeline(transaction=False)
    for run in runs:
        pipe.hget(layout.run(run), "state")
    return [s.decode() for s in pipe.execute()]


def _all(layout: KeyLayout, state: str, r: redis.Redis, runs: list[str]) -> bool:
    return all(s == state for s in _states(layout, r, runs))


def _assert_each_key_applied_once(tmp_path: Path, client: Client, runs: list[str],
                                  steps: int) -> None:
    applied = applications(str(tmp_path / "world.sqlite"))
    assert applied == {f"{run}:{s}": 1 for run in runs for s in range(1, steps + 1)}
    for run in runs:
        assert verify(client.log, run).ok


def test_one_worker_holds_many_runs_at_once(
        layout: KeyLayout, client: Client, worker: WorkerFactory,
                                            r: redis.Redis, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """50 runs whose one-second calls overlap: one worker process holds all 50 leases at
    the same moment, and each key is applied once."""
    monkeypatch.setenv("TEST_SLOW_S", "1.0")
    runs = _start(client, "many", 2)
    worker(DURABLE_CONCURRENCY="64")
    assert wait_for(lambda: _held(layout, r, runs) == RUNS, 20)
    assert wait_for(lambda: _all(layout, "completed", r, runs), 30)
    _assert_each_key_applied_once(tmp_path, client, runs, 2)


def test_concurrency_bounds_the_runs_a_worker_holds(
        layout: KeyLayout, client: Client, worker: WorkerFactory,
                                                    r: redis.Redis,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``--concurrency 5``: never more than five leases at once, and all runs finish."""
    monkeypatch.setenv("TEST_SLOW_S", "0.2")
    runs = _start(client, "bounded", 2)
    worker(DURABLE_CONCURRENCY="5")
    most = 0

    def done() -> bool:
        nonlocal most
        most = max(most, _held(layout, r, runs))
        return _all(layout, "completed", r, runs)

    assert wait_for(done, 60, interval=0.02)
    assert 1 <= most <= 5


def test_a_worker_killed_with_50_runs_in_flight_loses_and_repeats_nothing(
    layout: KeyLayout,
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, r: redis.Redis,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGKILL while the worker holds 50 runs, each inside a one-second call (intent and
    claim recorded, the row maybe written, the outcome not recorded): another worker and
    the reconciler finish all 50 once the leases expire, every key applied exactly once."""
    monkeypatch.setenv("TEST_SLOW_S", "1.0")
    runs = _start(client, "killed", 3)
    doomed = worker(DURABLE_CONCURRENCY="64")
    assert wait_for(lambda: _held(layout, r, runs) == RUNS, 20)
    doomed.kill()
    assert doomed.wait(5) == -signal.SIGKILL
    monkeypatch.setenv("TEST_SLOW_S", "0.05")
    worker(DURABLE_CONCURRENCY="64")
    reconciler()
    assert wait_for(lambda: _all(layout, "completed", r, runs), 60)
    _assert_each_key_applied_once(tmp_path, client, runs, 3)


def test_sigterm_hands_every_run_back_without_waiting_for_a_lease(
    layout: KeyLayout, client: Client, worker: WorkerFactory, r: redis.Redis, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGTERM while the worker holds 50 runs inside their calls: the calls finish, their
    outcomes are recorded, each run lets go at that step boundary and goes back on the
    ready list; a second worker finishes them all although the leases (60 s) never
    expire, and the first worker exits 0."""
    monkeypatch.setenv("DURABLE_LEASE_TTL_MS", "60000")
    monkeypatch.setenv("TEST_SLOW_S", "1.0")
    runs = _start(client, "termed", 3)
    first = worker(DURABLE_CONCURRENCY="64", DURABLE_SHUTDOWN_GRACE_S="20")
    assert wait_for(lambda: _held(layout, r, runs) == RUNS, 20)
    first.send(signal.SIGTERM)
    assert first.wait(20) == 0
    assert _held(layout, r, runs) == 0  # every lease was let go, none left to expire
    monkeypatch.setenv("TEST_SLOW_S", "0.05")
    worker(DURABLE_CONCURRENCY="64")
    assert wait_for(lambda: _all(layout, "completed", r, runs), 30)
    _assert_each_key_applied_once(tmp_path, client, runs, 3)


def test_a_second_signal_hands_runs_back_mid_call(
    layout: KeyLayout,
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, r: redis.Redis,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second SIGTERM skips the grace period: runs are handed back while their calls are
    in flight (intent and claim recorded, outcome not): their leases are released at once,
    and the next worker resolves each open call by ``lookup`` after its deadline, applying
    nothing twice."""
    monkeypatch.setenv("DURABLE_LEASE_TTL_MS", "60000")
    monkeypatch.setenv("TEST_SLOW_S", "1.5")
    runs = _start(client, "twice", 2)
    log = tmp_path / "first.log"
    first = worker(DURABLE_CONCURRENCY="64", DURABLE_SHUTDOWN_GRACE_S="60", log_path=log)
    assert wait_for(lambda: _held(layout, r, runs) == len(runs), 20)
    first.send(signal.SIGTERM)
    assert wait_for(lambda: "shutting down" in log.read_text(), 10)
    first.send(signal.SIGTERM)
    assert first.wait(20) == 0
    assert _held(layout, r, runs) == 0
    assert "handed back" in log.read_text()
    monkeypatch.setenv("TEST_SLOW_S", "0.05")
    worker(DURABLE_CONCURRENCY="64")
    reconciler()
    assert wait_for(lambda: _all(layout, "completed", r, runs), 40)
    applied = applications(str(tmp_path / "world.sqlite"))
    assert all(applied.get(f"{run}:{s}") == 1 for run in runs for s in (1, 2)), applied


def test_async_tools_run_on_their_own_loop_and_a_cancel_cancels_them(
    layout: KeyLayout, client: Client, worker: WorkerFactory, r: redis.Redis
) -> None:
    """``async def`` tools: 20 runs whose awaits overlap complete on one worker; a cancel
    while one awaits (window: dispatched, no outcome) cancels its task at once."""
    runs = [client.start("asyncer", {"steps": 2, "sleep_s": 0.5}, run_id=f"aio-{i}").run_id
            for i in range(20)]
    stuck = client.start("asyncer", {"steps": 1, "sleep_s": 30}, run_id="aio-long").run_id
    worker(DURABLE_CONCURRENCY="32")
    assert wait_for(lambda: _all(layout, "completed", r, runs), 30)
    assert client.status(runs[0]).result == [{"slept": 0.5, "key": f"{runs[0]}:1"},
                                             {"slept": 0.5, "key": f"{runs[0]}:2"}]

    def dispatched() -> bool:
        current = client.status(stuck).current
        return current is not None and current.status == "dispatched"

    assert wait_for(dispatched, 10)
    client.cancel(stuck, "no longer needed")
    final = client.wait(stuck, timeout=10)
    assert final.state == "canceled"
    types = types_of(client, stuck)
    assert types[-3:] == ["cancel_requested", "call_canceled", "canceled"]


def test_the_connection_pool_serves_as_many_threads_as_the_worker_has_slots(
    server: Server, settings: Settings
) -> None:
    """300 threads of one process each holding a connection at the same moment (a blocking
    read): the pool is sized from DURABLE_CONCURRENCY and waits for a free connection, so
    none fails (redis-py's default pool refuses the 101st: a busy worker took that for a
    Redis outage and stranded runs)."""
    import threading

    from durable.backend.connection import connect

    conn = connect(settings.replace(concurrency=300))
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            conn.blpop(["nothing-comes"], timeout=1)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=hold) for _ in range(300)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    conn.close()
    assert errors == []


def test_a_run_whose_lease_expired_under_its_worker_goes_back_on_the_ready_list(
    client: Client, worker: WorkerFactory, r: redis.Redis, tmp_path: Path
) -> None:
    """The worker is paused (SIGSTOP) inside a call until its lease expires (intent and
    claim recorded, no outcome), then resumed: its late write is refused, and the run goes
    back on the ready list at once, so the same worker finishes it with no reconciler
    running (it used to wait for one)."""
    run = client.start("count", {"steps": 2, "sleep_s": 2.0}, run_id="expired").run_id
    log = tmp_path / "w.log"
    w = worker(log_path=log)
    assert wait_for(lambda: (a := client.status(run).current) is not None
                    and a.status == "dispatched", 15)
    w.send(signal.SIGSTOP)
    try:
        assert wait_for(lambda: r.get(client.log.keys.lease(run)) is None, 10)
    finally:
        w.send(signal.SIGCONT)
    assert client.wait(run, timeout=40).state == "completed"
    assert "work discarded" in log.read_text()
    assert verify(client.log, run).ok


def test_a_worker_as_shipped_has_400_slow_sync_calls_in_flight_at_once(
    client: Client, worker: WorkerFactory
) -> None:
    """Sizing out of the box: 400 runs of one call of a plain tool that waits 2 s, on one
    worker with the default settings, have every call in flight together: their outcomes,
    in the runs' logs, land within 1.5 s of each other. With 256 threads for slow sync code
    (the last release's default), the last 144 calls waited for a first one to end: 2 s
    later. The threads are started by a thread of the hub's own as calls need them, so the
    driving never waits for one to start."""
    runs = [s.run_id for s in
            client.start_many("count", [{"steps": 1, "sleep_s": 2.0}] * 400)]
    worker()
    ended = []
    for run in runs:
        final = client.wait(run, timeout=120)
        assert final.state == "completed", (run, final.state, final.reason)
        ended.append(next(e.event.ts for e in client.events(run)
                          if isinstance(e.event, ev.ActionSucceeded)))
    assert max(ended) - min(ended) < 1500, sorted(ended)
