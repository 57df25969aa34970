"""Shared fixtures: one real Redis server per session (random port, private directory),
flushed before each test, as rq's own tests do."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis

from durable.client import Client
from durable.settings import Settings
from durable.testing import Server


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    srv = Server(fsync="everysec").start()
    yield srv
    srv.stop()


@pytest.fixture()
def r(server: Server) -> Iterator[redis.Redis]:
    client = server.client()
    client.flushall()
    yield client
    client.flushall()
    client.close()


@pytest.fixture()
def settings(server: Server, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings pointing at the test server; also exported for child processes."""
    monkeypatch.setenv("DURABLE_REDIS_URL", server.url)
    monkeypatch.setenv("DURABLE_AGENTS", "examples.agents,tests.agents")
    monkeypatch.setenv("DURABLE_LEASE_TTL_MS", os.environ.get("TEST_LEASE_TTL_MS", "1000"))
    return Settings()


@pytest.fixture()
def client(settings: Settings, r: redis.Redis) -> Client:
    return Client(settings, r)
