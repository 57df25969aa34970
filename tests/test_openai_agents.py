"""The OpenAI Agents SDK integration: unchanged SDK agents run as durable runs, their model
requests, tool calls and handoffs steps of the log (``durable.integrations.openai_agents``).

Real worker processes, SIGKILLed for real; the models are the SDK's
``OpenAIChatCompletionsModel`` against a local OpenAI-compatible HTTP server started by the
test, which records every request with its ``Idempotency-Key``; the tools write their effects
into a SQLite database that never deduplicates (``TEST_DB_DEDUPE=0``): a model request sent
again or an effect applied twice would show.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, function_tool

from durable.agents import is_placeholder, registry
from durable.audit.verify import verify
from durable.client import Client
from durable.integrations import openai_agents as integration
from durable.log import events as ev
from durable.streams.streaming import Partial
from durable.testing import wait_for
from tests.agents import openai_agents as oai
from tests.agents.basic import applications
from tests.conftest import ApproverFactory, ReconcilerFactory, WorkerFactory
from tests.servers.integration_world import decided
from tests.servers.openai import OpenAIServer, resent_after_recorded

pytestmark = pytest.mark.usefixtures("openai_env")


def _effects(tmp_path: Path) -> dict[str, int]:
    return applications(str(tmp_path / "world.sqlite"))


BOOKER_STEPS = ["oai_booker.model", "oai_booker.handoff", "oai_booker.model",
                "oai_booker.tool.book", "oai_booker.model", "oai_booker.tool.book",
                "oai_booker.tool.note", "oai_booker.model"]
#: The steps of a booker run that are model requests.
BOOKER_MODEL_STEPS = (1, 3, 5, 8)


def test_an_agent_runs_as_a_durable_run_with_a_handoff(
    client: Client, worker: WorkerFactory, tmp_path: Path, openai_server: OpenAIServer
) -> None:
    run = client.start("oai_booker", {"input": "book slots 1 and 2"}, run_id="ob").run_id
    worker(burst=True).wait(60)
    state = client.status(run)
    assert state.state == "completed", (state.state, state.reason, state.error)
    assert state.result == "booked: slot 1, slot 2"
    steps = decided(client, run)
    assert [s.tool for s in steps] == BOOKER_STEPS
    assert steps[1].args == {"to": "booker", "tool": "transfer_to_booker", "arguments": "{}"}
    assert state.actions[2].result == {"agent": "booker"}  # the handoff, recorded by name
    models = [s for s in steps if s.tool == "oai_booker.model"]
    assert all(s.model and is_placeholder(s.args) for s in models)  # digest, not the chat
    assert steps[3].args == {"call_id": "call_1_book", "arguments": {"slot": 1}}
    # The second reply's two tool calls were one parallel decision.
    assert steps[5].group == steps[6].group == 6
    assert state.model_calls == 4 and state.tokens == 4 * 10  # usage counted: budgets work
    # Each model request went out once, with its step's idempotency key, streamed.
    assert openai_server.counts(run) == {f"{run}:{n}": 1 for n in BOOKER_MODEL_STEPS}
    assert all(r["stream"] for r in openai_server.requests)
    assert _effects(tmp_path) == {f"{run}:4": 1, f"{run}:6": 1}
    # The tools saw their step's key; the note's result went back to the model as recorded.
    assert state.actions[7].result == {"return": f"noted two ({run}:7)"}
    assert verify(client.log, run).ok


@pytest.mark.parametrize(("window", "step"), [
    ("after_effect", 4),    # after the booking's effect, before its outcome: lookup
    ("after_effect", 2),    # after the handoff ran, before it was recorded
    ("after_effect", 3),    # after a model reply arrived, before it was recorded
    ("after_outcome", 6),   # after one of two parallel calls was recorded
])
def test_a_killed_run_resumes_without_resending_requests_or_repeating_effects(
    window: str, step: int, client: Client, worker: WorkerFactory,
    reconciler: ReconcilerFactory, tmp_path: Path, openai_server: OpenAIServer,
) -> None:
    """SIGKILL at step ``step``'s ``window``; another worker re-executes the agent: every
    recorded model reply, handoff and tool result comes back from the log, so no recorded
    request is sent again and no effect is applied twice."""
    run = client.start("oai_booker", {"input": "book"}, run_id=f"obk{step}{window[6]}").run_id
    doomed = worker(kill_at=f"{window}:{step}")
    assert doomed.wait(30) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result == "booked: slot 1, slot 2"
    assert [s.tool for s in decided(client, run)] == BOOKER_STEPS
    requests = openai_server.counts(f"{run}:")
    assert set(requests) == {f"{run}:{n}" for n in BOOKER_MODEL_STEPS}
    assert resent_after_recorded(client, run, openai_server) == []
    if step in BOOKER_MODEL_STEPS:  # the reply that arrived was never recorded: sent again
        assert requests[f"{run}:{step}"] >= 2
    assert _effects(tmp_path) == {f"{run}:4": 1, f"{run}:6": 1}
    assert verify(client.log, run).ok


def _waiting_approval(client: Client, worker: WorkerFactory, run: str) -> str:
    worker()
    state = client.wait(run, 30)
    assert state.state == "waiting_approval", (state.state, state.reason, state.error)
    (request,) = [a.request for a in state.approvals.values() if a.decision is None]
    assert state.approvals[request].role == "finance"
    return request


def test_a_tool_that_needs_approval_waits_for_a_signed_decision(
    client: Client, worker: WorkerFactory, tmp_path: Path, approver: ApproverFactory,
    openai_server: OpenAIServer,
) -> None:
    alice = approver("alice", "finance")
    run = client.start("oai_refunder", {"input": "refund A1"}, run_id="or").run_id
    request = _waiting_approval(client, worker, run)
    waits = [e.event for e in client.events(run) if isinstance(e.event, ev.WaitEntered)]
    assert waits[-1].data == {"tool": "oai_refunder.tool.refund", "args": {
        "call_id": "call_1_refund", "arguments": {"order": "A1", "cents": 500}}}
    assert _effects(tmp_path) == {}  # nothing before the decision
    client.sign_and_approve(run, request, "approve", "alice", alice)
    final = client.wait(run, 30)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result == "refunded: refund A1 500"
    assert _effects(tmp_path) == {f"{run}:2": 1}
    # Re-executed after the wait: the first model request was not sent again.
    assert openai_server.counts(run) == {f"{run}:1": 1, f"{run}:3": 1}
    assert verify(client.log, run).ok


def test_an_approved_call_killed_after_its_effect_is_applied_once(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path,
    approver: ApproverFactory, openai_server: OpenAIServer,
) -> None:
    """SIGKILL after the approved refund's effect, before its outcome is recorded: the
    lookup finds it applied; it is not applied again, and no request is sent again."""
    alice = approver("alice", "finance")
    run = client.start("oai_refunder", {"input": "refund A1"}, run_id="ork").run_id
    doomed = worker(kill_at="after_effect:2")
    state = client.wait(run, 30)
    assert state.state == "waiting_approval", (state.state, state.reason)
    (request,) = [a.request for a in state.approvals.values() if a.decision is None]
    client.sign_and_approve(run, request, "approve", "alice", alice)
    assert doomed.wait(30) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result == "refunded: refund A1 500"
    assert _effects(tmp_path) == {f"{run}:2": 1}
    assert set(openai_server.counts(f"{run}:")) == {f"{run}:1", f"{run}:3"}
    assert resent_after_recorded(client, run, openai_server) == []
    assert verify(client.log, run).ok


def test_a_rejected_call_is_told_to_the_model_as_not_approved(
    client: Client, worker: WorkerFactory, tmp_path: Path, approver: ApproverFactory
) -> None:
    alice = approver("alice", "finance")
    run = client.start("oai_refunder", {"input": "refund A1"}, run_id="orx").run_id
    request = _waiting_approval(client, worker, run)
    client.sign_and_approve(run, request, "reject", "alice", alice, note="not this one")
    final = client.wait(run, 30)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result.startswith("not refunded: Tool execution was not approved.")
    assert _effects(tmp_path) == {}


def test_a_callable_needs_approval_holds_back_only_the_calls_it_names(
    client: Client, worker: WorkerFactory, tmp_path: Path, approver: ApproverFactory
) -> None:
    alice = approver("alice", "finance")
    run = client.start("oai_small_refunder", {"input": "refund"}, run_id="osr").run_id
    request = _waiting_approval(client, worker, run)
    assert _effects(tmp_path) == {f"{run}:2": 1}  # 50 cents: no approval needed
    client.sign_and_approve(run, request, "approve", "alice", alice)
    final = client.wait(run, 30)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result == "refunded: refund A1 50, refund A1 500"
    assert [s.tool for s in decided(client, run)] == [
        "oai_small_refunder.model", "oai_small_refunder.tool.small_refund",
        "oai_small_refunder.model", "oai_small_refunder.tool.small_refund.approval",
        "oai_small_refunder.model"]
    assert _effects(tmp_path) == {f"{run}:2": 1, f"{run}:4": 1}


def test_a_conversation_continues_in_a_new_run_from_the_items_returned(
    client: Client, worker: WorkerFactory, openai_server: OpenAIServer
) -> None:
    first = client.start("oai_chat", {"input": "a story"}, run_id="oca").run_id
    worker(burst=True).wait(60)
    done = client.status(first)
    assert done.state == "completed", (done.state, done.reason, done.error)
    items = done.result["items"]
    assert done.result["last_agent"] == "storyteller"
    assert [i.get("role") for i in items] == ["user", "assistant"]
    second = client.start("oai_chat", {"input": [*items, {"role": "user", "content": "more"}]},
                          run_id="ocb").run_id
    worker(burst=True).wait(60)
    assert client.status(second).state == "completed"
    (request,) = [r for r in openai_server.requests if r["key"] == f"{second}:1"]
    sent = [(m["role"], m.get("content")) for m in request["body"]["messages"]]
    assert sent[1] == ("user", "a story") and sent[-1] == ("user", "more")
    assert sent[2][0] == "assistant"  # the earlier answer went back to the model


def test_a_tool_whose_reply_was_lost_is_resolved_by_its_lookup(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path
) -> None:
    """The tool applied its effect and raised ``OutcomeUnknown``: the SDK's error handling
    would tell the model it failed (and the model call it again, a second booking); the step
    is left unknown instead, and its lookup finds the booking once its deadline passed."""
    run = client.start("oai_lossy", {"input": "book"}, run_id="ol").run_id
    worker()
    reconciler()
    final = client.wait(run, 60, waiting=False)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result == "booked: slot 1"
    assert _effects(tmp_path) == {f"{run}:2": 1}
    types = [e.event.__struct_config__.tag for e in client.events(run) if e.event is not None]
    assert "action_reconciled" in types
    assert [s.tool for s in decided(client, run)] == [
        "oai_lossy.model", "oai_lossy.tool.lossy_book", "oai_lossy.model"]


def test_a_run_goes_past_the_sdks_default_turn_limit(
    client: Client, worker: WorkerFactory, openai_server: OpenAIServer
) -> None:
    """The SDK stops at 10 turns by default; a durable run has no hidden ceiling."""
    run = client.start("oai_counter", {"input": "count"}, run_id="oc").run_id
    worker(burst=True).wait(120)
    state = client.status(run)
    assert state.state == "completed", (state.state, state.reason, state.error)
    assert state.result == "counted 15"
    assert state.model_calls == 16
    assert not any(r["stream"] for r in openai_server.requests)  # stream=False


def test_the_model_calls_budget_ends_the_run_budget_exhausted(
    client: Client, worker: WorkerFactory, openai_server: OpenAIServer
) -> None:
    run = client.start("oai_short", {"input": "count"}, run_id="os").run_id
    worker(burst=True).wait(60)
    state = client.status(run)
    assert (state.state, state.reason) == ("failed", "budget_exhausted")
    assert state.model_calls == 4
    assert len(openai_server.counts(run)) == 4


def test_a_follower_receives_the_streamed_text_as_it_is_generated(
    client: Client, worker: WorkerFactory, openai_server: OpenAIServer
) -> None:
    openai_server.delta_delay_s = 0.02
    run = client.start("oai_storyteller", {"input": "a story"}, run_id="ost").run_id
    deltas: list[str] = []
    with client.follow(run) as follower:
        ready = threading.Event()

        def read() -> None:
            for item in follower:
                ready.set()
                if isinstance(item, Partial) and isinstance(item.data, dict):
                    deltas.append(item.data["delta"])

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert ready.wait(10)  # the follower reads the log (run_started) before any token
        worker()
        reader.join(60)
    final = client.status(run)
    assert final.state == "completed"
    assert "".join(deltas) == final.result == " ".join(f"word{i}" for i in range(40))


def test_a_child_tool_runs_the_other_agent_as_a_child_run(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
    openai_server: OpenAIServer,
) -> None:
    """SIGKILL after the child's start, before it is recorded: the caller is executed again
    and starts the same child once (its id derives from the caller's run and step)."""
    run = client.start("oai_manager", {"input": "get a story"}, run_id="om").run_id
    doomed = worker(kill_at="after_effect:2")
    assert doomed.wait(30) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=60, waiting=False)
    assert final.state == "completed", (final.state, final.reason, final.error)
    story = " ".join(f"word{i}" for i in range(40))
    assert final.result == f"the story: {story}"
    assert [s.tool for s in decided(client, run)] == ["oai_manager.model", "durable.child",
                                                    "oai_manager.model"]
    (child,) = final.children
    assert client.status(child).result == story
    assert client.status(child).parent == run
    assert set(openai_server.counts(f"{run}:")) == {f"{run}:1", f"{run}:3"}
    assert set(openai_server.counts(f"{child}:")) == {f"{child}:1"}
    assert resent_after_recorded(client, run, openai_server) == []
    assert resent_after_recorded(client, child, openai_server) == []
    assert verify(client.log, run).ok and verify(client.log, child).ok


def test_the_sdks_turn_limit_fails_the_run_with_its_message(
    client: Client, worker: WorkerFactory
) -> None:
    run = client.start("oai_turns", {"input": "count"}, run_id="ot").run_id
    worker(burst=True).wait(60)
    state = client.status(run)
    assert state.state == "failed", (state.state, state.reason, state.error)
    assert "MaxTurnsExceeded" in (state.error or "")
    assert state.model_calls == 3


def test_a_cancel_stops_a_streaming_model_request(
    client: Client, worker: WorkerFactory, openai_server: OpenAIServer
) -> None:
    """The model step is cancellable: a cancel cancels the streamed request on the steps'
    event loop, and the run ends canceled long before the stream would end."""
    openai_server.delta_delay_s = 1.0  # 40 words: 40 s
    run = client.start("oai_storyteller", {"input": "a story"}, run_id="osc").run_id
    worker()
    assert wait_for(lambda: openai_server.counts(run) != {}, 15)
    client.cancel(run, "user changed their mind")
    final = client.wait(run, timeout=10)
    assert final.state == "canceled"
    types = [e.event.__struct_config__.tag for e in client.events(run) if e.event is not None]
    assert types[-3:] == ["cancel_requested", "call_canceled", "canceled"]


@pytest.mark.parametrize(("status", "state", "sent"), [
    (503, "completed", 2),   # the provider said to come back: retried, with the same key
    (400, "failed", 1),      # a bad request: never sent again
])
def test_a_model_error_is_retried_only_when_the_provider_says_so(
    status: int, state: str, sent: int, client: Client, worker: WorkerFactory,
    openai_server: OpenAIServer,
) -> None:
    openai_server.faults.append(status)
    run = client.start("oai_storyteller", {"input": "a story"}, run_id=f"oe{status}").run_id
    worker(burst=True).wait(60)
    final = client.status(run)
    assert final.state == state, (final.state, final.reason, final.error)
    assert openai_server.counts(f"{run}:") == {f"{run}:1": sent}


# In-process: the recorded JSON, and what construction refuses.


def test_a_model_response_round_trips_through_its_recorded_json() -> None:
    from agents import ModelResponse, Usage
    from openai.types.responses import ResponseFunctionToolCall

    from durable.integrations.openai_agents import model, tools

    call = ResponseFunctionToolCall(type="function_call", call_id="c1", name="book",
                                    arguments='{"slot": 1}')
    response = ModelResponse(output=[call], usage=Usage(requests=1, input_tokens=2,
                                                        output_tokens=3, total_tokens=5),
                             response_id="r1")
    back = model.decode_response(model.encode_response(response))
    assert back.output == [call] and back.response_id == "r1"
    assert back.usage.total_tokens == 5
    assert tools.decode_output(tools.encode_output({"a": [1]})) == {"a": [1]}
    assert tools.decode_output(tools.encode_output(Path("x"))) == "x"
    with pytest.raises(TypeError):
        model.decode_response({"nope": 1})


def test_step_context_outside_a_step_says_so() -> None:
    with pytest.raises(LookupError):
        integration.step_context()


def test_construction_refuses_what_it_cannot_make_durable() -> None:
    from agents.run_config import RunConfig

    def tool(name: str) -> Any:
        def fn() -> str:
            return name

        return function_tool(fn, name_override="same")

    with pytest.raises(ValueError, match="unknown tools"):
        integration.DurableAgent(Agent(name="a"), name="oai_typo",
                                 tools={"nope": integration.StepOptions()})
    with pytest.raises(ValueError, match="two different tools"):
        integration.DurableAgent(Agent(name="a", tools=[tool("x"), tool("y")]), name="oai_dup")
    twin = Agent(name="a")
    with pytest.raises(ValueError, match="two different agents"):
        integration.DurableAgent(Agent(name="a", handoffs=[twin]), name="oai_twin")
    with pytest.raises(ValueError, match=r"run_config\.model"):
        integration.DurableAgent(Agent(name="a"), name="oai_cfg",
                                 run_config=RunConfig(model="gpt-x"))
    assert not [n for n in [*registry.agents, *registry.tools]
                if n.startswith(("oai_typo", "oai_dup", "oai_twin", "oai_cfg"))]
    # The agents themselves are unchanged: the durable clones are other objects.
    assert oai.triage.handoffs == [oai.booker]
    assert oai.refund.needs_approval is True
