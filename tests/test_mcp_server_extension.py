"""``durable mcp`` on the 2026-07-28 revision, where tasks are the tasks extension
(``io.modelcontextprotocol/tasks``, SEP-2663): the official ``mcp`` SDK's client in its
default mode (it negotiates the newest revision), with the extension's client side on its
extension seam (``tests.mcp_door.TasksExtension``). A call the server answers with a task is
resolved by polling ``tasks/get``; a wait for input is its ``inputRequests``, answered with
``tasks/update``; ``tasks/cancel`` is the durable cancel; a client that did not declare the
extension is never answered with a task."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis
from mcp import types

from durable.client import Client
from durable.testing import Server
from tests.agent2agent import published
from tests.mcp_door import TaskHandle, TasksExtension, modern_get, serving, text_of

pytestmark = pytest.mark.timeout(240)


@pytest.fixture()
def forms(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """The workers also load ``tests.agents.forms`` (``booker``)."""
    monkeypatch.setenv("DURABLE_AGENTS", f"{settings.worker.agents},tests.agents.forms")


def test_the_tasks_extension_on_the_newest_revision(server: Server, settings: Any,
                                                    tmp_path: Path, worker: Any,
                                                    client: Client, r: redis.Redis,
                                                    forms: None) -> None:
    """``DURABLE_MCP_WAIT_S=0.5``: a run that takes longer comes back as a task
    (``resultType: "task"``), which the client resolves to the run's result; a run waiting
    for input comes back as a task (at once), ``input_required`` with the agent's form, and
    the answer given with ``tasks/update`` is the run's response; ``tasks/cancel`` cancels a
    task, by the caller. A client without the extension gets the task named in a tool
    result, and the server advertises the extension, not the 2025 ``tasks`` capability."""
    worker()
    published(r, "chat", "booker", "quoter")

    async def seats(params: dict[str, Any]) -> dict[str, Any]:
        assert params["requestedSchema"]["properties"]["seats"]["type"] == "integer"
        return {"action": "accept", "content": {"seats": 3}}

    with serving(server, tmp_path, DURABLE_MCP_WAIT_S="0.5") as door:
        async def go() -> None:
            tasks = TasksExtension(answer=seats)
            async with door.client(mode="auto", extensions=[tasks]) as c:
                assert c.protocol_version == "2026-07-28"
                caps = c.server_capabilities
                assert caps.tasks is None and "io.modelcontextprotocol/tasks" in \
                    (caps.extensions or {})
                out = await c.call_tool("chat", {"parts": 2, "pause_s": 1.5})
                assert out.structured_content == {"said": ["tok0", "tok1"]}
                (handle,) = tasks.handles
                assert handle.status == "working"
                assert client.status(handle.task_id).owner == "mcp:acme-bot"
                assert tasks.polled[-1].status == "completed"

                booked = await c.call_tool("booker", {"to": "Faro"})
                assert booked.structured_content == {"to": "Faro", "seats": 3,
                                                     "window": False}
                waiting = tasks.handles[-1]  # at once, or after the bound on a busy machine
                assert waiting.status in ("input_required", "working")
                asked = next(p for p in tasks.polled if p.input_requests)
                assert asked.status_message == "How many seats to Faro?"
                state = client.status(waiting.task_id)
                assert state.last_wait is not None
                assert state.last_wait.by == "mcp:acme-bot tasks/update"
                assert list(asked.input_requests or {}) == [state.last_wait.request]

                got = await c.session.call_tool("quoter", {"text": "q"}, allow_claimed=True)
                assert isinstance(got, TaskHandle) and got.status in ("input_required", "working")
                await c.session.send_request(types.CancelTaskRequest(
                    params=types.CancelTaskRequestParams(task_id=got.task_id)),
                    types.EmptyResult)
                canceled = await modern_get(c.session, got.task_id)
                assert canceled.status == "cancelled"
                cancel = client.status(got.task_id).cancel
                assert cancel is not None and cancel.by == "mcp:acme-bot"
            async with door.client(mode="auto") as plain:  # no extension declared
                named = await plain.call_tool("chat", {"parts": 1, "pause_s": 1.5})
                assert isinstance(named.structured_content, dict)
                assert named.structured_content["task"]["status"] == "working"
                assert "tasks/get" in text_of(named)

        asyncio.run(go())

