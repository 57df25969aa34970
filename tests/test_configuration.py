"""Configuration pinned per run: a run records the configuration it was started under
(model, prompt digest, tool set digest, policy version), a model step the model and prompt
it ran under, and every job compares the pin with the worker's and applies the agent's
policy per changed field (``durable.agents.configuration``). Real Redis, real worker processes;
a worker started with another ``TEST_MODEL`` is a new deployment (``tests.agents.configured``).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

import tests.agents.configured  # noqa: F401  (the client pins starts with it)
from durable import catalog
from durable.agents import Agent, Registry, registry
from durable.audit.verify import verify
from durable.client import Client
from durable.errors import UsageError
from durable.log import events as ev
from durable.log.state import RunState
from durable.testing import Server, wait_for
from tests.agents.basic import applications
from tests.browser import login, serving
from tests.conftest import ApproverFactory, ReconcilerFactory, WorkerFactory, run_durable
from tests.runs import events_of

AGENTS = "tests.agents.configured"


def _validations(client: Client, run: str) -> list[ev.ResumeValidated]:
    return [e for e in events_of(client, run) if isinstance(e, ev.ResumeValidated)]


def _waiting_for_input(client: Client, worker: WorkerFactory, run: str) -> None:
    """Drive the run on a worker of the first deployment until it waits for input, answer
    it, and stop that worker: the next worker to take the run resumes it."""
    w = worker(DURABLE_AGENTS=AGENTS)
    assert client.wait(run, 20, waiting=True).state == "waiting_input"
    w.stop()
    client.respond(run, {"go": True})


def _resumed_under_model_b(client: Client, worker: WorkerFactory, run: str, policy: str,
                           **env: str) -> RunState:
    client.start("configured", {"text": "x"}, run_id=run)
    assert client.status(run).config["model"] == "model-a"  # pinned at start
    _waiting_for_input(client, worker, run)
    worker(DURABLE_AGENTS=AGENTS, TEST_MODEL="model-b", TEST_MODEL_POLICY=policy, **env)
    return client.wait(run, 30)


def test_a_run_records_its_configuration_and_a_model_step_the_pin_it_ran_under(
    client: Client, worker: WorkerFactory, world_db: Path
) -> None:
    run = client.start("configured", {"text": "x"}, run_id="pin1").run_id
    (started,) = [e for e in events_of(client, run) if isinstance(e, ev.RunStarted)]
    # Empty fields are left out of the pin (the agent declares no policy version).
    assert set(started.config) == {"model", "prompt", "tools"}
    assert started.config["model"] == "model-a" and len(started.config["tools"]) == 16
    _waiting_for_input(client, worker, run)
    worker(DURABLE_AGENTS=AGENTS)
    final = client.wait(run, 30)
    assert final.state == "completed" and final.result == {"model": "model-a", "told": {}}
    assert _validations(client, run) == []  # the same configuration: nothing to record
    steps = {e.tool: e.ran_under for e in events_of(client, run)
             if isinstance(e, ev.StepDecided)}
    assert steps == {"configured.think": f"model-a@{started.config['prompt']}",
                     "sqlwrite": ""}  # only the model step names it
    assert verify(client.log, run).ok


def test_continue_records_the_change_and_goes_on_under_the_new_pin(
    client: Client, worker: WorkerFactory, world_db: Path
) -> None:
    final = _resumed_under_model_b(client, worker, "cont", "continue")
    assert final.state == "completed" and final.result == {"model": "model-b", "told": {}}
    (seen,) = _validations(client, "cont")
    assert seen.outcome == "continued" and seen.changes == {"model": ["model-a", "model-b"]}
    assert seen.actions == {"model": "continue"} and seen.config["model"] == "model-b"
    assert final.config["model"] == "model-b"
    think = next(e for e in events_of(client, "cont") if isinstance(e, ev.StepDecided))
    assert think.ran_under.startswith("model-b@")
    assert applications(str(world_db)) == {"cont:2": 1}
    shown = run_durable("log", "cont", "--json", env={**os.environ, "DURABLE_AGENTS": AGENTS})
    assert shown.returncode == 0, shown.stderr
    (what,) = [json.loads(line)["what"] for line in shown.stdout.splitlines()
               if json.loads(line)["type"] == "resume_validated"]
    assert what == "configuration changed on resume (model 'model-a' -> 'model-b'): " \
                   "continued under it", what


def test_replan_tells_the_agent_what_changed(client: Client, worker: WorkerFactory,
                                             world_db: Path) -> None:
    final = _resumed_under_model_b(client, worker, "replan", "replan")
    assert final.state == "completed"
    assert final.result == {"model": "model-b", "told": {"model": ["model-a", "model-b"]}}
    assert [v.outcome for v in _validations(client, "replan")] == ["replanned"]
    assert final.config_changes == {}  # told once, at its next decision


def test_expire_ends_the_run_naming_the_field(client: Client, worker: WorkerFactory,
                                              world_db: Path) -> None:
    final = _resumed_under_model_b(client, worker, "exp", "expire")
    assert final.state == "expired"
    assert final.reason is not None and "configuration changed (model)" in final.reason
    assert "'model-a' -> 'model-b'" in final.reason
    assert [v.outcome for v in _validations(client, "exp")] == ["expired"]
    assert final.config["model"] == "model-a"  # the pin is what the run ran under
    assert applications(str(world_db)) == {}  # nothing was sent under the new model


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_reapprove_waits_for_an_approval_of_the_change(
    decision: str, client: Client, worker: WorkerFactory, world_db: Path,
    approver: ApproverFactory
) -> None:
    ops = approver("ops", "operator")
    run = f"reap-{decision}"
    waiting = _resumed_under_model_b(client, worker, run, "reapprove")
    assert waiting.state == "waiting_approval"
    (request,) = [a for a in waiting.approvals.values() if a.decision is None]
    assert request.kind == "configuration" and request.role == "operator"
    assert waiting.wait is not None and "'model-a' -> 'model-b'" in waiting.wait.reason
    assert waiting.config["model"] == "model-a"  # not yet the new one
    client.sign_and_approve(run, request.request, decision, "ops", ops)
    final = client.wait(run, 30)
    outcomes = [v.outcome for v in _validations(client, run)]
    if decision == "approve":
        assert final.state == "completed" and final.result["model"] == "model-b"
        assert outcomes == ["reapprove", "approved"]
        assert applications(str(world_db)) == {f"{run}:2": 1}
    else:
        assert final.state == "quarantined" and "rejected by ops" in (final.reason or "")
        assert outcomes == ["reapprove"] and applications(str(world_db)) == {}
    assert verify(client.log, run).ok


def test_a_crash_after_the_change_is_recorded_repeats_nothing(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, world_db: Path
) -> None:
    """Killed after the resume's ``resume_validated`` went out with the next intent (the
    model step's), before that step was sent: the worker that takes over finds the run
    pinned to its configuration, records no second validation, and the effect is applied
    once."""
    run = "crash"
    client.start("configured", {"text": "x"}, run_id=run)
    _waiting_for_input(client, worker, run)
    doomed = worker(DURABLE_AGENTS=AGENTS, TEST_MODEL="model-b", kill_at="after_intent:1")
    assert doomed.wait(30) == -signal.SIGKILL
    state = client.status(run)
    assert state.config["model"] == "model-b" and state.step == 1  # recorded, then killed
    worker(DURABLE_AGENTS=AGENTS, TEST_MODEL="model-b")
    reconciler()
    final = client.wait(run, 30)
    assert final.state == "completed" and final.result["model"] == "model-b"
    assert [v.outcome for v in _validations(client, run)] == ["continued"]
    assert applications(str(world_db)) == {f"{run}:2": 1}
    assert verify(client.log, run).ok


def test_a_run_started_without_the_agent_is_pinned_by_its_first_job(
    client: Client, worker: WorkerFactory, world_db: Path
) -> None:
    """A producer that does not have the agent (it validates against the published
    catalog) records no pin; the first job records the worker's, once."""
    worker(DURABLE_AGENTS=AGENTS)  # publishes the agent; pins nothing yet
    assert wait_for(lambda: catalog.published(client.redis, "configured") is not None, 20)
    bare = Client(client.settings, client.redis, agents=Registry())
    run = bare.start("configured", {"text": "x"}, run_id="late").run_id
    assert client.wait(run, 20, waiting=True).state == "waiting_input"
    (pinned,) = _validations(client, run)
    assert pinned.outcome == "pinned" and pinned.config["model"] == "model-a"
    assert pinned.changes == {}


def test_an_unknown_policy_word_is_refused_at_registration() -> None:
    class Sloppy(Agent):
        name = "sloppy"
        on_configuration_change = {"model": "retry"}  # type: ignore[dict-item]

    class Typo(Agent):
        name = "typo"
        on_configuration_change = {"modle": "expire"}

    agents = Registry()
    with pytest.raises(UsageError, match=r"on_configuration_change\['model'\] is 'retry'"):
        agents.add_agent(Sloppy())
    with pytest.raises(UsageError, match="names the field 'modle'"):
        agents.add_agent(Typo())
    assert agents.agents == {}  # nothing registered


def test_status_and_deploy_check_show_the_pin_and_the_drift(
    client: Client, worker: WorkerFactory, world_db: Path
) -> None:
    """A run waits pinned to model-a; the code about to be deployed has model-b and
    expires runs whose model changed: ``durable status`` and ``durable deploy check`` (the
    real CLI, with the new code's environment) name the pin, the drift and what a resume
    would do, and write nothing."""
    run = client.start("configured", {"text": "x"}, run_id="shown").run_id
    w = worker(DURABLE_AGENTS=AGENTS)
    assert client.wait(run, 20, waiting=True).state == "waiting_input"
    w.stop()
    version = client.status(run).version
    new = {**os.environ, "DURABLE_AGENTS": AGENTS, "TEST_MODEL": "model-b",
           "TEST_MODEL_POLICY": "expire", "COLUMNS": "250"}
    shown = run_durable("status", run, "--json", env=new)
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert status["config"]["model"] == "model-a"
    assert status["config_drift"] == {"model": ["model-a", "model-b"]}
    table = run_durable("status", run, env=new).stdout
    assert "model=model-a" in table and "on resume: expire" in table, table
    checked = run_durable("deploy", "check", "--agents", AGENTS, "--json", env=new)
    assert checked.returncode == 0, checked.stderr  # drift alone does not fail the gate
    (verdict,) = [json.loads(x) for x in checked.stdout.splitlines()]
    assert verdict["run_id"] == run and verdict["outcome"] == "same"
    assert verdict["drift"] == {"model": ["model-a", "model-b"]}
    assert verdict["on_resume"] == "expire"
    same = run_durable("deploy", "check", "--agents", AGENTS, "--json",
                       env={**os.environ, "DURABLE_AGENTS": AGENTS})
    assert [json.loads(x)["drift"] for x in same.stdout.splitlines()] == [{}]
    assert client.status(run).version == version  # nothing was written


def test_the_integrations_pin_the_frameworks_model_instructions_and_tools() -> None:
    """The pydantic-ai and OpenAI Agents SDK agents derive their configuration from the
    framework's agent: its model id, a digest of its instructions, and its tools."""
    import tests.agents.openai_agents
    import tests.agents.pydantic_ai  # noqa: F401

    pai = registry.agent("pai_booker").configuration(registry)
    assert pai["model"] == "function:booking_model:" and len(pai["prompt"]) == 16
    assert registry.agent("pai_refunder").configuration(registry)["prompt"] == ""  # none
    oai = registry.agent("oai_refunder").configuration(registry)
    assert oai["model"] == "scripted" and len(oai["prompt"]) == 16 and len(oai["tools"]) == 16
    assert oai != registry.agent("oai_booker").configuration(registry)


def test_the_console_run_page_shows_the_pin_and_the_drift(
    client: Client, server: Server, apps: Path, page: Page,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run page (a real console process, in Chromium) shows the run's pin and, against
    the code the console runs with (its ``DURABLE_AGENTS``: model-b, policy expire), what
    differs and what a resume would do."""
    run = client.start("configured", {"text": "x"}, run_id="shown-console",
                       enqueue=False).run_id
    for name, value in (("DURABLE_AGENTS", AGENTS), ("TEST_MODEL", "model-b"),
                        ("TEST_MODEL_POLICY", "expire")):
        monkeypatch.setenv(name, value)
    with serving(server, apps, monkeypatch) as console:
        login(page, console, "vera", f"/runs/{run}")
        expect(page.locator("#config")).to_contain_text("model=model-a")
        drift = page.locator("#config-drift")
        expect(drift).to_contain_text("model 'model-a' -> 'model-b'")
        expect(drift).to_contain_text("on resume: expire")
        page.goto("about:blank")  # its live stream closed before the console stops
