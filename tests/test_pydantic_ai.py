"""The pydantic-ai integration: an unchanged pydantic-ai ``Agent`` run as a durable run, its
model requests and tool calls steps of the log (``durable.integrations.pydantic_ai``).

Real worker processes, SIGKILLed for real; the models are pydantic-ai ``FunctionModel``s
that count their requests per idempotency key in a SQLite file, and the tools write their
effects into a SQLite database that never deduplicates (``TEST_DB_DEDUPE=0``): a model
request sent again or an effect applied twice would show.
"""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import FunctionToolset

from durable.agents import is_placeholder, registry
from durable.audit.replay import check_determinism, import_log
from durable.audit.verify import verify
from durable.client import Client
from durable.integrations import pydantic_ai as integration
from durable.integrations.pydantic_ai import compat
from durable.log import events as ev
from durable.settings import Settings
from durable.testing import wait_for
from tests.agents import pydantic_ai as pai_agents
from tests.agents.basic import applications, model_requests
from tests.conftest import ApproverFactory, ReconcilerFactory, WorkerFactory
from tests.runs import types_of
from tests.servers.integration_world import decided, set_env

AGENTS = "examples.agents,tests.agents.basic,tests.agents.pydantic_ai"


@pytest.fixture(autouse=True)
def _env(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_env(monkeypatch, tmp_path, AGENTS)


def _model_requests(tmp_path: Path) -> dict[str, int]:
    return model_requests(str(tmp_path / "model.sqlite"))



BOOKER_STEPS = ["pai_booker.model", "pai_booker.tool.book", "pai_booker.model",
                "pai_booker.tool.book", "pai_booker.tool.note", "pai_booker.model"]


def test_an_agent_runs_as_a_durable_run_its_requests_and_calls_steps(
    client: Client, worker: WorkerFactory, tmp_path: Path
) -> None:
    run = client.start("pai_booker", {"prompt": "book slots 1 and 2"}, run_id="pb").run_id
    worker(burst=True).wait(60)
    state = client.status(run)
    assert state.state == "completed", (state.state, state.reason)
    assert state.result == "booked: slot 1, slot 2"
    steps = decided(client, run)
    assert [s.tool for s in steps] == BOOKER_STEPS  # two calls of one response: in order
    models = [s for s in steps if s.tool == "pai_booker.model"]
    assert all(s.model and is_placeholder(s.args) for s in models)  # digest, not the chat
    assert steps[1].args == {"slot": 1} and steps[4].args == {"text": "two"}
    assert state.model_calls == 3 and state.tokens == 3 * 10  # usage counted: budgets work
    assert _model_requests(tmp_path) == {f"{run}:{n}": 1 for n in (1, 3, 6)}
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:2": 1, f"{run}:4": 1}
    # The tools saw their step's idempotency key; the model saw the tools' results.
    note = state.actions[5].result
    assert note == {"result": f"noted two ({run}:5)", "kind": "tool_return"}
    assert verify(client.log, run).ok


@pytest.mark.parametrize(("step", "repeated"), [
    (4, {}),             # after a tool's effect, before its outcome: resolved by lookup
    (3, {3: 2}),         # after a model request returned: effect-free, sent again once
])
def test_a_killed_run_resumes_without_repeating_requests_or_effects(
    step: int, repeated: dict[int, int], client: Client, worker: WorkerFactory,
    reconciler: ReconcilerFactory, tmp_path: Path,
) -> None:
    """SIGKILL at step ``step``'s after-effect window; another worker re-executes the agent:
    the recorded model responses and tool results come back from the log."""
    run = client.start("pai_booker", {"prompt": "book"}, run_id=f"pbk{step}").run_id
    doomed = worker(kill_at=f"after_effect:{step}")
    assert doomed.wait(30) == -signal.SIGKILL
    # Steps 4 and 5 (two tool calls of one reply) are one parallel group: decided together.
    assert client.status(run).step == {4: 5}.get(step, step)
    worker()
    reconciler()
    final = client.wait(run, timeout=60)
    assert final.state == "completed", (final.state, final.reason)
    assert final.result == "booked: slot 1, slot 2"
    assert [s.tool for s in decided(client, run)] == BOOKER_STEPS
    requests = _model_requests(tmp_path)
    assert requests == {f"{run}:{n}": repeated.get(n, 1) for n in (1, 3, 6)}
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:2": 1, f"{run}:4": 1}
    assert verify(client.log, run).ok


def test_a_cancel_stops_a_model_request_in_flight(
    client: Client, worker: WorkerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model step is cancellable: a cancel cancels the request's coroutine on the
    steps' event loop, and the run ends canceled long before the request would return."""
    monkeypatch.setenv("TEST_MODEL_SLOW_S", "30")
    run = client.start("pai_booker", {"prompt": "book"}, run_id="pbc").run_id
    worker()
    # A worker's start (importing pydantic-ai) takes seconds on a loaded machine.
    assert wait_for(lambda: _model_requests(tmp_path) != {}, 60)
    client.cancel(run, "user changed their mind")
    final = client.wait(run, timeout=10)
    assert final.state == "canceled"
    types = types_of(client, run)
    assert types[-3:] == ["cancel_requested", "call_canceled", "canceled"]
    assert applications(str(tmp_path / "world.sqlite")) == {}
    assert verify(client.log, run).ok


def _request_starts(tmp_path: Path) -> dict[str, float]:
    """When the model began each request, by the step's idempotency key."""
    conn = sqlite3.connect(tmp_path / "model.sqlite")
    try:
        return dict(conn.execute("SELECT key, MIN(at) FROM requests GROUP BY key").fetchall())
    finally:
        conn.close()


def test_model_requests_in_flight_hold_no_thread_of_the_worker(
    client: Client, worker: WorkerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step of a pydantic-ai agent is a task on the worker's event loop, as an ``async
    def`` tool's call is: 24 runs whose model takes 2 s have their first requests in flight
    together on a worker that gives sync user code at most 2 threads
    (``DURABLE_USER_THREADS``). When each step waited on a thread for its coroutine (on a
    loop of the integration's own), 2 at most were: the requests' starts show which."""
    monkeypatch.setenv("TEST_MODEL_SLOW_S", "2")
    runs = [s.run_id for s in client.start_many("pai_booker", [{"prompt": "book"}] * 24)]
    worker(DURABLE_USER_THREADS="2")
    for run in runs:
        final = client.wait(run, timeout=120)
        assert final.state == "completed", (run, final.state, final.reason)
    starts = _request_starts(tmp_path)
    firsts = sorted(starts[f"{run}:1"] for run in runs)
    together = max(sum(1 for t in firsts if s <= t < s + 1.5) for s in firsts)
    assert together >= 12, firsts
    assert applications(str(tmp_path / "world.sqlite")) == \
        {f"{run}:{n}": 1 for run in runs for n in (2, 4)}


def _waiting_approval(client: Client, worker: WorkerFactory, run: str) -> str:
    worker()
    state = client.wait(run, 30)
    assert state.state == "waiting_approval", (state.state, state.reason)
    (request,) = [a.request for a in state.approvals.values() if a.decision is None]
    assert state.approvals[request].role == "finance"
    return request


def test_a_tool_requiring_approval_waits_for_the_approver(
    client: Client, worker: WorkerFactory, tmp_path: Path, approver: ApproverFactory
) -> None:
    alice = approver("alice", "finance")
    run = client.start("pai_refunder", {"prompt": "refund A1"}, run_id="pr").run_id
    request = _waiting_approval(client, worker, run)
    waits = [e.event for e in client.events(run) if isinstance(e.event, ev.WaitEntered)]
    assert waits[-1].data == {"tool": "pai_refunder.tool.refund",
                              "args": {"order": "A1", "cents": 500}}  # what the approver sees
    assert applications(str(tmp_path / "world.sqlite")) == {}  # nothing before the decision
    client.sign_and_approve(run, request, "approve", "alice", alice)
    final = client.wait(run, 30)
    assert final.state == "completed", (final.state, final.reason)
    assert final.result == "refunded: refund A1 500"
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:2": 1}
    # Re-executed after the wait: the first model request was not sent again.
    assert _model_requests(tmp_path) == {f"{run}:1": 1, f"{run}:3": 1}
    assert verify(client.log, run).ok


def test_a_rejected_tool_call_is_told_to_the_model_as_denied(
    client: Client, worker: WorkerFactory, tmp_path: Path, approver: ApproverFactory
) -> None:
    alice = approver("alice", "finance")
    run = client.start("pai_refunder", {"prompt": "refund A1"}, run_id="prx").run_id
    request = _waiting_approval(client, worker, run)
    client.sign_and_approve(run, request, "reject", "alice", alice, note="not this one")
    final = client.wait(run, 30)
    assert final.state == "completed", (final.state, final.reason)
    assert final.result == "not refunded: The tool call was denied: rejected by alice."
    assert applications(str(tmp_path / "world.sqlite")) == {}


def test_a_conversation_continues_from_its_message_history(
    client: Client, worker: WorkerFactory
) -> None:
    """``return_messages``-style continuation: the next run's input carries the history."""
    from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart

    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("earlier question")])]
    inp = integration.DurableAgent.prompt_input("book", history)
    assert inp["message_history"][0]["parts"][0]["content"] == "earlier question"
    run = client.start("pai_booker", inp, run_id="pbh").run_id
    worker(burst=True).wait(60)
    assert client.status(run).result == "booked: slot 1, slot 2"


# In-process: the wire format of a tool step's outcome, and what construction refuses.


def test_a_tool_steps_record_of_an_earlier_release_is_read_as_the_base_records_it() -> None:
    """Tool steps recorded before the integration stood on pydantic-ai's base
    (``{"return": ...}``, ``{"retry": ...}``...) are read as the ``CallToolResult`` the
    base records now: a run recorded then goes on after an upgrade. Each is a value
    pydantic-ai decodes as the same kind of outcome."""
    from pydantic_ai.durable_exec import JSON_CODEC, CallToolResult, ToolsetCallToolId

    op = ToolsetCallToolId("function", toolset_id="<agent>")
    earlier = [({"return": {"a": [1, 2]}}, "tool_return"),
               ({"tool_return": {"return_value": 3, "content": "c", "kind": "tool-return"}},
                "tool_return"),
               ({"retry": "again"}, "model_retry"), ({"failed": "gone"}, "tool_failed"),
               ({"approval_required": {"why": 1}}, "approval_required"),
               ({"deferred": {"job": 2}, "kind": "external"}, "call_deferred")]
    for old, kind in earlier:
        now = compat.payload(op, old)
        assert now["kind"] == kind, old
        again = JSON_CODEC.dump(CallToolResult, JSON_CODEC.load(CallToolResult, now))
        assert again["kind"] == kind, (old, again)
    first = JSON_CODEC.load(CallToolResult, compat.payload(op, earlier[0][0]))
    assert JSON_CODEC.dump(CallToolResult, first)["result"] == {"a": [1, 2]}
    assert compat.payload(op, {"result": 1, "kind": "tool_return"}) == {
        "result": 1, "kind": "tool_return"}  # what the base records: as it is


def test_step_context_outside_a_step_says_so() -> None:
    with pytest.raises(LookupError):
        integration.step_context()


def test_construction_refuses_what_it_cannot_make_durable() -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    with pytest.raises(ValueError, match="unknown tools"):
        integration.DurableAgent(Agent(TestModel()), name="pai_typo",
                                 tools={"nope": integration.StepOptions()})
    anonymous = FunctionToolset([lambda: 1])
    with pytest.raises(ValueError, match="needs an id"):
        integration.DurableAgent(Agent(TestModel(), toolsets=[anonymous]), name="pai_anon")
    assert not [n for n in [*registry.agents, *registry.tools] if n.startswith(("pai_typo",
                                                                              "pai_anon"))]
    assert pai_agents.booker.name == "pai_booker"  # the agent itself is unchanged


# A run recorded by the release before the integration stood on pydantic-ai's base.

PREVIOUS = Path(__file__).parent / "fixtures" / "pydantic_ai" / "pai_booker_previous.jsonl"
#: Its run id (a request's identity holds the run's id and the conversation's, drawn from it).
RECORDED = "fx-pai-booker"


def _previous() -> list[dict[str, Any]]:
    """``pai_booker``'s run as the previous release recorded it (b9b0309, tool steps as
    ``{"return": ...}``): kept, never recorded again."""
    return [msgspec.json.decode(line) for line in PREVIOUS.read_bytes().splitlines() if line]


def test_a_run_the_previous_release_recorded_replays_unchanged(client: Client) -> None:
    """Every step of the recorded run is decided the same by this release's agent, from the
    same outcomes: its steps' names and arguments (a model request's digest) are those of
    then, and the records of then are read."""
    import_log(client.log, RECORDED, _previous())
    assert verify(client.log, RECORDED).ok
    assert check_determinism(client.log, RECORDED, registry.agent("pai_booker")) == 5


def test_a_run_the_previous_release_left_in_flight_goes_on(
    client: Client, worker: WorkerFactory, tmp_path: Path
) -> None:
    """The run as the previous release had recorded it up to its first booking's outcome
    (step 2), then a worker of this release: it reads the recorded request and booking back
    (neither is sent again) and goes on to the end."""
    events = _previous()
    cut = [i for i, e in enumerate(events) if e["type"] == "action_succeeded"][1] + 1
    import_log(client.log, RECORDED, events[:cut])
    client.enqueue(RECORDED)
    worker(burst=True).wait(60)
    final = client.status(RECORDED)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result == "booked: slot 1, slot 2"
    assert _model_requests(tmp_path) == {f"{RECORDED}:3": 1, f"{RECORDED}:6": 1}
    assert applications(str(tmp_path / "world.sqlite")) == {f"{RECORDED}:4": 1}
    assert verify(client.log, RECORDED).ok
