"""Tenants and owners: recorded in the run's first event, indexed, filterable in ``durable
runs`` and the console, inherited by child runs and given by schedules, counted in the
metrics under a bounded label. Real Redis, real worker processes."""

from __future__ import annotations

import os

import msgspec
import pytest

from durable.client import Client
from durable.errors import UsageError
from durable.log import events as ev
from durable.log import keys
from durable.settings import Settings
from durable.telemetry.metrics import exposition
from tests.conftest import ReconcilerFactory, WorkerFactory, run_durable


def _first(client: Client, run: str) -> ev.RunStarted:
    event = client.events(run)[0].event
    assert isinstance(event, ev.RunStarted)
    return event


def test_a_start_records_and_indexes_tenant_owner_and_priority(client: Client) -> None:
    client.start("count", {"steps": 1}, run_id="t-a1", tenant="acme", owner="ann@acme",
                 priority=5)
    client.start_many("count", [{"steps": 1}] * 3, run_ids=["t-b1", "t-b2", "t-b3"],
                      tenant="bolt", owner="svc")
    client.start("count", {"steps": 1}, run_id="t-none")
    first = _first(client, "t-a1")
    assert (first.tenant, first.owner, first.priority) == ("acme", "ann@acme", 5)
    state = client.status("t-a1")
    assert (state.tenant, state.owner, state.priority) == ("acme", "ann@acme", 5)
    assert _first(client, "t-none").tenant == ""
    assert {r.run_id for r in client.runs(tenant="bolt")} == {"t-b1", "t-b2", "t-b3"}
    assert [r.run_id for r in client.runs(tenant="acme")] == ["t-a1"]
    assert {r.run_id for r in client.runs(owner="svc")} == {"t-b1", "t-b2", "t-b3"}
    assert client.runs(tenant="acme", state="completed") == []
    k = client.log.keys
    assert client.redis.zcard(k.runs_of_tenant("bolt", k.shard_of("t-b1"))) == 3
    row = client.runs(tenant="acme")[0]
    assert (row.tenant, row.owner) == ("acme", "ann@acme")


def test_a_log_written_before_tenants_reads_as_no_tenant() -> None:
    """An entry of an older release has no tenant, owner or priority: the defaults."""
    old = msgspec.msgpack.encode({"type": "run_started", "v": 3, "run": "old", "seq": 1,
                                  "ts": 1, "agent": "count"})
    event = ev.decode(old)
    assert isinstance(event, ev.RunStarted)
    assert (event.tenant, event.owner, event.priority) == ("", "", 0)


def test_bad_names_and_a_required_tenant_are_refused_before_anything_is_written(
        settings: Settings, client: Client) -> None:
    for bad in ({"tenant": "a{b}"}, {"owner": "x" * 65}, {"priority": 1000}):
        with pytest.raises(UsageError):
            client.start("count", {"steps": 1}, run_id="bad", **bad)
    strict = Client(settings.replace(require_tenant=True), client.redis)
    with pytest.raises(UsageError, match="tenant is required"):
        strict.start("count", {"steps": 1}, run_id="bad")
    with pytest.raises(UsageError, match="tenant is required"):
        strict.start_many("count", [{"steps": 1}], run_ids=["bad"])
    assert not client.redis.exists(client.log.keys.log("bad"))
    assert strict.start("count", {"steps": 1}, run_id="good", tenant="acme").created


def test_the_metrics_label_at_most_the_configured_tenants(settings: Settings,
                                                           client: Client) -> None:
    capped = Client(settings.replace(metric_tenants=2), client.redis)
    for n, tenant in enumerate(["t1", "t2", "t3", "t4", "t1"]):
        capped.start("count", {"steps": 1}, run_id=f"m{n}", tenant=tenant)
    capped.start("count", {"steps": 1}, run_id="m-none")
    text = exposition(client)[0].decode()
    started = {line for line in text.splitlines()
               if line.startswith("durable_runs_started_total{")}
    assert started == {'durable_runs_started_total{agent="count",tenant="t1"} 2.0',
                       'durable_runs_started_total{agent="count",tenant="t2"} 1.0',
                       'durable_runs_started_total{agent="count",tenant="other"} 2.0',
                       'durable_runs_started_total{agent="count",tenant=""} 1.0'}, started


@pytest.mark.usefixtures("world_db")
def test_a_child_inherits_its_parents_tenant_and_owner(client: Client, worker: WorkerFactory,
                                                      reconciler: ReconcilerFactory) -> None:
    run = client.start("parent", {"children": 1}, run_id="fam-t", tenant="acme",
                       owner="ann").run_id
    worker()
    reconciler()
    assert client.wait(run, 30, waiting=False).state == "completed"
    kid = client.status(keys.child_id(run, 1))
    assert (kid.tenant, kid.owner) == ("acme", "ann")
    assert {r.run_id for r in client.runs(tenant="acme")} == {run, keys.child_id(run, 1)}


def test_a_schedules_runs_carry_its_tenant(client: Client) -> None:
    entry = client.schedules.add("nightly", "* * * * *", "count", {"steps": 1},
                                 tenant="acme", owner="cron", now=0)
    assert entry.schedule is not None and entry.schedule.tenant == "acme"
    client.schedules.sweep(now=120_000)
    runs = client.runs(tenant="acme")
    assert runs and all(r.owner == "cron" for r in runs)
    assert _first(client, runs[0].run_id).tenant == "acme"


def test_the_cli_starts_and_lists_by_tenant(client: Client) -> None:
    env = dict(os.environ)
    out = run_durable("start", "count", "--input", '{"steps": 1}', "--run-id", "cli-t",
                      "--tenant", "acme", "--owner", "ann", env=env)
    assert out.stdout.strip() == "cli-t", out.stderr
    client.start("count", {"steps": 1}, run_id="cli-other", tenant="bolt")
    shown = run_durable("runs", "--tenant", "acme", env=env).stdout
    assert "cli-t" in shown and "cli-other" not in shown and "ann" in shown, shown
    refused = run_durable("start", "count", "--tenant", "a b", env=env)
    assert refused.returncode != 0 and "invalid tenant" in refused.stderr, refused.stderr
