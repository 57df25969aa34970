"""MCP sessions that outlive a step and survive their server (``durable.integrations.
mcp_sessions``): a worker keeps one session per server, reused by every call, and opens a new
one when the server died.

A real stdio MCP server (``tests.servers.mcp``) started by the worker's MCP client; it SIGKILLs
itself inside a call (``TEST_MCP_DIE_AT``), after its effect is committed and before it
answers. Its effects go to a SQLite file that never deduplicates (``TEST_DB_DEDUPE=0``), and it
counts there the server processes that served calls.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("mcp")

from durable.audit.verify import verify
from durable.client import Client
from durable.settings import Settings
from tests.agents import mcp_code
from tests.agents import pydantic_ai_long as long_agents
from tests.agents.basic import applications
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.servers.integration_world import decided, set_env
from tests.servers.mcp import sessions

AGENTS = "examples.agents,tests.agents.basic,tests.agents.pydantic_ai_long,tests.agents.mcp_code"


@pytest.fixture(autouse=True)
def _env(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_env(monkeypatch, tmp_path, AGENTS)


def test_a_code_agent_keeps_one_session_and_reconnects_when_the_server_dies_mid_call(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server dies inside the third ``apply`` (step 4), its effect committed, its answer
    never sent: the call is unknown, the lookup finds its key, and the run goes on over a new
    session; the tool list stays the one recorded at step 1. One worker, two server processes
    (not one per call)."""
    monkeypatch.setenv("TEST_MCP_DIE_AT", "3")
    run = client.start("mcp_books", {}, run_id="msess").run_id
    worker()
    reconciler()
    final = client.wait(run, timeout=90)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["peeked"] == {"result": mcp_code.APPLIES}
    assert [s.tool for s in decided(client, run)] == [
        "mcp_ledger.tools", *["mcp_ledger.call"] * mcp_code.APPLIES, "mcp_ledger.read"]
    db = str(tmp_path / "world.sqlite")
    assert applications(db) == {f"{run}:{n}": 1 for n in range(2, 2 + mcp_code.APPLIES)}
    assert final.actions[4].result == f"applied 3 ({run}:4)"  # the lookup's answer
    assert sessions(db) == 2
    assert verify(client.log, run).ok


def test_a_pydantic_ai_mcp_toolset_reconnects_when_its_server_dies_mid_run(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """pydantic-ai's ``MCPToolset`` in a durable run: the server dies inside the 10th
    ``apply`` (step 21), after its effect and before its answer. The call is unknown, resolved
    by its lookup; the run goes on over a new session, every key applied once, its tool list
    the one recorded once."""
    monkeypatch.setenv("TEST_MCP_DIE_AT", "10")
    run = client.start("pai_mcp", {"prompt": "apply"}, run_id="psess").run_id
    worker()
    reconciler()
    final = client.wait(run, timeout=180)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result == f"applied {long_agents.MCP_CALLS}, peeked {long_agents.MCP_CALLS}"
    tools = [s.tool for s in decided(client, run)]
    assert tools.count("pai_mcp.mcp.ledger.tools") == 1
    assert tools.count("pai_mcp.mcp.ledger.call") == long_agents.MCP_CALLS
    calls = [n for n, t in enumerate(tools, 1) if t == "pai_mcp.mcp.ledger.call"]
    db = str(tmp_path / "world.sqlite")
    assert applications(db) == {f"{run}:{n}": 1 for n in calls}
    assert sessions(db) == 2
    assert verify(client.log, run).ok
