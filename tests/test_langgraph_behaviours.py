"""LangGraph's own behaviours (``tests/agents/langgraph_behaviours.py`` and
``langgraph_topologies.py``, taken from LangGraph's tests and Temporal's plugin's) end in a
durable run as they end under LangGraph's own checkpointer, with LangGraph's counts: each
graph runs here, in the test's process, under ``InMemorySaver`` (the reference: its result
and how often each node's and task's code ran), and as a durable run on a real worker,
answered the same way through ``Client.respond``; result and counts must be equal.

Real worker processes; the chat model is langchain-openai's ``ChatOpenAI`` against the local
OpenAI-compatible server of ``tests.servers.openai``; executions are counted in SQLite.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, Interrupt

from durable.audit.verify import verify
from durable.client import Client
from durable.integrations.base import jsonable
from durable.log import events as ev
from durable.log.state import RunState
from tests.agents import langgraph_topologies  # noqa: F401  (registers its behaviours)
from tests.agents.langgraph_behaviours import BEHAVIOURS
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.servers.effects import applications
from tests.servers.integration_world import set_env
from tests.servers.openai import OpenAIServer, resent_after_recorded


@pytest.fixture(autouse=True)
def langgraph_env(settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                  openai_server: OpenAIServer) -> None:
    openai_server.reset()
    set_env(monkeypatch, tmp_path,
            "tests.agents.langgraph_behaviours,tests.agents.langgraph_topologies",
            TEST_OPENAI_URL=openai_server.url)


def counts(tmp_path: Path, thread: str) -> dict[str, int]:
    """How often each node's and task's code ran in ``thread``."""
    return {key.split(":")[1]: n for key, n in applications(str(tmp_path / "world.sqlite")).items()
            if key.startswith("ran:") and key.endswith(f":{thread}")}


def without_ids(value: Any) -> Any:
    """``value`` without messages' ids (LangGraph draws them at random)."""
    if isinstance(value, dict):
        return {k: without_ids(v) for k, v in value.items()
                if not (k == "id" and "type" in value and "content" in value)}
    if isinstance(value, list):
        return [without_ids(v) for v in value]
    return value


def answer_for(asked: list[tuple[str, Any]], answer: Any) -> Any:
    """An answer as the run is given it: an answer per interrupt value becomes one per
    interrupt id (``asked``: the pending interrupts' ids and values)."""
    if isinstance(answer, dict) and len(asked) > 1:
        return {i: answer[v] for i, v in asked if v in answer}
    return answer


def _resume(pending: tuple[Interrupt, ...], answer: Any) -> Command[Any]:
    """LangGraph's own resume: by interrupt id (an answer per value, or one for all)."""
    if isinstance(answer, dict) and len(pending) > 1:
        return Command(resume=answer_for([(i.id, i.value) for i in pending], answer))
    return Command(resume={pending[0].id: answer})


async def reference(name: str) -> tuple[Any, str]:
    """The behaviour under LangGraph's own checkpointer: its result (or its error) and the
    thread it ran in."""
    b = BEHAVIOURS[name]
    graph = b.graph.copy({"checkpointer": InMemorySaver()})
    thread = f"ref-{name}-{uuid.uuid4().hex[:8]}"
    config: Any = {"configurable": {"thread_id": thread}}
    answers, given = list(b.answers), b.input
    try:
        while True:
            out = await graph.ainvoke(given, config)
            pending: tuple[Interrupt, ...] = (await graph.aget_state(config)).interrupts
            if not pending:
                break
            given = _resume(pending, answers.pop(0))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}", thread
    if isinstance(out, dict):
        out = {k: v for k, v in out.items() if k != "__interrupt__"}
    return jsonable(out), thread


def drive(client: Client, runs: dict[str, str], timeout: float = 120.0) -> dict[str, RunState]:
    """Answer each run's interrupts with its behaviour's answers, in order, until every run
    ended: the final states."""
    left = {run: list(BEHAVIOURS[name].answers) for run, name in runs.items()}
    done: dict[str, RunState] = {}
    end = time.monotonic() + timeout
    while len(done) < len(runs):
        assert time.monotonic() < end, {r: client.status(r).state for r in runs if r not in done}
        for run in runs:
            if run in done:
                continue
            state = client.status(run)
            if state.state in ("completed", "failed", "quarantined", "canceled", "expired"):
                done[run] = state
            elif state.state == "waiting_input" and left[run]:
                waits = [e.event for e in client.events(run)
                         if isinstance(e.event, ev.WaitEntered)]
                asked = [(i["id"], i["value"]) for i in waits[-1].data["interrupts"]]
                client.respond(run, answer_for(asked, left[run].pop(0)))
        time.sleep(0.05)
    return done


#: The behaviours run more than once: the order their concurrent tasks take their steps in
#: varies from run to run.
REPEATED = {"gathered_tasks": 4, "gathered_sync_tasks": 3}


def test_langgraph_behaviours_end_as_in_langgraph_with_its_counts(
    client: Client, worker: WorkerFactory, tmp_path: Path, openai_server: OpenAIServer
) -> None:
    """Every behaviour, as a durable run, ends with LangGraph's result (or its error) and
    each node's and task's code ran as often as under LangGraph's own checkpointer: an
    answered interrupt runs its node again (LangGraph's resume), never a finished task or
    node; concurrent tasks find their recorded steps whatever order they take them in."""
    runs = {f"lgb-{name}-{i}": name for name in BEHAVIOURS
            for i in range(REPEATED.get(name, 1))}
    for run, name in runs.items():
        client.start(f"lg_{name}", {"input": BEHAVIOURS[name].input}, run_id=run)
    worker()
    finals = drive(client, runs)
    expected = {name: asyncio.run(reference(name)) for name in BEHAVIOURS}
    for run, name in runs.items():
        result, thread = expected[name]
        final = finals[run]
        ran, reference_ran = counts(tmp_path, run), counts(tmp_path, thread)
        if isinstance(result, str):  # LangGraph raised: the run fails with its error
            assert final.state == "failed", (name, final.state, final.reason, final.error)
            assert result in (final.error or ""), (name, final.error)
        else:
            assert final.state == "completed", (name, final.state, final.reason, final.error)
            assert without_ids(final.result) == without_ids(result), name
        assert ran == reference_ran, (name, ran, reference_ran)
        assert verify(client.log, run).ok
    # The counts LangGraph's own tests and the issue name.
    assert counts(tmp_path, "lgb-interrupt_loop-0") == {"ask_age": 4}
    assert counts(tmp_path, "lgb-interrupt_cycles-0") == {
        "prepare": 1, "multi_interrupt": 3, "add_ten": 1}
    assert counts(tmp_path, "lgb-retries_spent-0") == {"hopeless": 3}
    assert "node 'hopeless': ValueError: the service is gone" in (
        finals["lgb-retries_spent-0"].error or "")
    # The model was asked once per request, whatever the resumes: each reply came back
    # from the log after an answer.
    assert all(n == 1 for n in openai_server.counts("lgb-").values())


@pytest.mark.parametrize(("name", "window", "nth"), [
    ("gathered_tasks", "after_effect", 2),       # the second of four replies, not recorded
    ("gathered_tasks", "after_outcome", 3),      # three of four replies recorded
    ("gathered_sync_tasks", "after_effect", 2),  # synchronous tasks, on their threads
])
def test_concurrent_tasks_killed_mid_gather_find_their_steps_by_task(
    name: str, window: str, nth: int, client: Client, worker: WorkerFactory,
    reconciler: ReconcilerFactory, tmp_path: Path, openai_server: OpenAIServer,
) -> None:
    """SIGKILL while an entrypoint's concurrent tasks (each a model request, taken as one
    parallel decision) are in flight, at ``window`` of the ``nth`` request: executed again,
    the tasks ask in whatever order they get to, each finds its recorded request by its
    task, the group the crash left open is taken again in its recorded order, and the run
    ends with LangGraph's result: no nondeterminism, no recorded request sent again."""
    run = client.start(f"lg_{name}", {"input": BEHAVIOURS[name].input},
                       run_id=f"lgg-{name}-{window[6:9]}").run_id
    doomed = worker(hooks=[f"tests.servers.kills:KillAtCall={window}:lg_{name}.model:{nth}"])
    assert doomed.wait(60) == -signal.SIGKILL
    worker()
    reconciler()
    final = drive(client, {run: name})[run]
    result, thread = asyncio.run(reference(name))
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result == result
    assert resent_after_recorded(client, run, openai_server) == []
    ran, once = counts(tmp_path, run), counts(tmp_path, thread)
    assert all(once[k] <= ran[k] <= 2 * once[k] for k in once), (ran, once)
    assert verify(client.log, run).ok
