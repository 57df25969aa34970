"""Starting by name: workers publish their agents (name, version, input schema) to Redis,
and a producer that does not import an agent starts it from that catalog, its input
checked against the published schema. A run id is idempotent for the same input only."""

from __future__ import annotations

import json
import logging
import subprocess
import threading
from pathlib import Path

import pytest
import redis

from durable import catalog
from durable.agents import Registry, registry
from durable.client import Client
from durable.errors import InvalidInput, RunIdConflict, UnknownAgent
from durable.log import events as ev
from durable.log import keys
from durable.settings import Settings
from durable.testing import Server, Worker, env_for, wait_for
from durable.workers.runtime import publish_agents
from tests.agents.basic import EchoInput
from tests.conftest import ServerFactory, WorkerFactory, run_durable


def _bare_client(r: redis.Redis) -> Client:
    """A producer that imports no agent at all."""
    return Client(Settings.from_env(agents=""), r, agents=Registry())


def _published(r: redis.Redis, name: str) -> dict[str, object]:
    raw = r.hget(keys.AGENTS, name)
    assert raw is not None, f"{name} is not published"
    out: dict[str, object] = json.loads(raw)
    return out


def _start_cli(server: Server, *argv: str) -> subprocess.CompletedProcess[str]:
    """``durable start`` in a process with no agents to import."""
    return run_durable("start", *argv, env=env_for(server.url, DURABLE_AGENTS=""))


def test_a_client_without_the_agent_starts_a_run_a_worker_published(
    server: Server, client: Client, r: redis.Redis, worker: WorkerFactory
) -> None:
    worker()
    assert wait_for(lambda: r.hexists(keys.AGENTS, "echo"), 30)
    entry = _published(r, "echo")
    assert entry["name"] == "echo" and entry["version"] == registry.agent("echo").version
    assert entry["schema"] == EchoInput.model_json_schema()
    assert entry["tools"] == ["noop", "stubborn", "blocker"]
    assert str(entry["by"]).startswith("worker:") and int(str(entry["published_at"])) > 0

    out = _start_cli(server, "echo", "--input", '{"text": "by name"}', "--run-id", "name-1")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "name-1\n"
    state = client.wait("name-1", 30)
    assert state.state == "completed" and state.result == "by name"
    started = client.events("name-1")[0].event
    assert isinstance(started, ev.RunStarted)
    # The defaults the schema declares are filled in, as the model would; the run records
    # the published version and tools.
    assert started.input == {"text": "by name", "steps": 1}
    assert started.agent_version == entry["version"] and started.tools == entry["tools"]


def test_invalid_input_is_refused_with_the_published_schema(
    server: Server, client: Client, r: redis.Redis
) -> None:
    catalog.publish(r, [registry.agent("echo")], "worker:test")
    out = _start_cli(server, "echo", "--input", '{"steps": "many"}', "--run-id", "bad-1")
    assert out.returncode == 2
    assert "invalid input for agent 'echo'" in out.stderr and "steps" in out.stderr
    bare = _bare_client(r)
    with pytest.raises(InvalidInput, match="text: 5 is not of type 'string'"):
        bare.start("echo", {"text": 5}, run_id="bad-2")
    k = client.log.keys
    assert not r.exists(k.run("bad-1"), k.run("bad-2"), k.log("bad-1"))
    assert bare.runs() == []


def test_an_agent_neither_imported_nor_published_is_unknown(
    server: Server, client: Client, r: redis.Redis
) -> None:
    catalog.publish(r, [registry.agent("echo")], "worker:test")
    with pytest.raises(UnknownAgent) as caught:
        _bare_client(r).start("ghost", {})
    assert "no worker has registered it" in str(caught.value)
    assert caught.value.known == ["echo"]
    out = _start_cli(server, "ghost")
    assert out.returncode == 2
    assert "unknown agent 'ghost': no worker has registered it (known: echo)" in out.stderr
    assert client.runs() == []


def test_a_producer_that_imports_the_agent_publishes_it_unless_a_worker_did(
    client: Client, r: redis.Redis
) -> None:
    client.start("count", {"steps": 1}, run_id="pub-1", enqueue=False)
    assert str(_published(r, "count")["by"]).startswith("client:")
    # A worker's entry is the one that stays.
    catalog.publish(r, [registry.agent("echo")], "worker:w1")
    client.start("echo", {"text": "x"}, run_id="pub-2", enqueue=False)
    assert _published(r, "echo")["by"] == "worker:w1"
    # And a producer without the agent can now start what the first one published.
    assert _bare_client(r).start("count", {"steps": 2}, run_id="pub-3").created


@pytest.mark.parametrize("local", [True, False], ids=["imported", "by-name"])
def test_the_same_run_id_with_the_same_input_returns_the_existing_run(
    client: Client, r: redis.Redis, local: bool
) -> None:
    catalog.publish(r, [registry.agent("echo")], "worker:test")
    producer = client if local else _bare_client(r)
    first = producer.start("echo", {"text": "same"}, run_id="same-1")
    queue = client.settings.worker.queue
    length, queued = r.xlen(client.log.keys.log("same-1")), r.llen(keys.ready(queue, "echo"))
    # Equal once the defaults are filled in: still the same input.
    again = producer.start("echo", {"steps": 1, "text": "same"}, run_id="same-1")
    assert first.created and not again.created and again.run_id == "same-1"
    assert r.xlen(client.log.keys.log("same-1")) == length
    assert r.llen(keys.ready(client.settings.worker.queue, "echo")) == queued


@pytest.mark.parametrize("local", [True, False], ids=["imported", "by-name"])
def test_the_same_run_id_with_another_input_is_refused_and_nothing_written(
    client: Client, r: redis.Redis, local: bool
) -> None:
    catalog.publish(r, [registry.agent("echo")], "worker:test")
    producer = client if local else _bare_client(r)
    producer.start("echo", {"text": "first"}, run_id="other-1")
    before = r.xrange(client.log.keys.log("other-1"))
    projection = r.hgetall(client.log.keys.run("other-1"))
    queued = r.llen(keys.ready(client.settings.worker.queue, "echo"))
    with pytest.raises(RunIdConflict, match="already exists with a different input"):
        producer.start("echo", {"text": "second"}, run_id="other-1")
    with pytest.raises(RunIdConflict, match="agent 'echo', not 'count'"):
        client.start("count", {"steps": 1}, run_id="other-1")
    assert r.xrange(client.log.keys.log("other-1")) == before
    assert r.hgetall(client.log.keys.run("other-1")) == projection
    assert r.llen(keys.ready(client.settings.worker.queue, "echo")) == queued


def test_the_cli_says_why_a_run_id_is_refused(server: Server, client: Client) -> None:
    client.start("count", {"steps": 1}, run_id="cli-conflict", enqueue=False)
    out = run_durable("start", "count", "--input", '{"steps": 2}', "--run-id", "cli-conflict",
                      env=env_for(server.url))
    assert out.returncode == 2
    assert "run 'cli-conflict' already exists with a different input" in out.stderr


def test_a_worker_whose_redis_went_away_while_it_started_publishes_its_agents_once_back(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    """Window: Redis is killed after the worker connected and before it published its
    agents (the worker is held in its import of their modules, ``tests.gated_import``).
    That publication fails; once Redis is back the worker's agents are in the catalog, and
    a producer that does not import them starts one by name and the worker completes it.
    (The worker only logged the failure: its agents stayed unlisted until another worker
    started.)"""
    srv = make_server(fsync="always")
    mark, gate, log = tmp_path / "importing", tmp_path / "gate", tmp_path / "w.log"
    w = Worker(srv.url, log_path=log, DURABLE_AGENTS="examples.agents,tests.gated_import",
               env={"TEST_IMPORT_MARK": str(mark), "TEST_IMPORT_GATE": str(gate)})
    try:
        assert wait_for(mark.exists, 60), log.read_text()
        srv.kill()
        gate.touch()
        assert wait_for(lambda: "could not publish the agents" in log.read_text(), 30), \
            log.read_text()
        srv.start()
        r = srv.client()
        assert wait_for(lambda: r.hexists(keys.AGENTS, "count"), 30), log.read_text()
        assert str(_published(r, "count")["by"]).startswith("worker:")
        producer = _bare_client(r)
        run = producer.start("count", {"steps": 1}, run_id="after-outage").run_id
        assert producer.wait(run, 30).state == "completed"
        assert w.alive()
    finally:
        w.stop()


def test_a_worker_refused_the_catalog_by_its_acl_says_so_once_and_does_not_retry(
    make_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis answers the worker's publication with NOPERM (its ACL user lacks the catalog's
    key): no later attempt can succeed, so the worker logs an error naming the key and the
    refusal, and starts no thread retrying it. (It took the refusal for an outage: a warning,
    then a thread retrying quietly for as long as the worker lived.)"""
    srv = make_server(fsync="everysec")
    admin = srv.client()
    admin.execute_command("ACL", "SETUSER", "nocatalog", "on", ">pw", "resetkeys", "~rq:*",
                          "+@all")
    limited = redis.Redis(host="127.0.0.1", port=srv.port, username="nocatalog", password="pw")
    retrying = {t.ident for t in threading.enumerate() if t.name == "catalog"}
    with caplog.at_level(logging.WARNING, logger="durable.worker"):
        publish_agents(limited, "worker:test")
    (record,) = [r for r in caplog.records if r.name == "durable.worker"]
    assert record.levelno == logging.ERROR
    assert keys.AGENTS in record.getMessage() and "no permissions" in record.getMessage()
    assert {t.ident for t in threading.enumerate() if t.name == "catalog"} == retrying
    assert not admin.exists(keys.AGENTS)
    limited.close()
