"""What pydantic-ai's durability base makes durable beyond model requests and tool calls,
as this engine runs it: the agent graph's wait between polls of a background job is the
run's durable timer (``durable_sleep``: the run waits ``waiting_timer``, holding no worker,
and the reconciler wakes it), and a capability's ``@durable_operation`` is a step of its
own, read back from the log when the function is executed again.

Real worker and reconciler processes, SIGKILLed for real; the models are pydantic-ai
``FunctionModel``s counting their requests per idempotency key, the effects a SQLite
database that never deduplicates.
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
from tests.agents import pydantic_ai_ops  # noqa: F401  (registers the agents)
from tests.agents.basic import applications, model_requests
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.servers.integration_world import decided, set_env

AGENTS = "examples.agents,tests.agents.basic,tests.agents.pydantic_ai_ops"


@pytest.fixture(autouse=True)
def _env(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_env(monkeypatch, tmp_path, AGENTS)


def test_the_wait_between_polls_of_a_background_job_is_a_durable_timer(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path
) -> None:
    """The model submits a job and asks to be polled a second later: the run waits on its
    timer (recorded, holding no worker), the reconciler wakes it, the re-executed function
    reads the first request from the log and polls once."""
    run = client.start("pai_poller", {"prompt": "go"}, run_id="ppoll").run_id
    worker()
    reconciler()
    final = client.wait(run, timeout=60, waiting=False)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result == "the job is done"
    waits = [e.event for e in client.events(run) if isinstance(e.event, ev.WaitEntered)]
    assert [w.kind for w in waits] == ["timer"]
    assert [s.tool for s in decided(client, run)] == ["pai_poller.model"] * 2
    assert model_requests(str(tmp_path / "model.sqlite")) == {f"{run}:1": 1, f"{run}:2": 1}
    assert verify(client.log, run).ok


def test_a_capabilitys_durable_operation_is_a_step_read_back_after_a_kill(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path
) -> None:
    """``Audit.record`` (a ``@durable_operation``) runs before each model request, as the
    step ``<name>.capability``. Crash window: SIGKILL once the model request's intent is
    recorded (step 2), after the operation's step (1) recorded its effect: the re-executed
    function reads the operation's result from the log, so its effect is applied once."""
    run = client.start("pai_audited", {"prompt": "go"}, run_id="paudit").run_id
    assert worker(kill_at="after_intent:2").wait(60) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    steps = decided(client, run)
    assert [s.tool for s in steps] == ["pai_audited.capability", "pai_audited.model"]
    assert steps[0].args["capability"] == "audit" and steps[0].args["operation"] == "record"
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:1": 1}
    assert verify(client.log, run).ok
