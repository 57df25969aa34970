"""The hub: one thread drives every held run, and hands the driving over when agent code
or a tool is slow (``workers.hub``).

The in-process tests drive the worker's own ``StepLoop`` and ``RunHub`` on the session's
real Redis; the others run real worker processes against a real SQLite world that applies
every request it gets (``TEST_DB_DEDUPE=0``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from durable.agents import registry
from durable.audit.verify import verify
from durable.client import Client
from durable.log.keys import KeyLayout
from durable.queue import enqueue_many
from durable.settings import Settings
from durable.testing import wait_for
from durable.workers.hub import TAKE_AHEAD, RunHub
from durable.workers.loop import StepLoop
from durable.workers.spares import PRESTARTED
from tests.agents import basic as test_agents
from tests.agents.basic import applications
from tests.conftest import ReconcilerFactory, ServerFactory, WorkerFactory


@pytest.fixture()
def hub(settings: Settings, r: redis.Redis) -> Iterator[RunHub]:
    """A hub of 64 slots in this process, on a step loop of its own, with the default
    lease (5 s), not the suite's 1 s: its heartbeats share this process with the test's
    own polling, and on a loaded machine a second without a beat lost every lease (the
    work discarded, as it should be, and the runs left for a reconciler these tests do
    not start). No test here is about leases."""
    registry.load("examples.agents,tests.agents.basic")
    test_agents.GATE.clear()
    settings = settings.replace(lease_ttl_ms=5000)
    loop = StepLoop(settings, redis.Redis.from_url(settings.redis.url), registry,
                    "w:hub:test")
    hub = RunHub(loop, 64)
    yield hub
    test_agents.GATE.set()  # nothing stays blocked past the test
    hub.slots.shutdown(5)


def _completed(layout: KeyLayout, r: redis.Redis, runs: list[str]) -> int:
    pipe = r.pipeline(transaction=False)
    for run in runs:
        pipe.hget(layout.run(run), "state")
    try:
        return sum(s == b"completed" for s in pipe.execute())
    except redis.ConnectionError:  # the test's own connection was killed too
        return -1


def test_quick_agent_code_and_tools_run_on_the_driving_thread(
    layout: KeyLayout, hub: RunHub, client: Client, r: redis.Redis
) -> None:
    """300 runs of four quick steps each: the driving stays on its thread (a hand-off per
    call would be 2,400 of them; at most 1 % is allowed), and every run completes."""
    runs = client.start_many("count", [{"steps": 4}] * 300, enqueue=False)
    ids = [run.run_id for run in runs]
    enqueue_many(r, client.log.keys, client.queue, ids)
    hub.slots.finish()
    assert _completed(layout, r, ids) == 300
    # A collection pause, or the machine preempting the driver inside agent code, may
    # cost a few: far from one per call.
    assert hub.handoffs <= 24, hub.handoffs


def test_a_hub_takes_a_backlog_a_share_at_a_time_and_completes_it(
    layout: KeyLayout, settings: Settings, client: Client, r: redis.Redis
) -> None:
    """600 ready runs and 1,000 free slots: a fill takes ``TAKE_AHEAD`` of them, not all
    (the others stay on the ready list for the other workers, which start them as soon);
    the hub then takes the rest as it starts runs, and completes every one."""
    registry.load("examples.agents,tests.agents.basic")
    loop = StepLoop(settings, redis.Redis.from_url(settings.redis.url), registry,
                    "w:hub:share")
    big = RunHub(loop, 1000)
    try:
        runs = client.start_many("count", [{"steps": 1}] * 600, enqueue=False)
        ids = [run.run_id for run in runs]
        enqueue_many(r, client.log.keys, client.queue, ids)
        assert big.slots.fill() == TAKE_AHEAD
        big.slots.finish()
        assert _completed(layout, r, ids) == 600
    finally:
        big.slots.shutdown(5)


def test_a_slow_tool_hands_the_driving_over_and_the_other_runs_go_on(
    layout: KeyLayout, hub: RunHub, client: Client, r: redis.Redis
) -> None:
    """A run blocks in its tool (the gate stays closed: dispatched, no outcome) while 100
    quick runs arrive: another thread drives them all to the end meanwhile; once the gate
    opens, the blocked run completes too."""
    gated = client.start("gated", {}, enqueue=False).run_id
    enqueue_many(r, client.log.keys, client.queue, [gated])
    hub.slots.fill()
    assert wait_for(lambda: (a := client.status(gated).current) is not None
                    and a.status == "dispatched", 10)
    quick = [run.run_id for run in client.start_many("count", [{"steps": 2}] * 100,
                                                      enqueue=False)]
    enqueue_many(r, client.log.keys, client.queue, quick)
    hub.slots.fill()
    assert wait_for(lambda: _completed(layout, r, quick) == 100, 30)
    still = client.status(gated).current
    assert still is not None and still.status == "dispatched"  # still in its call
    assert hub.handoffs >= 1
    test_agents.GATE.set()
    assert client.wait(gated, timeout=10).state == "completed"
    assert hub.slots.wait_idle(10)


def test_slow_code_goes_to_a_spare_thread_once_known_slow(
    hub: RunHub, client: Client, r: redis.Redis
) -> None:
    """Ten runs whose tool waits 0.2 s, one after another: the first call is timed on the
    driving thread until the monitor hands the driving over; the later ones go to a spare
    thread as they start, and the driving stays where it is. Each run completes, and no
    thread is started beyond those the hub started with (spares are reused): a few, not a
    spare per slot."""
    runs = [client.start("count", {"steps": 1, "sleep_s": 0.2}, enqueue=False).run_id
            for _ in range(10)]
    threads = hub.threads  # the spares started with it, and the driver
    for run in runs:
        enqueue_many(r, client.log.keys, client.queue, [run])
        hub.slots.fill()
        assert client.wait(run, timeout=10).state == "completed"
    assert hub.handoffs == 1, hub.handoffs
    assert hub.offloads >= 9, hub.offloads
    assert hub.threads == threads == 1 + min(hub.slots.size, PRESTARTED)


def test_a_plain_functions_slow_thinking_holds_no_thread_of_the_hub(
    hub: RunHub, client: Client, r: redis.Redis
) -> None:
    """20 runs of a plain code agent that thinks 20 ms before each of its 3 steps (far past
    the hand-off time): its decisions are awaited from the function's own thread, so the
    decisions run on no thread of the hub (none is timed there, none goes to a spare), and
    every run completes. (Waiting for a function on a hub thread handed the driving over,
    then sent each decision to a spare, which slept until the function answered.)"""
    runs = client.start_many("ponderer", [{"steps": 3}] * 20, enqueue=False)
    ids = [run.run_id for run in runs]
    enqueue_many(r, client.log.keys, client.queue, ids)
    hub.slots.finish()
    assert [client.status(run).result for run in ids] == [3] * 20
    # No decision ran on a thread of the hub (it would have been timed there), and fewer
    # calls went to a spare than the 80 decisions: the 60 quick tool calls go there only
    # when a loaded machine slows them (25 of them under a busy core and three other test
    # processes), the decisions sent there would be 80 alone.
    assert "ponderer.decide()" not in hub.spares.took
    assert hub.offloads < 80, hub.offloads


def test_a_hub_built_while_redis_is_down_serves_once_it_is_back(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Window: Redis is killed after the worker connected and before its hub loaded the
    script that takes ready runs (a worker process started there died of the error: a
    deaf, missing process after an outage). The hub is built all the same, and once Redis
    is back it takes the runs and completes them."""
    srv = make_server(fsync="always")
    monkeypatch.setenv("DURABLE_REDIS_URL", srv.url)
    settings = Settings()
    registry.load("examples.agents,tests.agents.basic")
    client = Client(settings)
    ids = [run.run_id for run in client.start_many("count", [{"steps": 2}] * 5,
                                                   enqueue=False)]
    loop = StepLoop(settings, redis.Redis.from_url(srv.url), registry, "w:hub:outage")
    srv.kill()
    hub = RunHub(loop, 8)
    try:
        srv.start()
        r = srv.client()
        enqueue_many(r, client.log.keys, client.queue, ids)
        hub.slots.fill()
        assert [client.wait(run, timeout=20).state for run in ids] == ["completed"] * 5
    finally:
        hub.slots.shutdown(5)


def test_the_hubs_connection_killed_mid_batch_loses_and_repeats_nothing(
    layout: KeyLayout,
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, r: redis.Redis,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every client connection is killed 80 times while one worker drives 200 runs: some
    kills land after a batch was sent and before its replies were read (whether its calls
    ran is unknown). The batches are sent again; every run completes, the world agrees
    with every log (a key recorded as applied is applied exactly once; one the database
    refused past its deadline, as it may under load, never), and every log verifies (no
    outcome recorded twice)."""
    monkeypatch.setenv("TEST_DB", str(tmp_path / "world.sqlite"))
    monkeypatch.setenv("TEST_DB_DEDUPE", "0")
    monkeypatch.setenv("TEST_SLOW_S", "0.02")
    runs = [client.start("writer", {"steps": 3}, run_id=f"cut-{i}").run_id
            for i in range(200)]
    log = tmp_path / "w.log"
    w = worker(DURABLE_CONCURRENCY="64", log_path=log)
    reconciler()
    assert wait_for(lambda: _completed(layout, r, runs) >= 1, 30)  # both are up and serving
    killer = redis.Redis.from_url(client.settings.redis.url)
    stop = threading.Event()

    def kill() -> None:
        for _ in range(80):
            if stop.wait(0.025):
                return
            try:
                killer.client_kill_filter(_type="normal", skipme=True)
            except redis.RedisError:
                pass

    cutter = threading.Thread(target=kill)
    cutter.start()
    try:
        done = wait_for(lambda: _completed(layout, r, runs) == 200, 60)
    finally:
        stop.set()
        cutter.join()
    assert done, "\n".join([
        f"worker alive: {w.alive()}; runs not completed: " + ", ".join(
            f"{run} {client.status(run).state}" for run in runs
            if client.status(run).state != "completed"),
        *[line for line in log.read_text().splitlines()
          if "ERROR" in line or "Error" in line or "Traceback" in line][-30:],
        log.read_text()[-2000:]])
    applied = applications(str(tmp_path / "world.sqlite"))
    expected = {key: n for run in runs for key, n in _owed(client, run).items()}
    assert len(expected) == 600
    wrong = {key for key in expected.keys() | applied.keys()
             if applied.get(key, 0) != expected.get(key)}
    assert not wrong, "\n".join(f"{key} applied {applied.get(key, 0)} times, owed "
                                 f"{expected.get(key)}; its run's log:\n"
                                 f"{_log_lines(client, key.rsplit(':', 1)[0])}"
                                 for key in sorted(wrong))
    for run in runs:
        report = verify(client.log, run)
        assert report.ok, {k: v for k, v in report.checks.items() if v != "ok"}


def _owed(client: Client, run: str) -> dict[str, int]:
    """Key -> how often the world must have applied it, by the run's log: once for a step
    that succeeded, never for one the database refused past its deadline (``sqlwrite``
    checks it under its write lock). Any other outcome fails the test."""
    owed = {}
    for act in client.status(run).actions.values():
        refused = act.status == "failed" and act.error == "refused: past the deadline"
        assert act.status == "succeeded" or refused, (run, act)
        owed[act.key] = 0 if refused else 1
    return owed


def _log_lines(client: Client, run: str) -> str:
    """A run's log, one event a line (what a failure shows)."""
    return "\n".join(f"  {e.event!r}"[:400] for e in client.log.read(run) if e.event)


def test_the_run_threads_remain_a_choice(
    layout: KeyLayout, client: Client, worker: WorkerFactory, r: redis.Redis, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``DURABLE_DRIVER=threads``: one thread per held run, as before the hub; 30 runs
    complete with every key applied once."""
    monkeypatch.setenv("TEST_DB", str(tmp_path / "world.sqlite"))
    monkeypatch.setenv("TEST_DB_DEDUPE", "0")
    runs = [client.start("writer", {"steps": 2}, run_id=f"thr-{i}").run_id
            for i in range(30)]
    log = tmp_path / "w.log"
    worker(DURABLE_CONCURRENCY="16", DURABLE_DRIVER="threads", log_path=log)
    assert wait_for(lambda: _completed(layout, r, runs) == 30, 60)
    assert applied_once(tmp_path, runs, 2)
    assert "run threads" in log.read_text()


def applied_once(tmp_path: Path, runs: list[str], steps: int) -> bool:
    applied = applications(str(tmp_path / "world.sqlite"))
    return applied == {f"{run}:{s}": 1 for run in runs for s in range(1, steps + 1)}



def test_the_ready_list_on_its_own_server_still_feeds_the_hub(
    layout: KeyLayout,
    settings: Settings, make_server: ServerFactory, worker: WorkerFactory, r: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``DURABLE_QUEUE_URL`` on a second server: the hub's pops of ready runs cannot ride
    in its batches (a round trip there instead). 120 runs through 16 slots all complete:
    free slots keep taking the runs left on the list."""
    queue = make_server(fsync="everysec")
    monkeypatch.setenv("DURABLE_QUEUE_URL", queue.url)
    client = Client(Settings())
    runs = [client.start("count", {"steps": 2}).run_id for _ in range(120)]
    worker(DURABLE_CONCURRENCY="16")
    assert wait_for(lambda: _completed(layout, r, runs) == 120, 60)
    client.close()


@pytest.mark.parametrize("driver", ["hub", "threads"])
def test_a_run_handed_again_while_it_is_driven_is_driven_again_not_dropped(
    driver: str, client: Client, worker: WorkerFactory
) -> None:
    """Window: a run goes back on the ready list at a job boundary (``DURABLE_STEPS_PER_JOB``)
    while its slot still drives it, and the worker's ready-list poll takes it before that
    slot lets go. The second slot found the run driven and dropped it, and the run's
    "queued" marker kept every other enqueue out for a minute: with no reconciler, a run
    stayed pending for good (the memory bench's 1,000-step runs, beside 150 short ones).
    Now the slot that drives it drives it again. No reconciler here: every run must end by
    the worker alone."""
    long = [client.start("count", {"steps": 40}, run_id=f"again-l{i}").run_id
            for i in range(2)]
    short = [s.run_id for s in client.start_many("count", [{"steps": 4}] * 150)]
    worker(DURABLE_STEPS_PER_JOB="4", DURABLE_DRIVER=driver)
    for run in long + short:
        final = client.wait(run, timeout=60)
        assert final.state == "completed", (run, final.state, final.step)
