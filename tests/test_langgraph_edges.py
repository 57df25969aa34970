"""The LangGraph integration at its edges: nodes of one superstep taking steps at once and
killed between them, LangGraph's own refusals and errors (bad input, an undeclared tool, a
recursion limit), a provider's errors, a node that streams its model, a RetryPolicy that
retries a node whose tool failed, and what construction refuses.

Real worker processes and the local OpenAI-compatible server, as ``tests/test_langgraph.py``.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from durable.audit.verify import verify
from durable.client import Client
from durable.errors import DurableError
from durable.settings import Settings
from tests.agents import langgraph_graphs  # noqa: F401  (registers the graphs here too)
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.servers.effects import applications
from tests.servers.integration_world import decided, set_env
from tests.servers.openai import OpenAIServer, resent_after_recorded


@pytest.fixture(autouse=True)
def langgraph_env(settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                  openai_server: OpenAIServer) -> None:
    openai_server.reset()
    set_env(monkeypatch, tmp_path, "tests.agents.langgraph_graphs",
            TEST_OPENAI_URL=openai_server.url)


@pytest.mark.parametrize("window", ["after_effect", "after_outcome"])
def test_nodes_of_one_superstep_take_their_steps_together_and_replay_by_task(
    window: str, client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
    openai_server: OpenAIServer,
) -> None:
    """Two nodes run at once: their model requests are one parallel decision (steps 2 and
    3). SIGKILL at the ``window`` of the second: executed again, the graph resumes from its
    checkpoint, each node finds its recorded request by its task (whatever order the two
    ask in), and no recorded request is sent again."""
    run = client.start("lg_fan_out", {"input": {}}, run_id=f"lgf{window[6]}").run_id
    doomed = worker(kill_at=f"{window}:3")
    assert doomed.wait(60) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, 60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["joined"] == "word0 word1|word39"
    models = [s for s in decided(client, run) if s.tool == "lg_fan_out.model"]
    assert [s.step for s in models] == [2, 3] and models[0].group == models[1].group == 2
    assert set(openai_server.counts(f"{run}:")) == {f"{run}:2", f"{run}:3"}
    assert resent_after_recorded(client, run, openai_server) == []
    assert verify(client.log, run).ok


def test_bad_input_an_unlisted_tool_and_a_recursion_limit_are_refused_clearly(
    client: Client, worker: WorkerFactory, openai_server: OpenAIServer
) -> None:
    with pytest.raises(DurableError, match="extra"):  # refused at start: nothing started
        client.start("lg_storyteller", {"input": {}, "extra": 1}, run_id="lgx0")
    runs = [client.start("lg_undeclared", {"input": {}}, run_id="lgx1").run_id,
            client.start("lg_storyteller", {"input": "not a state"}, run_id="lgx2").run_id,
            client.start("lg_looper", {"input": {}}, run_id="lgx3").run_id]
    worker(burst=True).wait(60)
    first, second, third = (client.status(r) for r in runs)
    # A graph calling a tool it did not declare needs its code fixed: the run waits for an
    # operator, its log intact (its effect would have run again on every recovery).
    assert first.state == "quarantined", (first.state, first.reason)
    assert "the tool 'note' is not one of its steps" in (first.reason or "")
    # LangGraph's own refusal of the input, and its recursion limit, fail the run with
    # LangGraph's message.
    assert second.state == "failed", (second.state, second.reason, second.error)
    assert "InvalidUpdateError" in (second.error or ""), second.error
    assert third.state == "failed", (third.state, third.reason, third.error)
    assert "GraphRecursionError" in (third.error or ""), third.error
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
    assert outcomes == {503: ("completed", {"lge503:2": 2}), 400: ("failed", {"lge400:2": 1})}


def test_a_node_that_streams_its_model_takes_one_step(
    client: Client, worker: WorkerFactory, openai_server: OpenAIServer
) -> None:
    run = client.start("lg_streamer", {"input": {"messages": [
        {"role": "user", "content": "a story"}]}}, run_id="lgst").run_id
    worker(burst=True).wait(60)
    final = client.status(run)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["messages"][-1]["content"] == " ".join(f"word{i}" for i in range(40))
    assert [s.tool for s in decided(client, run) if s.tool.endswith(".model")] == [
        "lg_streamer.model"]
    assert openai_server.counts(f"{run}:") == {f"{run}:2": 1}
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
    assert final.state == "quarantined", (final.state, final.reason,
                                          [(a.status, a.error) for a in final.actions.values()])
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


def test_a_node_langgraph_retries_runs_again_with_steps_of_its_own(
    client: Client, worker: WorkerFactory, tmp_path: Path, openai_server: OpenAIServer
) -> None:
    """The node's booking fails (the service refuses the first try); LangGraph's
    RetryPolicy runs the node again, as LangGraph does: its second attempt sends its model
    request again and takes the booking again, each a step with a key of its own (named by
    the attempt), and the booking is applied once."""
    run = client.start("lg_retrying", {"input": {}}, run_id="lgre").run_id
    worker(burst=True).wait(60)
    final = client.status(run)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result["booked"] == ["slot 1"]
    calls = [s for s in decided(client, run) if not s.tool.endswith(".checkpoint")]
    assert [(s.tool, final.actions[s.step].status) for s in calls] == [
        ("lg_retrying.model", "succeeded"), ("lg_retrying.tool.flaky_book", "failed"),
        ("lg_retrying.model", "succeeded"), ("lg_retrying.tool.flaky_book", "succeeded")]
    assert [s.args["attempt"] for s in calls if "attempt" in s.args] == [1, 2]
    assert openai_server.counts(f"{run}:") == {f"{run}:{calls[0].step}": 1,
                                               f"{run}:{calls[2].step}": 1}
    effects = applications(str(tmp_path / "world.sqlite"))
    assert effects == {f"try:{calls[1].key}": 1, f"try:{calls[3].key}": 1, calls[3].key: 1}


def test_construction_refuses_what_it_cannot_make_durable() -> None:
    from langgraph.checkpoint.memory import InMemorySaver
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
    parent = StateGraph(Work)
    parent.add_node("sub", builder.compile(checkpointer=InMemorySaver()))
    parent.add_edge(START, "sub")
    with pytest.raises(ValueError, match="a checkpointer of its own"):
        DurableGraph(parent.compile(), name="lg_own_saver")
