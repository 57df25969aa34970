"""One region at a time (``durable.regions``): a process of another region is
fenced at lease acquisition; ``durable region takeover`` refuses while the old primary
answers, and after a real primary's SIGKILL promotes the replica, looks up every claimed key
without an outcome and hands the runs to the new region's workers: no effect applied twice,
nothing written by the old region after it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from durable.cli.main import main
from durable.client import Client
from durable.errors import RegionFenced
from durable.flow import fairness
from durable.leases import Leases
from durable.log import events as ev
from durable.log import keys
from durable.log.keys import UNSHARDED
from durable.settings import Settings
from durable.testing import Server, Worker, wait_for
from tests.agents.basic import applications
from tests.conftest import ServerFactory, WorkerFactory


def test_a_process_of_another_region_is_fenced_and_regions_off_read_nothing(
    server: Server, r: redis.Redis,
) -> None:
    """Regions off: no region record is read or written. Region A claims the unclaimed
    database at its first acquisition; a process of region B is refused with nothing
    written (the lease, the fence and the queued marker as they were)."""
    if isinstance(r, redis.RedisCluster):
        pytest.skip("one server")
    client = Client(Settings.from_env(redis_url=server.url, agents="tests.agents.basic"), r)
    client.start("writer", {"steps": 1}, run_id="reg-1", enqueue=False)
    off = Leases(r, 5000, UNSHARDED)
    lease, version, _ = off.acquire("reg-1", "w-off")
    assert lease is not None and version > 0
    off.release(lease)
    assert not r.exists(UNSHARDED.region())
    a = Leases(r, 5000, UNSHARDED, region="A")
    lease, _, _ = a.acquire("reg-1", "w-a")
    assert lease is not None
    assert r.hgetall(UNSHARDED.region()) == {b"owner": b"A", b"epoch": b"1", b"state": b"active"}
    a.release(lease)
    r.set(UNSHARDED.queued("reg-1"), 1)
    before = (r.get(UNSHARDED.lease("reg-1")), r.get(UNSHARDED.fence("reg-1")))
    with pytest.raises(RegionFenced, match="region 'A' owns it at epoch 1"):
        Leases(r, 5000, UNSHARDED, region="B").acquire("reg-1", "w-b", take_queued=True)
    assert (r.get(UNSHARDED.lease("reg-1")), r.get(UNSHARDED.fence("reg-1"))) == before
    assert r.exists(UNSHARDED.queued("reg-1"))
    client.close()


def test_a_fenced_worker_gives_the_run_back_and_pauses_until_its_region_owns_it(
    server: Server, r: redis.Redis, client: Client, worker: WorkerFactory, world_db: Path,
    tmp_path: Path,
) -> None:
    """A worker of region B while region A owns the database: it pops the run, is fenced,
    puts the run back on the ready list at once and takes no more (said once); the record
    naming B, it takes runs again and finishes the run."""
    if isinstance(r, redis.RedisCluster):
        pytest.skip("one server")
    r.hset(UNSHARDED.region(), mapping={"owner": "A", "epoch": 1, "state": "active"})
    client.start("writer", {"steps": 2}, run_id="reg-p")
    wlog = tmp_path / "b.log"
    worker(log_path=wlog, DURABLE_REGION="B")
    paused = "Region 'B' takes no runs while region 'A' owns them"
    assert wait_for(lambda: paused in wlog.read_text(), 30, 0.05)
    ready = keys.ready(client.settings.worker.queue, "writer")
    assert wait_for(lambda: fairness.is_ready(r, ready, "reg-p"), 10, 0.05)
    assert r.hget(UNSHARDED.run("reg-p"), "state") == b"pending"
    assert applications(str(world_db)) == {}
    r.hset(UNSHARDED.region(), "owner", "B")
    assert wait_for(lambda: r.hget(UNSHARDED.run("reg-p"), "state") == b"completed", 30, 0.05)
    text = wlog.read_text()
    assert text.count(paused) == 1 and "region 'B' owns its runs again" in text
    assert applications(str(world_db)) == {"reg-p:1": 1, "reg-p:2": 1}


def test_a_takeover_while_the_old_primary_answers_is_refused_and_writes_nothing(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Bad input: the replica's link to its primary is up (or ``--from-url`` names a
    primary that answers): exit 1, the replica still a replica, no record written."""
    primary, replica = make_server(), make_server()
    with replica.client() as rep:
        rep.replicaof("127.0.0.1", primary.port)
        assert wait_for(lambda: rep.info("replication")["master_link_status"] == "up", 30)
    monkeypatch.setenv("DURABLE_REDIS_URL", replica.url)
    assert main(["region", "takeover", "--region", "B"]) == 1
    assert "still a replica" in capsys.readouterr().err
    assert main(["region", "takeover", "--region", "B", "--from-url", primary.url]) == 1
    assert "still answers" in capsys.readouterr().err
    with replica.client() as rep, primary.client() as pri:
        assert rep.info("replication")["role"] == "slave"
        assert not pri.exists(UNSHARDED.region()) and not rep.exists(UNSHARDED.region())


#: What a worker's log says once when another region's ownership pauses it.
PAUSED = "takes no runs while region 'B' owns them"


def _actors_after_takeover(r: redis.Redis, run_id: str) -> set[str]:
    """The actors of the entries after the run's takeover record (none if it has none)."""
    elog = Client(Settings.from_env(redis_url=""), r).log
    entries = elog.entries(run_id, r.xrange(UNSHARDED.log(run_id)))
    marks = [i for i, e in enumerate(entries)
             if isinstance(e.event, ev.LeaseAcquired) and e.event.region == "B"]
    assert len(marks) <= 1
    return {e.event.actor for e in entries[marks[0] + 1:] if e.event} if marks else set()


def test_a_takeover_after_the_primary_dies_applies_no_effect_twice(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], record_property: object,
) -> None:
    """Crash window: region A's primary is SIGKILLed while A's workers are inside slow
    effects (sent, outcome not yet recorded: claimed keys without an outcome on the
    replica, which has every acknowledged append: DURABLE_MIN_REPLICAS=1). The takeover
    promotes the replica and looks those keys up; region B's workers finish every run. An A
    worker pointed at the promoted server, and the A workers still holding their runs,
    write nothing after the takeover; every effect is applied exactly once."""
    primary, replica = make_server(fsync="everysec"), make_server(fsync="everysec")
    with replica.client() as rep:
        rep.replicaof("127.0.0.1", primary.port)
        assert wait_for(lambda: rep.info("replication")["master_link_status"] == "up", 30)
    db = str(tmp_path / "world.sqlite")
    common = {"DURABLE_AGENTS": "tests.agents.basic", "DURABLE_LEASE_TTL_MS": "1000",
              "TEST_DB": db, "TEST_DB_DEDUPE": "0"}
    for name, value in common.items():
        monkeypatch.setenv(name, value)
    a_env = {**common, "DURABLE_REGION": "A", "DURABLE_MIN_REPLICAS": "1",
             "TEST_SLOW_S": "0.4"}
    client = Client(Settings.from_env(redis_url=primary.url, min_replicas=1))
    runs = [f"rg-{i}" for i in range(8)]
    for run_id in runs:
        client.start("writer", {"steps": 3}, run_id=run_id)
    a_workers = [Worker(primary.url, log_path=tmp_path / f"a{i}.log", env=a_env,
                        DURABLE_CONCURRENCY="4") for i in range(2)]
    b_workers: list[Worker] = []
    try:
        # Some effects applied, none of the runs done: then the primary dies mid-run.
        assert wait_for(lambda: len(applications(db)) >= 4, 60, 0.02)
        primary.kill()
        client.close()
        monkeypatch.setenv("DURABLE_REDIS_URL", replica.url)
        assert main(["region", "takeover", "--region", "B", "--from-url", primary.url,
                     "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        print(f"\ntakeover: {report}")
        record_property("takeover", report)  # type: ignore[operator]
        assert report["promoted"] and report["runs"] >= 1 and not report["unverified"]
        assert report["looked_up"] == report["found_applied"] + report["resent"]
        late_log = tmp_path / "a-late.log"
        fenced = Worker(replica.url, log_path=late_log, env=a_env, DURABLE_MIN_REPLICAS="0")
        a_workers.append(fenced)
        # Alone with the ready runs, it pops some, is fenced, and pauses: the runs it popped
        # are ready again for region B's workers, started only now.
        assert wait_for(lambda: PAUSED in late_log.read_text(), 60, 0.05)
        b_env = {**common, "DURABLE_REGION": "B"}
        b_workers = [Worker(replica.url, log_path=tmp_path / f"b{i}.log", env=b_env)
                     for i in range(2)]
        check = redis.Redis.from_url(replica.url)
        assert wait_for(lambda: all(check.hget(UNSHARDED.run(i), "state") == b"completed"
                                    for i in runs), 90, 0.1), \
            [(i, check.hget(UNSHARDED.run(i), "state")) for i in runs]
        a_pids = {f":{w.pid}:" for w in a_workers}
        for run_id in runs:
            late = [a for a in _actors_after_takeover(check, run_id)
                    if any(p in a for p in a_pids)]
            assert late == [], run_id
        check.close()
        assert late_log.read_text().count(PAUSED) == 1  # once per pause, not per run
    finally:
        for w in a_workers + b_workers:
            w.stop()
    counts = applications(db)
    twice = {k: n for k, n in counts.items() if n > 1}
    print(f"applied twice: {len(twice)}")
    assert twice == {}
    assert counts == {f"{i}:{s}": 1 for i in runs for s in (1, 2, 3)}
