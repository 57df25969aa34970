"""Cancel always ends a run: a quarantined one too (recording what was in flight), and a
cancel of a terminal run says so. Real Redis, real worker and reconciler processes, the
real CLI."""

from __future__ import annotations

import os

import pytest

import tests.agents.settle  # noqa: F401  (registers hangafter)
from durable.audit.verify import verify
from durable.client import Client
from durable.log import events as ev
from durable.log import keys
from durable.log.store import Spec
from durable.reconciler.sweep import Sweeper
from durable.testing import wait_for
from tests.conftest import WorkerFactory, run_durable


def _types(client: Client, run: str) -> list[str]:
    return [type(e.event).__name__ for e in client.events(run)]


@pytest.fixture()
def hung(client: Client, worker: WorkerFactory, monkeypatch: pytest.MonkeyPatch) -> str:
    """A run whose agent hung in ``decide`` after its first step (window: the step's
    outcome staged, not yet in the log): quarantined by the watchdog, lease let go."""
    monkeypatch.setenv("DURABLE_AGENTS", os.environ["DURABLE_AGENTS"] + ",tests.agents.settle")
    monkeypatch.setenv("DURABLE_DECIDE_TIMEOUT_MS", "500")
    run = client.start("hangafter", {}, run_id="hung").run_id
    worker()
    state = client.wait(run, 30)
    assert state.state == "quarantined", state
    assert "did not return within 500 ms" in (state.reason or "")
    assert wait_for(lambda: client.redis.get(client.log.keys.lease(run)) is None, 5)
    assert state.actions[1].status == "dispatched"  # what was in flight, by the log
    return run


def test_cancel_ends_a_quarantined_run_whose_agent_hung_after_a_step(
    client: Client, hung: str
) -> None:
    """The probe of the issue: ``durable cancel`` printed ``RUN: quarantined``, exited 0,
    and nothing changed. Now the run ends ``canceled``, and the log records the cancel and
    the call that was in flight (interrupted: its outcome is unknown, for a lookup)."""
    res = run_durable("cancel", hung, "--reason", "operator gave up", env=dict(os.environ))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"{hung}: canceled"
    state = client.status(hung)
    assert state.state == "canceled" and state.reason == "operator gave up"
    assert _types(client, hung)[-3:] == ["CancelRequested", "ActionInterrupted", "Canceled"]
    assert state.actions[1].status == "unknown"
    assert client.redis.hget(keys.QUARANTINE, hung) is None
    assert verify(client.log, hung).ok


def test_the_reconciler_ends_a_quarantined_run_whose_cancel_was_only_requested(
    client: Client, hung: str
) -> None:
    """Window: the cancel request is in the log of the quarantined run but nobody ended it
    (a lease was held when it was asked for): the reconciler finds it due and ends it."""
    handle = client.log.load(hung, actor="op")
    client.log.commit(handle, [Spec(ev.CancelRequested, {"reason": "later", "by": "op"})])
    assert client.status(hung).state == "quarantined"
    # due for the reconciler
    assert client.redis.zscore(client.log.keys.due_of(hung), hung) is not None
    rec = Sweeper(client.settings, client.redis, client.registry)
    assert rec.reconcile(hung) == "canceled"
    assert client.status(hung).state == "canceled"


def test_a_cancel_of_a_terminal_run_says_so_and_writes_nothing(
    client: Client, worker: WorkerFactory
) -> None:
    """A completed run: one line, exit 1, the log unchanged."""
    run = client.start("count", {"steps": 1}, run_id="done").run_id
    worker()
    assert client.wait(run, 30).state == "completed"
    before = client.status(run).version
    res = run_durable("cancel", run, env=dict(os.environ))
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.splitlines() == [f"durable: run {run} is already completed; "
                                       "nothing to cancel"]
    assert client.status(run).version == before
