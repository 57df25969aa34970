"""Waiting states: approvals bound to a digest, responses, expiry, revalidation on resume,
runtime identity and schema migration. Real workers, a real SQLite effect counter."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest
import redis
from rq import Worker as RQWorker
from rq.job import Job, JobStatus

from durable.agents import registry
from durable.audit.verify import verify
from durable.client import Client
from durable.errors import Refused
from durable.log.state import RunState
from durable.reconciler.sweep import Sweeper
from durable.security.signing import keygen
from tests.agents.basic import applications
from tests.conftest import ApproverFactory, WorkerFactory
from tests.runs import types_of

#: Private keys of the registered approvers (``keys``), by name.
Keys = dict[str, bytes]


@pytest.fixture()
def keys_(approver: ApproverFactory) -> Keys:
    return {"alice": approver("alice", "finance"), "bob": approver("bob", "support")}


def _approve(client: Client, keys_: Keys, run: str, request: str, decision: str,
             who: str, note: str = "") -> RunState:
    return client.sign_and_approve(run, request, decision, who, keys_[who], note)


def _drive(client: Client, worker: WorkerFactory, run: str) -> None:
    """Drive the run with a worker until it waits or ends; the worker is then stopped, so
    that nothing takes the run again until the test says so."""
    w = worker()
    client.wait(run, 20, waiting=True)
    w.stop()


def _waiting_for_approval(client: Client, worker: WorkerFactory, run: str) -> str:
    _drive(client, worker, run)
    state = client.status(run)
    assert state.state == "waiting_approval", state
    (request,) = [a.request for a in state.approvals.values() if a.decision is None]
    return request


def _job_ends(rq_worker: RQWorker, r: redis.Redis, timeout: float = 10.0) -> None:
    """The job the worker holds, if any, finishes: the run's wait is written to its log a
    moment before the job that wrote it returns, so the worker may still hold it."""
    job_id = rq_worker.get_current_job_id()
    if job_id is None:
        return
    job = Job.fetch(job_id, connection=r)
    deadline = time.monotonic() + timeout
    while job.get_status(refresh=True) not in (JobStatus.FINISHED, JobStatus.FAILED):
        assert time.monotonic() < deadline, f"job {job_id} still {job.get_status()}"
        time.sleep(0.01)
    assert job.get_status() == JobStatus.FINISHED
    while rq_worker.get_current_job_id() == job_id:
        assert time.monotonic() < deadline, f"worker still holds {job_id}"
        time.sleep(0.01)


def test_approve_then_the_action_runs_once(client: Client, keys_: Keys, worker: WorkerFactory,
                                           payer_files: Path, r: redis.Redis) -> None:
    run = client.start("payer", {"amount": 42}, run_id="ap1").run_id
    worker()  # stays up: the waiting run must not keep it busy
    state = client.wait(run, 20)
    assert state.state == "waiting_approval", state
    (request,) = [a.request for a in state.approvals.values() if a.decision is None]
    appr = state.approvals[request]
    assert appr.role == "finance" and appr.evidence == ["invoice:42"] and len(appr.digest) == 64
    assert r.get(client.log.keys.lease(run)) is None  # a waiting run holds no lease...
    (rq_worker,) = RQWorker.all(connection=r)
    _job_ends(rq_worker, r)  # ...and its job ends: the worker is left with none
    assert rq_worker.get_current_job_id() is None
    _approve(client, keys_, run, request, "approve", "alice")
    final = client.wait(run, 20)
    assert final.state == "completed" and final.result == {"paid": True, "status": "succeeded"}
    assert applications(str(payer_files / "w.sqlite")) == {f"{run}:1": 1}
    assert verify(client.log, run).ok


def test_reject_is_an_outcome_the_agent_handles(client: Client, keys_: Keys, worker: WorkerFactory,
                                                payer_files: Path) -> None:
    run = client.start("payer", {"amount": 5}, run_id="ap2").run_id
    request = _waiting_for_approval(client, worker, run)
    _approve(client, keys_, run, request, "reject", "alice", note="not this month")
    _drive(client, worker, run)
    final = client.status(run)
    assert final.state == "completed" and final.result == {"paid": False, "status": "rejected"}
    assert applications(str(payer_files / "w.sqlite")) == {}


def test_an_unanswered_approval_expires(client: Client, keys_: Keys, worker: WorkerFactory,
                                        payer_files: Path) -> None:
    run = client.start("payer", {"amount": 5}, run_id="ap3").run_id
    request = _waiting_for_approval(client, worker, run)
    expires = client.status(run).approvals[request].expires
    Sweeper(client.settings, client.redis, registry).tick(now=expires + 1)
    assert client.status(run).state == "expired"
    with pytest.raises(Refused):
        _approve(client, keys_, run, request, "approve", "alice")  # too late: nothing written
    assert applications(str(payer_files / "w.sqlite")) == {}


def test_a_late_duplicate_approval_changes_nothing(client: Client, keys_: Keys,
                                                   worker: WorkerFactory,
                                                   payer_files: Path) -> None:
    run = client.start("payer", {"amount": 7}, run_id="ap4").run_id
    request = _waiting_for_approval(client, worker, run)
    _approve(client, keys_, run, request, "approve", "alice")
    version = client.status(run).version
    state = _approve(client, keys_, run, request, "reject", "alice")
    assert state.version == version and state.approvals[request].decision == "approve"


def test_a_wrong_role_is_refused_and_writes_nothing(client: Client, keys_: Keys,
                                                    worker: WorkerFactory,
                                                    payer_files: Path) -> None:
    run = client.start("payer", {"amount": 7}, run_id="ap5").run_id
    request = _waiting_for_approval(client, worker, run)
    version = client.status(run).version
    with pytest.raises(Refused, match="bob does not have the role 'finance'"):
        _approve(client, keys_, run, request, "approve", "bob")
    keys_["mallory"] = keygen()[0]  # a key nobody registered
    with pytest.raises(Refused, match="unknown approver 'mallory'"):
        _approve(client, keys_, run, request, "approve", "mallory")
    assert client.status(run).version == version


def test_approval_after_the_facts_changed_is_refused_and_asked_again(
    client: Client, keys_: Keys, worker: WorkerFactory, payer_files: Path
) -> None:
    """The balance the approver saw changed before the approved call ran: the digest
    recomputed over the action as it is now differs, so the call is refused and a new
    approval is requested."""
    run = client.start("payer", {"amount": 9}, run_id="ap6").run_id
    first = _waiting_for_approval(client, worker, run)
    (payer_files / "balance").write_text("3")
    _approve(client, keys_, run, first, "approve", "alice")
    second = _waiting_for_approval(client, worker, run)
    assert second != first
    state = client.status(run)
    assert state.approvals[second].digest != state.approvals[first].digest
    assert "changed since it was approved" in (state.wait.reason if state.wait else "")
    assert applications(str(payer_files / "w.sqlite")) == {}
    _approve(client, keys_, run, second, "approve", "alice")
    _drive(client, worker, run)
    assert client.status(run).state == "completed"
    assert applications(str(payer_files / "w.sqlite")) == {f"{run}:1": 1}


def test_respond_resumes_and_a_late_duplicate_response_changes_nothing(
    client: Client, worker: WorkerFactory, payer_files: Path
) -> None:
    run = client.start("quoter", {"text": "q"}, run_id="in1").run_id
    _drive(client, worker, run)
    assert client.status(run).state == "waiting_input"
    client.respond(run, {"ok": True})
    version = client.status(run).version
    assert client.respond(run, {"ok": False}).version == version
    _drive(client, worker, run)
    assert client.status(run).result == {"answer": {"ok": True}}


@pytest.mark.parametrize("then,expected", [("refresh", "completed"), ("expire", "expired")])
def test_a_failed_revalidation_on_resume_is_handled_as_declared(
    then: str, expected: str, client: Client, worker: WorkerFactory, payer_files: Path
) -> None:
    run = client.start("quoter", {"text": "q"}, run_id=f"rv-{then}").run_id
    _drive(client, worker, run)
    client.respond(run, {"ok": True})
    worker(TEST_QUOTE_STALE=then)
    final = client.wait(run, 20)
    assert final.state == expected
    types = types_of(client, run)
    assert "revalidation_failed" in types
    if then == "refresh":
        assert final.result == {"refreshed": "the quote expired while waiting"}


def test_resuming_under_a_new_agent_version_asks_for_approval(
    client: Client, keys_: Keys, worker: WorkerFactory, payer_files: Path, approver: ApproverFactory
) -> None:
    keys_["ops"] = approver("ops", "operator")
    run = client.start("payer", {"amount": 3}, run_id="ver").run_id
    first = _waiting_for_approval(client, worker, run)
    _approve(client, keys_, run, first, "approve", "alice")
    worker(PAYER_VERSION="2")
    state = client.wait(run, 20)
    assert state.state == "waiting_approval"
    assert state.approvals[f"{run}:v2"].kind == "version"
    _approve(client, keys_, run, f"{run}:v2", "approve", "ops")
    final = client.wait(run, 20)
    assert final.state == "completed" and final.agent_version == "2"
    assert verify(client.log, run).ok


def test_a_v1_log_is_upcast_and_completed_under_v2_code(client: Client, worker: WorkerFactory,
                                                        r: redis.Redis) -> None:
    """Raw v1 entries (the recorded fixture, cut after step 2) are read through the
    registered migration and the run is finished by today's worker."""
    fixture = Path(__file__).parent / "fixtures" / "count_completed.jsonl"
    lines = [msgspec.json.decode(x) for x in fixture.read_bytes().splitlines()]
    prefix = [e for e in lines if e["seq"] <= 8]  # up to step 2's outcome
    assert all(e["v"] == 1 for e in prefix)
    run = "v1run"
    for e in prefix:
        e["run"] = run
        r.xadd(client.log.keys.log(run), {"e": msgspec.msgpack.encode(e)})
        if e["type"] == "action_succeeded":  # the v1 system's ledger, as it left it
            r.hset(client.log.keys.ledger(run), e["key"], f"done|succeeded|{e['seq']}")
    r.hset(client.log.keys.run(run), mapping={"version": len(prefix), "state": "pending", "step": 2,
                                              "agent": "count"})
    assert client.status(run).agent_version == "1"
    client.enqueue(run)
    _drive(client, worker, run)
    final = client.status(run)
    assert final.state == "completed" and final.result == {"steps": 4}
    assert verify(client.log, run).ok


def test_a_future_version_log_is_quarantined_then_released_after_an_upgrade(
    client: Client, worker: WorkerFactory, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable.log import events as ev
    from durable.log import migrations

    run = client.start("count", {"steps": 1}, run_id="fut", enqueue=False).run_id
    r.xadd(client.log.keys.log(run), {"e": msgspec.msgpack.encode(
        {"type": "lease_lost", "v": ev.SCHEMA_VERSION + 1, "run": run, "seq": 2, "ts": 1,
         "owner": "w", "epoch": 1})})
    r.hset(client.log.keys.run(run), "version", 2)
    assert client.status(run).state == "quarantined"
    assert run in [s.run_id for s in client.runs("quarantined")]
    assert client.release(run) == "quarantined"  # this code still cannot read it
    # The upgrade: code that knows the next schema version.
    monkeypatch.setattr(ev, "SCHEMA_VERSION", ev.SCHEMA_VERSION + 1)
    monkeypatch.setitem(migrations.UPCASTERS, ("*", ev.SCHEMA_VERSION - 1), lambda d: d)
    assert client.release(run) == "pending"
    assert client.status(run).state == "pending"


def test_a_second_decision_from_the_command_line_says_who_decided_and_when(
    client: Client, keys_: Keys, worker: WorkerFactory, payer_files: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``durable approve`` of a request already decided writes nothing, says who decided it
    and when, and exits 1."""
    from durable.cli import main

    run = client.start("payer", {"amount": 3}, run_id="ap-cli").run_id
    request = _waiting_for_approval(client, worker, run)
    key_file = payer_files / "alice.key"
    key_file.write_bytes(keys_["alice"])
    assert main(["approve", run, "--request", request, "--decision", "approve",
                 "--approver", "alice", "--key", str(key_file)]) == 0
    version = client.status(run).version
    capsys.readouterr()
    assert main(["approve", run, "--request", request, "--decision", "reject",
                 "--approver", "alice", "--key", str(key_file)]) == 1
    err = capsys.readouterr().err
    assert f"request {request} is already decided: approve by alice at 20" in err
    assert client.status(run).version == version
