"""The sharded key layout, the queue on its own server, and the cluster helper.

Tests marked ``cluster`` run a second time against a real 3-master Redis Cluster under
``pytest --cluster`` (``./test.sh`` does both passes)."""

from __future__ import annotations

import random
import socket
import string
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from durable.backend.cluster import LocalCluster, cluster_port, ephemeral_low
from durable.backend.connection import connect
from durable.client import Client
from durable.errors import UsageError
from durable.log import keys
from durable.log.index import repair
from durable.log.keys import KeyLayout
from durable.log.state import ALL_STATES
from durable.settings import Settings
from durable.testing import Server, wait_for
from tests.agents.basic import applications
from tests.conftest import ReconcilerFactory, ServerFactory, WorkerFactory, run_durable


def _ids(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + "_.:-"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(n)]


@pytest.mark.parametrize("shards", [1, 3, 16])
def test_every_key_of_a_run_and_its_shard_indexes_share_one_slot(shards: int) -> None:
    """append.lua writes the log, projection, ledger, lease and the shard's indexes in one
    call: on a cluster they must all hash to one slot, for any run id."""
    layout = KeyLayout(shards)
    for run_id in _ids(300):
        shard = layout.shard_of(run_id)
        names = [layout.log(run_id), layout.run(run_id), layout.ledger(run_id),
                 layout.lease(run_id), layout.fence(run_id), layout.queued(run_id),
                 layout.runs_index(shard), layout.due(shard), layout.runs_of(run_id),
                 layout.due_of(run_id), layout.blobs(run_id), layout.metrics(shard),
                 *[layout.runs_in_state(s, shard) for s in ALL_STATES]]
        assert len({key_slot(n.encode()) for n in names}) == 1, run_id
        assert layout.run_of_log(layout.log(run_id)) == run_id


def test_shards_spread_evenly_over_the_slot_space() -> None:
    """Shard k of n hashes into the k-th n-th of the slots: masters that split the slots
    evenly get n/masters shards each."""
    layout = KeyLayout(16)
    slots = [key_slot(layout.due(k).encode()) for k in range(16)]
    assert [s * 16 // 16384 for s in slots] == list(range(16))
    counts = [0] * 16
    for run_id in _ids(4000):
        counts[layout.shard_of(run_id) or 0] += 1
    assert min(counts) > 4000 / 16 / 2, counts


def test_the_unsharded_layout_is_the_one_single_servers_always_had() -> None:
    """Data written before shards existed is found as it is: no migration."""
    layout = keys.UNSHARDED
    assert layout.log("R") == "dx:{R}:log" and layout.run("R") == "dx:{R}:run"
    assert layout.due_of("R") == keys.DUE == "dx:due"
    assert layout.runs_of("R") == keys.RUNS_BY_UPDATE == "dx:runs"
    assert layout.runs_in_state("pending") == "dx:runs:pending"
    assert layout.metrics() == keys.METRICS == "dx:metrics"


def test_the_sharded_key_strings_are_the_ones_written_before() -> None:
    """Data written by earlier releases on a cluster is found as it is: the same strings."""
    layout = KeyLayout(16)
    assert layout.shard_of("R") == 7 and layout.log("R") == "dx:{7.40}:R:log"
    assert layout.due(3) == "dx:{3.0}:due"
    assert layout.runs_in_state("pending", 0) == "dx:{0.13}:runs:pending"
    assert layout.pattern("lease", 3) == "dx:{3.0}:*:lease"
    assert layout.run_of("dx:{7.40}:R:lease") == "R"
    assert layout.metrics_keys()[-1] == "dx:metrics"


def test_a_process_configured_for_another_layout_refuses_to_start(server: Server,
                                                                   r: redis.Redis) -> None:
    """The layout is fixed for the life of the data: a process with another DURABLE_SHARDS
    would not find the runs, so it stops with one clear line instead."""
    if isinstance(r, redis.RedisCluster):
        pytest.skip("the single-server layout check")
    first = connect(Settings.from_env(redis_url=server.url), check=False)
    first.close()
    with pytest.raises(UsageError, match="DURABLE_SHARDS=0"):
        connect(Settings.from_env(redis_url=server.url, shards=4), check=False)


@pytest.mark.cluster
def test_runs_are_listed_and_reindexed_across_shards(client: Client, r: redis.Redis) -> None:
    """`durable runs` pages through every shard newest first, each run once; repair-index
    rebuilds the indexes of every shard from the logs."""
    ids = [f"ls-{i}" for i in range(45)]
    for run_id in ids:
        client.start("count", {"n": 2}, run_id=run_id, enqueue=False)

    def pages() -> list[str]:
        seen: list[str] = []
        after = None
        while True:
            page = client.runs(limit=7, after=after)
            if not page:
                return seen
            seen += [p.run_id for p in page]
            after = page[-1].run_id

    listed = pages()
    assert sorted(listed) == sorted(ids)
    updated = [client.projection(i)["updated"] for i in listed]
    assert updated == sorted(updated, reverse=True)
    assert {s.run_id for s in client.runs("pending", limit=100)} == set(ids)
    layout = client.log.keys
    for shard in layout.shard_ids():
        r.delete(layout.runs_index(shard), layout.due(shard),
                 layout.runs_in_state("pending", shard))
    assert client.runs(limit=100) == []
    assert repair(client).runs == len(ids)
    assert sorted(pages()) == sorted(ids)
    assert sum(r.zcard(layout.due(s)) for s in layout.shard_ids()) == len(ids)


@pytest.mark.cluster
def test_losing_the_queue_server_loses_no_run(
    client: Client, settings: Settings, worker: WorkerFactory, reconciler: ReconcilerFactory,
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """Crash window: the queue's server (DURABLE_QUEUE_URL: RQ's commands and the ready
    list) is killed -9 after the runs were started and queued, before any worker took
    them, and comes back empty. The reconciler finds the runs in the log's due sets and
    queues them again: every run completes, every effect applied once."""
    queue = make_server(fsync="everysec")
    monkeypatch.setenv("DURABLE_QUEUE_URL", queue.url)
    monkeypatch.setenv("TEST_DB", str(tmp_path / "world.sqlite"))
    monkeypatch.setenv("TEST_DB_DEDUPE", "0")
    producer = Client(Settings(), client.redis)
    ids = [producer.start("writer", {"steps": 2}, run_id=f"q-{i}").run_id for i in range(12)]
    with queue.client() as q:
        assert q.llen(keys.ready(settings.worker.queue, "writer")) == len(ids)
    queue.kill()
    empty = Server(fsync="everysec")
    empty.port, empty.url = queue.port, queue.url
    make_server_started = empty.start()
    try:
        with queue.client() as q:
            assert q.llen(keys.ready(settings.worker.queue, "writer")) == 0  # every command is gone
        worker()
        reconciler()
        k = client.log.keys
        assert wait_for(lambda: all(client.redis.hget(k.run(i), "state") == b"completed"
                                    for i in ids), 90, 0.2)
    finally:
        make_server_started.stop()
        producer.close()
    counts = applications(str(tmp_path / "world.sqlite"))
    assert counts == {f"{i}:{s}": 1 for i in ids for s in (1, 2)}


def test_a_cluster_without_a_queue_server_is_refused_in_one_line(tmp_path: Path) -> None:
    """RQ does not run on a cluster: DURABLE_REDIS_CLUSTER needs DURABLE_QUEUE_URL; a
    cluster node named without DURABLE_REDIS_CLUSTER is refused the same way (no MOVED
    traceback)."""
    from durable.backend.cluster import LocalCluster

    with LocalCluster(3, 0) as cluster:
        env = {"PATH": "/usr/bin:/bin", "XDG_STATE_HOME": str(tmp_path),
               "DURABLE_REDIS_CLUSTER": "1", "DURABLE_REDIS_URL": cluster.url}
        out = run_durable("runs", env=env)
        assert out.returncode == 2, out
        assert out.stderr.strip().splitlines() == [
            "durable: DURABLE_QUEUE_URL must name a plain Redis server when "
            "DURABLE_REDIS_CLUSTER is set: RQ does not run on a cluster"]
        del env["DURABLE_REDIS_CLUSTER"]  # as the user did: a node, a plain client
        out = run_durable("start", "count", "--input", '{"n": 1}', env=env)
        assert out.returncode == 2, out
        assert out.stderr.strip().splitlines() == [
            f"durable: {cluster.url} is a Redis Cluster node: set DURABLE_REDIS_CLUSTER=1 "
            "(and DURABLE_QUEUE_URL to a plain server for RQ)"]


def test_durable_cluster_starts_and_stops_a_local_cluster(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "XDG_STATE_HOME": str(tmp_path)}
    where = tmp_path / "c"
    started = run_durable("cluster", "start", "--dir", str(where), env=env, timeout=120)
    assert started.returncode == 0, started.stderr
    url = started.stdout.split("DURABLE_REDIS_URL=")[1].split()[0]
    cluster = redis.RedisCluster.from_url(url)
    try:
        assert len(cluster.get_primaries()) == 3
        cluster.set("a", 1)
        assert cluster.get("a") == b"1"
    finally:
        cluster.close()
    again = run_durable("cluster", "start", "--dir", str(where), env=env)
    assert again.returncode == 2 and "already" in again.stderr
    stopped = run_durable("cluster", "stop", "--dir", str(where), env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert run_durable("cluster", "stop", "--dir", str(where), env=env).returncode == 1


def test_a_node_whose_port_was_taken_before_it_bound_is_started_on_another() -> None:
    """Window: a node's port drawn free, then taken by another process before the node
    binds it (parallel test processes, an outgoing connection). The node exits at once; it
    is started again on a new port and the cluster comes up."""
    cluster = LocalCluster(3, 0)
    taken = cluster.nodes[1].port
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        with cluster:
            assert cluster.nodes[1].port != taken
            r = redis.RedisCluster.from_url(cluster.url)
            try:
                assert len(r.get_primaries()) == 3
            finally:
                r.close()


def test_a_node_whose_port_another_server_answers_on_is_started_on_another(
    make_server: ServerFactory,
) -> None:
    """Window: another process's Redis (another test's cluster node) bound the drawn port
    first. It answers, but it is not this node, which exits unable to bind: the node is
    started again on a new port, and the cluster is made of its own nodes alone."""
    foreign = make_server()
    cluster = LocalCluster(3, 0)
    cluster.nodes[1].port = foreign.port
    with cluster:
        assert cluster.nodes[1].port != foreign.port
        r = redis.RedisCluster.from_url(cluster.url)
        try:
            assert len(r.get_primaries()) == 3
            assert foreign.port not in {n.port for n in r.get_nodes()}
        finally:
            r.close()
    assert foreign.client().info("cluster")["cluster_enabled"] == 0  # left alone


def test_stopping_a_cluster_whose_start_failed_signals_no_process_of_ours() -> None:
    """Window: a cluster's start fails before every node has a process; stopping it then
    must not signal pid 0 (this process's whole group: the test runner, its parent shell).
    Run in a child of its own session, so that a regression kills only the child."""
    code = ("from durable.backend.cluster import LocalCluster, Node\n"
            "c = LocalCluster(3, 0)\n"
            "assert not c.alive(Node(c.nodes[0].port))\n"
            "c.stop()\n"
            "print('alive')\n")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60, start_new_session=True)
    assert child.returncode == 0 and child.stdout.strip() == "alive", child.stderr
    assert max(cluster_port() for _ in range(50)) + 10000 < ephemeral_low()


def test_two_logs_of_different_layouts_live_in_one_process() -> None:
    """The layout belongs to a log, not to the process: an unsharded log on one server and
    a log of 4 shards on another, both open in this process, each run and listed in its own
    layout, neither one's keys written in the other's."""
    from durable.testing import AgentEnvironment

    with AgentEnvironment("examples.agents") as plain, \
            AgentEnvironment("examples.agents", shards=4) as sharded:
        assert (plain.client.log.keys, sharded.client.log.keys) == (KeyLayout(0), KeyLayout(4))
        a = plain.client.start("count", {"steps": 2}, run_id="same-id").run_id
        b = sharded.client.start("count", {"steps": 3}, run_id="same-id").run_id
        assert plain.status(a).state == sharded.status(b).state == "pending"
        assert plain.drain() and sharded.drain()
        assert plain.status(a).result == {"steps": 2}
        assert sharded.status(b).result == {"steps": 3}
        assert plain.redis.exists("dx:{same-id}:log") and \
            not plain.redis.exists(KeyLayout(4).log("same-id"))
        assert sharded.redis.exists(KeyLayout(4).log("same-id")) and \
            not sharded.redis.exists("dx:{same-id}:log")
        assert [s.run_id for s in plain.client.runs("completed")] == ["same-id"]
        assert [s.run_id for s in sharded.client.runs("completed")] == ["same-id"]
        assert len(list(sharded.client.events("same-id"))) > len(
            list(plain.client.events("same-id")))  # one more step, read from its own log
