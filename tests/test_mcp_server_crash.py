"""A task outlives the worker running it and the client waiting on it: an MCP client creates
a task and waits on ``tasks/result``, its connection drops, the worker is SIGKILLed
mid-task, a standby worker takes the run over, and a new client (a new MCP session) gets
the task's result; no effect applied twice (counted in the external system, a SQLite
table)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis

from durable.client import Client
from tests.agent2agent import published
from tests.agents.basic import applications
from tests.mcp_door import McpDoor, call_with_task, door, get_task, task_result

__all__ = ["door"]  # the fixture

pytestmark = pytest.mark.timeout(300)


def test_a_task_outlives_a_sigkilled_worker_and_a_client_that_reconnects(
        door: McpDoor, worker: Any, reconciler: Any, client: Client, r: redis.Redis,
        world_db: Path) -> None:
    """Crash window: the worker is SIGKILLed after step 2's effect was applied, before its
    outcome is recorded (``after_effect:2``); the client that created the task drops its
    connection (its MCP session ends) while ``tasks/result`` waits, after the first step's
    progress; another client asks for the result across the kill and the takeover."""
    doomed = worker(kill_at="after_effect:2", TEST_SLOW_S="0.3")
    reconciler()
    published(r, "writer")

    async def go() -> tuple[str, str, Any]:
        heard = anyio.Event()

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            heard.set()

        async with door.client() as first:
            created = await call_with_task(first, "writer", {"steps": 3})
            task_id = created.task.task_id
            async with anyio.create_task_group() as waiting:
                waiting.start_soon(lambda: task_result(first, task_id, progress=progress))
                with anyio.fail_after(60):
                    await heard.wait()
                waiting.cancel_scope.cancel()  # the connection drops
        assert await asyncio.to_thread(doomed.wait, 60) == -9  # in its crash window
        async with door.client() as again:
            status = (await get_task(again, task_id)).status
            worker(TEST_SLOW_S="0.3")  # the standby takes the run over
            out = await task_result(again, task_id)
        return task_id, status, out

    task_id, status, out = asyncio.run(go())
    assert status == "working"  # the run outlived its worker, not yet taken over
    assert out.is_error is False and out.structured_content == {"rows": 3}
    assert client.status(task_id).state == "completed"
    applied = applications(str(world_db))
    assert len(applied) == 3 and set(applied.values()) == {1}, applied
