"""Evidence references (``durable.agents.evidence``): a step records the records its result rests
on (source, id, version); every resume after a wait checks each with its source's
registered checker and records one ``evidence_checked`` event; a reference that no longer
holds is handled as the agent declares (refresh, replan, expire). Real Redis, real worker
processes; the store is a JSON file the test edits while the run waits
(``tests.agents.evidence``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import tests.agents.evidence  # noqa: F401  (the client validates starts with it)
from durable.agents import Agent, Registry
from durable.agents.evidence import Current, EvidenceChecker, EvidenceRef
from durable.audit.verify import verify
from durable.client import Client
from durable.errors import UsageError
from durable.log import events as ev
from durable.log.state import RunState
from durable.log.store import Spec
from durable.testing import Worker
from tests.agents.evidence import write_crm
from tests.conftest import WorkerFactory, run_durable
from tests.runs import events_of

AGENTS = "tests.agents.evidence"


@pytest.fixture()
def crm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The store: record 42 at version 1, readable."""
    path = tmp_path / "crm.json"
    write_crm(path, {"records": {"42": {"version": 1, "name": "Ada"}}, "denied": []})
    monkeypatch.setenv("TEST_CRM", str(path))
    return path


def _edit(path: Path, **change: Any) -> None:
    data = json.loads(path.read_text())
    data.update(change)
    write_crm(path, data)


def _checks(client: Client, run: str) -> list[ev.EvidenceChecked]:
    return [e for e in events_of(client, run) if isinstance(e, ev.EvidenceChecked)]


def _waiting(client: Client, worker: WorkerFactory, run: str, policy: str) -> Worker:
    """Start a run on a worker whose agent has ``policy``; return once it waits for input,
    its record read and referenced."""
    client.start("dossier", {"id": "42"}, run_id=run)
    w = worker(DURABLE_AGENTS=AGENTS, TEST_EVIDENCE_POLICY=policy)
    waiting = client.wait(run, 20, waiting=True)
    assert waiting.state == "waiting_input"
    assert waiting.evidence == [EvidenceRef(source="crm", id="42", version="1", step=1)]
    return w


def test_nothing_changed_the_run_goes_on_and_the_check_is_recorded(
    client: Client, worker: WorkerFactory, crm: Path
) -> None:
    _waiting(client, worker, "same", "expire")
    (read,) = [e for e in events_of(client, "same") if isinstance(e, ev.ActionSucceeded)]
    assert read.evidence == [EvidenceRef(source="crm", id="42", version="1")]
    env = {**os.environ, "DURABLE_AGENTS": AGENTS, "COLUMNS": "250"}
    shown = run_durable("status", "same", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "crm/42 version 1 (step 1)" in shown.stdout, shown.stdout
    client.respond("same", {"go": True})
    final = client.wait("same", 30)
    assert final.state == "completed", final.reason
    assert final.result == {"record": {"version": 1, "name": "Ada"}, "reads": 1}
    (checked,) = _checks(client, "same")
    assert (checked.outcome, checked.checked, checked.failed) == ("held", 1, [])
    assert verify(client.log, "same").ok


def test_refresh_reads_again_when_the_version_changed(
    client: Client, worker: WorkerFactory, crm: Path
) -> None:
    _waiting(client, worker, "fresh", "refresh")
    _edit(crm, records={"42": {"version": 2, "name": "Ada Lovelace"}})
    client.respond("fresh", {"go": True})
    final = client.wait("fresh", 30)
    assert final.state == "completed", final.reason
    assert final.result == {"record": {"version": 2, "name": "Ada Lovelace"}, "reads": 2}
    (checked,) = _checks(client, "fresh")
    assert checked.outcome == "refresh" and checked.checked == 1
    assert checked.failed == [EvidenceRef(source="crm", id="42", version="1", step=1,
                                          why="version 1 -> 2")]
    # The re-read's reference replaced the stale one; what the agent was told is cleared.
    assert final.evidence == [EvidenceRef(source="crm", id="42", version="2", step=2)]
    assert final.evidence_failed == [] and final.refresh is None
    assert verify(client.log, "fresh").ok
    env = {**os.environ, "DURABLE_AGENTS": AGENTS, "COLUMNS": "400"}
    for command in ("log", "replay"):  # said for people, not as a class name
        shown = run_durable(command, "fresh", "--json", env=env)
        assert shown.returncode == 0, shown.stderr
        rows = [json.loads(line) for line in shown.stdout.splitlines()] \
            if command == "log" else json.loads(shown.stdout)["trajectory"]
        (what,) = [r["what"] for r in rows if r["type"] == "evidence_checked"]
        assert what == "evidence checked on resume: 1 of 1 no longer hold, crm/42 (step 1): " \
                       "version 1 -> 2 -> refresh", what
        assert "EvidenceChecked" not in shown.stdout


def test_replan_tells_the_agent_which_references_failed(
    client: Client, worker: WorkerFactory, crm: Path
) -> None:
    _waiting(client, worker, "plan", "replan")
    _edit(crm, denied=["42"])  # access revoked
    client.respond("plan", {"go": True})
    final = client.wait("plan", 30)
    assert final.state == "completed", final.reason
    assert final.result == {"replanned": ["crm/42: access denied"]}
    assert [c.outcome for c in _checks(client, "plan")] == ["replan"]
    assert final.evidence == [] and final.step == 1  # nothing was read again
    assert verify(client.log, "plan").ok


def test_expire_ends_the_run_naming_the_reference(
    client: Client, worker: WorkerFactory, crm: Path
) -> None:
    _waiting(client, worker, "gone", "expire")
    _edit(crm, records={})  # the record was deleted
    client.respond("gone", {"go": True})
    final = client.wait("gone", 30)
    assert final.state == "expired"
    assert final.reason == "evidence no longer holds: crm/42 (gone)"
    types = [type(e) for e in events_of(client, "gone")]
    assert types[-2:] == [ev.EvidenceChecked, ev.Expired]
    assert [c.outcome for c in _checks(client, "gone")] == ["expired"]
    assert verify(client.log, "gone").ok


@pytest.mark.parametrize("fault,why", [
    ("raise", "checker raised ConnectionError: crm unreachable"),
    ("hang", "timed out"),
])
def test_a_checker_that_raises_or_hangs_is_a_recorded_failure(
    fault: str, why: str, client: Client, worker: WorkerFactory, crm: Path
) -> None:
    """The checker raises, or outlasts its ``timeout_s`` (0.5 s): the reference fails with
    that reason, the policy applies, and the worker goes on serving runs."""
    w = _waiting(client, worker, f"{fault}1", "replan")
    _edit(crm, checker=fault)
    client.respond(f"{fault}1", {"go": True})
    final = client.wait(f"{fault}1", 30)
    assert final.state == "completed", final.reason
    assert final.result == {"replanned": [f"crm/42: {why}"]}
    (checked,) = _checks(client, f"{fault}1")
    assert checked.outcome == "replan" and checked.failed[0].why == why
    # The same worker process takes the next run through a wait and a check.
    _edit(crm, checker="")
    client.start("dossier", {"id": "42"}, run_id=f"{fault}2")
    assert client.wait(f"{fault}2", 20, waiting=True).state == "waiting_input"
    client.respond(f"{fault}2", {"go": True})
    assert client.wait(f"{fault}2", 30).state == "completed"
    assert [c.outcome for c in _checks(client, f"{fault}2")] == ["held"]
    assert w.alive()


def test_an_evidence_source_without_a_checker_is_refused_at_registration() -> None:
    class Ledger(EvidenceChecker):
        source = "ledger"

        def check(self, ref: EvidenceRef) -> Current:
            return Current.at(ref.version)

    class Reader(Agent):
        name = "reader"
        evidence_sources = ("ledger", "wiki")

    class Sloppy(Agent):
        name = "sloppy"
        on_evidence_change = "retry"  # type: ignore[assignment]

    agents = Registry()
    agents.add_checker(Ledger())
    with pytest.raises(UsageError, match=r"evidence_sources names 'wiki', for which no "
                                         r"EvidenceChecker is registered \(registered: ledger\)"):
        agents.add_agent(Reader())
    with pytest.raises(UsageError, match="on_evidence_change is 'retry'"):
        agents.add_agent(Sloppy())
    assert agents.agents == {}  # nothing registered


def test_an_outcome_without_references_is_as_long_as_before() -> None:
    """The field is left out of the entry when empty: bytes per step do not grow."""
    plain = ev.ActionSucceeded(v=ev.SCHEMA_VERSION, run="r", seq=3, ts=1, step=1, key="r:1",
                               result={"a": 1})
    assert ev.encode(plain) == ev.encode(
        ev.ActionSucceeded(v=ev.SCHEMA_VERSION, run="r", seq=3, ts=1, step=1, key="r:1",
                           result={"a": 1}, evidence=[]))
    ref = ev.ActionSucceeded(v=ev.SCHEMA_VERSION, run="r", seq=3, ts=1, step=1, key="r:1",
                             result={"a": 1},
                             evidence=[EvidenceRef(source="crm", id="42", version="1")])
    assert ev.decode(ev.encode(ref), "1-0", "r").evidence == ref.evidence  # type: ignore[attr-defined]
    assert RunState().evidence == []


def test_verify_refuses_a_check_of_references_no_step_recorded(
    client: Client, worker: WorkerFactory, crm: Path
) -> None:
    """A writer that goes through the append script (chained, so the chain holds) but
    records a check of a reference the run never recorded: ``verify`` names it."""
    w = _waiting(client, worker, "stray", "replan")
    w.stop()
    handle = client.log.load("stray")
    stray = EvidenceRef(source="crm", id="99", version="1", step=1, why="gone")
    client.log.commit(handle, [Spec(ev.EvidenceChecked, {"outcome": "replan", "checked": 1,
                                                          "failed": [stray]})])
    report = verify(client.log, "stray")
    assert not report.ok and report.failed == ["evidence"], report.checks
    assert "names references no step recorded: crm/99" in report.checks["evidence"]
