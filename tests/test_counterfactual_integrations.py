"""Counterfactual forks of the framework integrations' runs, each recorded by a real worker
against its tests' model and forked at its first step with every effect held (the effects'
SQLite table has no unique key: a booking applied twice would show). pydantic-ai and the
OpenAI Agents SDK: the model requests are sent again (effect-free), each booking is the
parent's call at the same step and reuses its outcome, and the fork completes as its
parent did, applying nothing (pydantic-ai's request identity holds the run's id, so its
diff parts at the first request). LangGraph: its tool calls carry a task id drawn anew in
each run, so none is the parent's and the first booking is held."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from durable.audit.diff import diff
from durable.client import Client
from tests.agents.basic import applications, model_requests
from tests.conftest import WorkerFactory
from tests.servers.integration_world import set_env


def test_a_held_fork_of_a_pydantic_ai_run_reuses_its_bookings_and_applies_none_again(
        settings: Any, client: Client, worker: WorkerFactory, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pydantic_ai")
    import tests.agents.pydantic_ai  # noqa: F401  (registers pai_booker here)

    set_env(monkeypatch, tmp_path, "examples.agents,tests.agents.basic,tests.agents.pydantic_ai")
    run = client.start("pai_booker", {"prompt": "book slots 1 and 2"}, run_id="pbf").run_id
    worker(burst=True).wait(60)
    assert client.wait(run, 30).state == "completed"
    booked = applications(str(tmp_path / "world.sqlite"))
    fork = client.fork(run, "1", "pbf-held", hold_effects=True).run_id
    worker(burst=True).wait(60)
    final = client.wait(fork, 30)
    assert final.state == "completed", (final.state, final.reason)
    assert final.result == client.status(run).result
    assert applications(str(tmp_path / "world.sqlite")) == booked  # nothing applied again
    asked = model_requests(str(tmp_path / "model.sqlite"))
    assert {k: n for k, n in asked.items() if k.startswith(f"{fork}:")} == {
        f"{fork}:{n}": 1 for n in (1, 3, 6)}  # the requests were sent: they are effect-free
    found = diff(client.log, run, fork)
    # pydantic-ai's request identity holds the run's id: the fork's requests differ from
    # the parent's by digest from the first, while its bookings are the parent's calls.
    assert found.first == 1 and found.b.totals()["reused"] == 2
    bookings = [row for row in found.rows if row["a"]["tool"] == "pai_booker.tool.book"]
    assert len(bookings) == 2 and all(row["same"] for row in bookings)
    assert found.b.totals()["effects_sent"] == 0


def test_a_held_fork_of_a_langgraph_run_holds_its_bookings(
        settings: Any, client: Client, worker: WorkerFactory, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, openai_server: Any) -> None:
    """A LangGraph graph's run (its checkpoints are steps of the log, effect-free) forked
    at its first step with every effect held: the graph runs again as far as its first
    booking, which is held, not reused: LangGraph names each tool call with its task's
    id, drawn anew in each run, so no call is the parent's. Nothing is applied again."""
    pytest.importorskip("langgraph")
    pytest.importorskip("langchain_openai")
    import tests.agents.langgraph_graphs  # noqa: F401  (registers lg_booker here)

    openai_server.reset()
    set_env(monkeypatch, tmp_path, "tests.agents.langgraph_graphs",
            TEST_OPENAI_URL=openai_server.url)
    run = client.start("lg_booker", {"input": {"messages": [
        {"role": "user", "content": "book slots 1 and 2"}]}}, run_id="lgf").run_id
    worker(burst=True).wait(60)
    assert client.wait(run, 30).state == "completed"
    booked = applications(str(tmp_path / "world.sqlite"))
    fork = client.fork(run, "1", "lgf-held", hold_effects=True).run_id
    worker(burst=True).wait(60)
    held = client.wait(fork, 30)
    assert held.state == "waiting_approval" and held.wait is not None
    assert held.wait.data["held"] and held.wait.data["tool"] == "lg_booker.tool.book"
    assert held.wait.data["args"]["input"] == {"slot": 1}
    assert applications(str(tmp_path / "world.sqlite")) == booked


def test_a_held_fork_of_an_openai_agents_run_reuses_its_bookings(
        settings: Any, client: Client, worker: WorkerFactory, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, openai_server: Any) -> None:
    """An OpenAI Agents SDK run (a handoff, then two bookings, the second with a note in
    one parallel decision) forked at its first step with every effect held: the scripted
    model names its calls the same way again, so each booking is the parent's call and
    reuses its outcome; nothing is applied again."""
    pytest.importorskip("agents")
    import tests.agents.openai_agents  # noqa: F401  (registers oai_booker here)
    from tests.servers.integration_world import set_openai_env

    openai_server.reset()
    set_openai_env(monkeypatch, tmp_path, openai_server.url)
    run = client.start("oai_booker", {"input": "book slots 1 and 2"}, run_id="obf").run_id
    worker(burst=True).wait(60)
    assert client.wait(run, 30).state == "completed"
    booked = applications(str(tmp_path / "world.sqlite"))
    fork = client.fork(run, "1", "obf-held", hold_effects=True).run_id
    worker(burst=True).wait(60)
    final = client.wait(fork, 30)
    assert final.state == "completed", (final.state, final.reason)
    assert final.result == client.status(run).result
    assert applications(str(tmp_path / "world.sqlite")) == booked
    assert diff(client.log, run, fork).b.totals()["reused"] == 2
