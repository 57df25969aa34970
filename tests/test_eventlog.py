"""The log on a real Redis: optimistic concurrency, idempotent start, quarantine, durability."""

from __future__ import annotations

import threading
import warnings

import pytest
import redis

from durable.audit.verify import verify
from durable.client import Client
from durable.errors import (
    ConflictError,
    InvalidInput,
    PayloadTooLarge,
    RunIdConflict,
    UnknownAgent,
)
from durable.log import blobs, store
from durable.log import events as ev
from durable.log.state import RunState
from durable.log.store import EventLog, RunHandle, Spec
from tests.agents import basic  # noqa: F401 - registers the test agents
from tests.conftest import ServerFactory


@pytest.mark.cluster
def test_start_is_idempotent_and_writes_nothing_the_second_time(client: Client,
                                                                r: redis.Redis) -> None:
    first = client.start("count", {"steps": 2}, run_id="same", enqueue=False)
    assert first.created and first.state == "pending"
    before = r.xlen(client.log.keys.log("same"))
    again = client.start("count", {"steps": 2}, run_id="same", enqueue=False)
    assert not again.created and again.run_id == "same"
    with pytest.raises(RunIdConflict):  # another input under the same id is refused
        client.start("count", {"steps": 99}, run_id="same", enqueue=False)
    assert r.xlen(client.log.keys.log("same")) == before == 1
    assert client.status("same").input == {"steps": 2, "sleep_s": 0.0}


@pytest.mark.cluster
def test_invalid_input_is_refused_before_anything_is_written(client: Client,
                                                             r: redis.Redis) -> None:
    with pytest.raises(InvalidInput, match="steps"):
        client.start("count", {"steps": "many"}, run_id="bad")
    with pytest.raises(UnknownAgent, match="nope"):
        client.start("nope", {}, run_id="bad")
    assert not r.exists(client.log.keys.log("bad")) and not r.exists(client.log.keys.run("bad"))


def test_oversized_input_is_refused(client: Client, r: redis.Redis) -> None:
    """Past the inline limit an input is kept beside the run (``tests.test_large_inputs``);
    past the ceiling of large values it is refused, nothing written."""
    client.settings.payloads.max_payload_bytes = 1024
    client.log.limits = blobs.Limits(inline=1024, ceiling=1536)
    with pytest.raises(PayloadTooLarge, match="DURABLE_MAX_RESULT_BYTES"):
        client.start("echo", {"text": "y" * 2000}, run_id="big")
    assert not r.exists(client.log.keys.log("big"))
    assert not r.exists(client.log.keys.blobs("big"))


@pytest.mark.cluster
def test_concurrent_writers_with_the_same_version_exactly_one_wins(client: Client,
                                                                   r: redis.Redis) -> None:
    """N threads append at the same expected version, M trials: one winner each time."""
    client.start("count", {"steps": 1}, run_id="race", enqueue=False)
    elog = EventLog(r, layout=client.log.keys)
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
    r.xadd(client.log.keys.log("junk"), {"e": b"\xc1 not msgpack"})
    state = client.status("junk")
    assert state.state == "quarantined"
    assert "unreadable log entry" in (state.reason or "")
    assert "junk" in [s.run_id for s in client.runs("quarantined")]


@pytest.mark.cluster
def test_a_future_version_entry_quarantines_with_the_reason(client: Client,
                                                            r: redis.Redis) -> None:
    import msgspec

    client.start("count", {"steps": 1}, run_id="future", enqueue=False)
    r.xadd(client.log.keys.log("future"), {"e": msgspec.msgpack.encode(
        {"type": "completed", "v": 99, "run": "future", "seq": 2, "ts": 1})})
    r.hset(client.log.keys.run("future"), "version", 2)
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
    from durable.backend.connection import connect
    from durable.errors import UnsafeRedis
    from durable.settings import Settings

    srv = make_server(fsync="everysec")
    conn = srv.client()
    with warnings_as_list() as caught:
        connect(Settings.from_env(redis_url=srv.url)).close()
    assert not [w for w in caught if issubclass(w.category, UnsafeRedis)]
    conn.config_set("appendonly", "no")
    conn.config_set("maxmemory-policy", "allkeys-lru")
    with pytest.warns(UnsafeRedis) as record:
        connect(Settings.from_env(redis_url=srv.url)).close()
    messages = " | ".join(str(w.message) for w in record)
    assert "appendonly is off" in messages and "allkeys-lru" in messages

    # The same with a password: the warning names the server without it.
    conn.config_set("requirepass", "s3cret-pw")
    url = srv.url.replace("redis://", "redis://:s3cret-pw@")
    with pytest.warns(UnsafeRedis) as record:
        connect(Settings.from_env(redis_url=url)).close()
    messages = " | ".join(str(w.message) for w in record)
    assert "s3cret-pw" not in messages and ":***@127.0.0.1" in messages
    with redis.Redis.from_url(url) as again:
        again.config_set("requirepass", "")


def warnings_as_list() -> warnings.catch_warnings[list[warnings.WarningMessage]]:
    return warnings.catch_warnings(record=True)


def _v3(event_type: str, seq: int, ts: int, actor: str, **fields: object) -> bytes:
    import msgspec

    return msgspec.msgpack.encode({"type": event_type, "v": 3, "run": "old", "seq": seq,
                                   "ts": ts, "actor": actor, **fields})


@pytest.mark.cluster
def test_a_log_written_by_the_previous_schema_goes_on_under_the_new_one(
    client: Client, r: redis.Redis
) -> None:
    """A run started and stepped by v3 code (maps, ids from ``XADD *``) is loaded, written
    to in the v4 form after its old entries, read back whole and verified."""
    log = client.log.keys.log("old")
    ids = [r.xadd(log, {"e": data}).decode() for data in (
        _v3("run_started", 1, 1000, "client", agent="count", agent_version="1",
            input={"steps": 1, "sleep_s": 0.0}, tools=["noop"]),
        _v3("step_decided", 2, 1001, "w-old", step=1, tool="noop", args={"n": 1}, key="old:1"),
    )]
    r.hset(client.log.keys.run("old"), mapping={"version": 2, "state": "pending", "step": 1,
                                                "last": ids[-1], "cancel": "0"})
    handle = client.log.load("old", actor="w-old")
    assert handle.state.step == 1 and handle.tail_actor == "w-old"
    client.log.commit(handle, [Spec(ev.ActionDispatched, {"step": 1, "key": "old:1",
                                                          "deadline": 10**13}),
                               Spec(ev.ActionSucceeded, {"step": 1, "key": "old:1",
                                                         "result": {"n": 1}}),
                               Spec(ev.Completed, {"result": "done"})],
                      ledger=[("c", "old:1", "claimed")])
    events = [e.event for e in client.events("old")]
    assert [e.v for e in events if e] == [ev.SCHEMA_VERSION] * 5
    assert [(e.seq, e.actor, e.run) for e in events if e] == [
        (1, "client", "old"), (2, "w-old", "old"), (3, "w-old", "old"), (4, "w-old", "old"),
        (5, "w-old", "old")]
    assert events[0] is not None and events[0].ts == 1000  # a v3 entry keeps its own time
    raw = [e for _, e in r.xrange(log)]
    assert raw[2][b"e"][0] & 0xF0 == 0x90  # the new entries are the v4 arrays
    assert client.status("old").state == "completed"
    assert verify(client.log, "old").ok


@pytest.mark.cluster
def test_entries_read_back_with_the_run_time_and_actor_their_place_gives(
    client: Client, r: redis.Redis
) -> None:
    """Each entry's id is its writer's time; an entry whose actor is the previous one's
    leaves it out, and a read from any offset still gets it right."""
    client.start("count", {"steps": 3}, run_id="place", enqueue=False)
    elog = client.log
    for actor in ("w1", "w1", "w2", "w2", "w2"):
        handle = elog.load("place", actor=actor)
        elog.commit(handle, [Spec(ev.LeaseAcquired, {"owner": actor, "epoch": 1})])
    entries = elog.read("place")
    named = [ev.named_actor(f[b"e"]) for _, f in r.xrange(client.log.keys.log("place"))]
    assert named == [True, True, False, True, False, False]
    assert [e.event.actor for e in entries if e.event] == [
        "client", "w1", "w1", "w2", "w2", "w2"]
    assert all(e.event and e.event.ts == ev.entry_ms(e.id) for e in entries)
    for i, start in enumerate(e.id for e in entries):
        tail = elog.read("place", start)
        assert [e.event for e in tail] == [e.event for e in entries[i:]]


def test_a_writer_whose_clock_is_behind_the_log_appends_after_it(
    client: Client, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Window: the writer's clock is an hour behind the log's last entry (another host's
    clock). Its entries go after that entry, at that entry's time, and read back so."""
    client.start("count", {"steps": 1}, run_id="skew", enqueue=False)
    handle = client.log.load("skew", actor="w")
    last = ev.entry_ms(handle.last_id)
    monkeypatch.setattr(store, "now_ms", lambda: last - 3_600_000)
    client.log.commit(handle, [Spec(ev.LeaseAcquired, {"owner": "w", "epoch": 1}),
                               Spec(ev.Released, {"by": "w"})])
    entries = client.log.read("skew")
    assert [e.id for e in entries] == [f"{last}-0", f"{last}-1", f"{last}-2"]
    assert all(e.event and e.event.ts == ev.entry_ms(e.id) for e in entries)
    assert verify(client.log, "skew").ok


def test_entries_deleted_past_the_tail_do_not_stop_the_log(client: Client,
                                                           r: redis.Redis) -> None:
    """Window: an admin deleted an entry (``XDEL``) whose id was ahead of every writer's
    clock: the stream's top id is in the future. The next append still lands."""
    client.start("count", {"steps": 1}, run_id="gap", enqueue=False)
    handle = client.log.load("gap", actor="w")
    ahead = f"{ev.entry_ms(handle.last_id) + 3_600_000}-0"
    r.xadd(client.log.keys.log("gap"), {"e": b"x"}, id=ahead)
    r.xdel(client.log.keys.log("gap"), ahead)
    client.log.commit(handle, [Spec(ev.LeaseAcquired, {"owner": "w", "epoch": 1})])
    assert r.xrevrange(client.log.keys.log("gap"), count=1)[0][0].decode() > ahead
    assert verify(client.log, "gap").ok


@pytest.mark.cluster
def test_a_short_run_s_log_is_rewritten_to_its_exact_size_when_it_ends(
    client: Client, r: redis.Redis
) -> None:
    """Redis keeps 4 KB ahead of need in a stream's newest node; a run that ends with a
    short log gives them back (its entries, ids and order unchanged)."""
    client.start("count", {"steps": 1}, run_id="small", enqueue=False)
    handle = client.log.load("small", actor="w")
    client.log.commit(handle, [Spec(ev.LeaseAcquired, {"owner": "w", "epoch": 1})])
    before = r.memory_usage(client.log.keys.log("small"), samples=0)
    ids = [i for i, _ in r.xrange(client.log.keys.log("small"))]
    client.log.commit(handle, [Spec(ev.Completed, {"result": 1})])
    after = r.memory_usage(client.log.keys.log("small"), samples=0)
    assert after < before - 2000, (before, after)
    assert [i for i, _ in r.xrange(client.log.keys.log("small"))][:-1] == ids
    assert client.status("small").state == "completed" and verify(client.log, "small").ok
