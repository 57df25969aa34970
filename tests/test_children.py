"""Child runs: a run starts other agents' runs and waits for their results without holding
a worker; a child's id derives from its parent's id and step, so a parent executed again
starts none twice; cancelling the parent cancels its live children. Real Redis, real
worker and reconciler processes, a SQLite database that never deduplicates."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from durable.audit.verify import verify
from durable.client import Client
from durable.log import events as ev
from durable.log import keys
from durable.testing import wait_for
from tests.agents.basic import applications
from tests.conftest import ReconcilerFactory, WorkerFactory, run_durable
from tests.runs import events_of

pytestmark = pytest.mark.usefixtures("world_db")


def test_a_parent_gets_its_childrens_results(client: Client, worker: WorkerFactory,
                                             reconciler: ReconcilerFactory,
                                             tmp_path: Path) -> None:
    run = client.start("parent", {"children": 2}, run_id="fam").run_id
    worker()
    reconciler()
    final = client.wait(run, 30, waiting=False)
    assert final.state == "completed", (final.state, final.reason)
    kids = [keys.child_id(run, 1), keys.child_id(run, 2)]
    assert final.result == {"children": kids, "results": [
        {"n": 1, "row": f"{kids[0]}:1"}, {"n": 2, "row": f"{kids[1]}:1"}]}
    assert final.children == kids
    for n, kid in enumerate(kids, start=1):
        state = client.status(kid)
        assert (state.parent, state.parent_step, state.state) == (run, n, "completed")
        assert verify(client.log, kid).ok
    waits = [e for e in events_of(client, run) if isinstance(e, ev.WaitEntered)]
    assert [w.kind for w in waits] == ["child", "child"]
    assert applications(str(tmp_path / "world.sqlite")) == {f"{k}:1": 1 for k in kids}
    shown = run_durable("status", kids[0], env=dict(os.environ))
    assert f"{run} (step 1)" in shown.stdout, shown.stdout
    logged = run_durable("log", run, env=dict(os.environ)).stdout
    assert f"start child run {kids[0]}" in logged, logged
    logged = run_durable("log", kids[1], env=dict(os.environ)).stdout
    assert f"child of {run}, its step 2" in logged, logged
    assert verify(client.log, run).ok


def test_a_worker_killed_while_both_children_run(client: Client, worker: WorkerFactory,
                                                 reconciler: ReconcilerFactory,
                                                 tmp_path: Path) -> None:
    """Window: the parent waits for its first child, both children are inside their first
    call (1.5 s), and the only worker is SIGKILLed. A new worker and the reconciler finish
    both children from their logs and wake the parent: each child was started once, each
    row written once, and the parent completes with both results."""
    run = client.start("parent", {"children": 2, "sleep_s": 1.5}, run_id="fam-kill").run_id
    kids = [keys.child_id(run, 1), keys.child_id(run, 2)]
    w = worker()

    def both_running() -> bool:
        return all(client.log.exists(k) and client.status(k).open_actions for k in kids)

    assert wait_for(both_running, 20)
    assert wait_for(lambda: client.status(run).state == "waiting_child", 20)
    w.kill()
    worker()
    reconciler()
    final = client.wait(run, 60, waiting=False)
    assert final.state == "completed", (final.state, final.reason)
    assert [r["n"] for r in final.result["results"]] == [1, 2]
    for kid in kids:
        started = [e for e in events_of(client, kid) if isinstance(e, ev.RunStarted)]
        assert len(started) == 1
    parent_starts = [e for e in events_of(client, run)
                     if isinstance(e, ev.StepDecided) and e.tool == keys.CHILD_TOOL]
    assert [e.step for e in parent_starts] == [1, 2]
    assert applications(str(tmp_path / "world.sqlite")) == {f"{k}:2": 1 for k in kids}
    assert verify(client.log, run).ok


def test_cancelling_the_parent_cancels_its_children(client: Client, worker: WorkerFactory,
                                                    reconciler: ReconcilerFactory) -> None:
    """The parent waits for two children inside a 30 s call; ``cancel`` of the parent ends
    it and both children ``canceled``, each child's log recording the request and why. A
    detached child goes on."""
    run = client.start("parent", {"children": 2, "sleep_s": 30, "detached": True},
                       run_id="fam-cancel").run_id
    kids = [keys.child_id(run, 1), keys.child_id(run, 2)]
    detached = keys.child_id(run, 3)
    worker()
    reconciler()
    assert wait_for(lambda: all(client.log.exists(k) and client.status(k).open_actions
                                for k in [*kids, detached]), 20)
    client.cancel(run, "the user gave up")
    assert client.wait(run, 15, waiting=False).state == "canceled"
    for kid in kids:
        assert client.wait(kid, 15, waiting=False).state == "canceled"
        (asked,) = [e for e in events_of(client, kid) if isinstance(e, ev.CancelRequested)]
        assert asked.reason == f"parent {run} canceled: the user gave up"
    assert client.status(detached).state not in ("canceled",)
    assert client.status(detached).cancel is None
    client.cancel(detached, "tidy up")


def test_a_failed_child_reaches_the_parent_as_a_failed_step(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory
) -> None:
    run = client.start("parent_of_failure", {}, run_id="fam-fail").run_id
    worker()
    reconciler()
    final = client.wait(run, 30, waiting=False)
    assert final.state == "completed", (final.state, final.reason)
    assert final.result["child"] == keys.child_id(run, 1)
    assert final.result["state"] == "failed"
    assert "refused by the API" in final.result["error"]


def test_an_async_parent_awaits_its_children(client: Client, worker: WorkerFactory,
                                             reconciler: ReconcilerFactory) -> None:
    run = client.start("async_parent", {}, run_id="fam-async").run_id
    worker()
    reconciler()
    final = client.wait(run, 30, waiting=False)
    assert final.state == "completed", (final.state, final.reason)
    assert [r["n"] for r in final.result] == [1, 2]


def test_a_child_sharing_its_parents_budgets_counts_in_them(client: Client,
                                                            worker: WorkerFactory,
                                                            reconciler: ReconcilerFactory) -> None:
    """The parent (6 model calls, 1,000 tokens) makes 2 calls, then a child sharing its
    budgets makes 3: the child's limits are what the parent had left (4 calls, 980
    tokens), recorded in its first event, and the parent counts the child's 3 calls, so
    its own budget ends it after 1 more call (6 in all), not 4 more."""
    run = client.start("budget_parent", {"before": 2, "child_calls": 3}, run_id="share").run_id
    worker()
    reconciler()
    final = client.wait(run, 30, waiting=False)
    assert (final.state, final.reason) == ("failed", "budget_exhausted"), final.error
    kid = client.status(keys.child_id(run, 3))
    assert kid.state == "completed" and kid.result == 3
    started = next(e for e in events_of(client, kid.run_id) if isinstance(e, ev.RunStarted))
    assert started.shared_budgets and started.budgets == {"model_calls": 4, "tokens": 980}
    assert (final.model_calls, final.tokens) == (6, 60)
    own = [e for e in events_of(client, run) if isinstance(e, ev.StepDecided) and e.model]
    assert len(own) == 3  # 2 before the child, 1 after: the child's 3 counted in between
    assert verify(client.log, run).ok and verify(client.log, kid.run_id).ok


def test_a_child_that_would_overspend_its_parents_budget_is_stopped_at_what_was_left(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory) -> None:
    """A child asked for 10 calls with 4 left in the parent's budget ends
    ``budget_exhausted`` after 4; the parent sees a failed child and, its budget spent,
    ends the same way at its next call."""
    run = client.start("budget_parent", {"before": 2, "child_calls": 10},
                       run_id="overspend").run_id
    worker()
    reconciler()
    final = client.wait(run, 30, waiting=False)
    kid = client.status(keys.child_id(run, 3))
    assert (kid.state, kid.reason, kid.model_calls) == ("failed", "budget_exhausted", 4)
    assert (final.state, final.reason) == ("failed", "budget_exhausted"), final.error
    assert final.model_calls == 6  # 2 + the child's 4: none of its own after


def test_a_quarantined_child_blocks_its_parent_visibly(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory) -> None:
    """Window: a child whose agent code raises is quarantined (it has not ended), its parent
    waiting for it. The parent's wait says so: ``durable status`` of the parent names the
    child and its reason, ``durable runs`` shows it, the ``durable_runs_blocked_by_child``
    gauge counts it; by its agent's default policy it keeps waiting."""
    from durable.telemetry.metrics import exposition
    from tests.test_metrics import samples

    run = client.start("parent_of_raiser", {}, run_id="waits-on-kid").run_id
    child = keys.child_id(run, 1)
    worker()
    reconciler()
    assert wait_for(lambda: client.log.projection(child).get("state") == "quarantined", 30)
    assert wait_for(lambda: "quarantined" in client.log.projection(run).get("reason", ""), 30)
    assert client.status(run).state == "waiting_child"
    shown = run_durable("status", run, env=dict(os.environ))
    assert shown.returncode == 0, shown.stderr
    blocked = next(line for line in shown.stdout.splitlines() if "│ blocked" in line)
    assert child in blocked and "a bug in the child's code" in blocked, shown.stdout
    assert "on_child_quarantined: wait" in blocked
    listed = run_durable("runs", env=dict(os.environ))
    assert f"blocked: child {child} is quarantined" in listed.stdout, listed.stdout
    gauge = samples(exposition(client)[0].decode())["durable_runs_blocked_by_child"]
    assert gauge == {(): 1.0}, gauge


@pytest.mark.parametrize(("agent", "state"), [("failing_parent_of_raiser", "completed"),
                                              ("canceling_parent_of_raiser", "canceled")])
def test_a_parents_policy_decides_what_its_quarantined_child_means(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, agent: str,
        state: str) -> None:
    """Window: as above. ``on_child_quarantined="fail"``: the parent is told of the child as
    one that did not complete (its ``join`` raises ``ChildFailed``, which it catches);
    ``"cancel"``: the parent is canceled."""
    run = client.start(agent, {}, run_id=f"policy-{state}").run_id
    child = keys.child_id(run, 1)
    worker()
    reconciler()
    final = client.wait(run, 60, waiting=False)
    assert final.state == state, final
    if state == "completed":
        assert client.status(child).state == "quarantined"
    else:  # the parent's cancel reaches its children after the parent's own end is written
        assert wait_for(lambda: client.status(child).state == "canceled", 60), \
            client.status(child).state
    if state == "completed":
        assert final.result == {"child": child, "state": "quarantined",
                                "error": final.result["error"]}
        assert "a bug in the child's code" in final.result["error"]
    else:
        assert f"child {child} is quarantined" in (final.reason or "")
