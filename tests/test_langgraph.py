"""The LangGraph integration: compiled graphs, unchanged, run as durable runs; each node's
chat model requests, tool calls and update are steps of the log
(``durable.integrations.langgraph``).

Real worker processes, SIGKILLed for real; the chat model is langchain-openai's
``ChatOpenAI`` against a local OpenAI-compatible HTTP server started by the test, which
records every request with its ``Idempotency-Key``; the tools write their effects into a
SQLite database that never deduplicates (``TEST_DB_DEDUPE=0``): a model request sent again
or an effect applied twice would show.
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


def _effects(tmp_path: Path) -> dict[str, int]:
    return applications(str(tmp_path / "world.sqlite"))


BOOKER_STEPS = ["lg_booker.model", "lg_booker.node.agent", "lg_booker.tool.book",
                "lg_booker.node.tools", "lg_booker.model", "lg_booker.node.agent",
                "lg_booker.tool.book", "lg_booker.tool.note", "lg_booker.node.tools",
                "lg_booker.model", "lg_booker.node.agent"]
BOOKER_MODEL_STEPS = (1, 5, 10)


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
    assert [s.tool for s in steps] == BOOKER_STEPS
    models = [s for s in steps if s.tool == "lg_booker.model"]
    assert all(s.model and is_placeholder(s.args) for s in models)  # digest, not the chat
    assert steps[1].args == {"task": "1:agent"}
    assert steps[2].args["input"] == {"slot": 1} and steps[2].args["task"] == "2:tools"
    assert steps[6].group == steps[7].group == 7  # two tool calls of one reply, in parallel
    assert state.model_calls == 3 and state.tokens == 3 * 10  # usage counted: budgets work
    assert openai_server.counts(run) == {f"{run}:{n}": 1 for n in BOOKER_MODEL_STEPS}
    assert all(r["stream"] for r in openai_server.requests)
    assert _effects(tmp_path) == {f"{run}:3": 1, f"{run}:7": 1}
    assert state.actions[8].result["content"] == f"noted two ({run}:8)"
    assert verify(client.log, run).ok


@pytest.mark.parametrize(("window", "step"), [
    # After each step's effect, before its outcome is recorded: a model reply arrived (1, 5,
    # 10), a booking applied (3, 7), a note written (8), a node's update computed (2, 4,
    # 6, 9, 11).
    *(("after_effect", n) for n in range(1, len(BOOKER_STEPS) + 1)),
    ("after_intent", 3),    # the booking's intent recorded, nothing sent
    ("after_outcome", 7),   # one of two parallel tool calls recorded
])
def test_a_killed_graph_resumes_without_resending_requests_or_repeating_effects(
    window: str, step: int, client: Client, worker: WorkerFactory,
    reconciler: ReconcilerFactory, tmp_path: Path, openai_server: OpenAIServer,
) -> None:
    """SIGKILL at step ``step``'s ``window``; another worker re-executes the graph: every
    recorded model reply, tool result and node update comes back from the log, so no
    recorded request is sent again and no effect is applied twice."""
    run = client.start("lg_booker", {"input": {"messages": [
        {"role": "user", "content": "book"}]}}, run_id=f"lgk{step}{window[6]}").run_id
    doomed = worker(kill_at=f"{window}:{step}")
    assert doomed.wait(30) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["messages"][-1]["content"] == "booked: slot 1, slot 2"
    assert [s.tool for s in decided(client, run)] == BOOKER_STEPS
    # Each request went out once, but the one whose reply arrived and was not recorded
    # (an effect-free step is sent again after a crash); no effect was applied twice.
    assert openai_server.counts(f"{run}:") == {
        f"{run}:{n}": 2 if (window, n) == ("after_effect", step) else 1
        for n in BOOKER_MODEL_STEPS}
    assert resent_after_recorded(client, run, openai_server) == []
    assert _effects(tmp_path) == {f"{run}:3": 1, f"{run}:7": 1}
    assert verify(client.log, run).ok


@pytest.mark.parametrize(("window", "step"), [
    ("after_effect", 3),    # mid-node: the second booking applied, not recorded
    ("after_outcome", 2),   # mid-node: the first booking recorded, the second not taken
])
def test_a_sigkill_mid_node_repeats_no_request_and_no_effect(
    window: str, step: int, client: Client, worker: WorkerFactory,
    reconciler: ReconcilerFactory, tmp_path: Path, openai_server: OpenAIServer,
) -> None:
    """SIGKILL inside one node, after its model reply and its first booking were recorded
    (``window`` of step ``step``): the node runs again on another worker, its recorded
    request is not sent again, the recorded booking is not applied again, and the booking
    the kill interrupted is found applied by its lookup (or made once)."""
    run = client.start("lg_busy", {"input": {}}, run_id=f"lgm{step}{window[6]}").run_id
    doomed = worker(kill_at=f"{window}:{step}")
    assert doomed.wait(30) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["booked"] == ["slot 1", "slot 2", "wrapped"]
    assert [s.tool for s in decided(client, run)] == [
        "lg_busy.model", "lg_busy.tool.book", "lg_busy.tool.book", "lg_busy.node.work",
        "lg_busy.node.wrap_up"]
    assert openai_server.counts(f"{run}:") == {f"{run}:1": 1}  # sent once: not re-sent
    assert _effects(tmp_path) == {f"{run}:2": 1, f"{run}:3": 1,  # none applied twice
                                  f"ran:work:{run}": 2}  # the node ran again, from the log
    assert verify(client.log, run).ok


def test_a_recorded_node_is_not_run_again_after_a_sigkill(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path,
    openai_server: OpenAIServer,
) -> None:
    """SIGKILL after the node's update was recorded (step 4), before the next node ran:
    executed again, the graph gives back the recorded update without running the node's
    code (it counts its executions), then runs the next node."""
    run = client.start("lg_busy", {"input": {}}, run_id="lgn").run_id
    doomed = worker(kill_at="after_outcome:4")
    assert doomed.wait(30) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["booked"] == ["slot 1", "slot 2", "wrapped"]
    assert [s.tool for s in decided(client, run)] == [
        "lg_busy.model", "lg_busy.tool.book", "lg_busy.tool.book", "lg_busy.node.work",
        "lg_busy.node.wrap_up"]
    assert _effects(tmp_path) == {f"{run}:2": 1, f"{run}:3": 1, f"ran:work:{run}": 1}
    assert openai_server.counts(f"{run}:") == {f"{run}:1": 1}
    assert verify(client.log, run).ok


def test_an_interrupt_is_a_durable_wait_and_its_answer_repeats_nothing(
    client: Client, worker: WorkerFactory, tmp_path: Path, openai_server: OpenAIServer
) -> None:
    """The node's interrupt() waits (``waiting_input``, no worker held); answered with
    ``durable respond``, the node runs again from its start as LangGraph resumes it, but its
    model request and its first booking come back recorded: each went out once."""
    run = client.start("lg_asker", {"input": {}}, run_id="lga").run_id
    worker()
    state = client.wait(run, 30)
    assert state.state == "waiting_input", (state.state, state.reason, state.error)
    waits = [e.event for e in client.events(run) if isinstance(e.event, ev.WaitEntered)]
    assert waits[-1].data == {"question": "book slot 2 too?", "booked": "slot 1"}
    assert _effects(tmp_path) == {f"{run}:2": 1}
    answered = run_durable("respond", run, "--input", '"yes"', env=dict(os.environ))
    assert answered.returncode == 0, answered.stderr
    final = client.wait(run, 30)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["booked"] == ["slot 1", "slot 2", "wrapped"]
    assert final.result["answer"] == "yes"
    assert openai_server.counts(f"{run}:") == {f"{run}:1": 1}
    assert _effects(tmp_path) == {f"{run}:2": 1, f"{run}:3": 1}
    assert [s.tool for s in decided(client, run)] == [
        "lg_asker.model", "lg_asker.tool.book", "lg_asker.tool.book", "lg_asker.node.work",
        "lg_asker.node.wrap_up"]
    assert verify(client.log, run).ok


class Following:
    """What a follower of ``run`` is given while the block runs, read on a thread: text
    deltas, node updates; ``reading`` is set once it read the log's first entry."""

    def __init__(self, client: Client, run: str) -> None:
        self.client, self.run = client, run
        self.deltas: list[str] = []
        self.nodes: list[str] = []
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

    def __exit__(self, *exc: object) -> None:
        self._thread.join(60)
        self._ctx.__exit__(None, None, None)


STORY = " ".join(f"word{i}" for i in range(40))


def test_a_follower_receives_tokens_and_node_updates(
    client: Client, worker: WorkerFactory, openai_server: OpenAIServer
) -> None:
    openai_server.delta_delay_s = 0.02
    run = client.start("lg_storyteller", {"input": {"messages": [
        {"role": "user", "content": "a story"}]}}, run_id="lgs").run_id
    with Following(client, run) as seen:
        worker()
    final = client.status(run)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["messages"][-1]["content"] == STORY
    assert "".join(seen.deltas) == STORY and seen.nodes == ["tell"]


def test_a_cancel_reaches_the_running_node(
    client: Client, worker: WorkerFactory, openai_server: OpenAIServer
) -> None:
    """The node's model request streams a token a second; once the follower got the first,
    a cancel cancels the request on the steps' event loop: the run ends canceled with most
    of the story never sent, and the node is never recorded."""
    openai_server.delta_delay_s = 1.0
    run = client.start("lg_storyteller", {"input": {"messages": [
        {"role": "user", "content": "a story"}]}}, run_id="lgc").run_id
    with Following(client, run) as seen:
        worker()
        assert seen.streaming.wait(30)
        client.cancel(run, "user changed their mind")
        final = client.wait(run, timeout=10)
    assert final.state == "canceled"
    assert len(seen.deltas) < 20 and seen.nodes == []
    tags = [e.event.__struct_config__.tag for e in client.events(run) if e.event is not None]
    assert "call_canceled" in tags and tags[-1] == "canceled"
    assert [s.tool for s in decided(client, run)] == ["lg_storyteller.model"]


def test_the_functional_api_runs_tasks_as_steps_and_resumes_without_repeating_them(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path,
    openai_server: OpenAIServer,
) -> None:
    """An ``@entrypoint`` whose ``@task``s ask the model and book a slot, then interrupt():
    answered, the entrypoint runs again (as LangGraph resumes it) and gets its finished
    tasks' outputs without running them; SIGKILLed after the second booking's effect, before
    its outcome is recorded, the graph is executed again on another worker, and the
    booking's lookup finds it applied."""
    run = client.start("lg_planner", {"input": {}}, run_id="lgp").run_id
    doomed = worker(kill_at="after_effect:5")
    state = client.wait(run, 30)
    assert state.state == "waiting_input", (state.state, state.reason, state.error)
    assert _effects(tmp_path) == {f"{run}:3": 1}
    client.respond(run, "yes")
    assert doomed.wait(30) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, 60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result == {"story": " ".join(f"word{i}" for i in range(40)),
                            "booked": ["slot 1", "slot 2"], "answer": "yes"}
    steps = decided(client, run)
    assert [s.tool for s in steps] == [
        "lg_planner.model", "lg_planner.task", "lg_planner.tool.book", "lg_planner.task",
        "lg_planner.tool.book", "lg_planner.task", "lg_planner.node.plan"]
    assert steps[1].args == {"task": "0:plan>tell_story#0", "name": "tell_story"}
    assert openai_server.counts(f"{run}:") == {f"{run}:1": 1}
    assert _effects(tmp_path) == {f"{run}:3": 1, f"{run}:5": 1}
    assert verify(client.log, run).ok


def _approval(client: Client, run: str) -> str:
    state = client.wait(run, 30)
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
    assert _effects(tmp_path) == {}  # nothing before the decision
    client.sign_and_approve(run, request, decision, "alice", alice, note="not this one")
    final = client.wait(run, 30)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["messages"][-1]["content"] == answer
    assert _effects(tmp_path) == ({f"{run}:3": 1} if decision == "approve" else {})
    assert openai_server.counts(f"{run}:") == {f"{run}:1": 1, f"{run}:5": 1}


def test_construction_refuses_what_it_cannot_make_durable() -> None:
    from langgraph.graph import START, StateGraph

    from durable.integrations.langgraph import DurableGraph
    from tests.agents.langgraph_graphs import Work

    builder = StateGraph(Work)
    builder.add_node("a", lambda s: s)
    builder.add_edge(START, "a")
    with pytest.raises(ValueError, match="static breakpoints"):
        DurableGraph(builder.compile(interrupt_before=["a"]), name="lg_breakpoint")
    with pytest.raises(TypeError, match="a compiled graph"):
        DurableGraph(builder, name="lg_builder")  # type: ignore[arg-type]


@pytest.mark.parametrize("window", ["after_effect", "after_outcome"])
def test_nodes_of_one_superstep_take_their_steps_together_and_replay_in_order(
    window: str, client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
    openai_server: OpenAIServer,
) -> None:
    """Two nodes run at once: their model requests are one parallel decision (steps 1 and
    2), their updates another. SIGKILL at the ``window`` of the second request: executed
    again, the graph asks for the same steps in the same order (no nondeterminism), and no
    recorded request is sent again."""
    run = client.start("lg_fan_out", {"input": {}}, run_id=f"lgf{window[6]}").run_id
    doomed = worker(kill_at=f"{window}:2")
    assert doomed.wait(30) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, 60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["joined"] == "word0 word1|word39"
    steps = decided(client, run)
    assert [s.tool for s in steps] == [
        "lg_fan_out.model", "lg_fan_out.model", "lg_fan_out.node.left",
        "lg_fan_out.node.right", "lg_fan_out.node.join"]
    assert steps[0].group == steps[1].group == 1
    assert set(openai_server.counts(f"{run}:")) == {f"{run}:1", f"{run}:2"}
    assert resent_after_recorded(client, run, openai_server) == []
    assert verify(client.log, run).ok


def test_bad_input_and_an_unlisted_tool_are_refused_clearly(
    client: Client, worker: WorkerFactory, tmp_path: Path, openai_server: OpenAIServer
) -> None:
    from durable.errors import DurableError

    with pytest.raises(DurableError, match="extra"):  # refused at start: nothing started
        client.start("lg_storyteller", {"input": {}, "extra": 1}, run_id="lgx0")
    runs = [client.start("lg_undeclared", {"input": {}}, run_id="lgx1").run_id,
            client.start("lg_storyteller", {"input": "not a state"}, run_id="lgx2").run_id]
    worker(burst=True).wait(60)
    first, second = (client.status(r) for r in runs)
    # A graph calling a tool it did not declare needs its code fixed: the run waits for an
    # operator, its log intact (its effect would have run again on every recovery).
    assert first.state == "quarantined", (first.state, first.reason)
    assert "the tool 'note' is not one of its steps" in (first.reason or "")
    # LangGraph's own refusal of the input fails the run with LangGraph's message.
    assert second.state == "failed", (second.state, second.reason, second.error)
    assert "InvalidUpdateError" in (second.error or ""), second.error
    assert openai_server.counts("lgx") == {}


def test_only_a_model_error_a_retry_may_cure_is_retried(
    client: Client, worker: WorkerFactory, openai_server: OpenAIServer
) -> None:
    """The provider answers the first request 503 (come back: sent again, same key) and,
    for the second run, 400 (a bad request: the run fails, nothing sent again)."""
    given = {"input": {"messages": [{"role": "user", "content": "a story"}]}}
    outcomes = {}
    for status in (503, 400):
        openai_server.faults.append(status)
        run = client.start("lg_storyteller", given, run_id=f"lge{status}").run_id
        worker(burst=True).wait(60)
        outcomes[status] = (client.status(run).state, openai_server.counts(f"{run}:"))
    assert outcomes == {503: ("completed", {"lge503:1": 2}), 400: ("failed", {"lge400:1": 1})}


def test_a_node_that_streams_its_model_takes_one_step(
    client: Client, worker: WorkerFactory, openai_server: OpenAIServer
) -> None:
    run = client.start("lg_streamer", {"input": {"messages": [
        {"role": "user", "content": "a story"}]}}, run_id="lgst").run_id
    worker(burst=True).wait(60)
    final = client.status(run)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["messages"][-1]["content"] == " ".join(f"word{i}" for i in range(40))
    assert [s.tool for s in decided(client, run)] == ["lg_streamer.model",
                                                      "lg_streamer.node.tell"]
    assert openai_server.counts(f"{run}:") == {f"{run}:1": 1}
    assert final.tokens == 10


def test_skipping_steps_the_log_does_not_hold_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``RunContext.skip_recorded`` goes only past steps settled in the log: asked to skip
    one never taken, it refuses, and the run waits for an operator, its log intact."""
    from durable.testing import AgentEnvironment

    monkeypatch.setenv("TEST_DB", str(tmp_path / "skip.sqlite"))
    with AgentEnvironment("tests.agents.basic") as env:
        final = env.execute("async_skipper", {"steps": 3}, run_id="skip-1")
    assert final.state == "quarantined", (final.state, final.reason)
    assert "step 2 is not settled in the log" in (final.reason or "")
    assert final.actions[1].status == "succeeded"


def test_a_long_agent_goes_past_langgraphs_default_superstep_limit(
    client: Client, worker: WorkerFactory, openai_server: OpenAIServer
) -> None:
    """16 model turns take 32 supersteps, past LangGraph's 25: the limit leaves room for the
    run's "model_calls" budget (20), which would end the run first."""
    run = client.start("lg_counter", {"input": {"messages": [
        {"role": "user", "content": "count"}]}}, run_id="lgcount").run_id
    worker(burst=True).wait(120)
    state = client.status(run)
    assert state.state == "completed", (state.state, state.reason, state.error)
    assert state.result["messages"][-1]["content"] == "counted 15"
    assert state.model_calls == 16
    assert not any(r["stream"] for r in openai_server.requests)  # stream=False


def test_a_node_langgraph_retries_takes_only_its_failed_step_again(
    client: Client, worker: WorkerFactory, tmp_path: Path, openai_server: OpenAIServer
) -> None:
    """The node's booking fails (the service refuses the first try); LangGraph's
    RetryPolicy runs the node again: its model reply comes back kept (not sent again), and
    the booking is taken again as a new step, with a key of its own, and applied once."""
    run = client.start("lg_retrying", {"input": {}}, run_id="lgre").run_id
    worker(burst=True).wait(60)
    final = client.status(run)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["booked"] == ["slot 1"]
    assert [(s.tool, final.actions[s.step].status) for s in decided(client, run)] == [
        ("lg_retrying.model", "succeeded"), ("lg_retrying.tool.flaky_book", "failed"),
        ("lg_retrying.tool.flaky_book", "succeeded"), ("lg_retrying.node.work", "succeeded")]
    assert openai_server.counts(f"{run}:") == {f"{run}:1": 1}
    assert _effects(tmp_path) == {f"try:{run}:2": 1, f"try:{run}:3": 1, f"{run}:3": 1}
