"""The log on a real Redis: optimistic concurrency, idempotent start, quarantine, durability."""

from __future__ import annotations

import threading

import pytest
import redis

from durable.client import Client
from durable.errors import (
    ConflictError,
    InvalidInput,
    PayloadTooLarge,
    RunIdConflict,
    UnknownAgent,
)
from durable.log import events as ev
from durable.log import keys
from durable.log.state import RunState
from durable.log.store import EventLog, RunHandle, Spec
from durable.log.verify import verify
from tests import agents  # noqa: F401 - registers the test agents
from tests.conftest import ServerFactory


@pytest.mark.cluster
def test_start_is_idempotent_and_writes_nothing_the_second_time(client: Client,
                                                                r: redis.Redis) -> None:
    first = client.start("count", {"steps": 2}, run_id="same", enqueue=False)
    assert first.created and first.state == "pending"
    before = r.xlen(keys.log("same"))
    again = client.start("count", {"steps": 2}, run_id="same", enqueue=False)
    assert not again.created and again.run_id == "same"
    with pytest.raises(RunIdConflict):  # another input under the same id is refused
        client.start("count", {"steps": 99}, run_id="same", enqueue=False)
    assert r.xlen(keys.log("same")) == before == 1
    assert client.status("same").input == {"steps": 2, "sleep_s": 0.0}


@pytest.mark.cluster
def test_invalid_input_is_refused_before_anything_is_written(client: Client,
                                                             r: redis.Redis) -> None:
    with pytest.raises(InvalidInput, match="steps"):
        client.start("count", {"steps": "many"}, run_id="bad")
    with pytest.raises(UnknownAgent, match="nope"):
        client.start("nope", {}, run_id="bad")
    assert not r.exists(keys.log("bad")) and not r.exists(keys.run("bad"))


def test_oversized_input_is_refused(client: Client, r: redis.Redis) -> None:
    client.settings.max_payload_bytes = 1024
    with pytest.raises(PayloadTooLarge):
        client.start("echo", {"text": "y" * 2000}, run_id="big")
    assert not r.exists(keys.log("big"))


@pytest.mark.cluster
def test_concurrent_writers_with_the_same_version_exactly_one_wins(client: Client,
                                                                   r: redis.Redis) -> None:
    """N threads append at the same expected version, M trials: one winner each time."""
    client.start("count", {"steps": 1}, run_id="race", enqueue=False)
    elog = EventLog(r)
    n_threads, trials = 8, 25
    for trial in range(trials):
        base = elog.load("race")
        results: list[str] = []
        barrier = threading.Barrier(n_threads)

        def writer(i: int, version: int, barrier: threading.Barrier, results: list[str],
                   trial: int) -> None:
            handle = RunHandle("race", RunState(run_id="race", version=version),
                               base_version=version, actor=f"t{i}")
            barrier.wait()
            try:
                elog.commit(handle, [Spec(ev.LeaseAcquired, {"owner": f"t{i}", "epoch": trial})])
                results.append("won")
            except ConflictError:
                results.append("conflict")

        threads = [threading.Thread(target=writer, args=(i, base.state.version, barrier,
                                                         results, trial))
                   for i in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results.count("won") == 1, results
    entries = elog.read("race")
    assert [e.event.seq for e in entries if e.event] == list(range(1, trials + 2))
    assert verify(elog, "race").ok


@pytest.mark.cluster
def test_an_undecodable_entry_quarantines_the_run_and_never_raises(client: Client,
                                                                   r: redis.Redis) -> None:
    client.start("count", {"steps": 1}, run_id="junk", enqueue=False)
    r.xadd(keys.log("junk"), {"e": b"\xc1 not msgpack"})
    state = client.status("junk")
    assert state.state == "quarantined"
    assert "unreadable log entry" in (state.reason or "")
    assert "junk" in [s.run_id for s in client.runs("quarantined")]


@pytest.mark.cluster
def test_a_future_version_entry_quarantines_with_the_reason(client: Client,
                                                            r: redis.Redis) -> None:
    import msgspec

    client.start("count", {"steps": 1}, run_id="future", enqueue=False)
    r.xadd(keys.log("future"), {"e": msgspec.msgpack.encode(
        {"type": "completed", "v": 99, "run": "future", "seq": 2, "ts": 1})})
    r.hset(keys.run("future"), "version", 2)
    state = client.status("future")
    assert state.state == "quarantined" and "newer schema version 99" in (state.reason or "")


def test_acknowledged_events_survive_a_kill_9_of_the_server(make_server: ServerFactory) -> None:
    """Window: the server SIGKILLed right after the appends were acknowledged (appendfsync
    always), then started again on the same port and data."""
    srv = make_server(fsync="always")
    elog = EventLog(srv.client())
    handle = RunHandle("dur", RunState(), actor="t")
    elog.commit(handle, [Spec(ev.RunStarted, {"agent": "count", "input": {"steps": 1}})])
    for i in range(50):
        elog.commit(handle, [Spec(ev.LeaseAcquired, {"owner": "x", "epoch": i})])
    acknowledged = handle.state.version
    srv.restart()  # kill -9, then the same port and data
    reloaded = EventLog(srv.client()).load("dur")
    assert reloaded.state.version == acknowledged == 51


def test_connecting_to_a_server_that_could_lose_events_warns_clearly(
    make_server: ServerFactory,
) -> None:
    from durable.connection import connect
    from durable.errors import UnsafeRedis
    from durable.settings import Settings

    srv = make_server(fsync="everysec")
    conn = srv.client()
    with warnings_as_list() as caught:
        connect(Settings(redis_url=srv.url)).close()
    assert not [w for w in caught if issubclass(w.category, UnsafeRedis)]
    conn.config_set("appendonly", "no")
    conn.config_set("maxmemory-policy", "allkeys-lru")
    with pytest.warns(UnsafeRedis) as record:
        connect(Settings(redis_url=srv.url)).close()
    messages = " | ".join(str(w.message) for w in record)
    assert "appendonly is off" in messages and "allkeys-lru" in messages

    # The same with a password: the warning names the server without it.
    conn.config_set("requirepass", "s3cret-pw")
    url = srv.url.replace("redis://", "redis://:s3cret-pw@")
    with pytest.warns(UnsafeRedis) as record:
        connect(Settings(redis_url=url)).close()
    messages = " | ".join(str(w.message) for w in record)
    assert "s3cret-pw" not in messages and ":***@127.0.0.1" in messages
    with redis.Redis.from_url(url) as again:
        again.config_set("requirepass", "")


def warnings_as_list() -> object:
    import warnings

    return warnings.catch_warnings(record=True)
