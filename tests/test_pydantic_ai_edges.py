"""What the pydantic-ai integration accepts, refuses and fails, at its edges: a tool a
capability contributes is a durable step like the agent's own; a model id in a run's input
that pydantic-ai cannot resolve fails the run with pydantic-ai's reason (it quarantined it);
``continue_from=`` a run that kept no conversation is refused at start (it was accepted, and
failed at the new run's first step).

Real worker processes, SIGKILLed for real; the models are pydantic-ai ``FunctionModel``s
counting their requests per idempotency key, the tools write their effects into a SQLite
database that never deduplicates (``TEST_DB_DEDUPE=0``).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")

from durable.audit.verify import verify
from durable.client import Client
from durable.errors import UsageError
from durable.log import events as ev
from durable.settings import Settings
from tests.agents import pydantic_ai as pai_agents
from tests.agents.basic import applications, model_requests
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.servers.integration_world import decided, set_env

AGENTS = "examples.agents,tests.agents.basic,tests.agents.pydantic_ai"
#: The agents started here, imported by the workers through ``DURABLE_AGENTS``.
STARTED = (pai_agents.durable_stamper, pai_agents.durable_booker)


@pytest.fixture(autouse=True)
def _env(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_env(monkeypatch, tmp_path, AGENTS)


def test_a_tool_a_capability_contributes_is_a_step_applied_once_across_a_kill(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path
) -> None:
    """Registration accepts the agent (it refused the ``CapabilityOwnedToolset`` pydantic-ai
    wraps a capability's toolset in). Crash window: SIGKILL after the capability's tool
    applied its effect (step 2, ``after_effect``), before its outcome was recorded: the next
    worker resolves the call by its lookup and never runs the tool again."""
    run = client.start("pai_stamper", {"prompt": "stamp"}, run_id="pcap").run_id
    assert worker(kill_at="after_effect:2").wait(60) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result == "stamped: stamp a"
    assert [s.tool for s in decided(client, run)] == [
        "pai_stamper.model", "pai_stamper.tool.stamps.stamp", "pai_stamper.model"]
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:2": 1}
    assert verify(client.log, run).ok


def test_a_model_id_pydantic_ai_cannot_resolve_fails_the_run_with_the_reason(
    client: Client, worker: WorkerFactory, tmp_path: Path
) -> None:
    run = client.start("pai_booker", {"prompt": "book", "model": "no-such-provider:model"},
                       run_id="pbadmodel").run_id
    worker()
    final = client.wait(run, timeout=60)
    assert final.state == "failed", (final.state, final.reason, final.error)
    failed = [e.event for e in client.events(run) if isinstance(e.event, ev.Failed)]
    assert "'no-such-provider:model'" in failed[-1].error
    assert "Unknown model" in failed[-1].error  # pydantic-ai's own reason
    assert decided(client, run) == []  # refused before any step: no request was sent
    assert model_requests(str(tmp_path / "model.sqlite")) == {}


def test_continuing_a_run_that_kept_no_conversation_is_refused_at_start(
    client: Client, worker: WorkerFactory
) -> None:
    """A plain run keeps no conversation (only a session's turn or a continuing run does):
    continuing it is refused, naming it, and nothing is written; a session's turn is
    continued."""
    plain = client.start("pai_booker", {"prompt": "book"}, run_id="pplain").run_id
    turn = client.start("pai_booker", {"prompt": "book"}, run_id="pturn", session="s1").run_id
    worker(burst=True).wait(60)
    assert client.status(plain).state == client.status(turn).state == "completed"
    with pytest.raises(UsageError, match="run 'pplain' kept no conversation"):
        client.start("pai_booker", {"prompt": "more"}, run_id="pnext", continue_from=plain)
    assert client.log.projection("pnext") == {}  # nothing was written
    after = client.start("pai_booker", {"prompt": "more"}, run_id="pafter",
                         continue_from=turn).run_id
    worker(burst=True).wait(60)
    final = client.status(after)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert decided(client, after)[0].tool == "conversation.load"  # the kept conversation
