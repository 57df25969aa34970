"""``durable.testing.AgentEnvironment``: one agent or one tool run in the test's process on
a real embedded Redis server, with a clock the test moves for timers, waits and leases.

Each test opens its own environment (its own server on a random port, its own clock); the
runs are driven by the worker's step protocol and the reconciler's sweep, in this process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable import clock
from durable.leases import Leases
from durable.log.keys import KeyLayout
from durable.testing import AgentEnvironment, TestClock
from tests.agents.basic import applications
from tests.runs import types_of

AGENTS = "examples.agents,tests.agents.basic,tests.agents.code"


@pytest.fixture()
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AgentEnvironment]:
    monkeypatch.setenv("TEST_DB", str(tmp_path / "world.sqlite"))
    monkeypatch.setenv("TEST_DB_DEDUPE", "0")
    with AgentEnvironment(AGENTS, clock=TestClock(start=1_800_000_000.0)) as environment:
        yield environment


def test_an_agent_runs_to_its_end_in_the_test_process(env: AgentEnvironment) -> None:
    """Three steps of a real agent, each decided, claimed, dispatched and recorded by the
    worker's own step protocol; the events carry the test clock's time."""
    final = env.execute("writer", {"steps": 3}, run_id="w-1")
    assert final.state == "completed"
    assert applications(os.environ["TEST_DB"]) == {f"w-1:{s}": 1 for s in (1, 2, 3)}
    events = list(env.client.events("w-1"))
    assert {e.event.ts for e in events if e.event} == {1_800_000_000_000}
    assert types_of(env.client, "w-1").count("action_succeeded") == 3


def test_a_timer_of_an_hour_passes_when_the_clock_is_moved(env: AgentEnvironment) -> None:
    """``ctx.sleep(3600)``: the run waits on a durable timer; a second short of the hour the
    sweep leaves it alone, at the hour it wakes it and the run completes, and what the
    agent read from ``ctx.time()`` on either side of the sleep is an hour apart."""
    run = env.start("sleeper", {"seconds": 3600})
    assert env.status(run).state == "waiting_timer"
    assert run not in env.advance(3599)  # not due yet: the sweep does not even look at it
    assert env.status(run).state == "waiting_timer"
    env.advance(1)
    final = env.status(run)
    assert final.state == "completed", final
    assert final.result["awake"] - final.result["asleep"] == pytest.approx(3600)


def test_an_input_wait_is_answered_or_expires_on_the_test_clock(
    env: AgentEnvironment,
) -> None:
    """``Wait("input", timeout_s=3600)``: answered, the run goes on at once; left alone,
    it expires when the clock passes its expiry (the reconciler's sweep writes it)."""
    answered = env.start("asker", {"text": "hello"})
    assert env.status(answered).state == "waiting_input"
    env.client.respond(answered, "go on")
    env.drain()
    assert env.status(answered).state == "completed"
    left = env.start("asker", {"text": "hello"})
    env.advance(1800)
    assert env.status(left).state == "waiting_input"
    env.advance(1800)
    final = env.status(left)
    assert final.state == "expired" and "wait_expired" in types_of(env.client, left)


def test_a_lease_left_by_a_dead_worker_expires_on_the_test_clock(
    layout: KeyLayout, env: AgentEnvironment,
) -> None:
    """Window: a worker took the run's lease and died (nothing written after it). Until
    the lease's time to live has passed on the test clock the run stays with it; then the
    sweep takes it back and the run completes here."""
    run = env.client.start("count", {"steps": 2}, enqueue=False).run_id
    ttl = env.settings.leases.ttl_ms
    lease, _, _ = Leases(env.redis, ttl, env.client.log.keys).acquire(run, "w:dead")
    assert lease is not None
    env.redis.zadd(layout.due_of(run), {run: clock.now_ms() + ttl})  # as a holder does
    assert env.advance(ttl / 2000).get(run) in (None, "held")
    assert env.redis.exists(layout.lease(run))
    env.advance(ttl / 1000)
    assert env.status(run).state == "completed"
    assert env.status(run).version > 1 and not env.redis.exists(layout.lease(run))


def test_one_tool_is_called_as_a_worker_calls_it(env: AgentEnvironment) -> None:
    """``call_tool``: one dispatch with a key and a deadline from the tool's timeout; the
    outcome is what a worker would record, and ``lookup`` finds the effect by its key."""
    done = env.call_tool("sqlwrite", {"n": 1}, key="k-1")
    assert done.outcome == "action_succeeded" and done.result == {"row": "k-1"}
    assert env.lookup("sqlwrite", "k-1").status == "applied"
    assert env.lookup("sqlwrite", "k-2").status == "not_applied"


def test_the_environment_gives_the_clock_back() -> None:
    """Outside the block the library reads the system clock again; a test clock moves
    forward only, and says so when asked to go back."""
    test_clock = TestClock(start=0.0)
    with AgentEnvironment(AGENTS, clock=test_clock):
        assert clock.current() is test_clock
        assert clock.now_ms() == 0
    assert clock.current() is clock.SYSTEM
    with pytest.raises(ValueError, match="forward only"):
        test_clock.advance(-1)
    assert test_clock.advance(2.5) == 2.5
