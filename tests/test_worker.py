"""Workers as real processes: crash windows with real SIGKILLs, fencing, forged jobs.

The external system is a real SQLite database that counts every application of every key
and refuses work past its deadline; each crash test runs with and without its unique
constraint (``dedupe``), so that in the second mode only the ledger and lookups stand
between a retry and a duplicate row.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import redis

from durable.audit.verify import verify
from durable.client import Client
from durable.testing import wait_for
from tests.agents.basic import applications
from tests.conftest import WorkerFactory


def _env(tmp_path: Path, dedupe: bool, **extra: str) -> dict[str, str]:
    return {"TEST_DB": str(tmp_path / "world.sqlite"), "TEST_DB_DEDUPE": "1" if dedupe else "0",
            **extra}


@pytest.fixture(autouse=True)
def _db_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_DB", str(tmp_path / "world.sqlite"))


@pytest.mark.cluster
@pytest.mark.parametrize("dedupe", [True, False], ids=["dedupe", "no-dedupe"])
@pytest.mark.parametrize("window", ["after_intent", "after_effect", "after_outcome"])
def test_crash_window_recovers_with_every_key_applied_once(
    window: str, dedupe: bool, client: Client, worker: WorkerFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Worker SIGKILLed at step 2: after_intent = intent and ledger claim recorded, nothing
    sent; after_effect = the row is written, the outcome not recorded; after_outcome = the
    outcome recorded (with the next intent). A fresh worker recovers once the lease expired."""
    monkeypatch.setenv("TEST_DB_DEDUPE", "1" if dedupe else "0")
    run = client.start("writer", {"steps": 3}, run_id=f"crash-{window}-{dedupe}").run_id
    first = worker(kill_at=f"{window}:2", **_env(tmp_path, dedupe))
    assert first.wait(30) == -signal.SIGKILL
    assert client.status(run).state == "pending"
    assert wait_for(lambda: client.redis.get(client.log.keys.lease(run)) is None, 5)
    worker(**_env(tmp_path, dedupe))
    client.enqueue(run, force=True)
    final = client.wait(run, timeout=30)
    assert final.state == "completed", final
    counts = applications(str(tmp_path / "world.sqlite"))
    assert counts == {f"{run}:1": 1, f"{run}:2": 1, f"{run}:3": 1}
    report = verify(client.log, run)
    assert report.ok, report.checks


@pytest.mark.cluster
def test_two_workers_racing_on_one_run_one_proceeds(client: Client, worker: WorkerFactory,
                                                    tmp_path: Path) -> None:
    run = client.start("writer", {"steps": 5}, run_id="race", enqueue=False).run_id
    for _ in range(6):
        client.enqueue(run, force=True)
    for _ in range(2):
        worker(**_env(tmp_path, False))
    final = client.wait(run, timeout=30)
    assert final.state == "completed"
    assert set(applications(str(tmp_path / "world.sqlite")).values()) == {1}
    assert verify(client.log, run).ok


@pytest.mark.cluster
def test_a_paused_worker_resumed_after_its_lease_moved_on_writes_nothing(
    client: Client, worker: WorkerFactory, tmp_path: Path, r: redis.Redis
) -> None:
    """SIGSTOP in the middle of a tool call (before the row is written); the lease expires,
    a second worker recovers the run; SIGCONT: the first worker's late effect is refused
    past its deadline and its late appends are rejected by the fencing check (or the call is
    given up before it returns, as one interrupted long ago)."""
    run = client.start("writer", {"steps": 2}, run_id="paused").run_id
    slow_log = tmp_path / "slow.log"
    slow = worker(log_path=slow_log, **_env(tmp_path, False, TEST_SLOW_S="1.0"))
    assert wait_for(lambda: client.status(run).state == "pending"
                    and client.status(run).actions.get(1) is not None
                    and client.status(run).actions[1].status == "dispatched", 10)
    os.kill(slow.pid, signal.SIGSTOP)
    try:
        assert wait_for(lambda: r.get(client.log.keys.lease(run)) is None, 10)
        worker(**_env(tmp_path, False))
        client.enqueue(run, force=True)
        final = client.wait(run, timeout=30)
        assert final.state == "completed"
    finally:
        os.kill(slow.pid, signal.SIGCONT)
    # The resumed worker drops its late work and says so: its appends refused by the fence
    # ("work discarded"), or, when its watchdog wakes first and finds the call long past its
    # interrupt (the pause counts), the call given up before it returns ("nothing of it is
    # recorded"). Either way nothing it did reaches the log or the database twice.
    assert wait_for(lambda: "work discarded" in slow_log.read_text()
                    or "nothing of it is recorded" in slow_log.read_text(), 15), \
        slow_log.read_text()
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:1": 1, f"{run}:2": 1}
    assert client.status(run).state == "completed"
    assert verify(client.log, run).ok


def test_a_forged_job_naming_an_arbitrary_function_is_refused(
    client: Client, worker: WorkerFactory, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    client.queue.enqueue_call(func="os.system", args=(f"touch {marker}",))
    assert worker(burst=True).wait(30) == 0
    assert not marker.exists()
    assert client.stats().get("forged_jobs") == 1
    assert client.queue.failed_job_registry.count == 1


def test_a_sigterm_the_kernel_hands_to_another_thread_still_stops_the_worker(
    worker: WorkerFactory, r: redis.Redis, tmp_path: Path
) -> None:
    """Window: the main thread waits in RQ's dequeue (``BLMOVE``) while the SIGTERM is
    delivered to another of the worker's threads (a process-wide signal may go to any
    thread). Python runs the handler on the main thread only, at its next bytecode: the
    dequeue's wait is short, so the worker still stops and exits 0."""
    log = tmp_path / "worker.log"
    w = worker(log_path=log)
    assert wait_for(lambda: any(c.get("cmd") == "blmove" for c in r.client_list()), 30), \
        log.read_text()
    # kill(2) given a thread's id delivers to that thread (the first that has not ended).
    for tid in sorted(int(t) for t in os.listdir(f"/proc/{w.pid}/task") if int(t) != w.pid):
        try:
            os.kill(tid, signal.SIGTERM)
            break
        except ProcessLookupError:
            continue
    else:
        pytest.fail("the worker has no thread but its main one")
    assert w.wait(15) == 0, log.read_text()
