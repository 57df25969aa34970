"""TLS: ``rediss://`` with a CA, a client certificate and its key, against Debian's real
redis-server speaking TLS only and requiring client certificates made by the test."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from durable.client import Client
from durable.errors import UsageError
from durable.log.store import Entry
from durable.settings import Settings
from durable.testing import Worker, wait_for
from tests.servers.secure import TlsServer, debian_redis

AGENTS = "examples.agents,tests.agents.basic"


def test_debian_redis_server_is_installed() -> None:
    """./test.sh installs it; without it the TLS tests would prove nothing."""
    out = subprocess.run([debian_redis(), "--version"], capture_output=True, text=True,
                         timeout=30)
    assert "Redis server v=" in out.stdout


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    srv = TlsServer(tmp_path_factory.mktemp("tls")).start()
    yield srv
    srv.stop()


@pytest.fixture()
def plain(tls: TlsServer) -> Iterator[redis.Redis]:
    client = tls.client()
    client.flushall()
    yield client
    client.flushall()
    client.close()


def durable(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durable", *args],
                          env={**os.environ, "DURABLE_AGENTS": AGENTS, **env},
                          capture_output=True, text=True, timeout=120)


def test_run_over_tls_end_to_end(tls: TlsServer, plain: redis.Redis, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer starts, a real worker (and RQ on the same connection) drives the run and
    an operator follows it, all over TLS with a client certificate."""
    started = durable(tls.env(), "start", "count", "--run-id", "t1", "--input", '{"steps": 3}')
    assert started.returncode == 0, started.stderr
    # The TLS settings, for the worker (it inherits the environment) and the client below.
    for key, value in tls.env().items():
        monkeypatch.setenv(key, value)
    worker = Worker(tls.url, log_path=tmp_path / "worker.log", DURABLE_AGENTS=AGENTS)
    try:
        assert wait_for(lambda: plain.hget("dx:{t1}:run", "state") == b"completed", 60)
    finally:
        worker.stop()
    log = (tmp_path / "worker.log").read_text()
    assert f"rediss://:***@127.0.0.1:{tls.port}/0" in log
    assert tls.password not in log

    client = Client(Settings())
    try:
        assert client.status("t1").state == "completed"

        async def follow() -> list[str]:
            items = client.afollow("t1", partial=False)
            return [type(item.event).__name__ for item in [i async for i in items]
                    if isinstance(item, Entry) and item.event is not None]

        assert asyncio.run(follow())[-1] == "Completed"
    finally:
        client.redis.close()
    shown = durable(tls.env(), "runs", "--json")
    assert shown.returncode == 0 and "t1" in shown.stdout


def test_server_certificate_from_another_ca_is_refused(tls: TlsServer, plain: redis.Redis) -> None:
    env = {**tls.env(), "DURABLE_REDIS_TLS_CA": str(tls.certs.other_ca),
           "DURABLE_CONNECT_TIMEOUT_S": "1"}
    done = durable(env, "runs")
    assert done.returncode == 3
    assert done.stderr.count("\n") == 1, done.stderr
    assert "over TLS" in done.stderr and "certificate verify failed" in done.stderr
    assert tls.password not in done.stderr


def test_without_client_certificate_the_server_refuses(tls: TlsServer,
                                                      plain: redis.Redis) -> None:
    env = {k: v for k, v in tls.env().items()
           if k not in ("DURABLE_REDIS_TLS_CERT", "DURABLE_REDIS_TLS_KEY")}
    done = durable({**env, "DURABLE_CONNECT_TIMEOUT_S": "1"}, "runs")
    assert done.returncode == 3
    # The server closes the handshake: that could be a server still starting, so the
    # command waits DURABLE_CONNECT_TIMEOUT_S (one line saying so), then fails in one line.
    assert "over TLS" in done.stderr.strip().splitlines()[-1], done.stderr


def test_plain_connection_to_tls_port_gets_nothing(tls: TlsServer) -> None:
    with redis.Redis(host="127.0.0.1", port=tls.port, password=tls.password,
                     socket_timeout=2) as client, pytest.raises(redis.RedisError):
        client.ping()


def test_tls_files_with_plain_url_are_a_usage_error(tls: TlsServer) -> None:
    """TLS files with a redis:// URL would silently send everything in clear: refused."""
    env = {**tls.env(), "DURABLE_REDIS_URL": f"redis://127.0.0.1:{tls.port}/0"}
    done = durable(env, "runs")
    assert done.returncode == 2
    assert "not a rediss:// URL" in done.stderr
    with pytest.raises(UsageError, match="no such file"):
        from durable.backend.connection import connection_options

        connection_options(Settings.from_env(redis_tls_ca=Path("/nonexistent/ca.pem")),
                           "rediss://127.0.0.1:1/0")
