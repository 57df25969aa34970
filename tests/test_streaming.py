"""Following a run: every log event in order with the partial output its steps emit
(``ToolContext.emit`` -> the run's stream channel), live, late, resumed, async, and through
``durable log RUN --follow``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any

import pytest
import redis

from durable.client import Client
from durable.errors import RunNotFound
from durable.log import events as ev
from durable.log.store import Entry
from durable.streams import async_streaming, streaming
from durable.streams.streaming import (
    Partial,
    afollow,
    async_twin,
    decode_partial,
    encode_partial,
)
from durable.testing import Server, env_for, wait_for
from tests.conftest import WorkerFactory, run_durable

pytestmark = pytest.mark.timeout(90)


def _tags(items: list[Any]) -> list[str]:
    return ["partial" if isinstance(i, Partial) else i.event.__struct_config__.tag
            for i in items]


def _ids(items: list[Any]) -> list[str]:
    return [i.id for i in items if isinstance(i, Entry)]


def _entries(items: Iterable[Entry | Partial]) -> list[Entry]:
    """``items``, which must all be log entries (no partial output)."""
    got = list(items)
    assert all(isinstance(i, Entry) for i in got), got
    return [i for i in got if isinstance(i, Entry)]


def _check_live(items: list[Any], client: Client, run_id: str) -> None:
    """Every event in log order, and the tool's partial output after its dispatch and
    before its outcome."""
    assert _ids(items) == [e.id for e in client.events(run_id)]
    tags = _tags(items)
    assert tags[-1] == "completed"
    partials = [i for i in items if isinstance(i, Partial)]
    assert [(p.run, p.step, p.seq, p.data) for p in partials] == [
        (run_id, 1, n + 1, {"token": f"tok{n}"}) for n in range(3)]
    first = tags.index("partial")
    assert tags.index("action_dispatched") < first
    assert max(i for i, t in enumerate(tags) if t == "partial") < tags.index(
        "action_succeeded")


def test_a_follower_sees_partial_output_before_the_steps_outcome(
    client: Client, worker: WorkerFactory
) -> None:
    client.start("chat", {"parts": 3, "pause_s": 0.5}, run_id="live-1")
    with client.follow("live-1") as follower:  # subscribed from here on
        worker()
        items = list(follower)
    _check_live(items, client, "live-1")
    assert client.status("live-1").result == {"said": ["tok0", "tok1", "tok2"]}


@pytest.mark.parametrize("side", ["sync", "async"])
def test_a_call_heard_before_its_dispatch_is_read_is_yielded_after_it(
    client: Client, worker: WorkerFactory, monkeypatch: pytest.MonkeyPatch, side: str
) -> None:
    """Window: the subscription hears a call's output before the follower's log reader has
    read the call's dispatch (here every log read is made 0.4 s late, as on a loaded
    machine). The output waits for its dispatch: the follower still yields the dispatch,
    then the output, then the call's end."""
    slow: Any = {"sync": streaming._Blocking, "async": async_streaming._Awaited}[side]
    read = slow.xread

    async def late(self: Any, last: str, block: int | None) -> Any:
        if side == "sync":
            time.sleep(0.4)  # the sync follower's reads are made at once, on its thread
        else:
            await asyncio.sleep(0.4)
        return await read(self, last, block)

    monkeypatch.setattr(slow, "xread", late)
    client.start("chat", {"parts": 3, "pause_s": 0.02}, run_id=f"lag-{side}")
    if side == "sync":
        with client.follow(f"lag-{side}") as follower:
            worker()
            items: list[Any] = list(follower)
    else:
        async def gather() -> list[Any]:
            got: list[Any] = []
            async for item in afollow(async_twin(client.redis), client.log.keys,
                                      f"lag-{side}", close_client=True):
                if not got:
                    worker()  # subscribed by the first item
                got.append(item)
            return got
        items = asyncio.run(gather())
    _check_live(items, client, f"lag-{side}")


def test_a_follower_that_joins_after_the_end_gets_every_event(
    client: Client, worker: WorkerFactory
) -> None:
    client.start("chat", {"parts": 2, "pause_s": 0.0}, run_id="late-1")
    worker()
    assert client.wait("late-1", 30).state == "completed"
    logged = client.events("late-1")

    items = _entries(client.follow("late-1"))  # no partial: best-effort, only live
    assert [i.event for i in items] == [e.event for e in logged]  # actors and times too
    assert isinstance(items[-1].event, ev.Completed)

    # Resuming after an entry yields the entries after it; after the last one, nothing.
    assert [i.event for i in _entries(client.follow("late-1", from_id=logged[2].id))] == [
        e.event for e in logged[3:]]
    assert list(client.follow("late-1", from_id=logged[-1].id, partial=False)) == []
    with pytest.raises(RunNotFound):
        client.follow("no-such-run")


def test_a_follower_reconnecting_mid_run_misses_no_event(
    client: Client, worker: WorkerFactory
) -> None:
    """A follower stopped after the first event and started again from its last id gets
    the rest of the log, in order, each event once."""
    client.start("chat", {"parts": 2, "pause_s": 0.3}, run_id="resume-1")
    first = client.follow("resume-1", partial=False)
    head = _entries([next(first)])
    first.close()
    worker()
    rest = list(client.follow("resume-1", from_id=head[-1].id, partial=False))
    assert _ids(head + rest) == [e.id for e in client.events("resume-1")]


def test_the_async_follower_sees_the_same(client: Client, worker: WorkerFactory) -> None:
    client.start("chat", {"parts": 3, "pause_s": 0.5}, run_id="async-1")

    async def follow() -> list[Any]:
        items: list[Any] = []
        async for item in client.afollow("async-1"):
            items.append(item)
            if len(items) == 1:  # subscribed and reading: now let a worker take the run
                worker()
        return items

    items = asyncio.run(follow())
    _check_live(items, client, "async-1")

    async def missing() -> None:
        async for _ in client.afollow("no-such-run"):
            pass

    with pytest.raises(RunNotFound):
        asyncio.run(missing())


def test_an_async_follower_closed_before_the_runs_end_stops_at_once(
        client: Client, worker: WorkerFactory) -> None:
    """A follower of a run that waits (it will not end) is closed as soon as it has the
    wait's entry: ``aclose`` returns at once. (redis-py can lose a cancel that lands while
    a pump awaits an ``XREAD``'s reply: the pumps are cancelled until they end; before,
    ``aclose`` waited for the run's end.)"""
    client.start("asker", {"text": "x"}, run_id="closed-1")
    worker()

    async def follow() -> float:
        items = client.afollow("closed-1")
        async for item in items:
            if isinstance(item, Entry) and isinstance(item.event, ev.WaitEntered):
                break
        t0 = time.monotonic()
        await asyncio.wait_for(items.aclose(), 10)  # type: ignore[attr-defined]
        return time.monotonic() - t0

    assert asyncio.run(follow()) < 2.0
    assert client.status("closed-1").state == "waiting_input"


def test_durable_log_follow_json_prints_every_event_and_exits_at_the_end(
    server: Server, client: Client, r: redis.Redis, worker: WorkerFactory
) -> None:
    client.start("chat", {"parts": 3, "pause_s": 0.3}, run_id="cli-follow-1")
    proc = subprocess.Popen([sys.executable, "-m", "durable", "log", "cli-follow-1",
                             "--follow", "--json"], env=env_for(server.url),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Once it listens for partial output, start the worker.
        channel = client.log.keys.stream("cli-follow-1")
        assert wait_for(lambda: r.pubsub_numsub(channel)[0][1] >= 1, 30)
        worker()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    events = [x for x in lines if x["type"] != "partial"]
    assert [x["id"] for x in events] == [e.id for e in client.events("cli-follow-1")]
    assert events[-1]["type"] == "completed"
    assert [x["data"]["token"] for x in lines if x["type"] == "partial"] == [
        "tok0", "tok1", "tok2"]


def test_durable_log_follow_prints_lines_for_people(
    server: Server, client: Client, worker: WorkerFactory
) -> None:
    client.start("chat", {"parts": 1, "pause_s": 0.0}, run_id="cli-follow-2")
    worker()
    assert client.wait("cli-follow-2", 30).state == "completed"
    first = client.events("cli-follow-2")[1].id
    out = run_durable("log", "cli-follow-2", "--follow", "--from", first,
                      env=env_for(server.url))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(first) and "completed" in lines[-1]
    assert len(lines) == len(client.events("cli-follow-2")) - 1


def test_following_a_quarantined_run_stops_and_says_so(
    server: Server, client: Client, worker: WorkerFactory
) -> None:
    """A quarantined run writes nothing more until an operator releases it: ``--follow``
    prints the quarantine, says so on stderr and exits 1 instead of waiting for ever."""
    client.start("buggy", {}, run_id="ghost-follow")  # its code raises after one step
    worker()
    assert client.wait("ghost-follow", 30).state == "quarantined"
    out = run_durable("log", "ghost-follow", "--follow", env=env_for(server.url))
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "quarantined" in out.stdout.splitlines()[-1]
    assert out.stderr.startswith("durable: ghost-follow is quarantined (agent buggy raised")


def test_partial_output_that_is_not_plain_data_is_omitted_not_fatal() -> None:
    raw = encode_partial("r1", 2, 1, 5, {"x": object()}, 1024)
    found = decode_partial(raw)
    assert found is not None and (found.run, found.step, found.seq) == ("r1", 2, 5)
    assert "_omitted" in found.data
    big = decode_partial(encode_partial("r1", 2, 1, 6, "x" * 5000, 1024))
    assert big is not None and "exceeds 1024" in big.data["_omitted"]
    assert decode_partial(b"not json") is None
