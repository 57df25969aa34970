"""``durable mcp --stdio`` launched by the official ``mcp`` SDK's client, as a desktop host
launches a local MCP server: the caller is the one whose token is in the environment; the
tools, a task-augmented call and its result work as over HTTP, with progress on the
pipe."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from durable.client import Client as DurableClient
from durable.testing import Server
from tests.agent2agent import published
from tests.mcp_door import call_with_task, list_tasks, task_result, tokens_file

pytestmark = pytest.mark.timeout(240)


def test_stdio_serves_the_caller_of_its_token(server: Server, settings: Any, tmp_path: Path,
                                              worker: Any, client: DurableClient,
                                              r: redis.Redis) -> None:
    worker()
    published(r, "chat")
    path, tokens = tokens_file(tmp_path)
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "durable", "mcp", "--stdio", "--tokens", str(path)],
        env={**os.environ, "DURABLE_MCP_TOKEN": tokens["globex-bot"], "DURABLE_AGENTS": ""})
    errlog = (tmp_path / "stderr.log").open("w")

    async def go() -> tuple[str, list[str]]:
        said: list[str] = []

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            said.append(message or "")

        async with Client(stdio_client(params, errlog=errlog), mode="legacy") as c:
            assert c.server_capabilities.tasks is not None
            assert "chat" in {t.name for t in (await c.list_tools()).tools}
            plain = await c.call_tool("chat", {"parts": 1, "pause_s": 0})
            assert plain.structured_content == {"said": ["tok0"]}
            created = await call_with_task(c, "chat", {"parts": 2, "pause_s": 0.3})
            out = await task_result(c, created.task.task_id, progress=progress)
            assert out.structured_content == {"said": ["tok0", "tok1"]}
            listed = [t.task_id for t in (await list_tasks(c)).tasks]
            assert created.task.task_id in listed and len(listed) == 2
            return created.task.task_id, said

    try:
        task_id, said = asyncio.run(go())
    finally:
        errlog.close()
    assert said and said[0] == "step 1: chatter", said
    state = client.status(task_id)
    assert (state.tenant, state.owner, state.state) == ("globex", "mcp:globex-bot", "completed")
    log = (tmp_path / "stderr.log").read_text()
    assert "mcp started on stdio, as 'globex-bot'" in log and "Traceback" not in log, log
