"""The LangGraph integration: compiled graphs, unchanged, run as durable runs with the run's
log as LangGraph's checkpointer; each chat model request and tool call is a step of the log,
named by the LangGraph task that makes it (``durable.integrations.langgraph``).

Real worker processes, SIGKILLed for real; the chat model is langchain-openai's
``ChatOpenAI`` against a local OpenAI-compatible HTTP server started by the test, which
records every request with its ``Idempotency-Key``; the tools write their effects into a
SQLite database that never deduplicates (``TEST_DB_DEDUPE=0``): a model request sent again
or an effect applied twice would show, and so would a node's or a task's code run again
(each counts its executions there).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from durable.agents import is_placeholder
from durable.audit.verify import verify
from durable.client import Client
from durable.log import events as ev
from durable.settings import Settings
from durable.streams.streaming import Partial
from tests.agents import langgraph_graphs  # noqa: F401  (registers the graphs here too)
from tests.conftest import ApproverFactory, ReconcilerFactory, WorkerFactory, run_durable
from tests.servers.effects import applications
from tests.servers.integration_world import decided, set_env
from tests.servers.openai import OpenAIServer, resent_after_recorded


@pytest.fixture(autouse=True)
def langgraph_env(settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                  openai_server: OpenAIServer) -> None:
    openai_server.reset()
    set_env(monkeypatch, tmp_path, "tests.agents.langgraph_graphs",
            TEST_OPENAI_URL=openai_server.url)


def _effects(tmp_path: Path, run: str) -> dict[str, int]:
    """Applications per key of the run's effects (its bookings, its notes)."""
    return {k: n for k, n in applications(str(tmp_path / "world.sqlite")).items()
            if k.startswith(f"{run}:")}


def _ran(tmp_path: Path, run: str) -> dict[str, int]:
    """How often each node's or task's code ran in the run."""
    return {k.split(":")[1]: n for k, n in applications(str(tmp_path / "world.sqlite")).items()
            if k.startswith("ran:") and k.endswith(f":{run}")}


def _calls(client: Client, run: str) -> list[ev.StepDecided]:
    """The run's model requests and tool calls (its checkpoint records left out)."""
    return [s for s in decided(client, run) if not s.tool.endswith(".checkpoint")]


def _keys(client: Client, run: str, tool: str) -> list[str]:
    return [s.key for s in decided(client, run) if s.tool == tool]


BOOKER_CALLS = ["lg_booker.model", "lg_booker.tool.book", "lg_booker.model",
                "lg_booker.tool.book", "lg_booker.tool.note", "lg_booker.model"]


def test_a_graph_runs_as_a_durable_run(
    client: Client, worker: WorkerFactory, tmp_path: Path, openai_server: OpenAIServer
) -> None:
    run = client.start("lg_booker", {"input": {"messages": [
        {"role": "user", "content": "book slots 1 and 2"}]}}, run_id="lgb").run_id
    worker(burst=True).wait(60)
    state = client.status(run)
    assert state.state == "completed", (state.state, state.reason, state.error)
    assert state.result["messages"][-1]["content"] == "booked: slot 1, slot 2"
    steps = decided(client, run)
    assert steps[0].tool == "lg_booker.checkpoint"  # the input's checkpoint, first
    calls = _calls(client, run)
    assert [s.tool for s in calls] == BOOKER_CALLS
    models = [s for s in calls if s.tool == "lg_booker.model"]
    assert all(s.model and is_placeholder(s.args) for s in models)  # digest, not the chat
    first = calls[1].args
    assert (first["input"], first["call_id"], first["attempt"], first["n"]) == (
        {"slot": 1}, "call_1_book", 1, 0)
    assert calls[3].group == calls[4].group == calls[3].step  # one reply's calls, at once
    assert calls[3].args["task"] == calls[4].args["task"] != first["task"]  # by their task
    assert state.model_calls == 3 and state.tokens == 3 * 10  # usage counted: budgets work
    assert openai_server.counts(run) == {f"{run}:{s.step}": 1 for s in models}
    assert all(r["stream"] for r in openai_server.requests)
    books = _keys(client, run, "lg_booker.tool.book")
    assert _effects(tmp_path, run) == {k: 1 for k in books}
    assert state.actions[calls[4].step].result["content"] == f"noted two ({calls[4].key})"
    assert verify(client.log, run).ok


def _kill_at(window: str, tool: str, nth: int) -> list[str]:
    """The hook that SIGKILLs a worker at ``window`` of the ``nth`` step of ``tool``."""
    return [f"tests.servers.kills:KillAtCall={window}:{tool}:{nth}"]


@pytest.mark.parametrize(("window", "tool", "nth"), [
    *(("after_effect", "model", n) for n in (1, 2, 3)),  # a model reply, not recorded
    ("after_intent", "tool.book", 1),    # the first booking's intent recorded, nothing sent
    ("after_effect", "tool.book", 1),    # the first booking applied, not recorded
    ("after_outcome", "tool.book", 1),   # the first booking recorded
    ("after_effect", "tool.book", 2),    # the second booking (beside the note) applied
    ("after_outcome", "tool.book", 2),   # one of two parallel tool calls recorded
    ("after_effect", "tool.note", 1),    # the note written, not recorded
    # Between supersteps: a checkpoint record (a node's writes, the checkpoint after its
    # superstep) taken but not recorded, or recorded.
    *(("after_effect", "checkpoint", n) for n in (1, 2, 3, 5)),
    ("after_outcome", "checkpoint", 3),
])
def test_a_killed_graph_resumes_without_resending_requests_or_repeating_effects(
    window: str, tool: str, nth: int, client: Client, worker: WorkerFactory,
    reconciler: ReconcilerFactory, tmp_path: Path, openai_server: OpenAIServer,
) -> None:
    """SIGKILL at ``window`` of the ``nth`` step of ``tool``; another worker loads
    LangGraph's checkpoints from the log and resumes the graph from the latest: every
    recorded model reply and tool result comes back from the log, so no recorded request is
    sent again and no effect is applied twice."""
    run = client.start("lg_booker", {"input": {"messages": [
        {"role": "user", "content": "book"}]}},
        run_id=f"lgk-{tool}-{nth}-{window[6:9]}").run_id
    doomed = worker(hooks=_kill_at(window, f"lg_booker.{tool}", nth))
    assert doomed.wait(60) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["messages"][-1]["content"] == "booked: slot 1, slot 2"
    assert [s.tool for s in _calls(client, run)] == BOOKER_CALLS
    # Each request went out once, but the one whose reply arrived and was not recorded
    # (an effect-free step is sent again after a crash); no effect was applied twice.
    models = [s.step for s in _calls(client, run) if s.tool == "lg_booker.model"]
    resent = models[nth - 1] if (window, tool) == ("after_effect", "model") else None
    assert openai_server.counts(f"{run}:") == {
        f"{run}:{n}": 2 if n == resent else 1 for n in models}
    assert resent_after_recorded(client, run, openai_server) == []
    assert _effects(tmp_path, run) == {k: 1 for k in _keys(client, run, "lg_booker.tool.book")}
    assert verify(client.log, run).ok


BUSY_CALLS = ["lg_busy.model", "lg_busy.tool.book", "lg_busy.tool.book"]


@pytest.mark.parametrize(("window", "tool", "nth", "runs"), [
    ("after_effect", "tool.book", 2, 2),   # mid-node: the second booking applied, not recorded
    ("after_outcome", "tool.book", 1, 2),  # mid-node: the first booking recorded, the second not
    ("after_outcome", "checkpoint", 2, 1),  # the node's writes recorded, the next not run
])
def test_a_sigkill_in_or_after_a_node_repeats_no_request_and_no_effect(
    window: str, tool: str, nth: int, runs: int, client: Client, worker: WorkerFactory,
    reconciler: ReconcilerFactory, tmp_path: Path, openai_server: OpenAIServer,
) -> None:
    """SIGKILL inside one node, after its model reply and its first booking were recorded
    (``window`` of step ``step``), or once its writes were: a node that did not finish runs
    again on another worker (LangGraph's recovery), its recorded request is not sent again,
    its recorded booking not applied again, and the booking the kill interrupted is found
    applied by its lookup; a node whose writes were recorded does not run again."""
    run = client.start("lg_busy", {"input": {}}, run_id=f"lgm-{tool}-{nth}-{window[6:9]}").run_id
    doomed = worker(hooks=_kill_at(window, f"lg_busy.{tool}", nth))
    assert doomed.wait(60) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["booked"] == ["slot 1", "slot 2", "wrapped"]
    assert [s.tool for s in _calls(client, run)] == BUSY_CALLS
    assert openai_server.counts(f"{run}:") == {f"{run}:2": 1}  # sent once: not re-sent
    assert _effects(tmp_path, run) == {k: 1 for k in _keys(client, run, "lg_busy.tool.book")}
    assert _ran(tmp_path, run) == {"work": runs}
    assert verify(client.log, run).ok


def test_an_interrupt_is_a_durable_wait_and_its_answer_repeats_nothing(
    client: Client, worker: WorkerFactory, tmp_path: Path, openai_server: OpenAIServer
) -> None:
    """The node's interrupt() waits (``waiting_input``, no worker held) with the
    interrupt's id and value; answered with ``durable respond``, LangGraph resumes the node
    from its start, but its model request and its first booking come back recorded: each
    went out once."""
    run = client.start("lg_asker", {"input": {}}, run_id="lga").run_id
    worker()
    state = client.wait(run, 60)
    assert state.state == "waiting_input", (state.state, state.reason, state.error)
    waits = [e.event for e in client.events(run) if isinstance(e.event, ev.WaitEntered)]
    (asked,) = waits[-1].data["interrupts"]
    assert asked["value"] == {"question": "book slot 2 too?", "booked": "slot 1"}
    assert len(asked["id"]) == 32 and waits[-1].reason == "interrupt in work"
    assert len(_effects(tmp_path, run)) == 1
    answered = run_durable("respond", run, "--input", '"yes"', env=dict(os.environ))
    assert answered.returncode == 0, answered.stderr
    final = client.wait(run, 60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["booked"] == ["slot 1", "slot 2", "wrapped"]
    assert final.result["answer"] == "yes"
    assert openai_server.counts(f"{run}:") == {f"{run}:2": 1}
    assert [s.tool for s in _calls(client, run)] == [
        "lg_asker.model", "lg_asker.tool.book", "lg_asker.tool.book"]
    assert _effects(tmp_path, run) == {k: 1 for k in _keys(client, run, "lg_asker.tool.book")}
    assert len(_keys(client, run, "lg_asker.tool.book")) == 2
    assert verify(client.log, run).ok


#: How often the planner's code runs when nothing fails: the entrypoint twice (once more
#: after its interrupt's answer, as LangGraph resumes it), each task once per call.
PLANNED = {"plan": 2, "tell_story": 1, "book_slot": 2, "stamp": 1}


@pytest.mark.parametrize(("window", "tool", "nth", "again", "maybe"), [
    # Before the interrupt: in the task tell_story (its model reply), in the task book_slot
    # (in its booking, after it).
    ("after_effect", "model", 1, {"plan", "tell_story"}, set()),
    ("after_effect", "tool.book", 1, {"plan", "book_slot"}, set()),
    ("after_outcome", "tool.book", 1, {"plan"}, {"book_slot", "stamp"}),
    ("wait", "", 0, set(), set()),  # the worker dies while the run waits for its answer
    # After the answer: every earlier task finished and recorded (the stamp among them);
    # in the second booking's task, before, in and after its booking.
    ("after_intent", "tool.book", 2, {"plan", "book_slot"}, set()),
    ("after_effect", "tool.book", 2, {"plan", "book_slot"}, set()),
    ("after_outcome", "tool.book", 2, {"plan"}, {"book_slot"}),
])
def test_a_sigkill_at_each_point_of_the_functional_api_applies_no_effect_twice(
    window: str, tool: str, nth: int, again: set[str], maybe: set[str], client: Client,
    worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path,
    openai_server: OpenAIServer,
) -> None:
    """An ``@entrypoint`` whose ``@task``s ask the model, book a slot (a tool step) and
    stamp it (the task's own code is its effect), then interrupt(); SIGKILLed at
    ``window`` of the ``nth`` step of ``tool`` (or while the run waits for its answer),
    another worker resumes it from LangGraph's checkpoints in the log. A task whose writes
    were recorded never runs again (the stamp is applied once); the tasks the kill
    interrupted (``again``) run again once, as under LangGraph's own checkpointer; a task
    whose code ran past the kill's step before the process died, its writes not recorded
    (``maybe``: how far it got is the race of the kill), runs again at most once; no
    booking is applied twice."""
    run = client.start("lg_planner", {"input": {}},
                       run_id=f"lgp-{tool}-{nth}-{window[6:9]}").run_id
    doomed = worker(hooks=_kill_at(window, f"lg_planner.{tool}", nth) if nth else [])
    if nth == 1:
        assert doomed.wait(60) == -signal.SIGKILL
        worker()
        reconciler()
    state = client.wait(run, 60)
    assert state.state == "waiting_input", (state.state, state.reason, state.error)
    if window == "wait":
        doomed.kill()
        worker()
    client.respond(run, "yes")
    if nth == 2:
        assert doomed.wait(60) == -signal.SIGKILL
        worker()
        reconciler()
    final = client.wait(run, 60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result == {"story": " ".join(f"word{i}" for i in range(40)),
                            "booked": ["slot 1", "slot 2"], "answer": "yes",
                            "stamped": "stamped slot 1"}
    ran = _ran(tmp_path, run)
    for what, n in PLANNED.items():
        least = n + (what in again)
        assert least <= ran[what] <= least + (what in maybe), (what, ran)
    books = _keys(client, run, "lg_planner.tool.book")
    assert len(books) == 2 and _effects(tmp_path, run) == {k: 1 for k in books}
    (model,) = _keys(client, run, "lg_planner.model")
    assert openai_server.counts(f"{run}:") == {model: 2 if tool == "model" else 1}
    assert verify(client.log, run).ok


class Following:
    """What a follower of ``run`` is given while the block runs, read on a thread: text
    deltas, node updates, custom chunks; ``reading`` is set once it read the log's first
    entry."""

    def __init__(self, client: Client, run: str) -> None:
        self.client, self.run = client, run
        self.deltas: list[str] = []
        self.nodes: list[str] = []
        self.custom: list[Any] = []
        self.reading, self.streaming = threading.Event(), threading.Event()

    def __enter__(self) -> Following:
        self._ctx = self.client.follow(self.run)
        self._thread = threading.Thread(target=self._read, args=(self._ctx.__enter__(),),
                                        daemon=True)
        self._thread.start()
        assert self.reading.wait(10)  # the log (run_started) comes before any token
        return self

    def _read(self, follower: Any) -> None:
        for item in follower:
            self.reading.set()
            data = item.data if isinstance(item, Partial) else None
            if isinstance(data, dict) and "delta" in data:
                self.deltas.append(data["delta"])
                self.streaming.set()
            elif isinstance(data, dict) and "node" in data:
                self.nodes.append(data["node"])
            elif isinstance(data, dict) and "custom" in data:
                self.custom.append(data["custom"])

    def __exit__(self, *exc: object) -> None:
        self._thread.join(60)
        self._ctx.__exit__(None, None, None)


STORY = " ".join(f"word{i}" for i in range(40))


def test_a_follower_receives_tokens_node_updates_and_custom_chunks(
    client: Client, worker: WorkerFactory, openai_server: OpenAIServer
) -> None:
    """The model's tokens (from its step), the node's update and its
    ``get_stream_writer()`` chunk (from the graph's function) reach the run's followers;
    none of them is in the log."""
    openai_server.delta_delay_s = 0.02
    run = client.start("lg_storyteller", {"input": {"messages": [
        {"role": "user", "content": "a story"}]}}, run_id="lgs").run_id
    with Following(client, run) as seen:
        worker()
    final = client.status(run)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["messages"][-1]["content"] == STORY
    assert "".join(seen.deltas) == STORY and seen.nodes == ["tell"]
    assert seen.custom == [{"telling": "a story"}]


def test_a_cancel_reaches_the_running_node(
    client: Client, worker: WorkerFactory, openai_server: OpenAIServer
) -> None:
    """The node's model request streams a token a second; once the follower got the first,
    a cancel cancels the request on the steps' event loop: the run ends canceled with most
    of the story never sent, and the node never finished."""
    openai_server.delta_delay_s = 1.0
    run = client.start("lg_storyteller", {"input": {"messages": [
        {"role": "user", "content": "a story"}]}}, run_id="lgc").run_id
    with Following(client, run) as seen:
        worker()
        assert seen.streaming.wait(30)
        client.cancel(run, "user changed their mind")
        final = client.wait(run, timeout=30)
    assert final.state == "canceled"
    assert len(seen.deltas) < 20 and seen.nodes == []
    tags = [e.event.__struct_config__.tag for e in client.events(run) if e.event is not None]
    assert "call_canceled" in tags and tags[-1] == "canceled"
    assert [s.tool for s in _calls(client, run)] == ["lg_storyteller.model"]


def _approval(client: Client, run: str) -> str:
    state = client.wait(run, 60)
    assert state.state == "waiting_approval", (state.state, state.reason, state.error)
    (request,) = [a.request for a in state.approvals.values() if a.decision is None]
    assert state.approvals[request].role == "finance"
    return request


@pytest.mark.parametrize(("decision", "answer"), [
    ("approve", "refunded: refund A1 500"),
    ("reject", "not refunded: Tool call was not approved: rejected by alice"),
])
def test_a_tool_that_needs_approval_waits_for_a_signed_decision(
    decision: str, answer: str, client: Client, worker: WorkerFactory, tmp_path: Path,
    approver: ApproverFactory, openai_server: OpenAIServer,
) -> None:
    """The refund waits in ``waiting_approval`` (the model node is synchronous: its request
    is a step too); approved, it is applied once; rejected, the model is told."""
    alice = approver("alice", "finance")
    run = client.start("lg_refunder", {"input": {"messages": [
        {"role": "user", "content": "refund A1"}]}}, run_id=f"lgr{decision[0]}").run_id
    worker()
    request = _approval(client, run)
    assert _effects(tmp_path, run) == {}  # nothing before the decision
    client.sign_and_approve(run, request, decision, "alice", alice, note="not this one")
    final = client.wait(run, 60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["messages"][-1]["content"] == answer
    refunds = _keys(client, run, "lg_refunder.tool.refund")
    assert _effects(tmp_path, run) == ({refunds[0]: 1} if decision == "approve" else {})
    models = _keys(client, run, "lg_refunder.model")
    assert len(models) == 2 and openai_server.counts(f"{run}:") == {k: 1 for k in models}
