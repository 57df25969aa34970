"""A stdio MCP server dies with the worker that started it
(``durable.integrations.mcp_sessions.dying_with_worker``): SIGKILLing a worker leaves none of
its servers running, for a code agent's ``McpServer``, a pydantic-ai ``MCPToolset`` and an
OpenAI Agents SDK ``MCPServerStdio`` alike.

Real worker processes, SIGKILLed for real at a crash window; a real MCP stdio server
(``tests.servers.mcp``) that writes its pid to a file when it starts (``TEST_MCP_PIDS``) and
goes on for two minutes after its client is gone (``TEST_MCP_LINGER_S``), as a server busy
with work of its own does: only a kill ends it within the test's bound.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("agents")
pytest.importorskip("mcp")

from durable.client import Client
from durable.settings import Settings
from durable.testing import wait_for
from tests.agents import mcp_code, pydantic_ai_long
from tests.agents import openai_agents as oai
from tests.agents.basic import applications
from tests.conftest import WorkerFactory
from tests.servers.integration_world import set_env
from tests.servers.mcp import started_pids

pytestmark = pytest.mark.skipif(sys.platform != "linux",
                                reason="a parent-death signal is Linux's (prctl)")

AGENTS = "examples.agents,tests.agents.basic,tests.agents.pydantic_ai_long,tests.agents.mcp_code"
#: How long the servers of a killed worker may take to be gone (s); they linger 120 s.
GONE_S = 10.0
#: The agents started here, imported by the workers through ``DURABLE_AGENTS``.
STARTED = (mcp_code.mcp_books, pydantic_ai_long.mcp_agent, oai.durable_mcp)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a test MCP server still running (not a zombie, not another
    process that took the pid)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X") and b"tests.servers.mcp" in command


def _lingering(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    pids = tmp_path / "mcp.pids"
    monkeypatch.setenv("TEST_MCP_PIDS", str(pids))
    monkeypatch.setenv("TEST_MCP_LINGER_S", "120")
    return pids


def _left_running(pids_file: Path) -> list[int]:
    """The servers that wrote to ``pids_file`` and still run ``GONE_S`` seconds after their
    worker died (killed then, so that a failing test leaves none behind)."""
    pids = started_pids(str(pids_file))
    assert pids, "no MCP server was started"
    wait_for(lambda: not any(_alive(p) for p in pids), GONE_S, 0.05)
    left = [p for p in pids if _alive(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


@pytest.mark.parametrize("via_shell", [False, True], ids=["direct", "via-a-shell"])
def test_a_code_agents_mcp_server_dies_with_its_killed_worker(
    via_shell: bool, settings: Settings, client: Client, worker: WorkerFactory,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Crash window: the worker is SIGKILLed after the first ``apply`` reached the server
    (step 2, ``after_effect``), its session open. Its server goes with it; started by a
    shell (as ``npx`` or ``uvx`` start one), the server, a grandchild, goes too."""
    set_env(monkeypatch, tmp_path, AGENTS, TEST_MCP_VIA_SHELL="1" if via_shell else "0")
    pids = _lingering(monkeypatch, tmp_path)
    run = client.start("mcp_books", {}, run_id="orphan-code").run_id
    assert worker(kill_at="after_effect:2").wait(90) == -signal.SIGKILL
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:2": 1}
    assert _left_running(pids) == []


def test_a_pydantic_ai_mcp_toolsets_server_dies_with_its_killed_worker(
    settings: Settings, client: Client, worker: WorkerFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Crash window: the worker is SIGKILLed after the first ``apply`` reached the server
    (step 3, ``after_effect``): its server goes with it."""
    set_env(monkeypatch, tmp_path, AGENTS)
    pids = _lingering(monkeypatch, tmp_path)
    run = client.start("pai_mcp", {"prompt": "apply"}, run_id="orphan-pai").run_id
    assert worker(kill_at="after_effect:3").wait(90) == -signal.SIGKILL
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:3": 1}
    assert _left_running(pids) == []


@pytest.mark.usefixtures("openai_env")
def test_an_openai_agents_mcp_server_dies_with_its_killed_worker(
    client: Client, worker: WorkerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Crash window: the worker is SIGKILLed after the first ``apply`` reached the SDK's
    ``MCPServerStdio`` (step 3, ``after_effect``): its server goes with it."""
    pids = _lingering(monkeypatch, tmp_path)
    run = client.start(oai.durable_mcp.name, {"input": "apply"}, run_id="orphan-oai").run_id
    assert worker(kill_at="after_effect:3").wait(90) == -signal.SIGKILL
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:3": 1}
    assert _left_running(pids) == []
