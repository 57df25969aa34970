"""Tool calls stream to followers as the model writes them (``durable.streams.partials``'
``{"tool_call": {"index", "id", "name", "args"}}``): from the built-in ``chat`` step,
pydantic-ai's model step and the OpenAI Agents SDK's.

Real worker processes; the models are the local OpenAI-compatible server of
``tests.servers.openai`` (it streams each tool call's arguments 8 characters at a time) and a
pydantic-ai ``FunctionModel`` that streams its call in three pieces. A follower subscribed
before the worker starts hears every piece; joined, they are the calls the log records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("agents")

from durable.client import Client
from durable.settings import Settings
from durable.streams.streaming import Partial
from tests.agents import openai_agents as oai
from tests.agents import tool_deltas
from tests.conftest import WorkerFactory
from tests.servers.integration_world import decided, set_env
from tests.servers.openai import ARGS_PIECE, OpenAIServer

AGENTS = "examples.agents,tests.agents.basic,tests.agents.openai_agents,tests.agents.tool_deltas"


@pytest.fixture(autouse=True)
def _env(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         openai_server: OpenAIServer) -> None:
    openai_server.reset()
    set_env(monkeypatch, tmp_path, AGENTS, TEST_OPENAI_URL=openai_server.url,
            DURABLE_MODEL_BASE_URL=openai_server.url, OPENAI_AGENTS_DISABLE_TRACING="1")


def _followed(client: Client, worker: WorkerFactory, run: str) -> list[Partial]:
    with client.follow(run) as follower:  # subscribed before any step runs
        worker()
        items = list(follower)
    return [i for i in items if isinstance(i, Partial)]


def _calls(partials: list[Partial], step: int) -> list[dict[str, Any]]:
    """The tool calls step ``step``'s deltas add up to, by index: id, name, arguments."""
    calls: dict[int, dict[str, Any]] = {}
    for p in partials:
        if p.step != step or not isinstance(p.data, dict) or "tool_call" not in p.data:
            continue
        delta = p.data["tool_call"]
        call = calls.setdefault(delta["index"], {"id": "", "name": "", "args": "", "pieces": 0})
        call["id"] = delta.get("id") or call["id"]
        call["name"] += delta.get("name") or ""
        call["args"] += delta["args"]
        call["pieces"] += 1 if delta["args"] else 0
    return [calls[i] for i in sorted(calls)]


def test_the_chat_step_streams_tool_call_names_and_argument_deltas(
    client: Client, worker: WorkerFactory
) -> None:
    run = client.start("chat_caller", {}, run_id="tdchat").run_id
    partials = _followed(client, worker, run)
    final = client.status(run)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result == [{"id": "call_1_book", "name": "book", "arguments": {"slot": 1}}]
    (call,) = _calls(partials, 1)
    assert (call["id"], call["name"], json.loads(call["args"])) == ("call_1_book", "book",
                                                                   {"slot": 1})
    assert call["pieces"] == -(-len('{"slot": 1}') // ARGS_PIECE)  # as the server sent them


def test_a_pydantic_ai_model_step_streams_its_tool_call_as_it_is_written(
    client: Client, worker: WorkerFactory
) -> None:
    run = client.start("pai_streamer", {"prompt": "book"}, run_id="tdpai").run_id
    partials = _followed(client, worker, run)
    final = client.status(run)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result == "booked"
    steps = decided(client, run)
    assert [s.tool for s in steps] == ["pai_streamer.model", "pai_streamer.tool.book",
                                       "pai_streamer.model"]
    (call,) = _calls(partials, 1)
    assert (call["id"], call["name"]) == ("call_book_7", "book")
    assert call["args"] == "".join(tool_deltas.ARGS_PIECES)
    assert call["pieces"] == len(tool_deltas.ARGS_PIECES)
    texts = [p.data for p in partials if p.step == 3 and isinstance(p.data, str)]
    assert "".join(texts) == "booked"


def test_an_openai_agents_model_step_streams_its_function_calls(
    client: Client, worker: WorkerFactory
) -> None:
    """The booker's second reply makes two calls at once: each its own index, name, id and
    argument deltas, in the SDK's streamed events."""
    run = client.start(oai.durable_booker.name, {"input": "book two"},
                       run_id="tdoai").run_id
    partials = _followed(client, worker, run)
    final = client.status(run)
    assert final.state == "completed", (final.state, final.reason, final.error)
    tools = [s.tool for s in decided(client, run)]
    assert tools[:2] == ["oai_booker.model", "oai_booker.handoff"]
    (handoff,) = _calls(partials, 1)
    assert (handoff["id"], handoff["name"], handoff["args"]) == (
        "call_0_transfer_to_booker", "transfer_to_booker", "{}")
    two = _calls(partials, 5)
    assert [(c["id"], c["name"], json.loads(c["args"])) for c in two] == [
        ("call_2_book", "book", {"slot": 2}), ("call_3_note", "note", {"text": "two"})]
    assert all(c["pieces"] >= 2 for c in two)  # streamed in pieces, not whole
