"""``durable mcp`` called as an MCP host calls it: the official ``mcp`` SDK's client over
Streamable HTTP against a real ``durable mcp`` process, with real worker processes on the
session's Redis. Each published agent is a tool; a task-augmented call is a run (task id =
run id) answered at once, ``tasks/result`` follows it with progress; a call without a task
waits up to its bound, then answers with the task; a wait for input is an elicitation;
``tasks/cancel`` is the durable cancel; a caller sees its tenant's tasks only."""

from __future__ import annotations

import asyncio
import functools
import statistics
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from mcp import types
from mcp.client.session import ClientRequestContext
from mcp.shared.exceptions import MCPError

from durable.client import Client
from durable.log import events as ev
from durable.testing import Server
from tests.agent2agent import elapsed_ms, published
from tests.agents.forms import FORM
from tests.mcp_door import (
    McpDoor,
    Progress,
    TaskStatuses,
    call_with_task,
    cancel_task,
    door,
    get_task,
    list_tasks,
    serving,
    task_result,
    text_of,
)

__all__ = ["door"]  # the fixture

pytestmark = pytest.mark.timeout(240)


@pytest.fixture()
def forms(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """The workers also load ``tests.agents.forms`` (``booker``)."""
    monkeypatch.setenv("DURABLE_AGENTS", f"{settings.worker.agents},tests.agents.forms")


def test_each_published_agent_is_a_tool_and_tasks_are_declared(door: McpDoor, worker: Any,
                                                               r: redis.Redis) -> None:
    worker()
    published(r, "chat", "quoter")

    async def go() -> None:
        async with door.client() as c:
            caps = c.server_capabilities
            assert caps.tasks is not None and caps.tasks.list is not None
            assert caps.tasks.cancel is not None
            assert caps.tasks.requests is not None and caps.tasks.requests.tools is not None
            assert caps.tasks.requests.tools.call is not None
            listed = {t.name: t for t in (await c.list_tools()).tools}
        assert {"chat", "quoter"} <= set(listed)
        chat = listed["chat"]
        assert set(chat.input_schema["properties"]) == {"parts", "pause_s"}
        assert chat.execution is not None and chat.execution.task_support == "optional"
        assert "durable run" in (chat.description or "")

    asyncio.run(go())


def test_a_task_augmented_call_answers_at_once_and_tasks_result_follows_the_run(
        door: McpDoor, worker: Any, client: Client, r: redis.Redis, tmp_path: Path) -> None:
    """A call with a task returns the task (working) at once; the task id is the run's,
    recorded with the caller's tenant and owner. ``tasks/result`` blocks until the run
    ends, reporting its steps and the partial output of the step in flight as progress
    (the test opens the step's gates as the progress says) and its status changes as
    notifications, and returns the result. Reports start-to-first-event latency against
    the native client's."""
    worker()
    published(r, "gated_chat", "chat")
    statuses = TaskStatuses()

    async def go() -> list[tuple[float, float, float, float]]:
        async with door.client(extensions=[statuses]) as c:
            gate = tmp_path / "gate"
            created = await call_with_task(c, "gated_chat",
                                           {"parts": 3, "first": 1, "gate": str(gate)})
            task = created.task
            assert task.status == "working" and task.ttl is None and task.poll_interval
            state = client.status(task.task_id)
            assert (state.agent, state.tenant, state.owner) == \
                ("gated_chat", "acme", "mcp:acme-bot")
            progress = Progress()
            outs: list[types.CallToolResult] = []
            async with anyio.create_task_group() as waiting:
                async def result() -> None:
                    outs.append(await task_result(c, task.task_id, progress=progress))

                waiting.start_soon(result)
                await progress.until('step 1: {"token": "tok0"}')
                got = await get_task(c, task.task_id)
                assert got.status == "working" and got.status_message == \
                    "step 1: gated_chatter"
                Path(f"{gate}.1").touch()
                await progress.until('step 1: {"token": "tok2"}')
                Path(f"{gate}.2").touch()
            (out,) = outs
            assert out.is_error is False and out.structured_content == {"steps": 2}
            assert out.meta == {"io.modelcontextprotocol/related-task":
                                {"taskId": task.task_id}}
            assert progress.messages == [
                "step 1: gated_chatter", *(f'step 1: {{"token": "tok{i}"}}' for i in range(3)),
                "step 2: noop"], progress.messages
            done = await get_task(c, task.task_id)
            assert done.status == "completed" and done.last_updated_at >= done.created_at
            # Latency, each sample beside a native run: to the task (the call's answer)
            # against ``Client.start`` and its first log entry read; to the first step as
            # progress (``tasks/result`` sent at once) against the first ``step_decided``
            # entry read.
            samples: list[tuple[float, float, float, float]] = []
            for i in range(10):
                gate = tmp_path / f"gate-{i}"
                t0 = time.perf_counter()
                made = await call_with_task(c, "gated_chat",
                                            {"parts": 1, "first": 0, "gate": str(gate)})
                first = elapsed_ms(t0)
                follow = Progress(t0)
                async with anyio.create_task_group() as waiting:
                    waiting.start_soon(functools.partial(task_result, c, made.task.task_id,
                                                         progress=follow))
                    step = await follow.until("step 1: gated_chatter")
                    Path(f"{gate}.1").touch()
                    Path(f"{gate}.2").touch()
                samples.append((first, step, *await asyncio.to_thread(_native, client)))
        return samples

    samples = asyncio.run(go())
    assert statuses.seen and statuses.seen[-1].status == "completed"
    mcp_first, mcp_step, native_first, native_step = (
        statistics.median(s[i] for s in samples) for i in range(4))
    print(f"\nMCP task-augmented call, 10 tasks: the task {mcp_first:.1f} ms (native start + "
          f"first entry {native_first:.1f} ms, x{mcp_first / native_first:.1f}); first step "
          f"as progress {mcp_step:.1f} ms (native {native_step:.1f} ms, "
          f"x{mcp_step / native_step:.1f})")


def _native(client: Client) -> tuple[float, float]:
    """``Client.start`` to the first log entry read, and to the first ``step_decided``
    entry read, as the native client follows a run (ms)."""
    t0 = time.perf_counter()
    started = client.start("chat", {"parts": 1, "pause_s": 0.2})
    follower = client.follow(started.run_id, partial=False)
    first: float | None = None
    try:
        for item in follower:
            first = elapsed_ms(t0) if first is None else first
            if isinstance(getattr(item, "event", None), ev.StepDecided):
                assert first is not None
                return first, elapsed_ms(t0)
    finally:
        follower.close()
    raise AssertionError("the run ended without a step")


def test_a_call_without_a_task_waits_up_to_its_bound_then_answers_with_the_task(
        server: Server, settings: Any, tmp_path: Path, worker: Any, client: Client,
        r: redis.Redis) -> None:
    """``DURABLE_MCP_WAIT_S=3``: a call whose run ends sooner answers with its result
    (progress on the way); one whose run cannot end yet (its step waits for a gate the test
    opens later) answers after the bound with the task to poll, not an error, and its
    ``tasks/result`` has the result once the gates are open."""
    worker()
    published(r, "chat", "gated_chat")
    with serving(server, tmp_path / "door", DURABLE_MCP_WAIT_S="3") as door:
        async def go() -> None:
            async with door.client() as c:
                progress = Progress()
                quick = await c.call_tool("chat", {"parts": 2, "pause_s": 0},
                                          progress_callback=progress)
                assert quick.structured_content == {"said": ["tok0", "tok1"]}
                assert progress.messages[0] == "step 1: chatter", progress.messages
                gate = tmp_path / "gate"
                t0 = time.perf_counter()
                slow = await c.call_tool("gated_chat", {"parts": 1, "first": 0,
                                                        "gate": str(gate)})
                waited = time.perf_counter() - t0
                assert waited >= 2.9, waited
                assert slow.is_error is False and isinstance(slow.structured_content, dict)
                task = slow.structured_content["task"]
                assert task["status"] == "working" and "tasks/get" in text_of(slow)
                Path(f"{gate}.1").touch()
                Path(f"{gate}.2").touch()
                out = await task_result(c, task["taskId"])
                assert out.structured_content == {"steps": 2}

        asyncio.run(go())


def test_a_wait_for_input_is_an_elicitation(door: McpDoor, worker: Any, client: Client,
                                            r: redis.Redis, forms: None) -> None:
    """A call without a task to an agent that waits for input: the client is asked (an
    elicitation of one text field), its answer is the run's response, the call returns the
    result. With a task: ``tasks/get`` says input_required; ``tasks/result`` asks with the
    agent's form, tied to the task, and returns the result. A client that declines is
    answered with the task, input_required."""
    worker()
    published(r, "quoter", "booker")
    asked: list[types.ElicitRequestFormParams] = []

    async def answer(context: ClientRequestContext,
                     params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        asked.append(params)
        if "seats" in params.requested_schema.get("properties", {}):
            return types.ElicitResult(action="accept", content={"seats": 2, "window": True})
        return types.ElicitResult(action="accept", content={"answer": "yes please"})

    async def decline(context: ClientRequestContext,
                      params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="decline")

    async def go() -> None:
        async with door.client(elicitation_callback=answer) as c:
            plain = await c.call_tool("quoter", {"text": "q"})
            assert plain.structured_content == {"answer": "yes please"}, plain
            assert asked[-1].message == "confirm the quote"
            assert set(asked[-1].requested_schema["properties"]) == {"answer"}
            run = plain.meta["io.modelcontextprotocol/related-task"]["taskId"]  # type: ignore[index]
            assert client.status(run).last_wait.by == "mcp:acme-bot elicitation"  # type: ignore[union-attr]

            created = await call_with_task(c, "booker", {"to": "Porto"})
            task_id = created.task.task_id
            await asyncio.to_thread(client.wait, task_id, 60)  # until it waits for input
            got = await get_task(c, task_id)
            assert got.status == "input_required" and got.status_message == \
                "How many seats to Porto?"
            out = await task_result(c, task_id)
            assert out.structured_content == {"to": "Porto", "seats": 2, "window": True}
            assert asked[-1].requested_schema == FORM
            # The task it belongs to; the SDK may add trace context (``traceparent``) beside
            # it when a tracer provider is set in the process.
            meta = dict(asked[-1].meta or {})
            meta.pop("traceparent", None)
            assert meta == {"io.modelcontextprotocol/related-task": {"taskId": task_id}}
        async with door.client(elicitation_callback=decline) as c:
            declined = await c.call_tool("quoter", {"text": "q"})
            assert isinstance(declined.structured_content, dict)
            assert declined.structured_content["task"]["status"] == "input_required"
            assert client.status(declined.structured_content["task"]["taskId"]).state == \
                "waiting_input"

    asyncio.run(go())


def test_tasks_cancel_is_the_durable_cancel(door: McpDoor, worker: Any, client: Client,
                                            r: redis.Redis) -> None:
    """``tasks/cancel`` records the cancel in the run's log, by the caller; the task is
    cancelled; a second cancel is refused (-32602); ``tasks/result`` says it was canceled."""
    worker()
    published(r, "quoter")

    async def go() -> None:
        async with door.client() as c:  # no elicitation: the run waits for input
            created = await call_with_task(c, "quoter", {"text": "x"})
            task_id = created.task.task_id
            await asyncio.to_thread(client.wait, task_id, 60)
            canceled = await cancel_task(c, task_id)
            assert canceled.status == "cancelled"
            with pytest.raises(MCPError, match="already in terminal status 'cancelled'") as exc:
                await cancel_task(c, task_id)
            assert exc.value.error.code == types.INVALID_PARAMS
            out = await task_result(c, task_id)
            assert out.is_error and "canceled" in text_of(out)
        state = client.status(task_id)
        assert state.state == "canceled" and state.cancel is not None
        assert state.cancel.by == "mcp:acme-bot"

    asyncio.run(go())


def test_a_caller_sees_its_tenants_tasks_only_and_a_key_starts_nothing_twice(
        door: McpDoor, worker: Any, client: Client, r: redis.Redis) -> None:
    """Another tenant's task id is an unknown task (-32602) to get, fetch or cancel, and is
    not listed; a call retried with the same idempotency key gets the run it started, the
    same key with other arguments is refused, starting nothing."""
    worker()
    published(r, "chat")
    key = {"durable-agents/idempotency-key": "order-42"}

    async def go() -> None:
        async with door.client("acme-bot") as acme, door.client("globex-bot") as globex:
            first = await call_with_task(acme, "chat", {"parts": 1, "pause_s": 0}, meta=key)
            again = await call_with_task(acme, "chat", {"parts": 1, "pause_s": 0}, meta=key)
            assert again.task.task_id == first.task.task_id
            with pytest.raises(MCPError, match="used already with other arguments"):
                await call_with_task(acme, "chat", {"parts": 2, "pause_s": 0}, meta=key)
            theirs = await call_with_task(globex, "chat", {"parts": 1, "pause_s": 0}, meta=key)
            assert theirs.task.task_id != first.task.task_id  # a key is per tenant
            for method in (get_task, task_result, cancel_task):
                with pytest.raises(MCPError, match="no task") as exc:
                    await method(globex, first.task.task_id)
                assert exc.value.error.code == types.INVALID_PARAMS
            assert [t.task_id for t in (await list_tasks(acme)).tasks] == [first.task.task_id]
            assert [t.task_id for t in (await list_tasks(globex)).tasks] == \
                [theirs.task.task_id]
        assert len(client.runs(agent="chat")) == 2

    asyncio.run(go())
