"""The script batcher (``durable.log.batching``): calls of many threads in one pipeline, and
a command that rides along with a thread's next call (a slot's pop of the next ready run,
sent with its run's last commit). Real Redis, real threads."""

from __future__ import annotations

import threading

import redis

from durable.agents import registry
from durable.client import Client
from durable.log import keys
from durable.log.batching import ScriptBatcher
from durable.workers.loop import StepLoop
from durable.workers.pool import RunPool

READY = "test:ready"


def test_a_rider_goes_with_the_next_call_and_its_reply_is_kept(r: redis.Redis) -> None:
    batcher = ScriptBatcher(r)
    r.rpush(READY, "a", "b")
    batcher.ride_along("LPOP", READY)
    assert batcher.command("INCR", "n") == 1
    sent = batcher.ridden()
    assert sent is not None and sent.error is None and sent.reply == b"a"
    assert r.lrange(READY, 0, -1) == [b"b"]
    assert batcher.ridden() is None  # taken once


def test_a_rider_not_sent_is_dropped(r: redis.Redis) -> None:
    batcher = ScriptBatcher(r)
    r.rpush(READY, "a")
    batcher.ride_along("LPOP", READY)
    assert batcher.ridden() is None
    batcher.command("INCR", "n")
    assert r.lrange(READY, 0, -1) == [b"a"]
    assert batcher.ridden() is None


def test_a_reply_not_taken_is_never_overwritten(r: redis.Redis) -> None:
    """Window: a run's last commit is refused and made again (a conflict): the pop sent with
    the first attempt holds a run; the second attempt pops nothing more."""
    batcher = ScriptBatcher(r)
    r.rpush(READY, "a", "b")
    batcher.ride_along("LPOP", READY)
    batcher.command("INCR", "n")
    batcher.ride_along("LPOP", READY)
    batcher.command("INCR", "n")
    sent = batcher.ridden()
    assert sent is not None and sent.reply == b"a"
    assert r.lrange(READY, 0, -1) == [b"b"]


def test_a_riders_error_is_its_own(r: redis.Redis) -> None:
    batcher = ScriptBatcher(r)
    r.set("not-a-list", "x")
    batcher.ride_along("LPOP", "not-a-list")
    assert batcher.command("INCR", "n") == 1
    sent = batcher.ridden()
    assert sent is not None and isinstance(sent.error, redis.ResponseError)


def test_riders_of_many_threads_each_get_their_own_reply(r: redis.Redis) -> None:
    batcher = ScriptBatcher(r)
    r.rpush(READY, *[f"run-{i}" for i in range(40)])
    got: dict[int, tuple[object, object]] = {}

    def one(i: int) -> None:
        batcher.ride_along("LPOP", READY)
        reply = batcher.command("INCRBY", f"n{i}", i + 1)
        sent = batcher.ridden()
        got[i] = (reply, sent.reply if sent is not None else None)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(got[i][0] == i + 1 for i in range(40))
    popped = sorted(p for _, p in got.values() if isinstance(p, bytes))
    assert popped == sorted(f"run-{i}".encode() for i in range(40))
    assert r.llen(READY) == 0


def test_a_run_driven_on_rqs_thread_pops_nothing_along(client: Client) -> None:
    """Window: RQ's ``advance`` command drives a run on RQ's own thread, which takes no next
    run: its last commit must not pop one (it would be driven by nobody)."""
    loop = StepLoop(client.settings, client.redis, registry, "test-worker:1:000000")
    RunPool(loop, 1)
    ready = keys.ready(loop.queue.name, "count")
    run = client.start("count", {"steps": 2}, enqueue=False).run_id
    client.redis.rpush(ready, "someone-else")
    loop.advance(run)
    assert client.status(run).state == "completed"
    assert client.redis.lrange(ready, 0, -1) == [b"someone-else"]
