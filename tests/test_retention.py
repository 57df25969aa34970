"""Retention: ``durable archive`` (evidence to gzip files, keys deleted), terminal runs'
keys expiring under ``DURABLE_RETENTION`` with the indexes pruned, the admission limit
``DURABLE_MAX_PENDING_RUNS``, and the production redis.conf's memory ceiling."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from durable.backend.connection import parse_config_file
from durable.client import Client
from durable.errors import TooManyPendingRuns
from durable.log import keys
from durable.log.keys import KeyLayout
from durable.reconciler.sweep import Sweeper
from durable.settings import Settings
from durable.testing import wait_for
from tests.conftest import WorkerFactory

ROOT = Path(__file__).resolve().parent.parent


def durable(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durable", *args],
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120)


def run_keys(layout: KeyLayout, run_id: str) -> list[str]:
    return [layout.log(run_id), layout.run(run_id), layout.ledger(run_id), layout.fence(run_id)]


def test_archive_writes_evidence_then_deletes_keys(client: Client, r: redis.Redis,
                                                   worker: WorkerFactory,
                                                   tmp_path: Path) -> None:
    for i in range(3):
        client.start("count", {"steps": 2}, run_id=f"old{i}")
    worker(burst=True).wait(120)
    assert all(client.wait(f"old{i}", 30).state == "completed" for i in range(3))
    client.start("asker", {}, run_id="live", enqueue=False)  # not terminal: kept

    out = tmp_path / "archive"
    done = durable("archive", "--older-than", "1ms", "--to", str(out), "--json")
    assert done.returncode == 0, done.stderr
    assert sorted(json.loads(done.stdout)["archived"]) == ["old0", "old1", "old2"]
    for i in range(3):
        with gzip.open(out / f"old{i}.jsonl.gz", "rt") as f:
            lines = [json.loads(line) for line in f]
        assert lines[0]["kind"] == "format" and lines[1]["type"] == "run_started"
        assert lines[-1]["kind"] == "summary"
        assert lines[-1]["state"] == "completed" and lines[-1]["events"] > 5
        assert not r.exists(*run_keys(client.log.keys, f"old{i}"))
        assert r.zscore(keys.RUNS_BY_UPDATE, f"old{i}") is None
        assert r.zscore(client.log.keys.runs_in_state("completed"), f"old{i}") is None
    assert r.exists(client.log.keys.log("live")) and [s.run_id for s in client.runs()] == ["live"]
    again = durable("archive", "--older-than", "1ms", "--to", str(out), "--json")
    assert json.loads(again.stdout)["archived"] == []


def test_archive_keeps_a_run_that_moved_on(client: Client, r: redis.Redis) -> None:
    """Crash window: an event appended (a late reconciliation) between the export and the
    delete: the delete is refused and nothing is lost."""
    client.start("asker", {}, run_id="moved", enqueue=False)
    client.cancel("moved")
    version = client.projection("moved")["version"]
    r.hset(client.log.keys.run("moved"), "version", int(version) + 1)  # another writer's append
    reply = client.log.scripts.archive_delete(
        keys=[*run_keys(client.log.keys, "moved")[:3], client.log.keys.lease("moved"),
              client.log.keys.fence("moved"), client.log.keys.queued("moved")],
        args=[version])
    assert reply[0] == b"changed"
    assert r.exists(client.log.keys.log("moved"))


def test_retention_expires_terminal_runs_and_prunes_indexes(
        layout: KeyLayout, settings: Settings, r: redis.Redis, worker: WorkerFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_RETENTION", "3s")
    client = Client(Settings(), r)
    client.start("count", {"steps": 1}, run_id="short")
    client.start("asker", {}, run_id="waits")
    worker(burst=True).wait(120)
    assert client.wait("short", 30).state == "completed"
    assert client.wait("waits", 30).state == "waiting_input"
    for key in run_keys(client.log.keys, "short")[:3]:
        assert 0 < r.pttl(key) <= 3000, key
    assert r.pttl(layout.log("waits")) == -1           # not terminal: no expiry
    assert wait_for(lambda: not r.exists(layout.log("short")), 20)
    assert r.zscore(keys.RUNS_BY_UPDATE, "short") is not None  # the index still lists it
    pruned = Sweeper(Settings(), r, client.registry).tick()
    assert pruned.examined >= 1
    assert r.zscore(keys.RUNS_BY_UPDATE, "short") is None
    assert r.zscore(layout.runs_in_state("completed"), "short") is None
    assert not r.exists(layout.fence("short"))
    assert [s.run_id for s in client.runs()] == ["waits"]


def test_max_pending_runs_refuses_new_runs(layout: KeyLayout, settings: Settings, r: redis.Redis,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_MAX_PENDING_RUNS", "2")
    client = Client(Settings(), r)
    client.start("count", {"steps": 1}, run_id="p1", enqueue=False)
    client.start("count", {"steps": 1}, run_id="p2", enqueue=False)
    with pytest.raises(TooManyPendingRuns):
        client.start("count", {"steps": 1}, run_id="p3")
    assert not r.exists(layout.log("p3"))
    assert client.start("count", {"steps": 1}, run_id="p1").created is False  # idempotent
    done = durable("start", "count", "--run-id", "p4")
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "DURABLE_MAX_PENDING_RUNS" in done.stderr
    assert not r.exists(layout.log("p4"))


def test_deploy_redis_conf_has_a_memory_ceiling_without_eviction() -> None:
    text = (ROOT / "deploy" / "redis.conf").read_text()
    cfg = parse_config_file(text)
    assert cfg["maxmemory"] and cfg["maxmemory"] != "0"
    assert cfg["maxmemory-policy"] == "noeviction"
    before = text.split("maxmemory ")[0]
    assert "evict" in before.rsplit("\n\n", 1)[-1]  # the comment says why
