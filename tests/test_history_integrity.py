"""History integrity: an entry not written through the append script (a raw ``XADD``: a seq
gap or repeat, or a tail the script did not write) quarantines the run, whoever holds it,
and ``durable quarantine release`` refuses a log that is not continuous. Real Redis, real
worker processes, the real CLI."""

from __future__ import annotations

import os

import pytest
import redis

from durable.audit.verify import verify
from durable.client import Client
from durable.errors import Tampered, Terminal
from durable.log import events as ev
from durable.log.keys import KeyLayout
from durable.log.store import Spec, now_ms
from durable.testing import wait_for
from tests.conftest import WorkerFactory, run_durable


def _forge(layout: KeyLayout, r: redis.Redis, run: str, seq: int,
           event: type[ev.Event] = ev.Completed,
           **fields: object) -> str:
    """A raw XADD of a well-formed event: what any client that reaches Redis can do."""
    if event is ev.Completed and not fields:
        fields = {"result": {"forged": True}}
    entry = event(v=ev.SCHEMA_VERSION, run=run, seq=seq, ts=now_ms(), actor="mallory",
                  **fields)  # type: ignore[arg-type]
    entry_id: bytes = r.xadd(layout.log(run), {"e": ev.encode(entry)})
    return entry_id.decode()


def _version(layout: KeyLayout, r: redis.Redis, run: str) -> int:
    return int(r.hget(layout.run(run), "version") or 0)


def test_a_raw_xadd_while_a_worker_holds_the_run_quarantines_it(
    layout: KeyLayout, client: Client, worker: WorkerFactory, r: redis.Redis
) -> None:
    """Window: step 1's tool running on a worker that holds the lease; a forged
    ``completed`` with the next seq is XADDed. The holder's next write (the tool's outcome)
    finds a tail it did not write: the run is quarantined, nothing is built on the forged
    entry, and the worker goes on with other runs."""
    run = client.start("count", {"steps": 3, "sleep_s": 1.5}, run_id="held").run_id
    w = worker()
    assert wait_for(lambda: (a := client.status(run).actions.get(1)) is not None
                    and a.status == "dispatched", 20)
    assert r.get(client.log.keys.lease(run)) is not None  # held
    forged = _forge(layout, r, run, _version(layout, r, run) + 1)
    assert wait_for(lambda: r.hget(client.log.keys.run(run), "state") == b"quarantined", 20)
    reason = client.projection(run).get("reason", "")
    assert "not written by the append script" in reason or "not continuous" in reason, reason
    entries = client.events(run)
    ids = [e.id for e in entries]
    after = [e.event for e in entries[ids.index(forged) + 1:]]
    assert all(isinstance(e, ev.Quarantined) for e in after), after  # nothing built on it
    assert client.status(run).state == "quarantined"
    assert not verify(client.log, run).ok
    other = client.start("count", {"steps": 2}, run_id="after").run_id
    assert client.wait(other, 30).state == "completed" and w.alive()


def test_a_raw_xadd_is_found_by_the_next_load_whoever_holds_the_run(
    layout: KeyLayout, client: Client, worker: WorkerFactory, r: redis.Redis
) -> None:
    """Window: a worker holds the run, its tool running; a forged entry with a repeated seq
    is appended. The next load by anyone else (here ``status``) quarantines the run at once;
    the holder's next write is refused and it lets go."""
    run = client.start("count", {"steps": 3, "sleep_s": 3}, run_id="load").run_id
    w = worker()
    assert wait_for(lambda: (a := client.status(run).actions.get(1)) is not None
                    and a.status == "dispatched", 20)
    _forge(layout, r, run, _version(layout, r, run))  # the same seq as the last real entry
    state = client.status(run)
    assert state.state == "quarantined", state
    assert "repeats" in (state.reason or "") or "repeats" in client.projection(run)["reason"]
    version = _version(layout, r, run)
    assert wait_for(lambda: r.get(client.log.keys.lease(run)) is None, 20)  # the holder let go
    assert client.projection(run)["state"] == "quarantined" and w.alive()
    assert _version(layout, r, run) == version  # the holder wrote nothing more


def test_a_seq_gap_quarantines_at_load(layout: KeyLayout, client: Client, r: redis.Redis) -> None:
    run = client.start("count", {"steps": 1}, run_id="gap", enqueue=False).run_id
    _forge(layout, r, run, 5, ev.LeaseAcquired, owner="w", epoch=1)
    r.hset(client.log.keys.run(run), "version", 5)  # even with the projection made to agree
    state = client.status(run)
    assert state.state == "quarantined" and "skips to" in (state.reason or ""), state


def test_release_refuses_a_log_holding_a_forged_completed(layout: KeyLayout, client: Client,
                                                          r: redis.Redis) -> None:
    """The probe of the issue: a quarantined run whose log holds a forged ``completed``
    with the seq of a real entry; ``quarantine release`` adopted the forged result. Now it
    refuses with one line, exit 1, and the run stays quarantined."""
    run = client.start("count", {"steps": 2}, run_id="rel", enqueue=False).run_id
    assert client.log.quarantine(run, "held by an operator", "test")
    _forge(layout, r, run, _version(layout, r, run))  # two entries with the same seq
    env = dict(os.environ)
    res = run_durable("quarantine", "release", run, env=env)
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert res.stderr.count("\n") == 1 and "not continuous" in res.stderr, res.stderr
    assert client.projection(run)["state"] == "quarantined"
    assert not any(isinstance(e.event, ev.Released) for e in client.events(run))
    assert client.status(run).state == "quarantined"


def test_release_still_works_for_a_continuous_log(client: Client) -> None:
    run = client.start("count", {"steps": 1}, run_id="fine", enqueue=False).run_id
    assert client.log.quarantine(run, "held by an operator", "test")
    assert client.release(run) == "pending"
    assert verify(client.log, run).ok


def test_a_write_on_top_of_a_foreign_tail_is_refused_and_quarantines(
        layout: KeyLayout, client: Client,
                                                                      r: redis.Redis) -> None:
    """Window: a writer folded the run, then a raw XADD landed (with the projection left as
    it was); the writer's next batch is refused (``Tampered``, a ``Terminal``) and the run
    quarantined by that same call, naming the foreign entry."""
    run = client.start("count", {"steps": 1}, run_id="tail", enqueue=False).run_id
    handle = client.log.load(run, actor="w")
    forged = _forge(layout, r, run, _version(layout, r, run) + 1)
    with pytest.raises(Tampered) as exc:
        client.log.commit(handle, [Spec(ev.LeaseAcquired, {"owner": "w", "epoch": 1})])
    assert isinstance(exc.value, Terminal) and exc.value.entry_id == forged
    assert client.projection(run)["state"] == "quarantined"
    assert forged in client.projection(run)["reason"]



def test_verify_names_a_ledger_claim_with_no_dispatch_the_state_a_worker_quarantines(
    layout: KeyLayout, client: Client, worker: WorkerFactory, r: redis.Redis
) -> None:
    """Bad input: a writer claims step 1's key in the run's ledger before any worker ran it,
    with no dispatch in the log. ``verify`` fails its ledger check naming the key, before
    and after a worker finds the claim and quarantines the run rather than send the call."""
    run = client.start("count", {"steps": 2}, run_id="claimed", enqueue=False).run_id
    r.hset(layout.ledger(run), f"{run}:1", "claimed|1")
    report = verify(client.log, run)
    assert "ledger" in report.failed, report.checks
    assert f"{run}:1 claimed in the ledger" in report.checks["ledger"]
    assert "no dispatch" in report.checks["ledger"]
    client.enqueue(run)
    worker()
    assert wait_for(lambda: client.status(run).state == "quarantined", 30)
    assert "no dispatch" in (client.status(run).reason or "")
    res = run_durable("verify", run, env=dict(os.environ))
    assert res.returncode == 1 and "claimed in the ledger" in res.stdout, res.stdout
