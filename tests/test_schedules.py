"""Durable schedules: one run per slot, whoever sweeps; what happens to missed slots; the
commands that add, list, pause, resume and delete them (``durable.controls.schedules``)."""

from __future__ import annotations

import json
import os
import time

import pytest
import redis

from durable.client import Client
from durable.controls.schedules import Schedule, plan, slot_run_id
from durable.errors import ScheduleNotFound, UsageError
from durable.log import events as ev
from durable.log import keys
from durable.testing import wait_for
from tests.conftest import ReconcilerFactory, WorkerFactory, run_durable

#: A fake clock's start (ms): 2030-03-17 17:46:40 UTC, a whole second.
T0 = 1_900_000_000_000
EVERY_SECOND = "* * * * * *"
DAY = 86_400


def every_second(missed: str = "latest", grace_s: int = 2) -> Schedule:
    return Schedule(name="s", cron=EVERY_SECOND, agent="echo", missed=missed, grace_s=grace_s)


def scheduled_runs(client: Client, name: str) -> list[str]:
    return sorted(r.run_id for r in client.runs(limit=10_000)
                  if r.run_id.startswith(f"{name}-"))


# What is due: a pure function of the clock --------------------------------------------------


def test_on_time_slots_each_start_and_the_next_one_is_kept() -> None:
    p = plan(every_second(), T0, T0 + 1500)
    assert p.slots == [T0 // 1000, T0 // 1000 + 1]
    assert p.next_ms == T0 + 2000 and p.skipped == 0
    assert plan(every_second(), T0, T0 - 1).slots == []


def test_missed_slots_catch_up_the_latest_one_or_none() -> None:
    """Down from T0 to T0 + 10 s with a grace of 2 s: slots T0..T0+7 s are missed (more
    than 2 s late), T0+8..T0+10 s are on time."""
    s = T0 // 1000
    latest = plan(every_second("latest"), T0, T0 + 10_000)
    assert latest.slots == [s + 7, s + 8, s + 9, s + 10]
    assert latest.skipped == 7 and latest.next_ms == T0 + 11_000
    skip = plan(every_second("skip"), T0, T0 + 10_000)
    assert skip.slots == [s + 8, s + 9, s + 10]
    assert skip.skipped == 8 and skip.next_ms == T0 + 11_000


def test_a_backlog_is_started_in_bounded_sweeps() -> None:
    p = plan(every_second(grace_s=3600), T0, T0 + 500_000, limit=100)
    assert len(p.slots) == 100 and p.next_ms == T0 + 100_000


# The sweep, on a real Redis with a fake clock --------------------------------------------


@pytest.mark.cluster
def test_a_sweep_starts_each_slot_once_and_records_its_schedule(client: Client) -> None:
    client.schedules.add("tick", EVERY_SECOND, "echo", {"text": "hi"}, now=T0 - 1)
    assert client.schedules.get("tick").next_ms == T0
    done = client.schedules.sweep(now=T0 + 1200)
    assert done == {"tick": f"started tick-{T0 // 1000}, tick-{T0 // 1000 + 1}"}
    # A second sweeper that read the old next slot starts nothing new and skips nothing.
    again = client.schedules.sweep(now=T0 + 2100)
    assert again == {"tick": f"started tick-{T0 // 1000 + 2}"}
    assert scheduled_runs(client, "tick") == [f"tick-{T0 // 1000 + i}" for i in range(3)]
    first = client.events(f"tick-{T0 // 1000}")[0].event
    assert isinstance(first, ev.RunStarted)
    assert (first.schedule, first.slot, first.input) == ("tick", T0 // 1000,
                                                         {"text": "hi", "steps": 1})
    assert client.stats()["schedule_runs_started"] == 3


@pytest.mark.cluster
def test_missed_slots_after_an_outage_follow_the_policy(client: Client) -> None:
    """Every process down for 30 slots, the grace is 2 s: ``latest`` starts the most recent
    missed slot and the on-time ones, ``skip`` only the on-time ones."""
    for name, missed in (("late", "latest"), ("never", "skip")):
        client.schedules.add(name, EVERY_SECOND, "echo", missed=missed, grace_s=2, now=T0 - 1)
    client.schedules.sweep(now=T0 + 30_000)
    s = T0 // 1000
    assert scheduled_runs(client, "late") == [f"late-{s + i}" for i in (27, 28, 29, 30)]
    assert scheduled_runs(client, "never") == [f"never-{s + i}" for i in (28, 29, 30)]
    assert client.stats()["schedule_slots_missed"] == 27 + 28


@pytest.mark.cluster
def test_pause_resume_delete(client: Client) -> None:
    s = T0 // 1000
    client.schedules.add("p", EVERY_SECOND, "echo", now=T0 - 1)
    client.schedules.sweep(now=T0)
    assert client.schedules.pause("p").next_ms is None
    assert client.schedules.sweep(now=T0 + 5000) == {}
    resumed = client.schedules.resume("p", now=T0 + 5500)
    assert resumed.next_ms == T0 + 6000 and resumed.schedule and not resumed.schedule.paused
    assert client.schedules.resume("p", now=T0 + 9000).next_ms == T0 + 6000  # no-op
    client.schedules.sweep(now=T0 + 6000)
    assert scheduled_runs(client, "p") == [f"p-{s}", f"p-{s + 6}"]  # paused slots never run
    client.schedules.delete("p")
    assert client.schedules.list() == []
    assert client.schedules.sweep(now=T0 + 9000) == {}
    assert scheduled_runs(client, "p") == [f"p-{s}", f"p-{s + 6}"]  # its runs are kept
    for verb in (client.schedules.pause, client.schedules.resume, client.schedules.delete,
                 client.schedules.get):
        with pytest.raises(ScheduleNotFound):
            verb("p")


def test_bad_schedules_are_refused_and_nothing_is_written(client: Client,
                                                          r: redis.Redis) -> None:
    bad = [("n", "61 * * * *", "echo", {}), ("n", "* * *", "echo", {}),
           ("n", "0 0 30 2 *", "echo", {}),  # February 30th: never
           ("n", EVERY_SECOND, "nobody", {}), ("n", EVERY_SECOND, "echo", {"steps": "x"}),
           ("n{x}", EVERY_SECOND, "echo", {})]
    for name, cron, agent, data in bad:
        with pytest.raises(UsageError):
            client.schedules.add(name, cron, agent, data)
    client.schedules.add("n", EVERY_SECOND, "echo")
    with pytest.raises(UsageError, match="exists already"):
        client.schedules.add("n", "0 0 * * *", "echo")
    assert [e.schedule.cron for e in client.schedules.list() if e.schedule] == [EVERY_SECOND]
    assert r.hlen(keys.SCHEDULES) == 1 and r.zcard(keys.SCHEDULES_NEXT) == 1


@pytest.mark.cluster
def test_an_unreadable_schedule_is_reported_skipped_and_counted(client: Client,
                                                                r: redis.Redis) -> None:
    client.schedules.add("good", EVERY_SECOND, "echo", now=T0 - 1)
    r.hset(keys.SCHEDULES, "bad", b"\xff not json")
    r.zadd(keys.SCHEDULES_NEXT, {"bad": T0})
    done = client.schedules.sweep(now=T0)
    assert done["good"] == f"started good-{T0 // 1000}"
    assert done["bad"].startswith("unreadable")
    assert client.stats()["schedules_unreadable"] == 1
    assert client.schedules.sweep(now=T0 + 1000) == {"good": f"started good-{T0 // 1000 + 1}"}
    listed = {e.name: e for e in client.schedules.list()}
    assert listed["bad"].schedule is None and "unreadable" in listed["bad"].error


# Real reconcilers ---------------------------------------------------------------------------


@pytest.mark.cluster
def test_every_second_for_10_s_with_two_reconcilers_one_run_per_slot(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory) -> None:
    worker()
    reconciler()
    reconciler()
    added = client.schedules.add("tick", EVERY_SECOND, "echo", {"text": "t"})
    assert added.next_ms is not None
    first = added.next_ms // 1000
    assert wait_for(lambda: len(scheduled_runs(client, "tick")) >= 10, timeout=40)
    client.schedules.pause("tick")
    paused = time.time() * 1000
    # Both reconcilers swept after the pause (their view of the schedule is the paused one).
    assert wait_for(lambda: len(s := client.sweeps()) == 2 and
                    all(sw.at > paused + 300 for sw in s), timeout=10)
    runs = scheduled_runs(client, "tick")
    last = max(int(run.rsplit("-", 1)[1]) for run in runs)
    assert runs == [slot_run_id("tick", slot) for slot in range(first, last + 1)]
    assert client.stats()["schedule_runs_started"] == len(runs)  # each started once
    for run in runs:
        started = [e.event for e in client.events(run) if isinstance(e.event, ev.RunStarted)]
        assert [(e.schedule, e.slot) for e in started] == [("tick", int(run.rsplit("-")[1]))]
        assert client.wait(run, timeout=30).state == "completed"


@pytest.mark.cluster
def test_after_reconcilers_were_down_for_days_one_catch_up_run(
        client: Client, reconciler: ReconcilerFactory, r: redis.Redis) -> None:
    """Added five days ago, swept by nobody since: ``latest`` starts only the most recent
    missed midnight, ``skip`` none; a garbled schedule beside them does not stop either."""
    now = int(time.time() * 1000)
    for name, missed in (("daily", "latest"), ("nightly", "skip")):
        client.schedules.add(name, "0 0 * * *", "echo", missed=missed, grace_s=0,
                             now=now - 5 * DAY * 1000)
    r.hset(keys.SCHEDULES, "garbled", b"{}")
    r.zadd(keys.SCHEDULES_NEXT, {"garbled": 0})
    rec = reconciler()
    midnight = now // 1000 // DAY * DAY
    assert wait_for(lambda: all((client.schedules.get(n).next_ms or 0) > now
                                for n in ("daily", "nightly")), timeout=20)
    assert scheduled_runs(client, "daily") == [f"daily-{midnight}"]
    assert scheduled_runs(client, "nightly") == []
    assert wait_for(lambda: client.stats().get("schedules_unreadable", 0) >= 1, timeout=10)
    assert rec.alive()


# The command line -------------------------------------------------------------------------


def test_the_command_line_adds_lists_pauses_resumes_deletes(client: Client) -> None:
    env = dict(os.environ)
    out = run_durable("schedule", "add", "hourly", "--cron", "0 * * * *", "echo",
                      "--input", '{"text": "x"}', "--missed", "skip", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("schedule hourly: echo at '0 * * * *' (UTC), first run")
    out = run_durable("schedule", "list", env=env)
    assert out.returncode == 0 and "hourly" in out.stdout and "0 * * * *" in out.stdout
    assert "skip, 60 s" in out.stdout
    out = run_durable("schedule", "list", "--json", env=env)
    row = json.loads(out.stdout)
    assert row["name"] == "hourly" and row["cron"] == "0 * * * *" and row["agent"] == "echo"
    assert row["input"] == {"text": "x", "steps": 1} and row["missed"] == "skip"
    assert row["next"] % 3_600_000 == 0 and row["paused"] is False
    out = run_durable("schedule", "pause", "hourly", "--json", env=env)
    assert json.loads(out.stdout)["paused"] is True and json.loads(out.stdout)["next"] is None
    assert "paused" in run_durable("schedule", "list", env=env).stdout
    out = run_durable("schedule", "resume", "hourly", env=env)
    assert out.returncode == 0 and "active, next run" in out.stdout
    assert run_durable("schedule", "delete", "hourly", env=env).returncode == 0
    out = run_durable("schedule", "delete", "hourly", env=env)
    assert out.returncode == 1 and out.stderr.strip() == "durable: no schedule 'hourly'"


@pytest.mark.parametrize(("args", "says"), [
    (["--cron", "every day", "echo"], "cron expression 'every day'"),
    (["--cron", "61 * * * *", "echo"], "cron expression '61 * * * *'"),
    (["--cron", "* * * * *", "nobody"], "unknown agent 'nobody'"),
    (["--cron", "* * * * *", "echo", "--input", '{"steps": "many"}'],
     "invalid input for agent 'echo'"),
    (["--cron", "* * * * *", "echo", "--input", "{"], "--input is not valid JSON"),
])
def test_the_command_line_refuses_bad_schedules_in_one_line(
        client: Client, r: redis.Redis, args: list[str], says: str) -> None:
    out = run_durable("schedule", "add", "n", *args, env=dict(os.environ))
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("durable: ") and says in lines[0], out.stderr
    assert r.hlen(keys.SCHEDULES) == 0 and r.zcard(keys.SCHEDULES_NEXT) == 0
