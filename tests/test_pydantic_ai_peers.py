"""The pydantic-ai capability does what pydantic-ai's own durable-execution tests expect of
its Temporal, DBOS and Prefect integrations: an agent it cannot make durable is refused when
it is built, with the reason; large tool returns and model responses are kept beside the run;
one toolset instance serves two agents; a run chooses its model.

Real worker processes, SIGKILLed for real; the models are pydantic-ai ``FunctionModel``s
counting their requests per idempotency key, the tools write their effects into a SQLite
database that never deduplicates (``TEST_DB_DEDUPE=0``).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

from durable.agents import registry
from durable.audit.verify import verify
from durable.client import Client
from durable.errors import UsageError
from durable.integrations.pydantic_ai import DurableAgent, RedisDurability
from durable.log import events as ev
from durable.settings import Settings
from tests.agents import pydantic_ai_peers as peers
from tests.agents.basic import applications, model_requests
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.servers.integration_world import decided, set_env

AGENTS = ("examples.agents,tests.agents.basic,tests.agents.pydantic_ai,"
          "tests.agents.pydantic_ai_peers")
#: Large values' limits: ``peers.BIG`` is over the inline limit, under the ceiling.
LIMITS = {"DURABLE_MAX_PAYLOAD_BYTES": "2048", "DURABLE_MAX_RESULT_BYTES": "65536"}


@pytest.fixture(autouse=True)
def _env(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_env(monkeypatch, tmp_path, AGENTS)


def _registered(prefix: str) -> list[str]:
    return [n for n in [*registry.agents, *registry.tools] if n.startswith(prefix)]


# In-process: what building a durable agent refuses, before anything is registered.


def test_an_agent_without_a_model_is_refused_when_built() -> None:
    with pytest.raises(UsageError, match="needs a model"):
        DurableAgent(Agent(None, name="pai_nomodel"))
    assert _registered("pai_nomodel") == []
    durability = RedisDurability()
    Agent(None, name="pai_nomodel_cap", capabilities=[durability])
    with pytest.raises(UsageError, match="needs a model"):
        durability.register()
    assert _registered("pai_nomodel_cap") == []
    # The capability's own model is enough.
    DurableAgent(Agent(None, name="pai_capmodel"), model=TestModel())
    assert "pai_capmodel" in registry.agents


def test_model_settings_that_are_not_data_are_refused_when_built() -> None:
    unserializable: Any = {"extra_body": {"hook": lambda: 1}}
    with pytest.raises(UsageError, match=r"model settings .*extra_body"):
        DurableAgent(Agent(TestModel(), name="pai_badsettings", model_settings=unserializable))
    with pytest.raises(UsageError, match=r"model settings .*extra_body"):
        DurableAgent(Agent(TestModel(settings=unserializable), name="pai_badmodelsettings"))
    assert _registered("pai_bad") == []
    DurableAgent(Agent(TestModel(), name="pai_goodsettings",
                       model_settings={"temperature": 0.0, "extra_body": {"seed": 1}}))
    assert "pai_goodsettings" in registry.agents


def test_a_capabilitys_toolset_without_an_id_is_refused_naming_the_capabilitys_id() -> None:
    """pydantic-ai's peers ask for the capability's ``id`` too: its toolset's steps are
    named after it."""
    from pydantic_ai.capabilities import Capability

    with pytest.raises(ValueError, match=r"Capability\(tools=\.\.\., id=\.\.\.\)"):
        DurableAgent(Agent(TestModel(), name="pai_capnoid",
                           capabilities=[Capability(tools=[peers.seal])]))
    assert _registered("pai_capnoid") == []


def test_a_capabilitys_toolset_built_anew_for_each_run_is_refused_naming_it() -> None:
    """pydantic-ai's base makes a toolset durable once, when the agent is built, and
    refuses another in a run (its Temporal, DBOS and Prefect engines alike): a capability
    whose ``get_toolset()`` returns a new instance each time is refused at registration,
    naming the toolset, rather than each run failing."""
    with pytest.raises(ValueError, match="toolset 'seals' is built anew each time"):
        DurableAgent(Agent(TestModel(), name="pai_anew",
                           capabilities=[peers.Sealing(anew=True)]))
    assert _registered("pai_anew") == []


# Real processes.


def test_large_tool_returns_and_model_responses_are_kept_beside_the_run_across_a_kill(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path
) -> None:
    """Tool returns (two parallel calls) and a model response over
    ``DURABLE_MAX_PAYLOAD_BYTES`` are large values (a reference in the log, the value beside
    the run), not failed steps. Crash window: SIGKILL once the second model request's intent
    is recorded (step 4), after both large tool returns (steps 2, 3) were recorded: the next
    worker reads them back from beside the run, and neither a tool nor the first request is
    sent again."""
    run = client.start("pai_big", {"prompt": "read"}, run_id="pbigv").run_id
    assert worker(kill_at="after_intent:4", **LIMITS).wait(60) == -signal.SIGKILL
    worker(**LIMITS)
    reconciler()
    final = client.wait(run, timeout=60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result == f"read {2 * peers.BIG}: " + "z" * peers.BIG
    outcomes = {e.event.step: e.event for e in client.events(run)
                if isinstance(e.event, ev.ActionSucceeded)}
    assert all(outcomes[n].blob is not None for n in (2, 3, 4)), outcomes
    assert outcomes[4].tokens > 0  # the model call's usage, read before it was put aside
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:2": 1, f"{run}:3": 1}
    assert model_requests(str(tmp_path / "model.sqlite"))[f"{run}:1"] == 1
    assert verify(client.log, run).ok


def test_one_toolset_instance_serves_two_agents_each_call_its_own_step(
    client: Client, worker: WorkerFactory, tmp_path: Path
) -> None:
    """The same ``FunctionToolset`` in two agents: each agent's call is its own step, named
    after it, applied once; the instance is left as it was."""
    one = client.start("pai_share_a", {"prompt": "go"}, run_id="pshare1").run_id
    two = client.start("pai_share_b", {"prompt": "go"}, run_id="pshare2").run_id
    worker()
    for run, label in ((one, "a"), (two, "b")):
        final = client.wait(run, timeout=60)
        assert final.state == "completed", (run, final.state, final.reason, final.error)
        assert final.result == f"{label}: stamp {label}"
        assert [s.tool for s in decided(client, run)] == [
            f"pai_share_{label}.model", f"pai_share_{label}.tool.shared.shared_stamp",
            f"pai_share_{label}.model"]
    assert applications(str(tmp_path / "world.sqlite")) == {f"{one}:2": 1, f"{two}:2": 1}
    assert list(peers.shared_toolset.tools) == ["shared_stamp"]


def _model_names(client: Client, run: str) -> list[str]:
    """The model that answered each of the run's model requests, as their recorded
    responses name it."""
    return [e.event.result["response"]["model_name"] for e in client.events(run)
            if isinstance(e.event, ev.ActionSucceeded) and isinstance(e.event.result, dict)
            and "response" in e.event.result]


def test_a_model_a_run_chooses_by_name_is_the_one_asked_across_a_kill(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path
) -> None:
    """``models={"second": ...}`` and a run's input ``{"model": "second"}``: that model is
    asked, and still is after a crash (the input is in the log). Crash window: SIGKILL after
    the tool the second model called applied its effect (step 2), before its outcome was
    recorded: the lookup resolves it and the next request goes to the second model again.
    A run that names no model asks the agent's own."""
    chosen = client.start("pai_chooser", {"prompt": "go", "model": "second"},
                          run_id="pchosen").run_id
    assert worker(kill_at="after_effect:2").wait(60) == -signal.SIGKILL
    plain = client.start("pai_chooser", {"prompt": "go"}, run_id="pplainmodel").run_id
    worker()
    reconciler()
    for run, who in ((chosen, "second"), (plain, "primary")):
        final = client.wait(run, timeout=60)
        assert final.state == "completed", (run, final.state, final.reason, final.error)
        assert final.result == f"{who} after mark {who}"
        assert _model_names(client, run) == [f"function:{who}_model:"] * 2, run
    assert applications(str(tmp_path / "world.sqlite")) == {f"{chosen}:2": 1, f"{plain}:2": 1}
    assert model_requests(str(tmp_path / "model.sqlite"))[f"{chosen}:1"] == 1
    assert verify(client.log, chosen).ok


def test_a_toolset_a_users_capability_contributes_is_a_step_applied_once_across_a_kill(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path
) -> None:
    """A capability subclass whose ``get_toolset()`` contributes a toolset. Crash window:
    SIGKILL after its tool applied its effect (step 2), before the outcome was recorded:
    the next worker resolves the call by its lookup, and never makes it again."""
    run = client.start("pai_sealer", {"prompt": "seal"}, run_id="pseal").run_id
    assert worker(kill_at="after_effect:2").wait(60) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result == "sealed: seal a"
    assert [s.tool for s in decided(client, run)] == [
        "pai_sealer.model", "pai_sealer.tool.seals.seal", "pai_sealer.model"]
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:2": 1}
    assert verify(client.log, run).ok


def test_a_tool_call_killed_before_its_effect_is_looked_up_then_made_once(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, tmp_path: Path
) -> None:
    """Crash window: SIGKILL once the tool call's intent is recorded (step 2), before the
    tool ran. Its outcome is unknown: the next worker asks its lookup, which finds nothing,
    and makes the call once its deadline has passed; the first model request is not sent
    again and the effect is applied once."""
    run = client.start("pai_sealer", {"prompt": "seal"}, run_id="psealin").run_id
    assert worker(kill_at="after_intent:2").wait(60) == -signal.SIGKILL
    assert applications(str(tmp_path / "world.sqlite")) == {}  # the tool never ran
    worker()
    reconciler()
    final = client.wait(run, timeout=60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    assert final.result == "sealed: seal a"
    assert [s.tool for s in decided(client, run)] == [
        "pai_sealer.model", "pai_sealer.tool.seals.seal", "pai_sealer.model"]
    assert applications(str(tmp_path / "world.sqlite")) == {f"{run}:2": 1}
    assert model_requests(str(tmp_path / "model.sqlite"))[f"{run}:1"] == 1
    assert verify(client.log, run).ok
