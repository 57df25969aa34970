"""Recovery within a second: a dead worker's runs resume at once on another worker (its
liveness key expired, the reconciler released its leases run by run), and live workers take
their runs again as soon as a restarted Redis answers. Real Redis, real worker processes,
real SIGKILLs; the figures measured are printed (``pytest -s``) and recorded as properties.
The first two run on a 3-master cluster too (``pytest --cluster``): every lease is released
by a script call on its own run's slot.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest
import redis

from durable.client import Client
from durable.errors import LeaseLost
from durable.leases import Heartbeats, Lease, Leases
from durable.log import events as ev
from durable.log import keys
from durable.log.keys import KeyLayout
from durable.log.store import Spec
from durable.settings import Settings
from durable.telemetry.liveness import Presence, dead_workers, held_by, release_worker
from durable.testing import Reconciler, Worker, wait_for
from tests.conftest import ReconcilerFactory, ServerFactory, WorkerFactory

RUNS = 200


def _owner(value: bytes | None) -> str:
    return value.decode().rsplit("|", 1)[0] if value else ""


def _owners(layout: KeyLayout, r: redis.Redis, runs: list[str]) -> list[str]:
    pipe = r.pipeline(transaction=False)
    for run in runs:
        pipe.get(layout.lease(run))
    return [_owner(v) for v in pipe.execute()]


def _live_workers(r: redis.Redis) -> set[str]:
    members = {m.decode() for m in r.smembers(keys.WORKERS)}
    return {m for m in members if r.exists(keys.alive(m))}


@pytest.mark.cluster
def test_a_dead_workers_leases_are_released_run_by_run_and_only_its_own(
    layout: KeyLayout, client: Client, r: redis.Redis
) -> None:
    """The reconciler's part alone, on the real scripts: a worker whose liveness key is gone
    is found, exactly its leases are released (another live worker's is kept), and a write
    under a released lease is refused (fencing: it may have been only slow)."""
    runs = [client.start("count", {"steps": 3}, run_id=f"lr-{i}", enqueue=False).run_id
            for i in range(6)]
    leases = Leases(r, 60_000, client.log.keys)
    held = [leases.acquire(run, "host:1:dead")[0] for run in runs[:4]]
    other = leases.acquire(runs[4], "host:2:live")[0]
    presence = Presence(r, "host:2:live", 60_000)
    presence.beat()
    Presence(r, "host:1:dead", 60_000).beat()
    r.delete(keys.alive("host:1:dead"))  # its key expired: it did not beat again
    assert dead_workers(r) == ["host:1:dead"]
    assert sorted(run for run, _ in held_by(r, client.log.keys, "host:1:dead")) == sorted(runs[:4])

    released = release_worker(r, client.log.keys,
                              lambda run, value: leases.release(Lease(run, value)),
                              "host:1:dead")
    assert sorted(released) == sorted(runs[:4])
    assert _owners(layout, r, runs[4:5]) == ["host:2:live"] and other is not None
    assert dead_workers(r) == []  # forgotten until it beats again
    assert int(r.hget(keys.STATS, "dead_worker_leases_released") or 0) == 4

    # Fencing: the "dead" worker was only slow; its write under the old lease is refused.
    stale = held[0]
    assert stale is not None
    handle = client.log.load(runs[0], lease=stale.value, actor="host:1:dead")
    with pytest.raises(LeaseLost):
        client.log.commit(handle, [Spec(ev.LeaseAcquired, {"owner": "host:1:dead",
                                                            "epoch": stale.epoch})])


@pytest.mark.cluster
def test_a_beat_leaves_out_a_lease_its_holders_write_renewed_a_moment_before(
    client: Client, r: redis.Redis
) -> None:
    """``Heartbeats``: a lease renewed by a write (``append.lua`` sets its TTL again) under a
    third of a beat before is left out of the beat; one written earlier, or never, is
    renewed. Read on the leases' real TTLs, after both were brought down to 10 s."""
    runs = [client.start("count", {"steps": 3}, run_id=f"hb-{i}", enqueue=False).run_id
            for i in range(2)]
    leases = Leases(r, 60_000, client.log.keys)  # a beat every 20 s: none of its own here
    beats = Heartbeats(leases)
    held = [leases.acquire(run, "host:1:hb")[0] for run in runs]
    assert all(lease is not None for lease in held)
    fresh, stale = [lease for lease in held if lease is not None]
    for lease in (fresh, stale):
        beats.hold(lease, lambda: None)

    def aged() -> list[int]:
        for run in runs:
            r.pexpire(client.log.keys.lease(run), 10_000)
        return [int(r.pttl(client.log.keys.lease(run))) for run in runs]

    assert max(aged()) <= 10_000
    beats.written(fresh.run_id, fresh.value, time.monotonic())
    beats.written(stale.run_id, stale.value, time.monotonic() - beats.interval / 2)
    assert beats.beat() == 0
    ttl = [int(r.pttl(client.log.keys.lease(run))) for run in runs]
    assert ttl[0] <= 10_000 < 50_000 < ttl[1], ttl  # the fresh one left out

    assert max(aged()) <= 10_000
    beats.written(fresh.run_id, fresh.value, time.monotonic() - beats.interval / 2)
    assert beats.beat() == 0
    ttl = [int(r.pttl(client.log.keys.lease(run))) for run in runs]
    assert min(ttl) > 50_000, ttl  # both renewed: the write is no longer recent


def test_sigkill_of_a_worker_holding_200_runs_resumes_them_within_a_second(
    layout: KeyLayout,
    client: Client, r: redis.Redis, worker: WorkerFactory, reconciler: ReconcilerFactory,
    tmp_path: Path, record_property: object,
) -> None:
    """Crash window: a worker is SIGKILLed while it holds 200 runs, each inside its first
    tool call (intent and claim recorded, outcome not), with the default liveness TTL
    (600 ms) and lease TTL (5 s). Another worker takes every run: median under a second
    after the kill, every run well before the lease's TTL would have let it."""
    a = worker(DURABLE_CONCURRENCY="256", DURABLE_LEASE_TTL_MS="5000",
               log_path=tmp_path / "a.log")
    rec = reconciler(DURABLE_LEASE_TTL_MS="5000", log_path=tmp_path / "rec.log")
    runs = [h.run_id for h in client.start_many(
        "count", [{"steps": 1, "sleep_s": 60}] * RUNS, run_ids=[f"kill-{i}" for i in range(RUNS)])]
    assert wait_for(lambda: len(set(_owners(layout, r, runs)) - {""}) == 1
                    and all(_owners(layout, r, runs)),
                    60, 0.1), a.log_path.read_text()[-2000:] if a.log_path else ""
    dead = _owners(layout, r, runs)[0]
    b = worker(DURABLE_CONCURRENCY="256", DURABLE_LEASE_TTL_MS="5000",
               log_path=tmp_path / "b.log")
    assert wait_for(lambda: len(_live_workers(r)) == 2, 30, 0.05)
    (survivor,) = _live_workers(r) - {dead}
    epochs = {run: int(r.get(client.log.keys.fence(run)) or 0) for run in runs}

    a.kill()
    killed = time.monotonic()
    resumed: dict[str, float] = {}

    def all_resumed() -> bool:
        now = time.monotonic() - killed
        for run, owner in zip(runs, _owners(layout, r, runs), strict=True):
            if owner == survivor and run not in resumed:
                resumed[run] = now
        return len(resumed) == RUNS

    assert wait_for(all_resumed, 30, 0.01), (len(resumed), rec.alive(), b.alive())
    took = sorted(resumed.values())
    p50, p95 = statistics.median(took), took[int(0.95 * len(took)) - 1]
    print(f"\n{RUNS} runs of a SIGKILLed worker resumed after: p50 {p50:.2f} s, "
          f"p95 {p95:.2f} s, max {took[-1]:.2f} s")
    record_property("resumed_p50_s", round(p50, 3))  # type: ignore[operator]
    record_property("resumed_p95_s", round(p95, 3))  # type: ignore[operator]
    # Generous on a shared 2-core machine; the lease's TTL path took 9.5-10.6 s.
    assert p50 <= 2.0, took
    assert took[-1] <= 4.0, took
    # new epochs
    assert all(int(r.get(client.log.keys.fence(run)) or 0) > epochs[run] for run in runs)
    assert int(r.hget(keys.STATS, "dead_workers") or 0) == 1


def test_redis_restart_workers_take_their_runs_again_within_a_second_of_it_answering(
    layout: KeyLayout, make_server: ServerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    record_property: object,
) -> None:
    """Crash window: Redis is killed -9 while a worker drives 20 runs step after step (an
    append every 0.1 s each; the tool is effect-free, so a run taken again resends its open
    call at once and writes), down for 2 s -- longer than the liveness TTL, shorter than the
    leases' -- then restarted on the same data. Every run is taken again and writes within a
    second of Redis answering; the reconciler does not mistake the worker for dead."""
    srv = make_server(fsync="always")
    monkeypatch.setenv("DURABLE_REDIS_URL", srv.url)
    monkeypatch.setenv("DURABLE_AGENTS", "tests.agents.liveness")
    client = Client(Settings())
    runs = [h.run_id for h in client.start_many(
        "stepper", [{"steps": 100_000, "sleep_s": 0.1}] * 20,
        run_ids=[f"rs-{i}" for i in range(20)])]
    w = Worker(srv.url, log_path=tmp_path / "w.log")
    rec = Reconciler(srv.url, log_path=tmp_path / "rec.log")
    try:
        assert wait_for(lambda: all(_owners(layout, client.redis, runs)), 30, 0.05)
        wait_for(lambda: False, 1.0)  # steps under way
        srv.kill()
        wait_for(lambda: False, 2.0)  # the outage itself
        srv.start()
        r = redis.Redis.from_url(srv.url)
        assert wait_for(lambda: _pings(r), 30, 0.002)
        answered_ms = int(time.time() * 1000)
        first: dict[str, float] = {}

        def all_back() -> bool:
            for run in runs:
                if run in first:
                    continue
                entry = r.xrange(keys.UNSHARDED.log(run), str(answered_ms), "+", count=1)
                if entry:
                    first[run] = (int(entry[0][0].split(b"-")[0]) - answered_ms) / 1000
            return len(first) == len(runs)

        assert wait_for(all_back, 30, 0.02), (sorted(first.values()), w.alive())
        took = sorted(first.values())
        print(f"\nafter a Redis restart, runs written again: p50 {statistics.median(took):.2f}"
              f" s, max {took[-1]:.2f} s after it answered")
        record_property("reacquired_max_s", round(took[-1], 3))  # type: ignore[operator]
        assert took[-1] <= 1.5, took  # the reconciler's lease path took 7.7-8.4 s
        assert int(r.hget(keys.STATS, "dead_workers") or 0) == 0
        assert w.alive() and rec.alive()
        r.close()
    finally:
        w.stop()
        rec.stop()
        client.close()


def _pings(r: redis.Redis) -> bool:
    try:
        return bool(r.ping())
    except redis.RedisError:
        return False
