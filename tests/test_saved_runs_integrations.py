"""Saved runs of the three framework integrations replay offline (``durable.testing
.replay_file``): a pydantic-ai agent, an OpenAI Agents SDK agent (with a handoff and a
parallel pair of tool calls) and a LangGraph graph, each recorded by a real worker against
its tests' model (a ``FunctionModel``; the local OpenAI-compatible server), exported with
``durable export RUN --saved``, then replayed in this process: no model request and no
effect is sent again (the counters stay where they were), and a changed prompt fails at the
first model step, by its request's digest."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable.agents import registry
from durable.cli import main
from durable.client import Client
from durable.testing import SavedRunDiverged, replay_file, saved_run_tests
from tests.agents.basic import applications, model_requests
from tests.conftest import WorkerFactory
from tests.servers.integration_world import set_env, set_openai_env

FIXTURES = Path(__file__).parent / "fixtures"

if importlib.util.find_spec("pydantic_ai") is not None:
    import tests.agents.pydantic_ai  # noqa: F401  (the agent of the fixture's run)

    #: The run the release before the integration stood on pydantic-ai's base recorded
    #: (``tests/fixtures/pydantic_ai``) still replays offline against this release's agent.
    test_the_previous_releases_pydantic_ai_run_replays = saved_run_tests(
        FIXTURES / "pydantic_ai")


def _recorded(client: Client, worker: WorkerFactory, agent: str, inp: Any, run: str,
              tmp_path: Path) -> Path:
    client.start(agent, inp, run_id=run)
    worker(burst=True).wait(120)
    final = client.status(run)
    assert final.state == "completed", (final.state, final.reason, final.error)
    path = tmp_path / f"{run}.jsonl.gz"
    assert main(["export", run, "--saved", "-o", str(path)]) == 0
    return path


@pytest.fixture()
def restore_registry() -> Iterator[None]:
    """The registry as it was: a test registers a changed agent under a recorded name."""
    agents, tools = dict(registry.agents), dict(registry.tools)
    yield
    registry.agents.clear()
    registry.agents.update(agents)
    registry.tools.clear()
    registry.tools.update(tools)


def test_a_saved_pydantic_ai_run_replays_and_new_instructions_fail_at_the_first_request(
        settings: Any, client: Client, worker: WorkerFactory, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, restore_registry: None) -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel

    from durable.integrations.pydantic_ai import DurableAgent, StepOptions
    from tests.agents import pydantic_ai as pai

    set_env(monkeypatch, tmp_path, "examples.agents,tests.agents.basic,tests.agents.pydantic_ai")
    path = _recorded(client, worker, "pai_booker", {"prompt": "book slots 1 and 2"}, "spb",
                     tmp_path)
    sent = (model_requests(str(tmp_path / "model.sqlite")),
            applications(str(tmp_path / "world.sqlite")))
    assert replay_file(path).steps == 6
    assert (model_requests(str(tmp_path / "model.sqlite")),
            applications(str(tmp_path / "world.sqlite"))) == sent

    for table in (registry.agents, registry.tools):  # the changed agent takes its name
        for name in [n for n in table if n == "pai_booker" or n.startswith("pai_booker.")]:
            del table[name]
    other = Agent(FunctionModel(pai.booking_model), name="pai_booker",
                  instructions="Book every slot there is.")
    other.tool_plain(pai.book)
    other.tool_plain(pai.note)
    changed = DurableAgent(other, tools={"book": StepOptions(timeout_s=2.0),
                                         "note": StepOptions(effect_free=True)})
    with pytest.raises(SavedRunDiverged) as diverged:
        replay_file(path, registry.agent(changed.name))
    assert diverged.value.step == 1 and "digest" in str(diverged.value), diverged.value


def test_a_saved_openai_agents_run_replays_without_a_request(
        settings: Any, client: Client, worker: WorkerFactory, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, openai_server: Any) -> None:
    pytest.importorskip("agents")
    import tests.agents.openai_agents  # noqa: F401  (registers oai_booker here)

    openai_server.reset()
    set_openai_env(monkeypatch, tmp_path, openai_server.url)
    path = _recorded(client, worker, "oai_booker", {"input": "book slots 1 and 2"}, "sob",
                     tmp_path)
    sent = (openai_server.counts("sob"), applications(str(tmp_path / "world.sqlite")))
    assert replay_file(path).steps == 8
    assert (openai_server.counts("sob"), applications(str(tmp_path / "world.sqlite"))) == sent


def test_a_saved_langgraph_run_replays_without_a_request(
        settings: Any, client: Client, worker: WorkerFactory, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, openai_server: Any) -> None:
    pytest.importorskip("langgraph")
    pytest.importorskip("langchain_openai")
    import tests.agents.langgraph_graphs  # noqa: F401  (registers lg_booker here)

    openai_server.reset()
    set_env(monkeypatch, tmp_path, "tests.agents.langgraph_graphs",
            TEST_OPENAI_URL=openai_server.url)
    path = _recorded(client, worker, "lg_booker", {"input": {"messages": [
        {"role": "user", "content": "book slots 1 and 2"}]}}, "slb", tmp_path)
    sent = (openai_server.counts("slb"), applications(str(tmp_path / "world.sqlite")))
    verdict = replay_file(path)
    assert verdict.ok and verdict.steps >= 6
    assert (openai_server.counts("slb"), applications(str(tmp_path / "world.sqlite"))) == sent
