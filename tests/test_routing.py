"""Routing by agent: a worker takes only runs of agents it has. Runs wait on their agent's
own ready list; a run of an agent no live worker has waits visibly (``durable status``
says why) and starts as soon as a worker that has it starts. Real Redis, real worker
processes, each loading its own agent module."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import tests.agents.routing_alpha
import tests.agents.routing_beta  # noqa: F401  (the client validates starts against them)
from durable.client import Client
from durable.log import events as ev
from durable.telemetry.liveness import served_agents
from durable.testing import wait_for
from tests.conftest import WorkerFactory, run_durable

ALPHA, BETA = "tests.agents.routing_alpha", "tests.agents.routing_beta"


def _owners(client: Client, run: str) -> set[str]:
    return {e.event.owner for e in client.events(run) if isinstance(e.event, ev.LeaseAcquired)}


def test_two_kinds_of_workers_take_only_their_agents_runs(client: Client,
                                                           worker: WorkerFactory,
                                                           tmp_path: Path) -> None:
    """The probe of the issue: a fleet with two kinds of workers quarantined every run a
    worker did not import. 50 runs of each agent, one worker of each kind: every run
    completes, none is quarantined, and each was driven only by the worker that has its
    agent."""
    runs = {agent: [client.start(agent, {"steps": 3}, run_id=f"{agent}-{i}").run_id
                    for i in range(50)] for agent in ("alpha", "beta")}
    worker(DURABLE_AGENTS=ALPHA, log_path=tmp_path / "a.log")
    worker(DURABLE_AGENTS=BETA, log_path=tmp_path / "b.log")
    every = [run for ids in runs.values() for run in ids]

    def states() -> set[str]:
        return {(client.redis.hget(client.log.keys.run(run), "state") or b"").decode()
                for run in every}

    assert wait_for(lambda: states() == {"completed"}, 60), states()
    owners = {agent: set().union(*(_owners(client, run) for run in ids))
              for agent, ids in runs.items()}
    assert len(owners["alpha"]) == 1 and len(owners["beta"]) == 1
    assert owners["alpha"] != owners["beta"]
    assert client.stats().get("runs_routed", 0) == 0  # nothing was taken by the wrong one


def test_a_run_no_live_worker_can_take_waits_visibly_then_starts(
    client: Client, worker: WorkerFactory
) -> None:
    run = client.start("beta", {"steps": 2}, run_id="lonely").run_id
    worker(DURABLE_AGENTS=ALPHA)
    other = client.start("alpha", {"steps": 1}, run_id="served").run_id
    assert client.wait(other, 30).state == "completed"  # the alpha worker is serving
    assert client.status(run).state == "pending"
    shown = run_durable("status", run, env={**os.environ, "COLUMNS": "200"})
    assert "no live worker has agent 'beta'" in shown.stdout, shown.stdout
    worker(DURABLE_AGENTS=BETA)
    assert client.wait(run, 30).state == "completed"


def test_a_rolling_deploy_runs_old_and_new_workers_side_by_side(
    client: Client, worker: WorkerFactory
) -> None:
    """Old (v1) and new (v2) workers of one agent at once, 40 runs in flight: every run
    completes; those taken by the new code continue under it (its default upgrade
    policy), none is quarantined."""
    runs = [client.start("alpha", {"steps": 4, "sleep_s": 0.05}, run_id=f"roll-{i}").run_id
            for i in range(40)]
    worker(DURABLE_AGENTS=ALPHA, TEST_ALPHA_VERSION="1")
    worker(DURABLE_AGENTS=ALPHA, TEST_ALPHA_VERSION="2")
    assert wait_for(lambda: all(client.redis.hget(client.log.keys.run(r), "state") == b"completed"
                                for r in runs), 60)
    versions = {client.status(r).result["version"] for r in runs}
    assert versions <= {"1", "2"} and versions


def test_a_strict_new_version_hands_old_runs_to_an_old_worker(
    client: Client, worker: WorkerFactory
) -> None:
    """A new version that may not take over older runs (``on_version_change =
    "quarantine"``) next to an old worker: each v1 run the new worker takes goes on the v1
    ready list, unwritten, and the old worker completes it. None is quarantined."""
    old = worker(DURABLE_AGENTS=ALPHA, TEST_ALPHA_VERSION="1", DURABLE_CONCURRENCY="4")
    worker(DURABLE_AGENTS=ALPHA, TEST_ALPHA_VERSION="2", TEST_ALPHA_POLICY="quarantine")

    def serving() -> set[str]:
        return set().union(*served_agents(client.redis).values())

    assert wait_for(lambda: {"alpha@1", "alpha@2"} <= serving(), 20)
    def completed(ids: list[str]) -> bool:
        return all(client.redis.hget(client.log.keys.run(r), "state") == b"completed"
                   for r in ids)

    runs: list[str] = []
    # Which worker takes a run's next step is up to the queue: batches of 10 runs until the
    # new worker has taken (and handed back) one, at most 10 batches.
    for batch in range(10):
        runs += [client.start("alpha", {"steps": 3, "sleep_s": 0.02},
                              run_id=f"strict-{batch}-{i}").run_id for i in range(10)]
        assert wait_for(partial(completed, list(runs)), 60), \
            {r: client.status(r).state for r in runs}
        if client.stats().get("runs_routed", 0) >= 1:
            break
    assert {client.status(r).result["version"] for r in runs} == {"1"}
    assert not [e for r in runs for e in client.events(r)
                if isinstance(e.event, ev.AgentUpgraded | ev.Quarantined)]
    assert client.stats().get("runs_routed", 0) >= 1  # the new worker took some, and gave them
    assert old.alive()
