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

import anyio
import pytest
import redis
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from durable.client import Client as DurableClient
from durable.testing import Server
from tests.agent2agent import published
from tests.mcp_door import Progress, call_with_task, list_tasks, task_result, tokens_file

pytestmark = pytest.mark.timeout(240)


def test_stdio_serves_the_caller_of_its_token(server: Server, settings: Any, tmp_path: Path,
                                              worker: Any, client: DurableClient,
                                              r: redis.Redis) -> None:
    worker()
    published(r, "chat", "gated_chat")
    path, tokens = tokens_file(tmp_path)
    gate = tmp_path / "gate"
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "durable", "mcp", "--stdio", "--tokens", str(path)],
        env={**os.environ, "DURABLE_MCP_TOKEN": tokens["globex-bot"], "DURABLE_AGENTS": ""})
    errlog = (tmp_path / "stderr.log").open("w")

    async def go() -> tuple[str, list[str]]:
        progress = Progress()
        async with Client(stdio_client(params, errlog=errlog), mode="legacy") as c:
            assert c.server_capabilities.tasks is not None
            assert "chat" in {t.name for t in (await c.list_tools()).tools}
            plain = await c.call_tool("chat", {"parts": 1, "pause_s": 0})
            assert plain.structured_content == {"said": ["tok0"]}
            created = await call_with_task(c, "gated_chat",
                                           {"parts": 1, "first": 0, "gate": str(gate)})
            outs = []
            async with anyio.create_task_group() as waiting:
                async def result() -> None:
                    outs.append(await task_result(c, created.task.task_id,
                                                  progress=progress))

                waiting.start_soon(result)
                await progress.until("step 1: gated_chatter")  # on the pipe, while it waits
                Path(f"{gate}.1").touch()
                Path(f"{gate}.2").touch()
            assert outs[0].structured_content == {"steps": 2}
            listed = [t.task_id for t in (await list_tasks(c)).tasks]
            assert created.task.task_id in listed and len(listed) == 2
            return created.task.task_id, progress.messages

    try:
        task_id, said = asyncio.run(go())
    finally:
        errlog.close()
    assert said[0] == "step 1: gated_chatter" and said[-1] == "step 2: noop", said
    state = client.status(task_id)
    assert (state.tenant, state.owner, state.state) == ("globex", "mcp:globex-bot", "completed")
    log = (tmp_path / "stderr.log").read_text()
    assert "mcp started on stdio, as 'globex-bot'" in log and "Traceback" not in log, log
