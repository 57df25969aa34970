"""An OpenAI Agents SDK agent's MCP servers inside a durable run
(``durable.integrations.openai_agents.mcp``): the tool list recorded once per run, each call
a keyed step, read-only tools effect-free, one session per worker and server.

Real worker processes, SIGKILLed for real; the model is the SDK's
``OpenAIChatCompletionsModel`` against the local server of ``tests.servers.openai``; the tools
are a real MCP stdio server's (``tests.servers.mcp``, started by the SDK's ``MCPServerStdio``
in the worker), which writes its effects into a SQLite file that never deduplicates
(``TEST_DB_DEDUPE=0``) and dies once inside a call (``TEST_MCP_DIE_AT``).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

pytest.importorskip("agents")
pytest.importorskip("mcp")

from agents import Agent
from agents.mcp import MCPServerStdio

from durable.audit.verify import verify
from durable.client import Client
from durable.integrations.openai_agents import DurableAgent
from tests.agents import openai_agents as oai
from tests.agents.basic import applications
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.servers.integration_world import decided
from tests.servers.mcp import sessions
from tests.servers.openai import OpenAIServer, resent_after_recorded

pytestmark = pytest.mark.usefixtures("openai_env")


def test_mcp_calls_are_steps_applied_once_across_a_dying_server_and_a_killed_worker(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path,
    openai_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two crash windows in one run. The server dies inside the second ``apply`` (step 5),
    its effect committed and its answer never sent: the call is unknown, its lookup finds
    the key, and the worker goes on over a new session. Then the worker is SIGKILLed after
    the fourth ``apply`` reached the server (step 9), before its outcome was recorded: the
    next worker replays the run from the log (tool list included) and the lookup resolves
    the call. No recorded model request is sent again, each key is applied once."""
    monkeypatch.setenv("TEST_MCP_DIE_AT", "2")
    run = client.start(oai.durable_mcp.name, {"input": "apply"}, run_id="omcp").run_id
    doomed = worker(kill_at="after_effect:9")
    reconciler()
    assert doomed.wait(90) == -signal.SIGKILL
    worker()
    final = client.wait(run, timeout=120)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result.startswith(f"applied {oai.MCP_APPLIES}, peeked")
    assert f"'{oai.MCP_APPLIES}'" in final.result  # peek read every application
    tools = [s.tool for s in decided(client, run)]
    assert tools.count("oai_mcp.mcp.ledger.tools") == 1 and tools[0] == "oai_mcp.mcp.ledger.tools"
    assert tools.count("oai_mcp.mcp.ledger.call") == oai.MCP_APPLIES
    assert tools.count("oai_mcp.mcp.ledger.read") == 1  # readOnlyHint: effect-free
    calls = [n for n, t in enumerate(tools, 1) if t == "oai_mcp.mcp.ledger.call"]
    db = str(tmp_path / "world.sqlite")
    assert applications(db) == {f"{run}:{n}": 1 for n in calls}
    assert resent_after_recorded(client, run, openai_server) == []
    assert sessions(db) == 3  # the first worker's session, its reopening, the second worker's
    assert verify(client.log, run).ok


def test_mcp_servers_without_a_step_name_or_with_sdk_approvals_are_refused() -> None:
    command, args = "python", ["-m", "tests.servers.mcp"]
    unnamed = MCPServerStdio(params={"command": command, "args": args})
    with pytest.raises(ValueError, match="needs a name"):
        DurableAgent(Agent(name="a", mcp_servers=[unnamed]), name="oai_unnamed")
    gated = MCPServerStdio(name="gated", params={"command": command, "args": args},
                           require_approval="always")
    with pytest.raises(TypeError, match="requires_approval=True"):
        DurableAgent(Agent(name="b", mcp_servers=[gated]), name="oai_gated")
