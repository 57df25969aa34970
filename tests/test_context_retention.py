"""Evidence outlives context (``DURABLE_CONTEXT_RETENTION``, ``durable.log.context``): a run's
model context is kept beside it by reference, removed after it ends by one recorded script
call, and the run still folds, verifies, replays and shows what was removed and when.

Real processes throughout: the ``talker`` agent (a conversation load, a ``chat`` step
against the local OpenAI-compatible server, a save) runs on a worker process; the removal
is made by the reconciler process's sweep, or by its ``Sweeper`` against the test's Redis.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from pydantic import ValidationError

from durable.audit.replay import replay
from durable.audit.verify import verify
from durable.client import Client
from durable.log import context
from durable.log import events as ev
from durable.log.state import BlobRef
from durable.reconciler.sweep import Sweeper
from durable.settings import Settings
from durable.testing import wait_for
from tests.conftest import ReconcilerFactory, WorkerFactory, run_durable
from tests.servers.model import ModelServer, expected_text

AGENTS = "examples.agents,tests.agents.basic,tests.agents.model_steps"


@pytest.fixture()
def model(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> Iterator[ModelServer]:
    srv = ModelServer(tokens=20).start()
    monkeypatch.setenv("DURABLE_MODEL_BASE_URL", srv.url)
    monkeypatch.setenv("DURABLE_AGENTS", AGENTS)
    yield srv
    srv.stop()


def _client(r: redis.Redis) -> Client:
    client = Client(Settings(), r)
    client.registry.load(AGENTS)
    return client


def _talk(client: Client, worker: WorkerFactory, run_id: str, **opts: Any) -> None:
    client.start("talker", {"say": "hello", "pad": 300}, run_id=run_id, **opts)
    worker(burst=True).wait(120)


def _context_refs(client: Client, run_id: str) -> list[BlobRef]:
    return context.context_refs(client.events(run_id))


def _trims(client: Client, run_id: str) -> list[ev.ContextTrimmed]:
    return [e.event for e in client.events(run_id) if isinstance(e.event, ev.ContextTrimmed)]


def test_context_goes_by_reference_and_a_trimmed_run_verifies_folds_and_replays(
        r: redis.Redis, worker: WorkerFactory, model: ModelServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_CONTEXT_RETENTION", "1h")
    client = _client(r)
    _talk(client, worker, "talk-1")
    done = client.wait("talk-1", 30)
    assert done.state == "completed", (done.state, done.error)
    # The model's reply and the conversation are beside the run, by reference and digest;
    # the reply's tokens are still counted, from the outcome.
    refs = _context_refs(client, "talk-1")
    assert len(refs) == 3, "\n".join(repr(e.event) for e in client.events("talk-1"))
    blobs_key = client.log.keys.blobs("talk-1")
    assert r.hlen(blobs_key) == 3
    assert done.tokens > 0
    chat = [e.event for e in client.events("talk-1")
            if isinstance(e.event, ev.ActionSucceeded) and e.event.tokens]
    assert len(chat) == 1 and chat[0].result is None and chat[0].blob is not None
    assert verify(client.log, "talk-1").ok

    trimmed = context.trim(client.log, "talk-1", "DURABLE_CONTEXT_RETENTION=1h")
    assert trimmed is not None and sorted(trimmed.refs) == sorted(x.field for x in refs)
    assert trimmed.bytes == sum(x.size for x in refs)
    assert not r.exists(blobs_key)
    assert context.trim(client.log, "talk-1", "DURABLE_CONTEXT_RETENTION=1h") is None
    assert len(_trims(client, "talk-1")) == 1

    # Evidence stays: the run folds to its end, verifies, and says what was removed.
    state = client.status("talk-1")
    assert state.state == "completed" and state.tokens == done.tokens
    assert state.context_trimmed and state.context_values_trimmed == 3
    report = verify(client.log, "talk-1")
    assert report.ok, report.checks
    assert "3 model context values removed by policy" in report.checks["context"]
    assert "DURABLE_CONTEXT_RETENTION=1h" in report.checks["context"]
    rows = replay(client.log, "talk-1").rows
    removed = [row for row in rows if "removed" in row]
    assert len(removed) == 3
    assert all(row["removed"]["at"] == _trims(client, "talk-1")[0].ts for row in removed)
    assert "REMOVED" in removed[0]["what"]
    assert rows[-1]["type"] == "context_trimmed" and "3 values" in rows[-1]["what"]
    shown = run_durable("log", "talk-1", env=dict(os.environ))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("REMOVED") == 3 and "model context removed" in shown.stdout


def test_verify_tells_a_recorded_removal_from_a_value_missing_or_put_back(
        r: redis.Redis, worker: WorkerFactory, model: ModelServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Tampering beside the log: a context value deleted with no ``context_trimmed`` (not
    trimmed: an error), and a trimmed value written back (an error too)."""
    monkeypatch.setenv("DURABLE_CONTEXT_RETENTION", "1h")
    client = _client(r)
    _talk(client, worker, "talk-a")
    _talk(client, worker, "talk-b")
    first = _context_refs(client, "talk-a")[0]
    r.hdel(client.log.keys.blobs("talk-a"), first.field)
    report = verify(client.log, "talk-a")
    assert not report.ok and "large_values" in report.failed
    assert "missing" in report.checks["large_values"]

    kept = r.hget(client.log.keys.blobs("talk-b"), _context_refs(client, "talk-b")[0].field)
    assert context.trim(client.log, "talk-b", "DURABLE_CONTEXT_RETENTION=1h") is not None
    assert verify(client.log, "talk-b").ok
    r.hset(client.log.keys.blobs("talk-b"), _context_refs(client, "talk-b")[0].field,
           kept or b"")
    report = verify(client.log, "talk-b")
    assert not report.ok and report.failed == ["context"]
    assert "still there" in report.checks["context"]


def test_the_reconciler_removes_context_after_the_setting_and_a_continuation_is_told(
        r: redis.Redis, worker: WorkerFactory, reconciler: ReconcilerFactory,
        model: ModelServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_CONTEXT_RETENTION", "2s")
    monkeypatch.setenv("DURABLE_RETENTION", "1h")
    client = _client(r)
    _talk(client, worker, "turn-1")
    assert client.wait("turn-1", 30).state == "completed"
    ttl = r.pttl(client.log.keys.log("turn-1"))
    assert 0 < ttl <= 3_600_000
    reconciler()
    assert wait_for(lambda: _trims(client, "turn-1"), 30)
    assert not r.exists(client.log.keys.blobs("turn-1"))
    trim = _trims(client, "turn-1")[0]
    assert trim.setting == "DURABLE_CONTEXT_RETENTION=2s" and len(trim.refs) == 3
    assert trim.ts - trim.ended >= 2000
    # The removal does not start DURABLE_RETENTION again: the run expires when it would have.
    assert r.pttl(client.log.keys.log("turn-1")) <= ttl
    assert verify(client.log, "turn-1").ok

    # The next turn cannot continue a conversation that is gone, and is told why.
    client.start("talker", {"say": "and then?"}, run_id="turn-2", continue_from="turn-1")
    worker(burst=True).wait(120)
    final = client.wait("turn-2", 30)
    assert final.state == "failed"
    assert "removed" in (final.error or "") and "DURABLE_CONTEXT_RETENTION=2s" in (
        final.error or "")


def test_two_sweeps_at_once_trim_a_run_once(
        r: redis.Redis, worker: WorkerFactory, model: ModelServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_CONTEXT_RETENTION", "1s")
    client = _client(r)
    for i in range(4):
        client.start("talker", {"say": f"hi {i}"}, run_id=f"both-{i}")
    worker(burst=True).wait(120)
    assert all(client.wait(f"both-{i}", 30).state == "completed" for i in range(4))
    sweepers = [Sweeper(Settings(), r, client.registry) for _ in range(2)]
    later = max(int(client.projection(f"both-{i}")["updated"]) for i in range(4)) + 5000
    start = threading.Barrier(2)
    counts: list[int] = []

    def sweep(sweeper: Sweeper) -> None:
        start.wait()
        counts.append(sweeper.trim_context(later))

    threads = [threading.Thread(target=sweep, args=(s,)) for s in sweepers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(counts) == 4
    for i in range(4):
        assert len(_trims(client, f"both-{i}")) == 1
        assert verify(client.log, f"both-{i}").ok
    assert sweepers[0].trim_context(later + 60_000) == 0  # nothing left, nothing written


def test_runs_without_the_setting_keep_context_inline() -> None:
    """Without ``DURABLE_CONTEXT_RETENTION`` nothing changes: no outcome goes by reference
    for being context, so no run's log or keys grow."""
    assert Settings().log.context_retention is None


@pytest.mark.parametrize(("env", "why"), [
    ({"DURABLE_CONTEXT_RETENTION": "soon"}, "not a duration: 'soon'"),
    ({"DURABLE_CONTEXT_RETENTION": "0s"}, "must be positive"),
    ({"DURABLE_CONTEXT_RETENTION": "2d", "DURABLE_RETENTION": "1d"},
     "DURABLE_CONTEXT_RETENTION=2d is longer than DURABLE_RETENTION=1d"),
    ({"DURABLE_RETENTION": "forever"}, "not a duration: 'forever'"),
])
def test_a_bad_retention_setting_is_refused_naming_it(
        env: dict[str, str], why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match="RETENTION") as err:
        Settings()
    assert why in str(err.value)


def test_removed_context_leaves_the_disk_at_the_aof_rewrite_it_asks_for(
        make_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention removes model context from Redis at once, but Redis's append-only file
    keeps every command it ran until it is rewritten: the model's reply is still in the
    file after the trim, and gone from it once ``durable redis --rewrite-aof`` returns,
    the run still verifying. (The test's own server, its rewrites in plain commands,
    uncompressed, so that a value on disk is found by its bytes.)"""
    srv = make_server(fsync="always")
    with srv.client() as conn:
        conn.config_set("aof-use-rdb-preamble", "no")
        conn.config_set("rdbcompression", "no")
    model = ModelServer(tokens=137).start()
    try:
        env = {**os.environ, "DURABLE_REDIS_URL": srv.url, "DURABLE_AGENTS": AGENTS,
               "DURABLE_MODEL_BASE_URL": model.url, "DURABLE_CONTEXT_RETENTION": "1h"}
        said = run_durable("start", "talker", "--run-id", "aof-1", "--input",
                           '{"say": "hello", "pad": 10}', env=env)
        assert said.returncode == 0, said.stderr
        assert run_durable("worker", "--burst", env=env, timeout=120).returncode == 0
    finally:
        model.stop()
    reply = expected_text(137).encode()

    def on_disk() -> bool:
        return any(reply in f.read_bytes() for f in srv.data_dir.rglob("*") if f.is_file())

    monkeypatch.setenv("DURABLE_REDIS_URL", srv.url)
    with srv.client() as conn:
        client = Client(Settings(), conn)
        assert client.status("aof-1").state == "completed"
        assert on_disk()
        assert context.trim(client.log, "aof-1", "DURABLE_CONTEXT_RETENTION=1h") is not None
        assert not conn.exists(client.log.keys.blobs("aof-1"))
        assert on_disk()  # removed from memory, still in the file
        rewrote = run_durable("redis", "--rewrite-aof", "60", env=env)
        assert rewrote.returncode == 0, rewrote.stderr
        assert "rewrote the append-only file of 1 server" in rewrote.stdout
        assert not on_disk()
        assert verify(client.log, "aof-1").ok
