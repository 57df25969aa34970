"""Late followers: the partial output of the step in flight is kept (bounded) while it runs,
so a follower that joins mid-step gets the text so far, then the rest, each token once.
Real worker processes stream a ``chat`` step from the local model server
(``tests.servers.model``), which holds its reply halfway until the test lets it go on.
The followers' tests are marked ``cluster``: ``pytest --cluster`` runs them on a real
3-master cluster too."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from durable.client import Client
from durable.log.keys import KeyLayout
from durable.log.store import Entry
from durable.streams.partials import Publisher, kept
from durable.streams.streaming import Partial
from durable.testing import Server
from durable.testing.processes import wait_for
from tests.conftest import WorkerFactory
from tests.servers.model import ModelServer, expected_text

AGENTS = "examples.agents,tests.agents.basic,tests.agents.model_steps"


@pytest.fixture()
def model(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[ModelServer]:
    """200 streamed tokens, held after the first 100 until ``release`` is set."""
    srv = ModelServer(tokens=200, hold_after=100).start()
    monkeypatch.setenv("DURABLE_MODEL_BASE_URL", srv.url)
    monkeypatch.setenv("DURABLE_AGENTS", AGENTS)
    yield srv
    srv.stop()


def _halfway(client: Client, worker: WorkerFactory, model: ModelServer, run_id: str) -> str:
    """A streaming run whose model step has emitted its first 100 tokens (kept), and holds."""
    client.registry.load(AGENTS)
    run = client.start("model_asker", {"stream": True}, run_id=run_id).run_id
    worker()
    assert model.holding.wait(30)
    wait_for(lambda: len(kept(client.redis, client.log.keys, run)) == 100, timeout=15)
    return run


@pytest.mark.cluster
def test_a_follower_joining_after_100_of_200_tokens_receives_all_200_in_order(
        client: Client, worker: WorkerFactory, model: ModelServer) -> None:
    run = _halfway(client, worker, model, "late-follower")
    partials: list[Partial] = []
    with client.follow(run) as items:
        for item in items:
            if isinstance(item, Partial):
                partials.append(item)
                if len(partials) == 100:
                    model.release.set()  # the first half came from what was kept
    assert [p.seq for p in partials] == list(range(1, 201))
    assert "".join(p.data for p in partials) == expected_text(200)
    assert {(p.step, p.attempt) for p in partials} == {(1, 1)}
    final = client.status(run)
    assert final.state == "completed" and final.result["answer"] == expected_text(200)
    # the step ended: nothing is kept any more
    assert kept(client.redis, client.log.keys, run) == []


@pytest.mark.cluster
def test_an_async_follower_joining_halfway_receives_every_token_in_order(
        client: Client, worker: WorkerFactory, model: ModelServer) -> None:
    run = _halfway(client, worker, model, "late-afollower")

    async def follow() -> list[Any]:
        got: list[Any] = []
        async for item in client.afollow(run):
            got.append(item)
            if sum(isinstance(i, Partial) for i in got) == 100:
                model.release.set()
        return got

    items = asyncio.run(follow())
    partials = [i for i in items if isinstance(i, Partial)]
    assert [p.seq for p in partials] == list(range(1, 201))
    assert "".join(p.data for p in partials) == expected_text(200)
    kinds = [type(i.event).__name__ if isinstance(i, Entry) else "partial" for i in items]
    first, last = kinds.index("partial"), len(kinds) - kinds[::-1].index("partial") - 1
    assert kinds[first - 1] == "ActionDispatched" and kinds[last + 1] == "ActionSucceeded"


def test_durable_log_follow_prints_partial_text_as_a_stream(
        client: Client, worker: WorkerFactory, model: ModelServer, server: Server) -> None:
    """The CLI joins halfway: the text so far, then the rest, on one line, not a line per
    token; the events around it one line each."""
    run = _halfway(client, worker, model, "cli-follower")
    env = {**os.environ, "DURABLE_REDIS_URL": server.url}
    proc = subprocess.Popen([sys.executable, "-m", "durable", "log", run, "--follow"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    seen = b""
    end = time.monotonic() + 30
    while b"t99 " not in seen and time.monotonic() < end:
        seen += os.read(proc.stdout.fileno(), 65536)
    model.release.set()
    out, err = proc.communicate(timeout=60)
    text = (seen + out).decode()
    assert proc.returncode == 0, err.decode()
    streamed = [line for line in text.splitlines() if line.startswith("  step 1 partial:")]
    assert streamed == [f"  step 1 partial: {expected_text(200)}"], text[-2000:]
    lines = text.splitlines()  # the text after the events before it, before the outcome
    assert "action_dispatched" in lines[lines.index(streamed[0]) - 1]
    assert "action_succeeded" in lines[lines.index(streamed[0]) + 1]
    assert "completed" in text.splitlines()[-1]


def test_what_is_kept_is_bounded_per_step_and_forgotten_when_the_call_ends(
        r: redis.Redis, layout: KeyLayout) -> None:
    r.hset(layout.run("kept-run"), "state", "pending")
    pub = Publisher(r, max_bytes=1024, keep_bytes=400, layout=layout)
    out = pub.for_call("kept-run", 3, 1)
    for i in range(50):
        out(f"token {i}")
    got = kept(r, layout, "kept-run")
    assert got and got[-1].seq == 50
    assert [p.seq for p in got] == list(range(got[0].seq, 51))  # the newest, contiguous
    assert sum(len(str(p.data)) + 60 for p in got) <= 400 + 100
    again = pub.for_call("kept-run", 3, 2)  # the step sent again: its output starts over
    again("fresh")
    assert [(p.attempt, p.seq, p.data) for p in kept(r, layout, "kept-run")] == [(2, 1, "fresh")]
    other = pub.for_call("kept-run", 4, 1)  # a parallel step keeps its own
    other("beside")
    assert [(p.step, p.data) for p in kept(r, layout, "kept-run")] == [(3, "fresh"), (4, "beside")]
    again.close()
    other.close()
    assert kept(r, layout, "kept-run") == [] and r.keys("*partial*") == []
