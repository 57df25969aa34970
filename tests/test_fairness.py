"""Fairness and priorities when ready runs are taken (``durable.flow.fairness``): the order of
``ready_take.lua`` on the real Redis server, then real worker processes: a small tenant's
runs start while a big tenant's backlog drains, and a high-priority run started behind
hundreds of ready ones takes its first step first."""

from __future__ import annotations

from typing import Any

import redis

from durable.client import Client
from durable.flow import fairness
from durable.log import events as ev
from durable.log import keys
from durable.queue import make_queue, push
from durable.testing import wait_for
from tests.conftest import WorkerFactory

READY = keys.ready("q", "agent")


def _take(r: redis.Redis, count: int | None = None) -> Any:
    raw = fairness.take(r.execute_command, r, READY, count)
    if raw is None:
        return [] if count else None
    if isinstance(raw, list):
        return [x.decode() for x in raw]
    return raw.decode()


def _push(r: redis.Redis, runs: list[str], tenant: str = "", priority: int = 0) -> None:
    push(make_queue(r, "q"), "agent", runs, {run: (tenant, priority) for run in runs})


def test_ready_runs_are_taken_round_robin_by_tenant(r: redis.Redis) -> None:
    _push(r, [f"a{n}" for n in range(100)], tenant="A")
    _push(r, ["b0", "b1"], tenant="B")
    _push(r, ["c0"], tenant="C")
    assert _take(r, 7) == ["a0", "b0", "c0", "a1", "b1", "a2", "a3"]
    _push(r, ["d0"], tenant="D")  # a newcomer starts in the current round, not after A's 96
    assert _take(r, 2) == ["a4", "d0"]
    assert r.zcard(keys.fair(READY, "runs")) == 95


def test_the_plain_list_takes_its_turn_and_a_single_take_answers_as_lpop(
        r: redis.Redis) -> None:
    _push(r, ["p0", "p1", "p2"])  # no tenant, priority 0: the plain list
    _push(r, ["t0", "t1"], tenant="T")
    assert r.llen(READY) == 3
    assert _take(r, 4) == ["p0", "t0", "p1", "t1"]
    assert _take(r) == "p2"
    assert _take(r) is None and _take(r, 5) == []


def test_priority_goes_ahead_and_aging_bounds_the_wait(r: redis.Redis) -> None:
    _push(r, [f"n{n}" for n in range(500)], tenant="A")
    _push(r, ["urgent"], tenant="A", priority=100)
    assert _take(r, 1) == ["urgent"]  # behind 500 ready ones, taken first
    # A steady stream of priority-1 runs from ever-new tenants passes a priority-0 run
    # for at most AGING rounds: then it is taken.
    _push(r, ["low"], tenant="L")
    taken: list[str] = []
    for n in range(3 * fairness.AGING):
        _push(r, [f"hi{n}"], tenant=f"H{n}", priority=1)
        taken += _take(r, 1)
        if "low" in taken:
            break
    assert "low" in taken, taken
    passed = [t for t in taken[:taken.index("low")] if t.startswith("hi")]
    assert len(passed) <= fairness.AGING + 2, taken  # (+ ties, broken by run id)


def _first_step_ms(client: Client, run: str) -> int:
    for entry in client.events(run):
        if isinstance(entry.event, ev.StepDecided):
            return entry.event.ts
    raise AssertionError(f"{run} took no step")


def test_a_small_tenant_starts_while_a_big_tenants_backlog_drains(
        client: Client, worker: WorkerFactory) -> None:
    """Tenant A starts 2,000 runs of 0.05 s steps, then tenant B starts 10: one worker with
    4 slots. B's runs take their first step within a bounded time and all complete while
    most of A's backlog still waits."""
    big = client.start_many("count", [{"steps": 2, "sleep_s": 0.05}] * 2000, tenant="A")
    began = client.start_many("count", [{"steps": 1, "sleep_s": 0.05}] * 10, tenant="B")
    small = [s.run_id for s in began]
    started_ms = client.events(small[0])[0].event.ts  # type: ignore[union-attr]
    worker(DURABLE_CONCURRENCY="4")
    assert wait_for(lambda: all(client.redis.hget(client.log.keys.run(r), "state") == b"completed"
                                for r in small), 60)
    done_a = sum(1 for s in big if client.redis.hget(client.log.keys.run(s.run_id), "state")
                 == b"completed")
    waits = [(_first_step_ms(client, r) - started_ms) / 1000 for r in small]
    assert max(waits) < 10, waits
    assert done_a < 1000, done_a  # B did not wait for A's backlog


def test_a_high_priority_run_behind_many_ready_ones_steps_first(
        client: Client, worker: WorkerFactory) -> None:
    client.start_many("count", [{"steps": 1}] * 300)
    urgent = client.start("count", {"steps": 1}, run_id="urgent", priority=50).run_id
    worker(DURABLE_CONCURRENCY="1")
    assert client.wait(urgent, 30).state == "completed"
    first = _first_step_ms(client, urgent)
    others = [r.run_id for r in client.runs("completed", 400) if r.run_id != urgent]
    assert all(_first_step_ms(client, r) >= first for r in others), others
