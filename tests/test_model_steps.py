"""The ``chat`` step never pays twice blindly: against a local OpenAI-compatible server
(``tests.servers.model``, real HTTP, counting each request per ``Idempotency-Key``) and real
worker and reconciler processes. Each request the server received must be one dispatch in
the log and one model call in the budget."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable import model_http
from durable.audit.verify import verify
from durable.client import Client
from durable.eventloop import EventLoop
from durable.log import events as ev
from durable.models import Chat, ModelError, ModelSettings, request_body, retry_after
from durable.testing import wait_for
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.runs import events_of
from tests.servers.model import ModelServer
from tests.test_startup import loaded_after

AGENTS = "examples.agents,tests.agents.basic,tests.agents.model_steps"


@pytest.fixture()
def model(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[ModelServer]:
    """The local model server, exported to the processes started after it."""
    srv = ModelServer(tokens=20).start()
    monkeypatch.setenv("DURABLE_MODEL_BASE_URL", srv.url)
    monkeypatch.setenv("DURABLE_AGENTS", AGENTS)
    yield srv
    srv.stop()


def _count(events: list[ev.Event], kind: type[ev.Event]) -> int:
    return sum(1 for e in events if isinstance(e, kind))


def test_a_model_slower_than_its_timeout_is_sent_at_most_the_configured_attempts(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
        model: ModelServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every reply comes 3 s after a 0.5 s timeout: the step is recorded timed out and sent
    again at once (effect-free), but three requests in all (``DURABLE_MODEL_ATTEMPTS``);
    then it fails ``NoOutcome``. Each request is a dispatch and a model call."""
    model.plan = [("slow", 3.0)] * 6
    monkeypatch.setenv("DURABLE_MODEL_TIMEOUT_S", "0.5")
    monkeypatch.setenv("DURABLE_MODEL_ATTEMPTS", "3")
    client.registry.load(AGENTS)
    run = client.start("model_asker", {}, run_id="slow-model").run_id
    worker()
    reconciler()
    final = client.wait(run, timeout=60, waiting=False)
    assert final.state == "failed", (final.state, final.error)
    assert "NoOutcome" in (final.error or "") or "no outcome after 3" in (final.error or "")
    assert len(model.requests(f"{run}:1")) == 3
    events = events_of(client, run)
    assert _count(events, ev.ActionDispatched) == 3
    assert _count(events, ev.ActionTimedOut) == 3
    assert final.model_calls == 3 and final.tokens == 0  # no reply: no tokens known
    assert verify(client.log, run).ok


def test_the_timeout_and_attempts_are_the_calls_own(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
        model: ModelServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings say 60 s and 5 attempts; the call says 0.4 s and 2: two requests, each
    given up after 0.4 s (the recorded deadline is 0.4 s after its dispatch)."""
    model.plan = [("slow", 3.0)] * 6
    monkeypatch.setenv("DURABLE_MODEL_TIMEOUT_S", "60")
    monkeypatch.setenv("DURABLE_MODEL_ATTEMPTS", "5")
    client.registry.load(AGENTS)
    run = client.start("model_asker", {"timeout_s": 0.4, "max_attempts": 2},
                       run_id="own-timeout").run_id
    worker()
    reconciler()
    final = client.wait(run, timeout=60, waiting=False)
    assert final.state == "failed" and "no outcome after 2" in (final.error or "")
    assert len(model.requests(f"{run}:1")) == 2 and final.model_calls == 2
    dispatched = [e for e in events_of(client, run) if isinstance(e, ev.ActionDispatched)]
    assert [e.deadline - e.ts for e in dispatched] == [pytest.approx(400, abs=50)] * 2


def test_429_and_503_are_asked_again_no_sooner_than_retry_after(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
        model: ModelServer) -> None:
    """A 429 saying ``Retry-After: 1``, a 503 saying 2, then an answer: three requests
    under one key, spaced as the server asked, three model calls, the tokens of the one
    reply."""
    model.plan = [("status", 429, 1), ("status", 503, 2), ("ok",)]
    client.registry.load(AGENTS)
    run = client.start("model_asker", {}, run_id="retry-after").run_id
    worker()
    reconciler()
    final = client.wait(run, timeout=60, waiting=False)
    assert final.state == "completed", (final.state, final.error)
    seen = model.requests(f"{run}:1")
    assert [s.reply for s in seen] == ["status", "status", "ok"]
    assert seen[1].at - seen[0].at >= 0.95 and seen[2].at - seen[1].at >= 1.95
    assert final.model_calls == 3 and final.tokens == 25
    waits = [e for e in events_of(client, run) if isinstance(e, ev.WaitEntered)]
    assert [w.kind for w in waits] == ["retry", "retry"]
    assert [round((w.until - w.ts) / 1000) for w in waits] == [1, 2]


def test_a_429_asking_for_longer_than_the_longest_honoured_wait_waits_that_long(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
        model: ModelServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 429 saying ``Retry-After: 3600`` under ``DURABLE_MODEL_MAX_RETRY_AFTER_S=1``: the
    step waits 1 s, not an hour, and the second request gets its answer."""
    model.plan = [("status", 429, 3600), ("ok",)]
    monkeypatch.setenv("DURABLE_MODEL_MAX_RETRY_AFTER_S", "1")
    client.registry.load(AGENTS)
    run = client.start("model_asker", {}, run_id="retry-after-cut").run_id
    worker()
    reconciler()
    final = client.wait(run, timeout=60, waiting=False)
    assert final.state == "completed", (final.state, final.error)
    waits = [e for e in events_of(client, run) if isinstance(e, ev.WaitEntered)]
    assert [(w.kind, round((w.until - w.ts) / 1000)) for w in waits] == [("retry", 1)]
    assert [s.reply for s in model.requests(f"{run}:1")] == ["status", "ok"]


def test_a_resend_the_budget_does_not_allow_ends_the_run(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
        model: ModelServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """``model_calls: 2``: the timed-out request is sent once more, not a third time."""
    model.plan = [("slow", 3.0)] * 6
    monkeypatch.setenv("DURABLE_MODEL_TIMEOUT_S", "0.5")
    client.registry.load(AGENTS)
    run = client.start("model_asker", {}, run_id="budget-resend", budgets={"model_calls": 2}).run_id
    worker()
    reconciler()
    final = client.wait(run, timeout=60, waiting=False)
    assert (final.state, final.reason) == ("failed", "budget_exhausted")
    assert len(model.requests(f"{run}:1")) == 2 and final.model_calls == 2


def test_a_workers_model_calls_share_one_connection(
        client: Client, worker: WorkerFactory, model: ModelServer, tmp_path: Path) -> None:
    """Twelve model calls of a run, each followed by a tool step, sent by one worker: on one
    TCP connection, kept open between them. A client made for each call opened a connection
    each time (and built an SSL context: 30-60 ms of CPU per call, for an http:// URL too).
    The worker's shutdown closes the client with the process's event loop, and exits 0."""
    client.registry.load(AGENTS)
    run = client.start("model_looper", {"calls": 12}, run_id="one-connection").run_id
    log = tmp_path / "worker.log"
    proc = worker(log_path=log)
    final = client.wait(run, timeout=60, waiting=False)
    assert final.state == "completed", (final.state, final.error)
    assert final.model_calls == 12 and len(model.seen) == 12
    # One; two if a pause longer than the pool's keep-alive (5 s) let the first go.
    assert model.connections <= 2, model.connections
    proc.send(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert wait_for(lambda: model.closed == model.connections, 5)
    assert "Traceback" not in log.read_text() and " ERROR " not in log.read_text()


def test_a_bad_timeout_fails_the_step_with_the_reason_and_the_worker_lives(
        client: Client, worker: WorkerFactory, model: ModelServer) -> None:
    client.registry.load(AGENTS)
    bad = client.start("model_asker", {"timeout_s": -1}, run_id="bad-timeout").run_id
    good = client.start("model_asker", {}, run_id="after-bad").run_id
    worker()
    final = client.wait(bad, timeout=30, waiting=False)
    assert final.state == "failed" and final.error is not None
    assert "'timeout_s' must be a positive float" in final.error
    assert client.wait(good, timeout=30).state == "completed"
    assert model.requests(f"{bad}:1") == []


def test_the_timeout_setting_is_read_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    chat = Chat()
    monkeypatch.setenv("DURABLE_MODEL_TIMEOUT_S", "7")
    monkeypatch.setenv("DURABLE_MODEL_ATTEMPTS", "4")
    assert (chat.timeout_for({}), chat.attempts_for({})) == (7.0, 4)
    monkeypatch.setenv("DURABLE_MODEL_TIMEOUT_S", "2.5")
    assert chat.timeout_for({"messages": []}) == 2.5
    assert chat.timeout_for({"timeout_s": 9}) == 9.0
    assert chat.timeout_for({"timeout_s": "soon"}) == 2.5  # refused by the call itself:
    with pytest.raises(ModelError, match="timeout_s"):
        request_body({"messages": [{"role": "user", "content": "x"}], "timeout_s": "soon"},
                     ModelSettings())
    with pytest.raises(ModelError, match="max_attempts"):
        request_body({"messages": [{"role": "user", "content": "x"}], "max_attempts": 1.5},
                     ModelSettings())


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after("3") == 3.0 and retry_after(" 0 ") == 0.0
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0
    assert retry_after("later") is None and retry_after(None) is None
    assert retry_after("inf") is None


# The clients: one per event loop and base URL, closed with the loop -----------------------

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture()
def local_model() -> Iterator[ModelServer]:
    srv = ModelServer(tokens=3).start()
    yield srv
    srv.stop()


def test_a_loop_keeps_one_client_per_url_and_closes_it_at_the_end_of_asyncio_run(
        local_model: ModelServer) -> None:
    url = local_model.url

    async def calls() -> list[Any]:
        first = await model_http.client_for(url)
        for _ in range(3):
            (await first.post(f"{url}/chat/completions", json=BODY, timeout=5)).raise_for_status()
        return [first, await model_http.client_for(url), await model_http.client_for(f"{url}/")]

    first, again, other = asyncio.run(calls())
    assert again is first and other is not first
    assert local_model.connections == 1  # three requests on one connection
    assert first.is_closed and other.is_closed  # closed on their loop as it shut down
    assert wait_for(lambda: local_model.closed == 1, 5)
    assert not [loop for loop in model_http._CLIENTS if loop.is_closed()]
    [second] = asyncio.run(calls())[:1]  # a new loop, a new client
    assert second is not first and second.is_closed and local_model.connections == 2


def test_a_workers_shutdown_closes_the_clients_of_the_process_loop(
        local_model: ModelServer) -> None:
    """A worker's shutdown closes what the process's event loop kept
    (``EventLoop.close_resources``): the clients its model steps sent requests with, and
    their connections. The loop runs on; a later request gets a new client."""
    loop = EventLoop()

    def post() -> Any:
        http = loop.wait(model_http.client_for(local_model.url))
        resp = loop.wait(http.post(f"{local_model.url}/chat/completions", json=BODY,
                                   timeout=5))
        assert resp.status_code == 200
        return http

    first = post()
    assert post() is first and local_model.closed == 0
    assert loop.close_resources()
    assert first.is_closed and wait_for(lambda: local_model.closed == 1, 5)
    second = post()
    assert second is not first and local_model.connections == 2
    assert loop.close_resources() and second.is_closed


def test_importing_the_model_step_does_not_import_httpx() -> None:
    """httpx is imported by the first request: with rich and click installed it imports its
    own command line, a tenth of a second of every worker's start."""
    loaded = loaded_after("import durable.models")
    assert "durable.model_http" in loaded and "httpx" not in loaded
