"""``async def`` code agents and tools on the worker's event loop: held by the hundred with
no thread per run, recovered after a SIGKILL without applying an effect twice, and a
function that blocks the loop reported (and, past its limit, interrupted) while the
other runs go on.

The external system of the crash test is a real SQLite database that never deduplicates
(``TEST_DB_DEDUPE=0``): only the ledger and lookups stand between a retry and a duplicate.
"""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from durable.client import Client
from durable.testing import wait_for
from tests.agents.basic import applications
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.runs import killed_at_step_2_then_resumed, types_of

#: Runs held at once by one worker in the thread test.
HELD = 300


@pytest.fixture(autouse=True)
def _db_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_DB", str(tmp_path / "world.sqlite"))
    monkeypatch.setenv("TEST_DB_DEDUPE", "0")


def _threads(pid: int) -> int:
    """Threads of the process ``pid`` and of its children (read from /proc by psutil)."""
    proc = psutil.Process(pid)
    return proc.num_threads() + sum(c.num_threads() for c in proc.children(recursive=True))


def _in_call(client: Client, runs: list[str]) -> int:
    count = 0
    for run in runs:
        act = client.status(run).current
        count += act is not None and act.status == "dispatched"
    return count


def test_many_async_agents_held_at_once_use_no_thread_per_run(
    client: Client, worker: WorkerFactory
) -> None:
    """300 runs of an ``async def`` agent, each awaiting an ``async def`` tool (20 s) at
    the same moment, in one worker: while every one of them is in its call, the worker
    process runs far fewer threads than runs (its own few, none per run); then each run
    completes."""
    runs = [run.run_id for run in client.start_many("async_holder",
                                                    [{"sleep_s": 20.0}] * HELD)]
    w = worker(DURABLE_CONCURRENCY=str(HELD + 10))
    assert wait_for(lambda: _in_call(client, runs) == HELD, 60, interval=0.5)
    threads = _threads(w.pid)
    assert threads < 50, f"{threads} threads for {HELD} held runs"
    assert wait_for(lambda: all(client.status(r).state == "completed" for r in runs), 90,
                    interval=0.5)


@pytest.mark.parametrize("window", ["after_intent", "after_effect", "after_outcome"])
def test_a_killed_async_agent_resumes_without_applying_an_effect_twice(
    window: str, client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
    tmp_path: Path,
) -> None:
    """SIGKILL at step 2's window of an ``async def`` agent whose ``async def`` tool writes
    rows: after its intent and claim are recorded, before the row is written / after the
    row is written, before its outcome is recorded / after its outcome is recorded. The
    function is executed again on another worker: step 1 returns its recorded row, step 2
    is resolved by lookup (or sent once), step 3 is new; each row is written once."""
    killed_at_step_2_then_resumed(client, worker, reconciler, str(tmp_path / "world.sqlite"),
                                  "async_writer", f"awk-{window}", window)


def test_an_async_agent_that_blocks_the_loop_is_reported_and_the_others_go_on(
    client: Client, worker: WorkerFactory, tmp_path: Path
) -> None:
    """One ``async def`` agent calls ``time.sleep`` (0.8 s) on the worker's event loop
    beside 20 well-behaved ones: the worker logs a warning naming its run, and every run
    completes."""
    blocker = client.start("async_holder", {"block_s": 0.8, "sleep_s": 0.1},
                           run_id="blocker").run_id
    others = [run.run_id for run in client.start_many("async_holder",
                                                      [{"sleep_s": 0.3, "steps": 2}] * 20)]
    log_path = tmp_path / "worker.log"
    worker(burst=True, log_path=log_path).wait(60)
    assert all(client.status(r).state == "completed" for r in [blocker, *others])
    text = log_path.read_text()
    assert "the event loop of async agents and tools is blocked" in text
    assert "agent:blocker" in text


def test_an_async_agent_blocking_the_loop_past_its_limit_is_quarantined(
    client: Client, worker: WorkerFactory, tmp_path: Path
) -> None:
    """One ``async def`` agent blocks the loop for 4 s (``time.sleep``) with a 1 s limit on
    agent code (``DURABLE_DECIDE_TIMEOUT_MS``): it is interrupted once the sleep returns
    and its run quarantined with the reason; the other runs, which waited on the loop
    meanwhile, are not taken for overrunning and complete."""
    blocker = client.start("async_holder", {"block_s": 4.0, "sleep_s": 0.1},
                           run_id="stuck").run_id
    others = [run.run_id for run in client.start_many("async_holder",
                                                      [{"sleep_s": 0.2}] * 10)]
    worker(burst=True, DURABLE_DECIDE_TIMEOUT_MS="1000").wait(60)
    states = [client.status(r).state for r in others]
    assert states == ["completed"] * len(others), states
    stuck = client.status(blocker)
    assert stuck.state == "quarantined"
    assert "blocked the event loop" in (stuck.reason or "")


def test_a_cancel_stops_an_async_agents_tool_in_flight_at_once(
    client: Client, worker: WorkerFactory
) -> None:
    """An ``async def`` agent awaits an ``async def`` tool of 30 s; a cancel while it is in
    flight (window: dispatched, no outcome) cancels the tool's task where it awaits: the
    call is recorded ``call_canceled`` and the run ``canceled`` well before the 30 s."""
    run = client.start("async_holder", {"sleep_s": 30.0}, run_id="acancel").run_id
    worker()
    assert wait_for(lambda: (a := client.status(run).current) is not None
                    and a.status == "dispatched", 30)
    client.cancel(run, "no longer needed")
    final = client.wait(run, timeout=10)
    assert final.state == "canceled"
    assert types_of(client, run)[-3:] == ["cancel_requested", "call_canceled", "canceled"]


@pytest.mark.parametrize(("sleep_s", "grace_ms", "outcome"), [
    (1.0, "20000", "action_succeeded"),   # done within its grace: its outcome is known
    (30.0, "300", "action_interrupted"),  # not done: stopped, its outcome unknown
])
def test_a_cancel_gives_an_async_tool_that_cannot_be_cancelled_its_grace(
    sleep_s: float, grace_ms: str, outcome: str, client: Client, worker: WorkerFactory,
    tmp_path: Path,
) -> None:
    """A cancel while an ``async def`` tool that cannot be cancelled is in flight (window:
    dispatched, no outcome) lets it run ``DURABLE_CANCEL_GRACE_MS`` more, as the worker's
    call watcher does a plain tool: a call that ends meanwhile is recorded as it ended (its
    row written once), one that does not is stopped and recorded interrupted. Either way
    no second call is sent and the run ends canceled."""
    run = client.start("async_slow_writer", {"steps": 2, "sleep_s": sleep_s}).run_id
    worker(DURABLE_CANCEL_GRACE_MS=grace_ms)
    assert wait_for(lambda: (a := client.status(run).current) is not None
                    and a.status == "dispatched", 30)
    client.cancel(run, "no longer needed")
    final = client.wait(run, timeout=60)
    assert final.state == "canceled", (final.state, final.reason)
    types = types_of(client, run)
    assert types.count("step_decided") == 1
    assert outcome in types and types.index("cancel_requested") < types.index(outcome)
    written = applications(str(tmp_path / "world.sqlite"))
    assert written == ({f"{run}:1": 1} if outcome == "action_succeeded" else {})


def test_an_async_agent_that_returns_while_its_step_is_in_flight_ends_with_it(
    client: Client, worker: WorkerFactory, tmp_path: Path
) -> None:
    """The function stops awaiting its step (``asyncio.wait_for``) and returns while the
    step is in flight: what it returned is its decision once the step's outcome is in. It
    was lost (the worker was not asking then), and the run waited for a decision forever."""
    run = client.start("async_impatient", {"sleep_s": 1.0}, run_id="aimpatient").run_id
    worker()
    final = client.wait(run, timeout=30)
    assert final.state == "completed", (final.state, final.reason)
    assert final.result == "gave up waiting"
    assert types_of(client, run)[-2:] == ["action_succeeded", "completed"]
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:1": 1}
