"""Timeouts and retries: named retryable errors retry quickly, then wait (waiting_retry)
with a due time the reconciler wakes; anything else is a failure the agent handles."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable.agents import registry
from durable.audit.verify import verify
from durable.client import Client
from durable.log.store import now_ms
from durable.reconciler.sweep import Sweeper
from durable.workers.loop import StepLoop


@pytest.fixture()
def flaky(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "calls"
    monkeypatch.setenv("TEST_FLAKY_FILE", str(path))
    return path


def _driver(client: Client) -> StepLoop:
    return StepLoop(client.settings, client.redis, registry, "test-worker")


def test_quick_retries_absorb_a_short_outage(client: Client, flaky: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_FLAKY_N", "2")
    client.start("persistent", {}, run_id="q1", enqueue=False)
    _driver(client).advance("q1")
    state = client.status("q1")
    assert state.state == "completed" and state.result == {"calls": 3}
    assert state.actions[1].attempts == 1  # one dispatch, retried inside its deadline
    assert verify(client.log, "q1").ok


def test_a_longer_outage_waits_for_its_retry_timer(client: Client, flaky: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_FLAKY_N", "4")
    client.start("persistent", {}, run_id="q2", enqueue=False)
    _driver(client).advance("q2")
    state = client.status("q2")
    assert state.state == "waiting_retry" and state.actions[1].status == "not_applied"
    assert state.wait is not None and state.wait.until > now_ms() - 1000
    Sweeper(client.settings, client.redis, registry).tick(now=state.wait.until + 1)
    assert client.status("q2").state == "pending"
    _driver(client).advance("q2")
    final = client.status("q2")
    assert final.state == "completed" and final.result == {"calls": 5}
    keys = {e.event.key for e in client.events("q2")
            if e.event is not None and hasattr(e.event, "key")}
    assert keys == {"q2:1"}  # the same key on every attempt
    assert final.actions[1].attempts == 2
    assert verify(client.log, "q2").ok


def test_a_non_retryable_error_is_a_failure_the_agent_decides_on(client: Client,
                                                                 flaky: Path) -> None:
    client.start("persistent", {"boom": True}, run_id="q3", enqueue=False)
    _driver(client).advance("q3")
    state = client.status("q3")
    assert state.state == "failed"
    assert state.error == "gave up: ValueError: bad request: not retryable"
    assert not flaky.exists()  # never retried
