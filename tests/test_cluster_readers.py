"""Every reader works on a Redis Cluster too: the counts per state sum every shard, a
follower reads a run through the cluster's async client, and the console serves its
pages. Marked ``cluster``: ``pytest --cluster`` runs them on a real 3-master cluster
(and the plain run on one server)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from durable.backend.embedded import free_port
from durable.client import Client
from durable.log.store import Entry
from durable.testing import wait_for
from durable.testing.processes import Process
from tests.conftest import WorkerFactory

pytestmark = pytest.mark.cluster


def test_counts_follow_and_the_console_read_every_shard(
    client: Client, worker: WorkerFactory, tmp_path: Path
) -> None:
    runs = [client.start("count", {"steps": 2}, run_id=f"read-{i}").run_id for i in range(8)]
    worker()
    for run in runs:
        assert client.wait(run, 30).state == "completed"
    assert client.counts()["completed"] == 8  # read zero on a cluster before

    async def follow() -> list[Entry]:
        return [item async for item in client.afollow(runs[0], partial=False)
                if isinstance(item, Entry)]

    entries = asyncio.run(follow())
    assert [e.id for e in entries] == [e.id for e in client.events(runs[0])]

    port = free_port()
    log = tmp_path / "console.log"
    proc = Process(client.settings.redis.url or "", ["console", "--dev", "--port", str(port)],
                   log_path=log)
    try:
        def page() -> int:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/api/runs", timeout=2).status_code
            except httpx.HTTPError:
                return 0

        assert wait_for(lambda: page() == 200, 30), log.read_text()
        listed = httpx.get(f"http://127.0.0.1:{port}/api/runs", timeout=5).json()
        assert {r["run_id"] for r in listed["runs"]} >= set(runs), listed
    finally:
        proc.stop()
