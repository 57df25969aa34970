"""Ending a durable pydantic-ai run from inside it and from outside: a tool's
``RunContext.cancel()`` inside its step ends the run ``canceled`` at once, whether the tool
is plain or ``async`` and across a kill; an operator's cancel ends a run whose step ran past
its deadline and whose outcome nobody can tell.

Both hung before. The tool's cancel reached the run's function (pydantic-ai cancels the
task driving the run), which ended while its step was in flight, and what it ended with was
lost: the worker waited for a decision forever, holding the lease, and an operator's cancel
stayed ``cancel_requested``. And a cancel of a run waiting for an operator to settle an
unknown outcome was answered by the same wait at every sweep.

Real worker and reconciler processes; the models are pydantic-ai ``FunctionModel``s counting
their requests per idempotency key in a SQLite file.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")

from durable.audit.verify import verify
from durable.client import Client
from durable.log import events as ev
from durable.settings import Settings
from durable.testing import wait_for
from tests.agents import pydantic_ai_cancel  # noqa: F401  (registers the agents)
from tests.agents.basic import model_requests
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.runs import types_of
from tests.servers.integration_world import set_env

AGENTS = "examples.agents,tests.agents.basic,tests.agents.pydantic_ai_cancel"


@pytest.fixture(autouse=True)
def _env(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_env(monkeypatch, tmp_path, AGENTS)


def _ts(client: Client, run: str, kind: type[ev.Event], step: int | None = None) -> int:
    return next(e.event.ts for e in client.events(run) if isinstance(e.event, kind)
                and (step is None or getattr(e.event, "step", None) == step))


def test_a_tool_that_cancels_its_run_from_its_step_ends_it_canceled_at_once(
    client: Client, worker: WorkerFactory, tmp_path: Path
) -> None:
    """``ctx.cancel()`` in a plain tool (on a thread) and in an ``async`` one, each run as
    the step it is: the run ends ``canceled`` within a second of the step's dispatch, the
    tool's result discarded (the model is not asked again)."""
    runs = {tool: client.start("pai_stepquit", {"prompt": tool}, run_id=f"pq-{tool}").run_id
            for tool in ("give_up", "give_up_async")}
    worker()
    for tool, run in runs.items():
        final = client.wait(run, timeout=60)
        assert final.state == "canceled", (tool, final.state, final.reason, final.error)
        assert types_of(client, run)[-3:] == ["action_succeeded", "cancel_requested",
                                              "canceled"], tool
        took = _ts(client, run, ev.Canceled) - _ts(client, run, ev.ActionDispatched, 2)
        assert took < 1000, (tool, took)
        assert verify(client.log, run).ok
    assert model_requests(str(tmp_path / "model.sqlite")) == {
        f"{run}:1": 1 for run in runs.values()}


def test_a_tool_that_cancels_its_run_still_does_after_a_kill(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path
) -> None:
    """Crash window: SIGKILL after the cancelling tool's call (step 2, ``after_effect``),
    before its outcome and the cancel were recorded (they are recorded together). The call
    is effect-free: the next worker sends it again, and the run ends ``canceled``, its first
    model request not sent again."""
    run = client.start("pai_stepquit", {"prompt": "give_up"}, run_id="pqkill").run_id
    assert worker(kill_at="after_effect:2").wait(60) == -signal.SIGKILL
    assert client.status(run).state != "canceled"
    worker()
    reconciler()
    final = client.wait(run, timeout=60)
    assert final.state == "canceled", (final.state, final.reason, final.error)
    assert model_requests(str(tmp_path / "model.sqlite")) == {f"{run}:1": 1}
    assert verify(client.log, run).ok


def test_an_operator_cancels_a_run_whose_step_overran_its_deadline(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory
) -> None:
    """A tool that ignores its deadline (1 s) and being cancelled: its step times out,
    its outcome unknown, and with no lookup the run waits for an operator. The operator
    cancels instead: the run ends ``canceled`` at the next sweep, the outcome left unknown."""
    run = client.start("pai_stepquit", {"prompt": "stall"}, run_id="pqstall").run_id
    worker()
    reconciler()
    assert client.wait(run, timeout=60).state == "waiting_external"
    client.cancel(run, "the operator gave up on it")
    final = client.wait(run, timeout=15, waiting=False)
    assert final.state == "canceled", (final.state, final.reason)
    assert final.actions[2].status == "unknown"
    assert wait_for(lambda: verify(client.log, run).ok, 10)
