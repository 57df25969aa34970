"""The hub on a Redis Cluster (a pipeline per master) and with ``DURABLE_MIN_REPLICAS`` (one
``WAIT`` per pipeline), against real ``redis-server`` processes on loopback: a 3-master
cluster of its own (with replicas where a master is killed), and a primary with a real
replica."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from durable.backend.cluster import LocalCluster
from durable.client import Client
from durable.errors import ReplicationTimeout
from durable.log import events as ev
from durable.log.batching import RedisCall, ScriptBatcher
from durable.log.keys import UNSHARDED, KeyLayout
from durable.log.store import EventLog, RunHandle, Spec
from durable.settings import Settings
from durable.testing import Server, Worker, wait_for
from tests.agents.basic import applications
from tests.conftest import ServerFactory
from tests.test_failover import _in_sync, _replication, _victim

# Runs on a cluster of their own, started here, whatever the pass.

#: The layout of the producer's log on the cluster (``DURABLE_SHARDS=16``).
SHARDED = KeyLayout(16)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3, 0) as c:
        yield c


@pytest.fixture()
def cc(cluster: LocalCluster) -> Iterator[redis.RedisCluster]:
    client = redis.RedisCluster.from_url(cluster.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture()
def producer(cluster: LocalCluster, cc: redis.RedisCluster,
             make_server: ServerFactory) -> Iterator[Client]:
    """A client of the cluster (RQ on a plain server of its own)."""
    settings = Settings.from_env(redis_url=cluster.url, redis_cluster=True, shards=16,
                        agents="examples.agents,tests.agents.basic",
                        queue_url=make_server(fsync="everysec").url)
    client = Client(settings, cc)
    yield client


def _started(elog: EventLog, client: Client, n: int, prefix: str) -> list[RunHandle]:
    ids = [f"{prefix}-{i}" for i in range(n)]
    for run_id in ids:
        client.start("count", {"n": 1}, run_id=run_id, enqueue=False)
    return [elog.load(run_id, actor="test") for run_id in ids]


def _append_together(elog: EventLog, batcher: ScriptBatcher,
                     handles: list[RunHandle]) -> list[Any]:
    """One ``LeaseAcquired`` per run, their appends sent as one batch (``send_now``); each
    run's answer: its entry id, or what its commit raised."""
    coros = [elog.commit_async(h, [Spec(ev.LeaseAcquired, {"owner": "t", "epoch": 1})])
             for h in handles]
    calls: list[RedisCall] = [c.send(None) for c in coros]
    batcher.send_now(calls)
    out: list[Any] = []
    for coro in coros:
        try:
            coro.send(None)
        except StopIteration as done:
            out.append(done.value)
        except Exception as exc:
            out.append(exc)
    return out


def _masters_of(cc: redis.RedisCluster, run_ids: list[str]) -> set[str]:
    return {cc.get_node_from_key(SHARDED.log(r)).name for r in run_ids}


def test_a_batch_goes_to_each_master_as_one_pipeline(cc: redis.RedisCluster,
                                                    producer: Client) -> None:
    """60 appends of runs on all three masters in one batch: it goes out as three parts,
    one per master; each master ran exactly the calls of its own runs (its ``EVALSHA``
    count), each call is answered, each event is on its run's log."""
    elog = EventLog(cc, layout=SHARDED)
    batcher = elog.batch_appends(everywhere=True)
    assert batcher is not None
    handles = _started(elog, producer, 60, "rt")
    owners = [cc.get_node_from_key(SHARDED.log(h.run_id)).name for h in handles]
    assert len(set(owners)) == 3
    before = _evalshas(cc)
    coros_parts = batcher.routes.parts([batcher.command_call("XLEN", SHARDED.log(h.run_id))
                                        for h in handles])
    assert sorted(p.node for p in coros_parts) == sorted(set(owners))
    answers = _append_together(elog, batcher, handles)
    assert all(isinstance(a, str) for a in answers), answers
    after = _evalshas(cc)
    assert {n: after[n] - before[n] for n in after} == \
        {n: owners.count(n) for n in set(owners)}
    for h in handles:
        assert cc.xlen(SHARDED.log(h.run_id)) == 2


def _evalshas(cc: redis.RedisCluster) -> dict[str, int]:
    out = {}
    for node in cc.get_primaries():
        stats = cc.info("commandstats", target_nodes=node)
        out[node.name] = int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    return out


def test_a_call_sent_to_the_wrong_master_is_redirected(
    cc: redis.RedisCluster, cluster: LocalCluster, producer: Client,
) -> None:
    """Crash window: the batcher's map of the cluster is stale (as after a failover or a
    resharding, before a refresh): every call of a batch goes to a master that does not
    own its slot and is refused with MOVED. Each is sent again where the cluster says and
    answered once: every event written exactly once."""
    client = producer
    stale = redis.RedisCluster.from_url(cluster.url)
    try:
        elog = EventLog(stale, layout=SHARDED)
        batcher = elog.batch_appends(everywhere=True)
        assert batcher is not None
        handles = _started(elog, client, 30, "mv")
        manager = stale.nodes_manager
        primaries = stale.get_primaries()
        for h in handles:  # point each run's slot at the next master
            slot = stale.keyslot(SHARDED.log(h.run_id))
            owner = manager.slots_cache[slot][0]
            wrong = primaries[(primaries.index(owner) + 1) % len(primaries)]
            manager.slots_cache[slot] = [wrong]
        answers = _append_together(elog, batcher, handles)
        assert all(isinstance(a, str) for a in answers), answers
        for h in handles:
            assert cc.xlen(SHARDED.log(h.run_id)) == 2
            assert manager.slots_cache[stale.keyslot(SHARDED.log(h.run_id))][0].name == \
                cc.get_node_from_key(SHARDED.log(h.run_id)).name  # the map learned
    finally:
        stale.close()


def test_the_hub_drives_runs_on_the_cluster_and_says_so(
    cluster: LocalCluster, cc: redis.RedisCluster, make_server: ServerFactory,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """A worker with the default driver on a 3-master cluster: its start line says
    ``driver hub`` and names the masters; 40 runs of two effects each (on every master)
    complete, every effect applied once."""
    queue = make_server(fsync="everysec")
    _cluster_env(monkeypatch, cluster, queue, tmp_path)
    client = Client(Settings())
    runs = [client.start("writer", {"steps": 2}, run_id=f"hc-{i}").run_id for i in range(40)]
    assert len(_masters_of(cc, runs)) == 3
    log = tmp_path / "worker.log"
    w = Worker(cluster.url, log_path=log, DURABLE_CONCURRENCY="16")
    try:
        assert wait_for(lambda: _completed(client, runs) == len(runs), 90, 0.2)
    finally:
        w.stop()
        client.close()
    assert "driver hub, 16 run slots (hub), log on 3 cluster masters" in log.read_text()
    assert applications(str(tmp_path / "world.sqlite")) == \
        {f"{r}:{s}": 1 for r in runs for s in (1, 2)}


@pytest.mark.parametrize("driver", ["hub", "threads"])
def test_the_hub_goes_on_across_the_failover_of_a_master(
    driver: str, make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """Crash window: a master (not the one the worker starts from) is killed -9 while a
    worker drives 30 runs of several effects each, some of them in flight on its
    connection to that master; its replica takes over. The hub's calls to the dead master
    fail (the worker says Redis is unavailable, then that it answers again) or are redirected
    (MOVED) to the new one; every run completes, and every effect is applied exactly once
    -- as with the run threads."""
    queue = make_server(fsync="everysec")
    with LocalCluster(3, 1, node_timeout_ms=1000) as cluster:
        assert wait_for(lambda: _in_sync(cluster), 60, 0.1), _replication(cluster)
        _cluster_env(monkeypatch, cluster, queue, tmp_path)
        monkeypatch.setenv("DURABLE_LEASE_TTL_MS", "2000")
        client = Client(Settings())
        runs = [client.start("writer", {"steps": 6}, run_id=f"fo-{i}").run_id
                for i in range(30)]
        log = tmp_path / "worker.log"
        w = Worker(cluster.url, log_path=log, DURABLE_CONCURRENCY="8",
                   TEST_SLOW_S="0.05", DURABLE_DRIVER=driver)
        try:
            assert wait_for(lambda: sum(client.redis.xlen(client.log.keys.log(r)) > 4 for r in runs)
                            >= 8, 60, 0.05)
            victim = _victim(cluster)
            cluster.kill(victim)
            cluster.wait_failover(victim, 60)
            assert wait_for(lambda: _completed(client, runs) == len(runs), 120, 0.25), \
                log.read_text()[-3000:]
        finally:
            w.stop()
            client.close()
        text = log.read_text()
        assert ("driver hub," if driver == "hub" else
                "driver threads (DURABLE_DRIVER=threads),") in text
        # Calls in flight to the dead master fail (an outage the worker logs, then its end:
        # "Redis answers: taking N dropped runs again", or "Redis answers again" once quiet);
        # when none was in flight at the kill, the redirections alone show nothing.
        if "Redis unavailable" in text:
            assert "Redis answers" in text.split("Redis unavailable", 1)[1], text[-3000:]
    assert applications(str(tmp_path / "world.sqlite")) == \
        {f"{r}:{s}": 1 for r in runs for s in range(1, 7)}


def _cluster_env(monkeypatch: pytest.MonkeyPatch, cluster: LocalCluster, queue: Server,
                 tmp_path: Path) -> None:
    for name, value in {
        "DURABLE_REDIS_URL": cluster.url, "DURABLE_REDIS_CLUSTER": "1",
        "DURABLE_QUEUE_URL": queue.url, "DURABLE_SHARDS": "16",
        "DURABLE_AGENTS": "tests.agents.basic", "DURABLE_LEASE_TTL_MS": "1000",
        "TEST_DB": str(tmp_path / "world.sqlite"), "TEST_DB_DEDUPE": "0",
    }.items():
        monkeypatch.setenv(name, value)


def _completed(client: Client, runs: list[str]) -> int:
    try:
        return sum(client.redis.hget(client.log.keys.run(r), "state") == b"completed" for r in runs)
    except redis.RedisError:  # the test's own client during the failover
        return -1


# With DURABLE_MIN_REPLICAS=1: a primary and a real replica (the session's server).


@pytest.fixture()
def replica(server: Server, r: redis.Redis, make_server: ServerFactory) -> Iterator[Server]:
    """A replica of the session's server, in sync."""
    if isinstance(r, redis.RedisCluster):
        pytest.skip("a replica of the single server")
    rep = make_server(fsync="everysec")
    with rep.client() as c:
        c.replicaof("127.0.0.1", server.port)
        assert wait_for(lambda: c.info("replication")["master_link_status"] == "up", 30)
    yield rep
    with rep.client() as c:
        c.replicaof("no", "one")


def _pid(server: Server) -> int:
    """The process of a running server (to stop it with SIGSTOP and let it go on)."""
    assert server.proc is not None, "the server is not running"
    return server.proc.pid


def _waits(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


def test_one_wait_covers_every_append_of_a_pipeline(
    server: Server, r: redis.Redis, replica: Server, settings: Settings,
) -> None:
    """MIN_REPLICAS=1, a replica in sync: 40 appends in one batch are acknowledged after
    one ``WAIT`` (the master's count of them grows by one, not 40), and each event is on
    the replica when its append is answered."""
    elog = EventLog(r, min_replicas=1, replica_timeout_ms=5000)
    batcher = elog.batch_appends(everywhere=True)
    assert batcher is not None
    client = Client(settings, r)
    handles = _started(elog, client, 40, "w1")
    before = _waits(r)
    answers = _append_together(elog, batcher, handles)
    assert all(isinstance(a, str) for a in answers), answers
    assert _waits(r) - before == 1
    with replica.client() as rep:
        assert all(rep.xlen(UNSHARDED.log(h.run_id)) == 2 for h in handles)


def test_an_append_no_replica_confirmed_is_not_taken_for_acknowledged(
    server: Server, r: redis.Redis, replica: Server, settings: Settings,
) -> None:
    """Crash window: the replica is stopped (SIGSTOP: it holds its link, acknowledges
    nothing) between two batches. Each append of the second batch is answered with
    ``ReplicationTimeout`` naming its run -- never an entry id -- though its event is on
    the master (it ran; nothing says the replica has it), as an append sent alone is
    answered (``durable.log.replicas``)."""
    elog = EventLog(r, min_replicas=1, replica_timeout_ms=300)
    batcher = elog.batch_appends(everywhere=True)
    assert batcher is not None
    client = Client(settings, r)
    handles = _started(elog, client, 10, "w0")
    os.kill(_pid(replica), signal.SIGSTOP)
    try:
        answers = _append_together(elog, batcher, handles)
    finally:
        os.kill(_pid(replica), signal.SIGCONT)
    assert [type(a) for a in answers] == [ReplicationTimeout] * len(handles)
    assert [a.run_id for a in answers] == [h.run_id for h in handles]
    assert all("confirmed by 0 of 1 replicas" in str(a) for a in answers)
    assert all(r.xlen(UNSHARDED.log(h.run_id)) == 2 for h in handles)


def test_the_hub_with_min_replicas_drives_runs_and_waits_out_a_stopped_replica(
    server: Server, r: redis.Redis, replica: Server, settings: Settings,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """MIN_REPLICAS=1 on a primary with a real replica: the hub drives (its start line says
    so, and that appends wait for a replica). Crash window: the replica is stopped
    (SIGSTOP) while 20 runs are in flight; the worker's appends are not acknowledged, and
    it says so (the outage line names ``DURABLE_MIN_REPLICAS``); once the replica answers
    again every run completes, each effect applied once."""
    monkeypatch.setenv("TEST_DB", str(tmp_path / "world.sqlite"))
    monkeypatch.setenv("TEST_DB_DEDUPE", "0")
    monkeypatch.setenv("DURABLE_MIN_REPLICAS", "1")
    monkeypatch.setenv("DURABLE_REPLICA_TIMEOUT_MS", "300")
    client = Client(Settings(), r)
    runs = [client.start("writer", {"steps": 4}, run_id=f"mr-{i}").run_id for i in range(20)]
    log = tmp_path / "worker.log"
    w = Worker(server.url, log_path=log, DURABLE_CONCURRENCY="8", TEST_SLOW_S="0.1")
    try:
        assert wait_for(lambda: sum(r.xlen(UNSHARDED.log(x)) > 3 for x in runs) >= 4, 60, 0.02)
        os.kill(_pid(replica), signal.SIGSTOP)
        try:
            assert wait_for(lambda: "DURABLE_MIN_REPLICAS" in log.read_text(), 30, 0.05), \
                log.read_text()[-2000:]
        finally:
            os.kill(_pid(replica), signal.SIGCONT)
        assert wait_for(lambda: _completed(client, runs) == len(runs), 90, 0.1), \
            log.read_text()[-3000:]
    finally:
        w.stop()
    text = log.read_text()
    assert "driver hub, 8 run slots (hub), log on one server, appends wait for 1 replicas" \
        in text
    assert applications(str(tmp_path / "world.sqlite")) == \
        {f"{x}:{s}": 1 for x in runs for s in range(1, 5)}
    with replica.client() as rep:
        assert wait_for(lambda: all(rep.hget(UNSHARDED.run(x), "state") == b"completed"
                                    for x in runs), 10)
