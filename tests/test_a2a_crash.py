"""A task outlives the worker running it and the stream following it: an A2A caller's stream
drops, the caller resubscribes (``tasks/resubscribe``, the 0.3 name), the worker is SIGKILLed
mid-task, a standby worker takes the run over, and the resubscribed stream carries the task
to completed, no effect applied twice (counted in the external system, a SQLite table)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis
from a2a.types import SubscribeToTaskRequest, TaskState

from durable.client import Client
from tests.agent2agent import A2AServer, door, kind, message, published
from tests.agents.basic import applications

__all__ = ["door"]  # the fixture

pytestmark = pytest.mark.timeout(300)


def test_a_resubscribed_stream_outlives_a_sigkilled_worker(
        door: A2AServer, worker: Any, reconciler: Any, client: Client, r: redis.Redis,
        world_db: Path) -> None:
    """Crash window: the worker is SIGKILLed after step 2's effect was applied, before its
    outcome is recorded (``after_effect:2``); the caller's first stream was dropped after
    step 1, and its resubscription is open across the kill and the takeover."""
    doomed = worker(kill_at="after_effect:2", TEST_SLOW_S="0.3")
    reconciler()
    published(r, "writer")

    async def go() -> list[str]:
        async with door.client("writer", v03=True) as c:
            first: list[str] = []
            async for item in c.send_message(message({"steps": 3})):
                first.append(kind(item))
                if item.WhichOneof("payload") == "task":
                    task_id = item.task.id
                if first[-1] == "status:TASK_STATE_WORKING":
                    break  # the connection drops
            assert first[0] == "task", first
            again: list[str] = []
            async for item in c.subscribe(SubscribeToTaskRequest(id=task_id)):
                again.append(kind(item))
                if len(again) == 1:
                    assert item.task.id == task_id
                    assert item.task.status.state in (TaskState.TASK_STATE_SUBMITTED,
                                                      TaskState.TASK_STATE_WORKING)
                    assert doomed.wait(60) == -9  # SIGKILLed in its crash window
                    worker(TEST_SLOW_S="0.3")  # the standby takes the run over
            return again

    events = asyncio.run(go())
    assert events[0] == "task" and events[-1] == "status:TASK_STATE_COMPLETED", events
    assert "artifact:result" in events
    (run,) = client.runs(agent="writer")
    state = client.status(run.run_id)
    assert state.state == "completed" and state.result == {"rows": 3}
    applied = applications(str(world_db))
    assert len(applied) == 3 and set(applied.values()) == {1}, applied
