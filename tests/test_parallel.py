"""Parallel steps: several calls decided at once run at once, each its own step (key,
deadline, outcome), in every agent style; recovery finds them in the order they were
issued and applies none twice. Real Redis, real worker processes, a real SQLite database
that never deduplicates (``TEST_DB_DEDUPE=0``): a step sent twice would show in it."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from durable.audit.verify import verify
from durable.client import Client
from durable.log import events as ev
from durable.testing import wait_for
from tests.agents.basic import applications
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.runs import events_of

STYLES = ["fan_out", "async_fan_out", "decide_fan_out"]


pytestmark = pytest.mark.usefixtures("world_db")


@pytest.mark.parametrize("agent", STYLES)
def test_three_one_second_calls_take_one_second(
    agent: str, client: Client, worker: WorkerFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe of the issue: 3 tool calls of 1 s each took 3.0 s. Now their intents are
    recorded in one append, they run at once, and the run's three calls take about 1 s."""
    monkeypatch.setenv("TEST_SLOW_S", "1.0")
    run = client.start(agent, {"calls": 3}, run_id=f"par-{agent}").run_id
    worker()
    final = client.wait(run, 30)
    assert final.state == "completed", (final.state, final.reason)
    results = final.result["results"]
    assert results == [{"row": f"{run}:{n}"} for n in (1, 2, 3)]
    events = events_of(client, run)
    decided = [e for e in events if isinstance(e, ev.StepDecided) and e.step <= 3]
    assert [(e.step, e.group) for e in decided] == [(1, 1), (2, 1), (3, 1)]
    assert len({e.seq for e in decided}) == 3
    # One append: the three intents and dispatches are consecutive entries.
    first = [type(e).__name__ for e in events if e.seq in range(decided[0].seq,
                                                                 decided[0].seq + 6)]
    assert first == ["StepDecided"] * 3 + ["ActionDispatched"] * 3
    dispatched = [e.ts for e in events if isinstance(e, ev.ActionDispatched) and e.step <= 3]
    outcomes = [e.ts for e in events if isinstance(e, ev.ActionSucceeded) and e.step <= 3]
    # In sequence the three would take 3000 ms at least; at once, about 1000 (a loaded
    # machine adds some).
    assert max(outcomes) - min(dispatched) < 2500, (dispatched, outcomes)
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:{n}": 1 for n in (1, 2, 3)}
    assert verify(client.log, run).ok


@pytest.mark.parametrize("window", ["after_intent:2", "after_effect:2"])
@pytest.mark.parametrize("agent", STYLES)
def test_a_worker_killed_while_they_run_applies_each_once(
    agent: str, window: str, client: Client, worker: WorkerFactory,
    reconciler: ReconcilerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL at step 2's window while the group runs: after the intents and claims were
    recorded (``after_intent:2``: nothing sent yet), or once step 2's row is written while
    steps 1 and 3 are still in flight (``after_effect:2``). The next worker resolves each
    open step by lookup, in step order, and sends only what was not applied: every key is
    applied once, and the function gets every result."""
    monkeypatch.setenv("TEST_SLOW_S", "0.3")
    run = client.start(agent, {"calls": 3}, run_id=f"kill-{agent}-{window[6:11]}").run_id
    doomed = worker(kill_at=window)
    assert doomed.wait(30) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, 60)
    assert final.state == "completed", (final.state, final.reason)
    assert final.result["results"] == [{"row": f"{run}:{n}"} for n in (1, 2, 3)]
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:{n}": 1 for n in (1, 2, 3)}
    assert verify(client.log, run).ok


def test_cancel_interrupts_every_call_of_the_group(client: Client,
                                                   worker: WorkerFactory) -> None:
    """Three cancellable calls of 30 s each: a cancel interrupts all three at once and the
    run ends ``canceled`` within seconds, each call recorded as canceled mid-flight."""
    run = client.start("fan_out", {"calls": 3, "tool": "noop", "sleep_s": 30},
                       run_id="par-cancel").run_id
    worker()
    assert wait_for(lambda: len(client.status(run).open_actions) == 3, 20)
    began = time.monotonic()
    client.cancel(run, "no longer needed")
    final = client.wait(run, 15)
    assert final.state == "canceled" and time.monotonic() - began < 10
    interrupted = {e.step for e in events_of(client, run)
                   if isinstance(e, ev.ActionInterrupted | ev.CallCanceled)}
    assert interrupted == {1, 2, 3}
    assert verify(client.log, run).ok


def test_one_failure_keeps_the_others_outcomes(client: Client, worker: WorkerFactory,
                                               tmp_path: Path) -> None:
    run = client.start("partly_failing", {}, run_id="par-fail").run_id
    worker(burst=True).wait(60)
    final = client.status(run)
    assert final.state == "completed", (final.state, final.reason)
    assert final.result == {"first": ["dict", "StepFailed", "dict"], "failed_step": 5,
                            "outcomes": ["dict", "StepFailed"]}
    assert applications(str(tmp_path / "world.sqlite")) == {
        f"{run}:1": 1, f"{run}:3": 1, f"{run}:4": 1}


@pytest.mark.parametrize("agent,said", [
    ("too_wide", "3 calls at once, the agent's max_parallel is 2"),
    ("from_a_thread", "a step was taken from another thread"),
])
def test_what_breaks_the_rule_is_refused_with_the_rule(
    agent: str, said: str, client: Client, worker: WorkerFactory
) -> None:
    run = client.start(agent, {}, run_id=f"par-{agent}").run_id
    worker(burst=True).wait(60)
    final = client.status(run)
    assert final.state == "quarantined"
    assert said in (final.reason or ""), final.reason
    assert not [e for e in events_of(client, run) if isinstance(e, ev.StepDecided)]


def test_an_outcome_lands_as_it_arrives(client: Client, worker: WorkerFactory) -> None:
    """A quick call and a 3 s one at once: the quick one's outcome is in the log while the
    slow one still runs (a worker killed then would keep it), not only once both end."""
    run = client.start("uneven", {}, run_id="par-uneven").run_id
    worker()

    def quick_recorded_slow_open() -> bool:
        events = events_of(client, run)
        done = {e.step for e in events if isinstance(e, ev.ActionSucceeded)}
        sent = {e.step for e in events if isinstance(e, ev.ActionDispatched)}
        return done == {1} and sent == {1, 2}

    assert wait_for(quick_recorded_slow_open, 10)
    final = client.wait(run, 15)
    assert final.state == "completed" and final.result == [{"n": 1}, {"n": 2}]
    assert verify(client.log, run).ok
