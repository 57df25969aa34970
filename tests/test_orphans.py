"""Orphaned runs (``durable.telemetry.orphans``): runs not over that nothing will move on.

Real runs on the embedded server, driven by real worker processes into the states they are
in; what would give each a next event (a lease, a ready list, a due entry, an open wait) is
then taken away one at a time, as a lost queue, a lost index entry or a dead reconciler
takes it, and the listing is checked against what is left. Time is passed in (``now``), not
slept through.
"""

from __future__ import annotations

import json
import time
from typing import Any

from durable.client import Client
from durable.leases import Leases
from durable.log import keys
from durable.log.store import now_ms
from durable.telemetry import orphans
from durable.telemetry.metrics import exposition
from durable.testing import Server, env_for, wait_for
from tests.conftest import WorkerFactory, run_durable
from tests.test_metrics import samples


def _unready(client: Client, run_id: str, agent: str) -> None:
    """The run's id leaves its ready list (a queue server that lost it)."""
    conn = client.queue.connection
    assert conn.lrem(keys.ready(client.queue.name, agent), 0, run_id) == 1


def _undue(client: Client, run_id: str) -> None:
    """The run leaves the due-set (an index entry lost)."""
    assert client.redis.zrem(client.log.keys.due_of(run_id), run_id) == 1


def _listed(client: Client, now: int | None = None) -> dict[str, str]:
    return {o.run_id: o.why for o in client.orphaned(now=now)}


def test_only_runs_that_nothing_will_move_are_orphaned(client: Client,
                                                       worker: WorkerFactory) -> None:
    """One run of each kind: a completed one, one waiting for input, one waiting for an
    approval, a quarantined one, and pending ones held by a lease, on a ready list, or due
    for the reconciler; then the ones from which every one of those was taken."""
    done = client.start("count", {"steps": 1}).run_id
    asker = client.start("asker", {"text": "hi"}).run_id
    payer = client.start("payer", {"amount": 5}).run_id
    worker(burst=True).wait(60)
    assert client.status(done).state == "completed"
    assert client.status(asker).state == "waiting_input"
    assert client.status(payer).state == "waiting_approval"
    for waiting in (asker, payer):  # what is left: the party who answers
        _undue(client, waiting)

    parked = client.start("count", {"steps": 1}, enqueue=False).run_id
    assert client.log.quarantine(parked, "an operator must look")
    queued = client.start("count", {"steps": 1}).run_id  # on the ready list
    _undue(client, queued)
    due = client.start("count", {"steps": 1}, enqueue=False).run_id  # due for a sweep
    held = client.start("count", {"steps": 1}, enqueue=False).run_id
    _undue(client, held)
    lease, _, _ = Leases(client.redis, 60_000, client.log.keys).acquire(held, "test-holder")
    assert lease is not None
    lost = client.start("count", {"steps": 1}).run_id
    _unready(client, lost, "count")
    _undue(client, lost)

    assert _listed(client) == {lost: "no lease, on no ready list, not in the due-set"}
    [found] = client.orphaned()
    assert (found.state, found.agent) == ("pending", "count")

    # Later, with no reconciler sweeping: the due run's entry is long overdue, and the
    # waits' deadlines passed with nothing to expire them. The queued run is still on its
    # list, the held one still held, the quarantined one still an operator's.
    wait = client.status(asker).wait
    assert wait is not None
    later = wait.until + 1
    grace = orphans.grace_ms(client.settings)
    assert later > now_ms() + 2 * client.settings.leases.ttl_ms + grace
    seen = _listed(client, now=later)
    assert set(seen) == {lost, due, asker, payer}, seen
    assert "and no reconciler took it" in seen[due]
    assert seen[asker] == seen[payer] == "no lease, on no ready list, not in the due-set"

    # The gauge counts what the client lists now.
    shared = samples(exposition(client)[0].decode())
    assert shared["durable_runs_orphaned"][()] == 1


def test_a_run_whose_worker_died_is_orphaned_only_while_no_reconciler_sweeps(
        client: Client, worker: WorkerFactory, reconciler: Any) -> None:
    """Window: a worker SIGKILLed after step 1's effect, before its outcome is recorded;
    its lease expires. Its due entry is fresh: a reconciler's next sweep takes it, so it is
    not orphaned now; past the grace with nobody sweeping, it is. A reconciler and a worker
    then finish it."""
    run = client.start("count", {"steps": 2}).run_id
    killed = worker(kill_at="after_effect:1")
    assert killed.wait(30) != 0
    assert wait_for(lambda: client.lease(run) is None, 30)
    assert client.status(run).state == "pending"
    assert run not in _listed(client)
    due = client.redis.zscore(client.log.keys.due_of(run), run)
    assert due is not None
    later = int(due) + orphans.grace_ms(client.settings) + 1
    assert _listed(client, now=later)[run].startswith(
        "no lease, on no ready list, due since ")
    reconciler(DURABLE_LEASE_TTL_MS="5000")
    worker(DURABLE_LEASE_TTL_MS="5000")
    assert client.wait(run, timeout=60).state == "completed"
    assert run not in _listed(client, now=later)


def test_durable_runs_orphaned_lists_them_and_refuses_what_it_cannot_honour(
        server: Server, client: Client) -> None:
    """``durable runs --orphaned``: a table and ``--json``; combined with a filter it does
    not apply, or with ``--stuck``, it says so in one line (exit 2) and writes nothing."""
    lost = client.start("count", {"steps": 1}, run_id="lost-1", enqueue=False).run_id
    _undue(client, lost)
    client.start("count", {"steps": 1}, run_id="fine-1", enqueue=False)
    env = env_for(server.url)
    done = run_durable("runs", "--orphaned", "--json", env=env)
    assert done.returncode == 1, done.stderr  # an orphan listed is a finding
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["run_id"], r["state"], r["agent"]) for r in rows] == [(lost, "pending", "count")]
    assert rows[0]["why"] == "no lease, on no ready list, not in the due-set"
    table = run_durable("runs", "--orphaned", env=env)
    assert table.returncode == 1 and lost in table.stdout and "fine-1" not in table.stdout
    version = client.status(lost).version
    for bad, says in ((["--state", "pending"], "without --state"),
                      (["--stuck"], "--stuck and --orphaned"),
                      (["--limit", "0"], "--limit must be at least 1")):
        refused = run_durable("runs", "--orphaned", *bad, env=env)
        assert refused.returncode == 2, refused
        assert says in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr
    assert client.status(lost).version == version
    assert client.log.quarantine(lost, "an operator looks")  # none left: exit 0
    none = run_durable("runs", "--orphaned", "--json", env=env)
    assert (none.returncode, none.stdout) == (0, ""), none.stderr


def test_a_parent_waiting_on_a_live_child_is_not_orphaned(
        server: Server, client: Client, worker: WorkerFactory) -> None:
    """A parent joins a child that waits an hour for input; no reconciler runs. Past the
    grace, the parent's due entry (the reconciler's next look at its child, every 5 s) is
    long overdue, but the child is live and its end wakes the parent: not orphaned. Its
    status gives the join's own deadline (a day), not the next look. Answered, the child
    ends and the parent completes."""
    parent = client.start("parent_of_asker", {}).run_id
    worker(burst=True).wait(60)
    state = client.status(parent)
    assert state.state == "waiting_child" and state.wait is not None, state.state
    child, deadline = str(state.wait.data["child"]), int(state.wait.data["expires"])
    assert client.status(child).state == "waiting_input"
    later = now_ms() + orphans.grace_ms(client.settings) + 10_000
    assert state.wait.until < later < deadline  # a look overdue, a day to go
    assert _listed(client, now=later) == {}
    shown = run_durable("status", parent, env=env_for(server.url))
    assert shown.returncode == 0, shown.stderr
    [row] = [line for line in shown.stdout.splitlines() if "child until" in line]
    assert time.strftime("%Y-%m-%d", time.localtime(deadline / 1000)) in row, row
    client.respond(child, "the blue one")
    worker(burst=True).wait(60)
    assert wait_for(lambda: client.status(parent).state == "completed", 30)
    assert client.status(parent).result == "the blue one"
