"""What operators read across runs (``durable.telemetry.overview`` through the ``Client``): counts,
search, the age filter, leases and heartbeats, workers and what they hold, the queue's
depth, the reconcilers' sweeps; and who asked for a cancel."""

from __future__ import annotations

from typing import Any

import redis

from durable.client import Client
from durable.log import events as ev
from durable.log import keys
from durable.log.store import now_ms
from durable.testing import wait_for
from tests.conftest import WorkerFactory


def test_counts_search_and_the_age_filter(client: Client, r: redis.Redis) -> None:
    for i in range(3):
        client.start("count", {"steps": 1}, run_id=f"alpha-{i}", enqueue=False)
    client.start("count", {"steps": 1}, run_id="beta-0", enqueue=False)
    counts = client.counts()
    assert counts["pending"] == 4 and counts["completed"] == 0
    assert [s.run_id for s in client.search("alpha")] == ["alpha-2", "alpha-1", "alpha-0"]
    assert [s.run_id for s in client.search("ta-0")] == ["beta-0"]
    r.zadd(keys.RUNS_BY_UPDATE, {"alpha-0": now_ms() - 3_600_000})  # as if updated an hour ago
    recent = client.runs(since=now_ms() - 60_000)
    assert sorted(s.run_id for s in recent) == ["alpha-1", "alpha-2", "beta-0"]
    assert len(client.runs()) == 4
    oldest = [s.run_id for s in client.runs(oldest_first=True)]
    assert oldest == ["alpha-0", "alpha-1", "alpha-2", "beta-0"]  # by time, then by id
    assert [s.run_id for s in client.runs(oldest_first=True, limit=2, after="alpha-1")] == \
        ["alpha-2", "beta-0"]


def test_leases_workers_and_the_queue(client: Client, worker: WorkerFactory,
                                      monkeypatch: Any) -> None:
    run = client.start("count", {"steps": 100, "sleep_s": 0.3}, run_id="held-1").run_id
    assert client.queue_depth()["ready"] == 1
    worker()
    assert wait_for(lambda: client.lease(run) is not None, 30)
    lease = client.lease(run)
    assert lease is not None and lease.epoch >= 1
    assert 0 <= lease.age_ms <= client.settings.leases.ttl_ms
    assert [x.run_id for x in client.leases()] == [run]
    assert wait_for(lambda: [w.runs for w in client.workers()] == [[run]], 30)
    (w,) = client.workers()
    assert w.name.startswith(lease.owner) and w.last_heartbeat > 0
    # The lease is taken before the first step is decided: on a busy machine the worker is
    # listed holding the run before step 1 is in its log.
    assert wait_for(lambda: 1 in client.status(run).actions, 30)
    key = client.status(run).actions[1].key
    assert wait_for(lambda: client.ledger(run).get(key, "").startswith("done|"), 30)
    state = client.cancel(run, "enough", by="carol")
    assert state.cancel is not None and state.cancel.by == "carol"
    (asked,) = [e.event for e in client.events(run)
                if isinstance(e.event, ev.CancelRequested)]
    assert (asked.by, asked.actor) == ("carol", "carol")
    assert client.wait(run, 30).state == "canceled"


def test_the_reconciler_records_its_sweeps(client: Client, reconciler: Any) -> None:
    run = client.start("count", {"steps": 1}, run_id="due-1", enqueue=False).run_id
    reconciler()
    assert wait_for(lambda: len(client.sweeps()) == 1, 30)
    client.reconcile_soon(run)  # no worker: the reconciler finds it ready and re-queues it
    assert wait_for(lambda: run in client.sweeps()[0].did, 30)
    sweep = client.sweeps()[0]
    assert sweep.reconciler.startswith("reconciler:") and sweep.did_at >= sweep.at - 60_000
