"""The built-in model step (``durable.models``), the world's scripted model and the
``assistant`` agent, against real processes: a world process in its non-deduplicating mode
(its model counts every request per ``Idempotency-Key``), worker processes SIGKILLed for
real, the reconciler.

A recorded model call sent again, or an effect applied twice, would show in the world's
counts.
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import httpx
import pytest

from durable.agents import ToolContext, resolve_awaitable
from durable.agents.cancel_token import CancelToken
from durable.audit.verify import verify
from durable.client import Client
from durable.log import events as ev
from durable.models import Chat, ChatReply, ModelError, ModelUnavailable, completion_result
from durable.testing import Server
from examples.agents.assistant import TOOLS
from examples.scenarios import Stack, run_one
from examples.world import WorldProcess
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.runs import events_of

TASK = {"task": "Tell bob@example.com that the invoices are paid, and record it."}


def _ctx(key: str, timeout_s: float = 5.0, emitted: list[Any] | None = None) -> ToolContext:
    return ToolContext(run_id=key.split(":")[0], step=1, key=key,
                       deadline_ms=int(time.time() * 1000) + int(timeout_s * 1000),
                       token=CancelToken(),
                       publish=emitted.append if emitted is not None else lambda data: None)


def _chat(args: dict[str, Any], ctx: ToolContext) -> Any:
    return resolve_awaitable(Chat().run(args, ctx), ctx.token)


_n = iter(range(1_000_000))


def _key() -> str:
    return f"m{time.time_ns() % 10**9}-{next(_n)}:1"


# The model step against the world's model ------------------------------------------------


def test_the_chat_step_sends_key_and_deadline_and_reads_tool_calls(world: WorldProcess) -> None:
    key = _key()
    messages = [{"role": "user", "content": "Tell bob@example.com hi"}]
    result = _chat({"messages": messages, "tools": TOOLS, "temperature": 0}, _ctx(key))
    assert result["tool_calls"] == [{"id": "call_1_notify", "name": "notify", "arguments": {
        "recipient": "bob@example.com", "message": "Tell bob@example.com hi"}}]
    assert result["finish_reason"] == "tool_calls"
    assert result["message"]["role"] == "assistant"
    assert result["message"]["tool_calls"][0]["function"]["name"] == "notify"
    usage = result["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert result["model"] == "scripted"  # DURABLE_MODEL_NAME went out as the model field
    assert world.client.requests(key) == [
        {"endpoint": "model", "key": key, "received_ms": pytest.approx(time.time() * 1000,
                                                                      abs=10_000),
         "disposition": "answered", "fault": ""}]
    late = _ctx(_key(), timeout_s=-1.0)  # the deadline went downstream: refused past it
    with pytest.raises(ModelUnavailable, match="408"):
        _chat({"messages": messages}, late)


def test_a_streamed_reply_emits_its_tokens_and_records_the_same_result(
        world: WorldProcess) -> None:
    conversation = [{"role": "user", "content": "Tell bob@example.com hi"},
                    {"role": "assistant", "content": None},
                    {"role": "tool", "tool_call_id": "c1",
                     "content": json.dumps({"notification_id": 7})},
                    {"role": "tool", "tool_call_id": "c2", "content": json.dumps(
                        {"report_id": 3})}]
    for messages in (conversation[:1], conversation):  # a tool call, then a text answer
        emitted: list[Any] = []
        plain = _chat({"messages": messages, "tools": TOOLS}, _ctx(_key()))
        streamed = _chat({"messages": messages, "tools": TOOLS, "stream": True},
                         _ctx(_key(), emitted=emitted))
        for field in ("message", "tool_calls", "finish_reason", "usage"):
            assert streamed[field] == plain[field], field
        text = [piece for piece in emitted if isinstance(piece, str)]
        assert "".join(text) == (plain["message"]["content"] or "")
        # The rest are the tool calls' deltas (``durable.streams.partials.tool_call_delta``).
        deltas = [piece["tool_call"] for piece in emitted if not isinstance(piece, str)]
        assert {d["name"] for d in deltas if d.get("name")} == \
            {c["name"] for c in plain["tool_calls"] or []}
    assert len(emitted) > 3 and "".join(emitted).startswith("Done: notified")


def test_a_lost_or_refused_reply_is_an_error_the_step_retries(world: WorldProcess) -> None:
    messages = [{"role": "user", "content": "hi"}]
    world.client.set_faults(target="model", fail_next=1, drop_next=2)
    with pytest.raises(ModelUnavailable, match="503"):
        _chat({"messages": messages}, _ctx(_key()))
    with pytest.raises(ModelUnavailable):
        _chat({"messages": messages}, _ctx(_key()))
    with pytest.raises(ModelUnavailable, match="DONE"):  # a stream cut halfway
        _chat({"messages": messages, "stream": True}, _ctx(_key()))
    with pytest.raises(ModelError, match="non-empty"):
        _chat({"messages": []}, _ctx(_key()))
    resp = httpx.post(f"{world.url}/v1/chat/completions", json={"messages": "nope"})
    assert resp.status_code == 400


def test_the_world_model_answers_from_the_conversation_alone(world: WorldProcess) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "tools": TOOLS}
    first = httpx.post(f"{world.url}/v1/chat/completions", json=body).json()
    again = httpx.post(f"{world.url}/v1/chat/completions", json=body).json()
    assert first == again and first["model"] == "m"
    args = json.loads(first["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
    assert args["recipient"] == "ops@example.com"  # the task names nobody: the default
    untooled = httpx.post(f"{world.url}/v1/chat/completions",
                          json={"messages": body["messages"]}).json()
    assert untooled["choices"][0]["finish_reason"] == "stop"
    assert httpx.get(f"{world.url}/v1/models").json()["data"][0]["id"] == "scripted"


def test_unreadable_tool_arguments_are_reported_not_guessed() -> None:
    result = completion_result({"choices": [{"message": {"content": None, "tool_calls": [
        {"id": "c", "function": {"name": "notify", "arguments": "{not json"}}]}}]})
    reply = ChatReply.from_result(result)
    assert reply.tool_calls[0].arguments == {}
    assert "not JSON" in (reply.tool_calls[0].error or "")
    assert reply.usage == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    with pytest.raises(ModelError):
        completion_result({"error": "nope"})


# The assistant, driven by workers -----------------------------------------------------------


def test_the_assistant_completes_recording_each_model_reply(
        client: Client, worker: WorkerFactory, world: WorldProcess) -> None:
    run = client.start("assistant", TASK, run_id="assist").run_id
    worker(burst=True).wait(60)
    final = client.status(run)
    assert final.state == "completed", (final.state, final.error, final.reason)
    assert final.result["tools_called"] == ["notify", "write"]
    assert final.result["answer"].startswith("Done: notified bob@example.com")
    events = events_of(client, run)
    decided = [e for e in events if isinstance(e, ev.StepDecided)]
    assert [e.tool for e in decided] == ["chat", "notify", "chat", "write", "chat"]
    assert all(set(e.args) == {"_digest", "_bytes"} for e in decided if e.tool == "chat")
    results = {e.step: e.result for e in events if isinstance(e, ev.ActionSucceeded)}
    first = results[1]
    assert first["tool_calls"][0]["name"] == "notify"
    assert first["tool_calls"][0]["arguments"]["recipient"] == "bob@example.com"
    assert first["finish_reason"] == "tool_calls" and first["usage"]["total_tokens"] > 0
    assert results[5]["tool_calls"] == [] and results[5]["finish_reason"] == "stop"
    assert final.model_calls == 3
    assert final.tokens == sum(results[s]["usage"]["total_tokens"] for s in (1, 3, 5))
    apps = world.applications(run)
    assert apps.model == {f"{run}:{s}": 1 for s in (1, 3, 5)}
    assert (apps.api, apps.db) == ({f"{run}:2": 1}, {f"{run}:4": 1})
    assert verify(client.log, run).ok


def test_a_streaming_assistant_completes_the_same_way(
        client: Client, worker: WorkerFactory, world: WorldProcess) -> None:
    run = client.start("assistant", TASK, run_id="assist-stream").run_id
    worker(burst=True, DURABLE_MODEL_STREAM="true").wait(60)
    final = client.status(run)
    assert final.state == "completed" and final.model_calls == 3 and final.tokens > 0
    assert world.applications(run).model == {f"{run}:{s}": 1 for s in (1, 3, 5)}


def test_model_faults_are_asked_again_under_the_same_key(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
        world: WorldProcess) -> None:
    """A 503 and a dropped reply are each recorded and sent again after a backoff; a reply
    later than the step's timeout is recorded as timed out and, the call being
    effect-free, sent again at once. Every request sent is a model call."""
    world.client.set_faults(target="model", fail_next=1, drop_next=1)
    run = client.start("assistant", TASK, run_id="assist-faults").run_id
    first = worker()
    reconciler()
    final = client.wait(run, timeout=60, waiting=False)
    assert final.state == "completed"
    assert world.applications(run).model == {f"{run}:1": 3, f"{run}:3": 1, f"{run}:5": 1}
    assert final.model_calls == 5
    first.stop()
    assert [r["disposition"] for r in world.client.requests(f"{run}:1")] == [
        "failed_503", "answered+dropped", "answered"]

    # The timeout leaves the prompt replies (milliseconds) room on a loaded machine.
    world.client.set_faults(target="model", slow_next=1, slow_s=8, slow_phase="reply")
    late = client.start("assistant", TASK, run_id="assist-late").run_id
    worker(DURABLE_MODEL_TIMEOUT_S="4")
    final = client.wait(late, timeout=90, waiting=False)
    assert final.state == "completed" and final.model_calls == 4
    events = events_of(client, late)
    assert [e.step for e in events if isinstance(e, ev.ActionTimedOut)] == [1]
    assert world.applications(late).model == {f"{late}:1": 2, f"{late}:3": 1, f"{late}:5": 1}
    assert verify(client.log, late).ok


def test_the_model_call_budget_ends_the_conversation(
        client: Client, worker: WorkerFactory, world: WorldProcess) -> None:
    run = client.start("assistant", TASK, run_id="assist-budget",
                       budgets={"model_calls": 2}).run_id
    worker(burst=True).wait(60)
    final = client.status(run)
    assert (final.state, final.reason) == ("failed", "budget_exhausted")
    assert final.model_calls == 2 and len(world.applications(run).model) == 2


@pytest.mark.parametrize("step", [3, 4])
def test_a_killed_assistant_repeats_no_recorded_model_call_and_no_effect(
        step: int, client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
        world: WorldProcess) -> None:
    """SIGKILL after step ``step`` returned, its outcome not recorded: 3, the model's reply
    asking for ``write`` (effect-free: sent again at once); 4, the row written (looked up by
    key after its deadline, never written again). Re-execution returns steps 1 to ``step -
    1`` from the log: their model calls and the notification are not sent again."""
    run = client.start("assistant", TASK, run_id=f"assist-kill-{step}").run_id
    doomed = worker(kill_at=f"after_effect:{step}")
    assert doomed.wait(30) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=30)
    assert final.state == "completed", (final.state, final.error, final.reason)
    apps = world.applications(run)
    in_flight = {f"{run}:3": 2} if step == 3 else {}
    assert apps.model == {f"{run}:1": 1, f"{run}:3": 1, f"{run}:5": 1, **in_flight}
    assert (apps.api, apps.db, apps.duplicates) == ({f"{run}:2": 1}, {f"{run}:4": 1}, {})
    resolved = [e.resolution for e in events_of(client, run) if isinstance(e, ev.ActionReconciled)]
    assert resolved == (["not_applied"] if step == 3 else ["applied"])
    assert verify(client.log, run).ok


# The demo's scenario --------------------------------------------------------------------------


def test_the_assistant_scenario(server: Server, tmp_path_factory: pytest.TempPathFactory) -> None:
    """``python -m examples demo --only assistant``: killed mid-conversation; every
    recorded model call requested once, the one in flight twice; no effect twice;
    verify."""
    with Stack.up(server.url, workdir=tmp_path_factory.mktemp("assistant")) as stack:
        out = run_one(stack, "assistant")
    out.assert_ok()
    assert out.figures["model calls"] == 4 and out.figures["model requests"] == 4
