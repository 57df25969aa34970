"""``durable a2a`` called as another agent calls it: the official ``a2a-sdk`` client against a
real ``durable a2a`` process, with real worker processes on the session's Redis. A task is a
run: its card, a stream of its steps and partial output, the retry of a message that starts
nothing twice, input-required answered by a message, the durable cancel."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError

from durable.a2a.cards import SCHEMA_EXTENSION
from durable.a2a.handler import run_id_for
from durable.client import Client
from tests.agent2agent import A2AServer, door, elapsed_ms, kind, message, published

__all__ = ["door"]  # the fixture

pytestmark = pytest.mark.timeout(240)

S = TaskState


def test_an_agent_card_per_published_agent(door: A2AServer, worker: Any,
                                           r: redis.Redis) -> None:
    async def go() -> None:
        worker()
        published(r, "chat", "asker")
        listed = httpx.get(f"{door.url}/agents").json()["agents"]
        assert {"chat", "asker"} <= {a["name"] for a in listed}
        async with httpx.AsyncClient() as http:
            card = await door.card("asker", http)
        assert card.name == "asker" and card.capabilities.streaming
        assert [i.protocol_version for i in card.supported_interfaces] == ["1.0", "0.3"]
        assert card.supported_interfaces[0].url == door.endpoint("asker")
        (skill,) = card.skills
        assert skill.id == "asker" and "as text: it becomes the field 'text'" in skill.description
        (ext,) = card.capabilities.extensions
        assert ext.uri == SCHEMA_EXTENSION and set(ext.params["schema"]["properties"]) == \
            {"text", "steps"}
        assert "bearer" in card.security_schemes
        assert httpx.get(f"{door.url}/agents/nope/.well-known/agent-card.json").status_code == 404

    asyncio.run(go())


def test_a_stream_carries_steps_partial_output_and_the_result(
        door: A2AServer, worker: Any, client: Client, r: redis.Redis) -> None:
    """message/stream: the task, then a working status per step, the step's partial output as
    chunks of one artifact, the result, completed. A retry of the same message id follows
    the same run (one run in all). Reports start-to-first-event latency."""
    async def go() -> None:
        worker()
        published(r, "chat")
        request = message({"parts": 3, "pause_s": 0.2})
        seen: list[str] = []
        firsts: dict[str, float] = {}
        async with door.client("chat") as c:
            t0 = time.perf_counter()
            async for item in c.send_message(request):
                k = kind(item)
                firsts.setdefault(k, elapsed_ms(t0))
                seen.append(k)
                if k == "task":
                    task_id = item.task.id
                    assert item.task.status.state == S.TASK_STATE_SUBMITTED
            assert seen[0] == "task" and seen[-1] == "status:TASK_STATE_COMPLETED", seen
            assert "status:TASK_STATE_WORKING" in seen
            assert seen.count("artifact:partial-1") == 3 and "artifact:result" in seen, seen
            print(f"\nA2A message/stream: first event (the task) {firsts['task']:.1f} ms, "
                  f"first worker event {firsts['status:TASK_STATE_WORKING']:.1f} ms, "
                  f"first partial output {firsts['artifact:partial-1']:.1f} ms, "
                  f"completed {firsts['status:TASK_STATE_COMPLETED']:.1f} ms")
            assert task_id == run_id_for("acme", "chat", request.message.message_id)
            got = await c.get_task(GetTaskRequest(id=task_id))
            assert got.status.state == S.TASK_STATE_COMPLETED
            assert got.artifacts[0].parts[0].data.struct_value["said"] == \
                ["tok0", "tok1", "tok2"]
            # The caller did not hear back and sends the same message again: same task.
            again = [item async for item in c.send_message(request)]
        assert [kind(i) for i in again] == ["task"] and again[0].task.id == task_id
        assert again[0].task.status.state == S.TASK_STATE_COMPLETED
        recorded = client.status(task_id).input  # whole numbers stay ints
        assert recorded == {"parts": 3, "pause_s": 0.2} and type(recorded["parts"]) is int
        runs = client.runs(agent="chat")
        assert [(x.run_id, x.tenant, x.owner) for x in runs] == [(task_id, "acme", "a2a:acme-bot")]
        # More samples of the latency, on short tasks: to the task, to the first worker event.
        samples: list[tuple[float, float]] = []
        async with door.client("chat") as c:
            for _ in range(10):
                t0, at = time.perf_counter(), dict[str, float]()
                async for item in c.send_message(message({"parts": 1, "pause_s": 0})):
                    at.setdefault(kind(item), elapsed_ms(t0))
                samples.append((at["task"], at["status:TASK_STATE_WORKING"]))
        firsts_sorted = sorted(s[0] for s in samples)
        workers_sorted = sorted(s[1] for s in samples)
        print(f"A2A message/stream, 10 tasks: first event median {firsts_sorted[5]:.1f} ms "
              f"(max {firsts_sorted[-1]:.1f}), first worker event median "
              f"{workers_sorted[5]:.1f} ms (max {workers_sorted[-1]:.1f})")

    asyncio.run(go())


@pytest.mark.parametrize("v03", [False, True], ids=["v1.0", "v0.3"])
def test_input_required_is_answered_by_a_message(door: A2AServer, worker: Any,
                                                 r: redis.Redis, client: Client,
                                                 v03: bool) -> None:
    """message/send (v0.3's name with the 0.3 interface): a run waiting for input is an
    input-required task; a message naming it answers; the same answer sent again changes
    nothing; the next message in the context starts the next task of that session."""
    async def go() -> None:
        worker()
        published(r, "asker")
        async with door.client("asker", streaming=False, v03=v03) as c:
            (first,) = [i async for i in c.send_message(message(text="hello", context_id="chat-1"))]
            task = first.task
            assert task.status.state == S.TASK_STATE_INPUT_REQUIRED, task
            assert task.context_id == "chat-1"
            assert client.status(task.id).session == "asker:chat-1"  # the agent's session
            assert "what should I say?" in task.status.message.parts[0].text
            answer = message(text="go on", task_id=task.id, context_id="chat-1")
            (done,) = [i async for i in c.send_message(answer)]
            assert done.task.status.state == S.TASK_STATE_COMPLETED, done.task
            assert done.task.artifacts[0].parts[0].text == "hello"
            (again,) = [i async for i in c.send_message(answer)]  # the retried answer
            assert again.task.status.state == S.TASK_STATE_COMPLETED
            (nxt,) = [i async for i in c.send_message(message(text="next", context_id="chat-1"))]
            assert nxt.task.id != task.id and nxt.task.context_id == "chat-1"
            assert nxt.task.status.state == S.TASK_STATE_INPUT_REQUIRED
            if not v03:  # ListTasks is 1.0's: the context's tasks, the latest first
                listed = await c.list_tasks(ListTasksRequest(context_id="chat-1"))
                assert [t.id for t in listed.tasks] == [nxt.task.id, task.id]

    asyncio.run(go())


def test_cancel_is_the_durable_cancel(door: A2AServer, worker: Any, client: Client,
                                      r: redis.Redis) -> None:
    """tasks/cancel records the cancel in the run's log: the run is canceled, by the caller."""
    async def go() -> None:
        worker()
        published(r, "asker")
        async with door.client("asker", streaming=False) as c:
            (first,) = [i async for i in c.send_message(message({"text": "x"}))]
            assert first.task.status.state == S.TASK_STATE_INPUT_REQUIRED
            canceled = await c.cancel_task(CancelTaskRequest(id=first.task.id))
        assert canceled.status.state == S.TASK_STATE_CANCELED
        state = client.status(first.task.id)
        assert state.state == "canceled" and state.cancel is not None
        assert state.cancel.by == "a2a:acme-bot"

    asyncio.run(go())


def test_an_approval_is_input_required_and_decided_by_an_approver(
        door: A2AServer, worker: Any, client: Client, r: redis.Redis, payer_files: Path,
        approver: Any) -> None:
    """A payout waiting for an approver is input-required, saying so; a message cannot
    decide it; a caller subscribed to the task sees it go on once an approver decided."""
    pem = approver("alice", "finance")
    worker()
    published(r, "payer")

    async def go() -> list[str]:
        async with door.client("payer") as c:
            sent = [i async for i in c.send_message(message({"amount": 5}))]
            assert kind(sent[-1]) == "status:TASK_STATE_INPUT_REQUIRED", [kind(i) for i in sent]
            task_id = sent[0].task.id
            text = sent[-1].status_update.status.message.parts[0].text
            assert "waiting for an approver (finance)" in text
            with pytest.raises(InvalidParamsError, match="does not wait for input"):
                [i async for i in c.send_message(message(text="yes", task_id=task_id))]
            events = []
            async for item in c.subscribe(SubscribeToTaskRequest(id=task_id)):
                events.append(kind(item))
                if len(events) == 1:
                    assert item.task.status.state == S.TASK_STATE_INPUT_REQUIRED
                    (request,) = client.status(task_id).approvals
                    client.sign_and_approve(task_id, request, "approve", "alice", pem)
            return events

    events = asyncio.run(go())
    assert events[0] == "task" and events[-1] == "status:TASK_STATE_COMPLETED", events


def test_list_tasks_orders_filters_and_pages_the_callers_tasks(
        door: A2AServer, worker: Any, r: redis.Redis) -> None:
    """ListTasks (A2A 1.0, 3.1.4): the caller's tasks only, the most recently updated first;
    filters by status and by status time; pages through page tokens, each task once, the
    last page's token empty, totalSize the count of matches; artifacts only with
    includeArtifacts, no history with historyLength 0."""
    async def go() -> None:
        worker()
        published(r, "asker")
        async with door.client("asker", "globex-bot", streaming=False) as globex:
            [i async for i in globex.send_message(message({"text": "theirs"}))]
        async with door.client("asker", streaming=False) as c:
            ids = []
            for n in range(3):
                (sent,) = [i async for i in c.send_message(message({"text": f"t{n}"}))]
                assert sent.task.status.state == S.TASK_STATE_INPUT_REQUIRED
                ids.append(sent.task.id)
            first, second, third = ids
            (done,) = [i async for i in c.send_message(message(text="go", task_id=first))]
            assert done.task.status.state == S.TASK_STATE_COMPLETED
            listed = await c.list_tasks(ListTasksRequest())
            assert [t.id for t in listed.tasks] == [first, third, second]
            stamps = [t.status.timestamp.ToMilliseconds() for t in listed.tasks]
            assert stamps == sorted(stamps, reverse=True)
            assert (listed.total_size, listed.next_page_token) == (3, "")
            assert not any(t.artifacts for t in listed.tasks)  # includeArtifacts unset
            assert all(t.history for t in listed.tasks)
            full = await c.list_tasks(ListTasksRequest(include_artifacts=True, history_length=0))
            assert [a.artifact_id for a in full.tasks[0].artifacts] == ["result"]
            assert not any(t.history for t in full.tasks)
            waiting = await c.list_tasks(ListTasksRequest(status=S.TASK_STATE_INPUT_REQUIRED))
            assert [t.id for t in waiting.tasks] == [third, second] and waiting.total_size == 2
            recent = await c.list_tasks(ListTasksRequest(
                status_timestamp_after=listed.tasks[1].status.timestamp))
            assert [t.id for t in recent.tasks] == [first, third]
            pages, page_token = [], ""
            while True:
                page = await c.list_tasks(ListTasksRequest(page_size=1, page_token=page_token))
                assert page.page_size == 1 and page.total_size == 3
                pages.append([t.id for t in page.tasks])
                page_token = page.next_page_token
                if not page_token:
                    break
            assert pages == [[first], [third], [second]]

    asyncio.run(go())
