"""Settle: an unknown outcome no lookup can resolve is settled by an operator's signed
decision (``durable settle``), recorded with who, when and the evidence; the run goes on;
the worker acts only on a settle whose signature holds, and ``verify`` re-checks it. Real
Redis, real worker processes, the real CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import tests.agents.settle  # noqa: F401  (registers peek, peeker)
from durable.audit.verify import verify
from durable.client import Client
from durable.controls.settling import result_digest
from durable.errors import Refused
from durable.log import counters
from durable.log import events as ev
from durable.log.store import Spec
from durable.telemetry.metrics import exposition
from tests.conftest import ApproverFactory, WorkerFactory, run_durable


@pytest.fixture()
def peek_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The peek tool's call counter, and this module's agents for the workers."""
    monkeypatch.setenv("TEST_PEEK_FILE", str(tmp_path / "peek-calls"))
    monkeypatch.setenv("DURABLE_AGENTS", os.environ["DURABLE_AGENTS"] + ",tests.agents.settle")
    return tmp_path / "peek-calls"


def _stuck(client: Client, worker: WorkerFactory, run_id: str) -> None:
    """Drive ``run_id`` until its first peek, stopped at its deadline with no lookup to ask,
    leaves it waiting for an operator; the worker is then stopped."""
    client.start("peeker", {"q": "orders"}, run_id=run_id)
    w = worker()
    state = client.wait(run_id, 30)
    w.stop()
    assert state.state == "waiting_external", state
    assert state.actions[1].status == "unknown"


def _lookups(client: Client) -> int:
    return int(client.redis.hget(client.log.keys.metrics(),
                                 counters.field(counters.LOOKUPS, "unknown"))
               or 0)


def _settles(client: Client, run: str) -> list[ev.ActionReconciled]:
    return [e.event for e in client.events(run)
            if isinstance(e.event, ev.ActionReconciled) and e.event.by == "operator"]


def test_a_run_stuck_on_a_lookup_less_tool_is_settled_not_applied_and_completes(
    client: Client, worker: WorkerFactory, approver: ApproverFactory, peek_file: Path,
    tmp_path: Path
) -> None:
    """The probe of the issue: a read with no lookup, stopped mid-call, left its run
    waiting_external, and ``respond --external`` was accepted and ignored. Now the run is
    listed by ``runs --stuck`` and the metric, the answer is refused with one line, and an
    operator's signed ``settle --not-applied`` sends the step again: the run completes,
    the lookup is never asked again, and the log records who, when and the evidence."""
    key = tmp_path / "olga.key"
    key.write_bytes(approver("olga", "operator"))
    _stuck(client, worker, "stuck-1")
    env = dict(os.environ)
    listed = run_durable("runs", "--stuck", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(x) for x in listed.stdout.splitlines()]
    assert [(r["run_id"], r["step"], r["tool"]) for r in rows] == [("stuck-1", 1, "peek")]
    assert b"durable_runs_unsettled 1.0" in exposition(client)[0]
    version = client.status("stuck-1").version
    answered = run_durable("respond", "stuck-1", "--external", "--input", "{}", env=env)
    assert answered.returncode == 1 and len(answered.stderr.splitlines()) == 1, answered
    assert "durable settle stuck-1 --step 1" in answered.stderr
    asked = _lookups(client)
    assert asked >= 1

    res = run_durable("settle", "stuck-1", "--step", "1", "--not-applied", "--evidence",
                      "the read never reached the database (its query log)", "--signer",
                      "olga", "--key", str(key), env=env)
    assert res.returncode == 0, res.stderr
    assert client.status("stuck-1").version == version + 2  # the settle, the wait's end
    worker()
    final = client.wait("stuck-1", 30)
    assert final.state == "completed", final
    assert final.result == {"q": "orders", "call": 2}
    assert _lookups(client) == asked  # a settled step's lookup is never asked again
    (settle,) = _settles(client, "stuck-1")
    assert (settle.resolution, settle.operator, settle.actor) == ("not_applied", "olga", "olga")
    assert settle.evidence.startswith("the read never reached") and settle.sig and settle.ts
    assert settle.operator_key == client.approvers.get("olga").fingerprint  # type: ignore[union-attr]
    assert run_durable("verify", "stuck-1", env=env).returncode == 0
    assert b"durable_runs_unsettled 0.0" in exposition(client)[0]


def test_settled_applied_with_a_result_completes_without_calling_again(
    client: Client, worker: WorkerFactory, approver: ApproverFactory, peek_file: Path
) -> None:
    """Settled ``applied`` with the result the operator found: the step counts as
    succeeded with it, the agent finishes on it, and the tool is not called again."""
    olga = approver("olga", "operator")
    _stuck(client, worker, "stuck-2")
    client.sign_and_settle("stuck-2", 1, "applied", "olga", olga,
                           evidence="the report was generated (mail at 10:02)",
                           result={"rows": 7})
    worker()
    final = client.wait("stuck-2", 30)
    assert final.state == "completed" and final.result == {"rows": 7}, final
    assert peek_file.read_text() == "1"
    (settle,) = _settles(client, "stuck-2")
    assert settle.result_digest == result_digest({"rows": 7})
    assert verify(client.log, "stuck-2").ok


def test_a_settle_that_does_not_hold_is_refused_and_writes_nothing(
    client: Client, worker: WorkerFactory, approver: ApproverFactory, peek_file: Path,
    tmp_path: Path
) -> None:
    """Refused with one line, exit 1, nothing written: a key without the operator role, an
    unregistered signer, and a step whose outcome is not unknown (here: settled already)."""
    approver("olga", "operator")
    finance = tmp_path / "fred.key"
    finance.write_bytes(approver("fred", "finance"))
    _stuck(client, worker, "stuck-3")
    env = dict(os.environ)
    version = client.status("stuck-3").version
    for signer, why in (("fred", "does not have the role 'operator'"),
                        ("nobody", "unknown signer 'nobody'")):
        res = run_durable("settle", "stuck-3", "--step", "1", "--not-applied", "--evidence",
                          "x", "--signer", signer, "--key", str(finance), env=env)
        assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res
        assert why in res.stderr
    assert client.status("stuck-3").version == version
    # Make the step succeeded, then try to settle it.
    olga = approver("olga2", "operator")
    client.sign_and_settle("stuck-3", 1, "applied", "olga2", olga, evidence="seen")
    worker()
    assert client.wait("stuck-3", 30).state == "completed"
    done = client.status("stuck-3").version
    key = tmp_path / "olga2.key"
    key.write_bytes(olga)
    res = run_durable("settle", "stuck-3", "--step", "1", "--applied", "--evidence", "again",
                      "--signer", "olga2", "--key", str(key), env=env)
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res
    assert "the run is completed" in res.stderr
    assert client.status("stuck-3").version == done
    with pytest.raises(Refused, match="step 2 is not a step"):
        client.sign_and_settle("stuck-3", 2, "applied", "olga2", olga, evidence="x")


def test_a_step_that_is_not_unknown_is_not_settled(
    client: Client, worker: WorkerFactory, approver: ApproverFactory, payer_files: Path
) -> None:
    """A step of a live run that was never sent (it waits for approval) is refused: one
    line, exit 1, nothing written."""
    key = payer_files / "olga.key"
    key.write_bytes(approver("olga", "operator"))
    client.start("payer", {"amount": 5}, run_id="asks")
    w = worker()
    assert client.wait("asks", 30).state == "waiting_approval"
    w.stop()
    version = client.status("asks").version
    res = run_durable("settle", "asks", "--step", "1", "--applied", "--evidence", "x",
                      "--signer", "olga", "--key", str(key), env=dict(os.environ))
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res
    assert "step 1 is decided, not unknown; only an unknown outcome is settled" in res.stderr
    assert client.status("asks").version == version


def test_a_forged_settle_is_never_acted_on_and_verify_names_it(
    client: Client, worker: WorkerFactory, approver: ApproverFactory, peek_file: Path
) -> None:
    """Window: the run waits for a settle; a settle written around the client (through the
    append script, signed by no registered key) says ``applied`` with a result. The worker
    checks it when it takes the run: the run is quarantined, not finished on that result;
    ``verify`` names the settle."""
    approver("olga", "operator")
    _stuck(client, worker, "forged-settle")
    handle = client.log.load("forged-settle", actor="mallory")
    act = handle.state.actions[1]
    client.log.commit(handle, [
        Spec(ev.ActionReconciled, {"step": 1, "key": act.key, "resolution": "applied",
                                   "result": {"rows": 666}, "by": "operator",
                                   "operator": "olga", "sig": "", "evidence": "trust me",
                                   "result_digest": result_digest({"rows": 666}),
                                   "attempt": act.attempts}),
        Spec(ev.WaitResolved, {"kind": "external", "request": act.key, "by": "olga"})])
    client.enqueue("forged-settle")
    worker()
    state = client.wait("forged-settle", 30)
    assert state.state == "quarantined", state
    assert "the settle of step 1 does not hold" in (state.reason or "")
    assert "carries no signature" in (state.reason or "")
    report = verify(client.log, "forged-settle")
    assert not report.ok and "carries no signature" in report.checks["settles_signed"]
