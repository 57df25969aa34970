"""The pydantic-ai capability's parity with its peers (pydantic-ai's Temporal, DBOS and Prefect
durability): no hidden request ceiling, every outcome a state, MCP servers pinned per run.

Real worker processes (SIGKILLed for real), a real MCP stdio server (``tests.servers.mcp``)
writing its effects into a SQLite file that never deduplicates (``TEST_DB_DEDUPE=0``).
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("mcp")

from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.models.test import TestModel

from durable.agents import registry
from durable.audit.verify import verify
from durable.client import Client
from durable.integrations.pydantic_ai import DurableAgent, RedisDurability
from durable.log import events as ev
from durable.settings import Settings
from durable.streams.streaming import Partial
from examples.world import WorldProcess
from tests.agents import mcp_code
from tests.agents import pydantic_ai_long as long_agents
from tests.agents.basic import applications, model_requests
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.servers.integration_world import decided, set_env

AGENTS = ("examples.agents,tests.agents.basic,tests.agents.pydantic_ai,"
          "tests.agents.pydantic_ai_long,tests.agents.mcp_code")


@pytest.fixture(autouse=True)
def _env(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_env(monkeypatch, tmp_path, AGENTS)


def _tools(client: Client, run: str) -> list[str]:
    return [s.tool for s in decided(client, run)]


def test_a_hundred_model_requests_complete_across_a_kill_at_the_sixtieth(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path
) -> None:
    """pydantic-ai's default ``request_limit=50`` does not apply (the run's budgets do): 100
    model requests in one run. SIGKILL after the 60th request was answered (step 119),
    before its response was recorded: that request alone is sent again (effect-free, never
    recorded); no recorded request is re-sent and each of the 99 effects is applied once."""
    run = client.start("pai_long", {"prompt": "count"}, run_id="plong").run_id
    doomed = worker(kill_at="after_effect:119")
    assert doomed.wait(240) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=300)
    assert final.state == "completed", (final.state, final.reason)
    assert final.result == f"ticked {long_agents.LONG_CALLS}"
    requests = model_requests(str(tmp_path / "model.sqlite"))
    assert requests == {f"{run}:{2 * k - 1}": 2 if k == 60 else 1 for k in range(1, 101)}
    assert applications(str(tmp_path / "world.sqlite")) == {
        f"{run}:{2 * k}": 1 for k in range(1, 100)}
    # Every request sent is paid for and counted: the 60th twice.
    assert final.model_calls == sum(requests.values()) == 101
    assert verify(client.log, run).ok


def test_a_usage_limit_of_the_input_ends_the_run_failed_budget_exhausted(
    client: Client, worker: WorkerFactory
) -> None:
    run = client.start("pai_long", {"prompt": "count", "usage_limits": {"request_limit": 3}},
                       run_id="plimit").run_id
    worker()
    final = client.wait(run, timeout=60)
    assert final.state == "failed", (final.state, final.reason)
    failed = [e.event for e in client.events(run) if isinstance(e.event, ev.Failed)]
    assert failed[-1].reason == "budget_exhausted" and "request_limit" in failed[-1].error
    assert final.model_calls == 3


def test_a_bad_input_is_refused_at_start(client: Client) -> None:
    from durable.errors import InvalidInput

    with pytest.raises(InvalidInput):
        client.start("pai_long", {"prompt": "x", "usage_limits": {"request_limit": "many"}})
    with pytest.raises(InvalidInput):
        client.start("pai_long", {"prompt": [{"kind": "no-such-part"}]})


def test_a_tool_that_cancels_its_run_ends_it_canceled(client: Client,
                                                      worker: WorkerFactory) -> None:
    """``RunContext.cancel()`` in a tool (pydantic-ai's ``RunCancelled``): ``canceled``."""
    run = client.start("pai_quitter", {"prompt": "try"}, run_id="pquit").run_id
    worker()
    final = client.wait(run, timeout=60)
    assert final.state == "canceled", (final.state, final.reason)
    assert verify(client.log, run).ok


def test_mcp_calls_are_steps_applied_once_across_a_kill_the_tool_list_recorded_once(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path
) -> None:
    """SIGKILL after the 10th ``apply`` reached the MCP server (step 21), before its outcome
    was recorded: the call is resolved by its lookup (the server's database has its key);
    the recovered run reads its tool list from the log, and sends no recorded call again."""
    run = client.start("pai_mcp", {"prompt": "apply"}, run_id="pmcp").run_id
    doomed = worker(kill_at="after_effect:21")
    assert doomed.wait(90) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=180)
    assert final.state == "completed", (final.state, final.reason)
    assert final.result == f"applied {long_agents.MCP_CALLS}, peeked {long_agents.MCP_CALLS}"
    tools = _tools(client, run)
    assert tools.count("pai_mcp.mcp.ledger.tools") == 1  # pinned: recorded once per run
    assert tools.count("pai_mcp.mcp.ledger.call") == long_agents.MCP_CALLS
    assert tools.count("pai_mcp.mcp.ledger.read") == 1  # readOnlyHint: effect-free
    calls = [n for n, t in enumerate(tools, 1) if t == "pai_mcp.mcp.ledger.call"]
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:{n}": 1 for n in calls}
    assert verify(client.log, run).ok


# In-process: what registration refuses.


def test_a_taken_name_and_a_shared_toolset_id_are_refused() -> None:
    with pytest.raises(ValueError, match="registered already"):
        DurableAgent(Agent(TestModel()), name="pai_long")
    one, two = FunctionToolset([lambda: 1], id="same"), FunctionToolset([lambda: 2], id="same")
    with pytest.raises(ValueError, match="two toolsets have the id 'same'"):
        DurableAgent(Agent(TestModel(), toolsets=[one, two]), name="pai_twice")
    assert not [n for n in [*registry.agents, *registry.tools] if n.startswith("pai_twice")]
    with pytest.raises(ValueError, match="attached to another agent"):
        shared = RedisDurability(name="pai_shared")
        Agent(TestModel(), capabilities=[shared])
        Agent(TestModel(), capabilities=[shared])


def test_a_broad_model_retryable_never_retries_pydantic_ais_own_refusals() -> None:
    from pydantic_ai.exceptions import UsageLimitExceeded, UserError

    from durable.integrations.pydantic_ai.steps import retryable_but_not_usage

    (retryable,) = retryable_but_not_usage((Exception,))
    assert isinstance(ConnectionError("reset"), retryable)
    assert not isinstance(UserError("bad settings"), retryable)
    assert not isinstance(UsageLimitExceeded("limit"), retryable)
    assert retryable_but_not_usage(()) == ()


def test_a_model_request_carries_the_steps_key_and_a_timeout_within_its_deadline() -> None:
    import time

    from durable.agents import ToolContext
    from durable.agents.cancel_token import CancelToken
    from durable.integrations.pydantic_ai.model import downstream

    ctx = ToolContext(run_id="r", step=3, key="r:3", deadline_ms=int(time.time() * 1000) + 5000,
                      token=CancelToken())
    settings = downstream({"timeout": 600.0, "extra_headers": {"X-A": "1"}}, ctx)
    assert settings["extra_headers"] == {"X-A": "1", "Idempotency-Key": "r:3"}
    timeout = settings["timeout"]
    assert isinstance(timeout, int | float) and 0 < timeout <= 5.0


def test_an_openai_model_over_http_gets_each_steps_key_once_across_a_kill(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, world: WorldProcess,
    tmp_path: Path
) -> None:
    """pydantic-ai's OpenAI model against a real OpenAI-compatible server (the world's
    scripted model), SIGKILLed after the ``notify`` effect (step 2), before its outcome is
    recorded: the server saw each model request once under its step's ``Idempotency-Key``
    (none recorded was sent again), and each effect was applied once."""
    run = client.start("pai_openai", {"prompt": "Tell bob@example.com the build is green"},
                       run_id="poai").run_id
    doomed = worker(kill_at="after_effect:2")
    assert doomed.wait(60) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=90)
    assert final.state == "completed", (final.state, final.reason)
    assert "notified" in str(final.result)
    tools = _tools(client, run)
    assert tools == ["pai_openai.model", "pai_openai.tool.notify", "pai_openai.model",
                     "pai_openai.tool.write", "pai_openai.model"]
    recorded = {e.event.step: e.event.ts for e in client.events(run)
                if isinstance(e.event, ev.ActionSucceeded)}
    assert len(world.client.requests(f"{run}:1")) == 1  # recorded before the kill
    for step in (1, 3, 5):
        seen = world.client.requests(f"{run}:{step}")
        # Sent again only while unrecorded (a lease lost under load re-sends an effect-free
        # step in flight); never once its response was in the log.
        assert seen and all(r["endpoint"] == "model" for r in seen), (step, seen)
        assert all(r["received_ms"] <= recorded[step] for r in seen), (step, seen)
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:2": 1, f"{run}:4": 1}
    assert final.model_calls == 3 and final.tokens > 0
    assert verify(client.log, run).ok


def test_a_streaming_agent_publishes_the_models_text_to_followers(
    client: Client, worker: WorkerFactory, world: WorldProcess,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stream=True``: the model step streams; its text reaches a follower as partial
    output, and the log holds the same final answer."""
    monkeypatch.setenv("TEST_PAI_STREAM", "1")
    run = client.start("pai_openai", {"prompt": "Tell bob@example.com hi"},
                       run_id="poais").run_id
    with client.follow(run) as follower:  # subscribed from here on
        worker()
        items = list(follower)
    text = "".join(i.data for i in items if isinstance(i, Partial) and isinstance(i.data, str))
    final = client.status(run)
    assert final.state == "completed", (final.state, final.reason)
    assert text.startswith("Done: notified") and text == final.result


def test_a_dynamic_toolsets_calls_are_steps(client: Client, worker: WorkerFactory,
                                            tmp_path: Path) -> None:
    """A ``DynamicToolset``: the run builds its tools, recorded as the step
    ``<name>.tool.<id>.tools`` before each model request (pydantic-ai's base makes the
    discovery durable); each call is the toolset's step, with the tool's name and arguments
    (both calls of the reply in one parallel group)."""
    run = client.start("pai_dynamic", {"prompt": "stamp"}, run_id="pdyn").run_id
    worker()
    final = client.wait(run, timeout=60)
    assert final.state == "completed", (final.state, final.reason)
    assert final.result == "stamped stamp a, stamp b"
    steps = [e.event for e in client.events(run) if isinstance(e.event, ev.StepDecided)]
    tools = "pai_dynamic.tool.stamps.tools"
    assert [s.tool for s in steps] == [tools, "pai_dynamic.model", "pai_dynamic.tool.stamps.call",
                                       "pai_dynamic.tool.stamps.call", tools, "pai_dynamic.model"]
    assert steps[2].args == {"tool": "stamp", "args": {"label": "a"}}
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:3": 1, f"{run}:4": 1}


def test_a_code_agent_calls_an_mcp_server_each_key_applied_once_across_a_kill(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path
) -> None:
    """``durable.integrations.mcp`` from a code agent: SIGKILL after the third ``apply``
    reached the server (step 4), before its outcome was recorded; the lookup finds its key
    in the server's database, and the tool list stays the one recorded."""
    run = client.start("mcp_books", {}, run_id="pmcpc").run_id
    doomed = worker(kill_at="after_effect:4")
    assert doomed.wait(60) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=90)
    assert final.state == "completed", (final.state, final.reason)
    assert final.result["peeked"] == {"result": mcp_code.APPLIES}  # structured
    assert _tools(client, run) == ["mcp_ledger.tools", *["mcp_ledger.call"] * 5,
                                   "mcp_ledger.read"]
    assert applications(str(tmp_path / "world.sqlite")) == {
        f"{run}:{n}": 1 for n in range(2, 7)}
    assert verify(client.log, run).ok


def _events_seen(path: Path) -> dict[str, Counter[str]]:
    """Per run, how many events of each kind its handler counted (``part_start``,
    ``function_tool_call``...), over every stream it was shown."""
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT run, kinds FROM events").fetchall()
    finally:
        conn.close()
    seen: dict[str, Counter[str]] = {}
    for run, kinds in rows:
        seen.setdefault(run, Counter()).update(k for k in kinds.split(",") if k)
    return seen


def _handled_across_a_kill(client: Client, worker: WorkerFactory,
                           reconciler: ReconcilerFactory, monkeypatch: pytest.MonkeyPatch,
                           tmp_path: Path, kill_at: str) -> None:
    """A ``pai_handled`` run whose worker is SIGKILLed at ``kill_at``, and one nobody
    killed: both complete, and the handler counted the same events of each kind for both."""
    monkeypatch.setenv("TEST_EVENTS", str(tmp_path / "events.sqlite"))
    killed = client.start("pai_handled", {"prompt": "book"}, run_id="phkill").run_id
    doomed = worker(kill_at=kill_at)
    assert doomed.wait(60) == -signal.SIGKILL
    calm = client.start("pai_handled", {"prompt": "book"}, run_id="phcalm").run_id
    worker()
    reconciler()
    for run in (calm, killed):
        final = client.wait(run, timeout=60)
        assert final.state == "completed", (run, final.state, final.reason)
        assert final.result == "booked both"
    seen = _events_seen(tmp_path / "events.sqlite")
    assert seen[calm]["function_tool_call"] == 2 and seen[killed] == seen[calm], seen


def test_a_streaming_only_model_runs_and_its_handler_sees_each_event_once_across_a_kill(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A model that only streams, and an agent-level event-stream handler counting each event
    as it is shown: the model's events in the model's step, every other event in a step of
    its own (``<name>.events``, pydantic-ai's event-handler operation). SIGKILL after the
    first booking's effect (step 3), before its outcome: the re-executed function takes the
    first request and the call event (step 2) from the log without showing them again, and
    the booking's result is shown once, so the handler saw as many events as in a run nobody
    killed."""
    _handled_across_a_kill(client, worker, reconciler, monkeypatch, tmp_path, "after_effect:3")


def test_a_recorded_tool_calls_events_are_not_shown_again_when_the_function_reruns(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """SIGKILL once the second model request's intent is recorded (step 5), after the first
    booking (step 3) and its events (steps 2, 4) were recorded: the function is executed
    again, and pydantic-ai reports that booking again (its call and result events), but
    their steps are in the log, so the handler is not shown them again; it counts as many
    events as in a run nobody killed (and is shown the second request, which the kill cut
    short, once)."""
    _handled_across_a_kill(client, worker, reconciler, monkeypatch, tmp_path, "after_intent:5")


def test_a_model_response_over_the_result_limit_fails_the_run_naming_it(
    client: Client, worker: WorkerFactory
) -> None:
    """A response larger than ``DURABLE_MAX_RESULT_BYTES``: the run ends ``failed`` with the
    cause (it was quarantined with ``KeyError('response')``)."""
    run = client.start("pai_long", {"prompt": "count"}, run_id="pbig").run_id
    worker(DURABLE_MAX_PAYLOAD_BYTES="1024", DURABLE_MAX_RESULT_BYTES="2048", TEST_BIG_REPLY="1")
    final = client.wait(run, timeout=60)
    assert final.state == "failed", (final.state, final.reason)
    failed = [e.event for e in client.events(run) if isinstance(e.event, ev.Failed)]
    assert "over the limit of 2048 (DURABLE_MAX_RESULT_BYTES)" in failed[-1].error, failed


def test_a_model_chosen_by_id_in_the_input_is_the_one_asked(
    client: Client, worker: WorkerFactory, world: WorldProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``{"model": "openai-chat:scripted"}``: pydantic-ai resolves the id in the worker (the
    OpenAI provider reads ``OPENAI_BASE_URL``), and the request reaches that server."""
    monkeypatch.setenv("OPENAI_BASE_URL", world.env()["DURABLE_MODEL_BASE_URL"])
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    run = client.start("pai_long", {"prompt": "Tell bob@example.com hi",
                                    "model": "openai-chat:scripted"}, run_id="pbyid").run_id
    worker()
    final = client.wait(run, timeout=60)
    assert final.state == "completed", (final.state, final.reason)
    assert [r["endpoint"] for r in world.client.requests(f"{run}:1")] == ["model"]


def test_the_input_carries_what_agent_run_takes_as_data() -> None:
    from pydantic_ai.messages import ImageUrl, ModelRequest, UserPromptPart
    from pydantic_ai.tools import DeferredToolResults
    from pydantic_ai.usage import UsageLimits

    from durable.integrations.pydantic_ai import RunInput, prompt_input

    data = prompt_input(["look", ImageUrl(url="https://example.com/a.png")],
                        usage_limits=UsageLimits(request_limit=200),
                        deferred_tool_results=DeferredToolResults(approvals={"c1": True}),
                        model="openai-chat:scripted", metadata={"tenant": "t1"})
    kwargs = RunInput.model_validate(data).run_kwargs()
    assert kwargs["user_prompt"] == ["look", ImageUrl(url="https://example.com/a.png")]
    assert kwargs["usage_limits"].request_limit == 200
    assert kwargs["deferred_tool_results"].approvals == {"c1": True}
    assert kwargs["model"] == "openai-chat:scripted" and kwargs["metadata"] == {"tenant": "t1"}
    # No limit given: none at all (pydantic-ai's own default is 50 requests).
    assert RunInput(prompt="x").run_kwargs()["usage_limits"].request_limit is None
    # Any sequence, as agent.run takes: a tuple gives the list's input.
    history = [ModelRequest(parts=[UserPromptPart(content="earlier")])]
    assert prompt_input(("look", "again"), tuple(history)) == prompt_input(["look", "again"],
                                                                           history)
