"""The counters operators alert on when a run cannot go on: resume failures and migration
errors (``durable.log.counters``), counted with the quarantine they cause, once per run.

Real worker processes take the runs over; the counters are read from the shared exposition.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from durable.client import Client
from durable.telemetry.metrics import exposition
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.test_metrics import samples


def _counted(client: Client, name: str) -> dict[Any, float]:
    return samples(exposition(client)[0].decode()).get(name, {})


def test_a_log_entry_of_a_newer_schema_is_one_migration_error_and_one_resume_failure(
        client: Client, r: redis.Redis, worker: WorkerFactory) -> None:
    """Bad input: a run's log gains an entry written by a newer schema version (code rolled
    back under it). The worker that takes the run cannot read it: it quarantines the run
    with the reason, keeps every entry, and counts one migration error (future_version)
    and one resume failure (unreadable); reading the run again counts nothing more."""
    run = client.start("count", {"steps": 1}, run_id="future", enqueue=False).run_id
    r.xadd(client.log.keys.log(run), {"e": msgspec.msgpack.encode(
        {"type": "completed", "v": 99, "run": run, "seq": 2, "ts": 1})})
    r.hset(client.log.keys.run(run), "version", 2)
    client.enqueue(run)
    worker(burst=True).wait(60)
    state = client.status(run)
    assert state.state == "quarantined" and "newer schema version 99" in (state.reason or "")
    assert r.xlen(client.log.keys.log(run)) == 3  # started, the future entry, quarantined
    assert _counted(client, "durable_migration_errors_total") == {
        (("kind", "future_version"),): 1.0}
    assert _counted(client, "durable_resume_failures_total") == {
        (("reason", "unreadable"),): 1.0}
    assert client.status(run).state == "quarantined"
    assert _counted(client, "durable_migration_errors_total") == {
        (("kind", "future_version"),): 1.0}


def test_changed_code_that_does_not_re_observe_is_a_resume_failure(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Window: killed after step 3's intent; the next worker's code decides another third
    step. The run is quarantined (nondeterminism) and counted once as a resume failure,
    with no migration error."""
    monkeypatch.setenv("TEST_DB", str(tmp_path / "world.sqlite"))
    monkeypatch.setenv("TEST_DB_DEDUPE", "0")
    run = client.start("variant", {}, run_id="nd").run_id
    assert worker(kill_at="after_intent:3", CODE_VARIANT="a").wait(30) == -signal.SIGKILL
    assert _counted(client, "durable_resume_failures_total") == {}
    worker(CODE_VARIANT="b")
    reconciler()
    assert client.wait(run, timeout=30).state == "quarantined"
    assert _counted(client, "durable_resume_failures_total") == {
        (("reason", "nondeterminism"),): 1.0}
    assert _counted(client, "durable_migration_errors_total") == {}
