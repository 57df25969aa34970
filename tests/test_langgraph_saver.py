"""``LogSaver``, LangGraph's checkpointer kept in the run's log: LangGraph's own conformance
suite for savers (``langgraph-checkpoint-conformance``) passes against it in a durable run on
a real worker, and against a saver answering only from what its records say (read back from
their JSON); a conversation's checkpoints record what changed, not the whole conversation
each time; a pickle is never written nor read back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langgraph.checkpoint.conformance")

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import START, MessagesState, StateGraph

from durable.audit.replay import import_log
from durable.client import Client
from durable.integrations.langgraph import LogSaver
from durable.integrations.langgraph.records import dump, load
from durable.integrations.langgraph.saver import Entries
from durable.settings import Settings
from tests.agents import langgraph_saver  # noqa: F401  (registers the agent here too)
from tests.conftest import WorkerFactory
from tests.servers.integration_world import set_env


def test_a_run_the_previous_integration_left_waiting_is_quarantined_with_its_reason(
    settings: Settings, client: Client, worker: WorkerFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run the previous release left in flight (nodes as steps, no checkpoint in its
    log: ``tests/fixtures/langgraph/previous_asker.jsonl``, its interrupt waiting for an
    answer) cannot be resumed from LangGraph's checkpoints: answered, it waits for an
    operator, its log intact and the reason named, instead of running its graph again from
    the start (its booking applied twice)."""
    from tests.agents import langgraph_graphs  # noqa: F401  (the run's agent, here too)

    set_env(monkeypatch, tmp_path, "tests.agents.langgraph_graphs")
    fixture = Path(__file__).parent / "fixtures" / "langgraph" / "previous_asker.jsonl"
    events = [msgspec.json.decode(line) for line in fixture.read_bytes().splitlines()]
    import_log(client.log, "lg-previous", events)
    assert client.status("lg-previous").state == "waiting_input"
    client.respond("lg-previous", "yes")
    worker()
    final = client.wait("lg-previous", 30)
    assert final.state == "quarantined", (final.state, final.reason)
    assert "tools no longer available on resume: lg_asker.node.work" in (final.reason or "")
    assert [s for s in final.actions.values() if s.step > 2] == []  # nothing taken again


def test_the_saver_passes_langgraphs_conformance_suite_in_a_durable_run(
    settings: Settings, client: Client, worker: WorkerFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The suite's every put, writes and delete is a record of the run's log (a real
    worker, a real Redis); a saver loaded from those records alone answers as the savers
    that wrote them."""
    set_env(monkeypatch, tmp_path, "tests.agents.langgraph_saver")
    run = client.start("lg_saver_conformance", {}, run_id="lgsc").run_id
    worker(burst=True).wait(120)
    final = client.status(run)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["passed"], final.result["report"]
    assert final.result["threads"] > 30 and final.result["differ"] == []
    records = [s for s in final.actions.values() if s.tool == "lg_saver_owner.checkpoint"]
    assert records and all(s.status == "succeeded" for s in records)


class ReadBack(LogSaver):
    """A saver whose every read answers from a fresh saver loaded from its records, each
    through its JSON (as the log holds it)."""

    def _fresh(self) -> LogSaver:
        assert isinstance(self.journal, Entries)
        fresh = LogSaver(Entries())
        for entry in self.journal.entries:
            fresh.load(msgspec.json.decode(msgspec.json.encode(entry)))
        return fresh

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._fresh().get_tuple(config)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None,
             limit: int | None = None) -> Iterator[CheckpointTuple]:
        return self._fresh().list(config, filter=filter, before=before, limit=limit)


def test_a_saver_read_back_from_its_records_passes_the_suite() -> None:
    @checkpointer_test(name="LogSaver read back")
    async def read_back() -> AsyncIterator[LogSaver]:
        yield ReadBack(Entries())

    report = asyncio.run(validate(read_back))
    assert report.passed_all_base(), report.to_dict()


def _conversation(saver: Any, turns: int) -> None:
    """``turns`` turns of a conversation (a human message and a reply each) in one thread,
    each turn an invocation of a one-node graph."""

    def reply(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(f"reply {len(state['messages'])} " + "x" * 200)]}

    graph = StateGraph(MessagesState).add_node("reply", reply).add_edge(START, "reply") \
        .compile(checkpointer=saver)
    config: RunnableConfig = {"configurable": {"thread_id": "talk"}}
    for n in range(turns):
        graph.invoke({"messages": [HumanMessage(f"turn {n} " + "y" * 200)]}, config)


def test_a_conversation_records_what_changed_not_the_whole_conversation() -> None:
    """100 turns: each turn's entries hold the turn's two messages (about the same bytes at
    the 100th turn as at the first), where LangGraph's in-memory saver stores the whole
    conversation at every checkpoint; read back, the last checkpoint holds all 200."""
    saver = LogSaver(Entries())
    _conversation(saver, 100)
    assert isinstance(saver.journal, Entries)
    entries = saver.journal.entries
    per_turn = len(entries) // 100
    sizes = [sum(len(msgspec.json.encode(e)) for e in entries[i:i + per_turn])
             for i in range(0, len(entries), per_turn)]
    early, late = sum(sizes[1:11]) / 10, sum(sizes[-10:]) / 10
    assert late < 1.3 * early, (early, late)
    memory = InMemorySaver()
    _conversation(memory, 100)
    stored = sum(len(b[1]) for b in memory.blobs.values())
    assert stored > 20 * saver.value_bytes, (stored, saver.value_bytes)
    back = LogSaver(Entries())
    for entry in entries:
        back.load(msgspec.json.decode(msgspec.json.encode(entry)))
    latest = back.get_tuple({"configurable": {"thread_id": "talk"}})
    assert latest is not None
    messages = latest.checkpoint["channel_values"]["messages"]
    assert len(messages) == 200 and messages[-1].content.startswith("reply 199 ")


class Opaque:
    """Only pickle can carry it."""

    __slots__ = ("lock",)


def test_a_pickle_is_never_written_nor_read_back() -> None:
    pickling = JsonPlusSerializer(pickle_fallback=True)
    with pytest.raises(TypeError, match="never holds a pickle"):
        dump(pickling, Opaque())
    with pytest.raises(ValueError, match="pickled value"):
        load(pickling, ("pickle", b"\x80\x04N."))
