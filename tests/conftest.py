"""Shared fixtures: one real Redis server per session (random port, private directory),
flushed before each test, as rq's own tests do; factories for worker processes and extra
servers (as arq's tests do), which stop everything they started at teardown.

``pytest --cluster`` (or ``DURABLE_TEST_CLUSTER=1``) runs the tests marked ``cluster``
against a real 3-master Redis Cluster on loopback instead (the log, ledger, leases and
indexes on the cluster, RQ on a plain server: ``DURABLE_QUEUE_URL``), and only them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from durable.backend.cluster import LocalCluster
from durable.client import Client
from durable.log import keys
from durable.security.signing import keygen, load_public_key
from durable.settings import Settings
from durable.testing import AdminKey, Reconciler, Server, Worker, forks
from examples.world import WorldProcess
from tests.servers.model import ModelServer

T = TypeVar("T")

#: The console's browser fixtures (``browser``, ``page``, ``console``, ``apps``).
pytest_plugins = ["tests.browser"]

#: Imported once by the fork server the tests' processes are forked from: the frameworks
#: their agents use, and the console. None reads the environment at import.
FRAMEWORKS = ("durable.console.cli", "durable.console.app", "httpx", "pydantic_ai",
              "agents", "mcp", "durable.integrations.pydantic_ai",
              "durable.integrations.openai_agents", "durable.integrations.mcp")

#: ``worker(**opts)``: a ``durable worker`` process on the session's server.
WorkerFactory = Callable[..., Worker]
#: ``reconciler(**opts)``: a ``durable reconciler`` process on the session's server.
ReconcilerFactory = Callable[..., Reconciler]
#: ``approver(name, *roles) -> bytes``: a new key registered for an approver; its private PEM.
ApproverFactory = Callable[..., bytes]
#: ``make_server(**opts)``: another started Redis server (random port, private directory).
ServerFactory = Callable[..., Server]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cluster", action="store_true",
                     help="run the tests marked 'cluster' against a 3-master Redis Cluster")


def on_cluster(config: pytest.Config) -> bool:
    return bool(config.getoption("--cluster") or os.environ.get("DURABLE_TEST_CLUSTER") == "1")


def pytest_configure(config: pytest.Config) -> None:
    """Processes the tests start are forked from a fork server per test process that has
    imported the library and the frameworks once (``durable.testing.forks``): most tests
    start one or more, and an import costs 0.6 to 3.5 s of CPU. ``DURABLE_TEST_EXEC=1`` starts
    each as ``python -m durable`` instead."""
    if os.environ.get("DURABLE_TEST_EXEC") != "1":
        forks.use_fork_server(FRAMEWORKS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not on_cluster(config):
        return
    keep = [i for i in items if i.get_closest_marker("cluster")]
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep


class ClusterServer:
    """The session's Redis Cluster where tests expect a ``Server``: ``url`` names a node,
    ``client()`` is a cluster client; ``queue`` is the plain server RQ uses."""

    def __init__(self) -> None:
        self.cluster = LocalCluster(3, 0).start()
        self.queue = Server(fsync="everysec").start()
        self.url = self.cluster.url

    def client(self) -> redis.Redis:
        client: redis.Redis = redis.RedisCluster.from_url(self.url)
        return client

    def flush(self) -> None:
        with self.queue.client() as q:
            q.flushall()

    def stop(self) -> None:
        self.cluster.stop()
        self.queue.stop()


@pytest.fixture(scope="session", autouse=True)
def admin_key() -> Iterator[AdminKey]:
    """The session's registry admin: its public key is in ``DURABLE_ADMIN_KEYS`` for every
    client and process of the session; ``approver`` signs the entries it adds with it."""
    key = AdminKey.make()
    before = os.environ.get("DURABLE_ADMIN_KEYS")
    os.environ["DURABLE_ADMIN_KEYS"] = key.public
    yield key
    if before is None:
        os.environ.pop("DURABLE_ADMIN_KEYS", None)
    else:
        os.environ["DURABLE_ADMIN_KEYS"] = before


@pytest.fixture()
def admin_file(admin_key: AdminKey, tmp_path: Path) -> Path:
    """The session admin's private key in a file (``--admin-key``), mode 0600."""
    path = tmp_path / "admin.key"
    path.write_bytes(admin_key.private)
    path.chmod(0o600)
    return path


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    srv: Any = ClusterServer() if on_cluster(request.config) else Server(fsync="everysec").start()
    yield srv
    srv.stop()


@pytest.fixture()
def layout(server: Server) -> keys.KeyLayout:
    """The key layout of the test server's data: 16 shards on the cluster (the default
    there), else unsharded: what ``EventLog.from_settings`` gives the ``settings``."""
    return keys.KeyLayout(16 if isinstance(server, ClusterServer) else 0)


@pytest.fixture()
def r(server: Server) -> Iterator[redis.Redis]:
    cluster = server if isinstance(server, ClusterServer) else None
    client = server.client()
    client.flushall()
    if cluster is not None:
        cluster.flush()
    yield client
    client.flushall()
    if cluster is not None:
        cluster.flush()
    client.close()


@pytest.fixture()
def settings(server: Server, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings pointing at the test server; also exported for child processes."""
    monkeypatch.setenv("DURABLE_REDIS_URL", server.url)
    if isinstance(server, ClusterServer):
        monkeypatch.setenv("DURABLE_REDIS_CLUSTER", "1")
        monkeypatch.setenv("DURABLE_QUEUE_URL", server.queue.url)
    monkeypatch.setenv("DURABLE_AGENTS",
                       "examples.agents,tests.agents.basic,tests.agents.streaming")
    monkeypatch.setenv("DURABLE_LEASE_TTL_MS", os.environ.get("TEST_LEASE_TTL_MS", "1000"))
    return Settings()


@pytest.fixture()
def client(settings: Settings, r: redis.Redis) -> Client:
    return Client(settings, r)


def _started(make: Callable[..., T]) -> tuple[Callable[..., T], list[T]]:
    """A factory that remembers what it started, for a fixture to stop at teardown."""
    started: list[T] = []

    def start(**opts: Any) -> T:
        thing = make(**opts)
        started.append(thing)
        return thing

    return start, started


@pytest.fixture()
def worker(server: Server, settings: Settings) -> Iterator[WorkerFactory]:
    """``worker(**opts) -> durable.testing.Worker``: a real worker process on the session's
    server, with the test's environment (``settings`` and any ``monkeypatch.setenv`` made
    before the call); ``opts`` are ``Worker``'s (``burst``, ``kill_at``, ``DURABLE_*``...).
    Every worker started is stopped (SIGTERM, then SIGKILL) before the server is flushed."""
    start, started = _started(lambda **opts: Worker(server.url, **opts))
    yield start
    for w in started:
        w.stop()


@pytest.fixture()
def reconciler(server: Server, settings: Settings) -> Iterator[ReconcilerFactory]:
    """``reconciler(**opts) -> durable.testing.Reconciler``: a reconciler process on the
    session's server with the test's environment; stopped at teardown."""
    start, started = _started(lambda **opts: Reconciler(server.url, **opts))
    yield start
    for rec in started:
        rec.stop()


@pytest.fixture()
def approver(client: Client, admin_key: AdminKey) -> ApproverFactory:
    """``approver(name, *roles) -> private key PEM``: makes an Ed25519 key pair and
    registers its public key for ``name`` with ``roles``, signed by the session's admin
    (``durable approvers add``)."""
    def make(name: str, *roles: str) -> bytes:
        private, public = keygen()
        client.approvers.add(name, list(roles), load_public_key(public),
                             admin_key=admin_key.private, by="test")
        return private

    return make


#: ``serve_model``: starts a model server for the given agents.
ModelFactory = Callable[..., ModelServer]


@pytest.fixture()
def serve_model(monkeypatch: pytest.MonkeyPatch, settings: Settings
                ) -> Iterator[ModelFactory]:
    """``serve_model(agents, **opts) -> ModelServer``: the scripted model server
    (``tests.servers.model``, ``opts`` its own) that the test's worker processes call
    (``DURABLE_MODEL_BASE_URL``), with ``DURABLE_AGENTS`` set to ``agents``; stopped at
    teardown."""
    started: list[ModelServer] = []

    def start(agents: str, **opts: Any) -> ModelServer:
        srv = ModelServer(**opts).start()
        started.append(srv)
        monkeypatch.setenv("DURABLE_MODEL_BASE_URL", srv.url)
        monkeypatch.setenv("DURABLE_AGENTS", agents)
        return srv

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture()
def world_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test agents' SQLite database (``TEST_DB``) with no unique key
    (``TEST_DB_DEDUPE=0``): only the system's ledger and lookups stand between a retry and
    a duplicate, and ``tests.agents.basic.applications`` counts what was applied."""
    monkeypatch.setenv("TEST_DB", str(tmp_path / "world.sqlite"))
    monkeypatch.setenv("TEST_DB_DEDUPE", "0")
    return tmp_path / "world.sqlite"


@pytest.fixture()
def payer_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The ``payer`` test agent's files: its SQLite database (``w.sqlite``, ``TEST_DB``) and
    the account balance it reads as a fact (``balance``, 1000, ``TEST_FACT_FILE``)."""
    monkeypatch.setenv("TEST_DB", str(tmp_path / "w.sqlite"))
    fact = tmp_path / "balance"
    fact.write_text("1000")
    monkeypatch.setenv("TEST_FACT_FILE", str(fact))
    return tmp_path


@pytest.fixture()
def make_server() -> Iterator[ServerFactory]:
    """``make_server(**opts) -> durable.testing.Server``: another started Redis server on a
    random port in a private directory (``opts`` are ``Server``'s: ``fsync``, ``data_dir``);
    every one is stopped at teardown."""
    start, started = _started(lambda **opts: Server(**opts).start())
    yield start
    for srv in started:
        srv.stop()


@pytest.fixture(scope="module")
def raw_world() -> Iterator[WorldProcess]:
    """The example's world (HTTP API, database, model) in its non-deduplicating mode, one
    per test module."""
    with WorldProcess(dedupe=False) as world:
        yield world


@pytest.fixture()
def world(raw_world: WorldProcess, monkeypatch: pytest.MonkeyPatch) -> WorldProcess:
    """The world, faults cleared, exported (its URL, its model's) to the processes."""
    raw_world.client.reset_faults()
    for name, value in raw_world.env().items():
        monkeypatch.setenv(name, value)
    return raw_world


@pytest.fixture(scope="module")
def openai_server() -> Iterator[Any]:
    """The local OpenAI-compatible server of ``tests.servers.openai``, one per test module
    (``reset()`` it per test)."""
    from tests.servers.openai import OpenAIServer

    server = OpenAIServer().start()
    yield server
    server.stop()


@pytest.fixture()
def openai_env(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               openai_server: Any) -> None:
    """The OpenAI Agents SDK tests' environment (``set_openai_env`` of
    ``tests.servers.integration_world``), on a fresh ``openai_server``:
    ``pytestmark = pytest.mark.usefixtures("openai_env")``."""
    from tests.servers.integration_world import set_openai_env

    openai_server.reset()
    set_openai_env(monkeypatch, tmp_path, openai_server.url)


def run_durable(*args: str, env: dict[str, str], cwd: Path | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``durable ARGS`` in a process of its own, as a user runs it (forked: see
    ``pytest_configure``)."""
    if forks.forking():
        return forks.run(args, env, cwd=cwd, timeout=timeout)
    return subprocess.run([sys.executable, "-m", "durable", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
