"""Approver identity: a decision counts only with an Ed25519 signature by a key an admin
registered (``durable approvers``), with the request's role, for this very request, before
its expiry; the worker checks it again before it sends the call and ``verify`` re-checks
every recorded one. Real Redis, real worker processes, the real CLI."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from durable.audit.verify import verify
from durable.client import Client
from durable.controls.approvals import check_decision, sign_decision
from durable.errors import Refused
from durable.log import events as ev
from durable.log.store import Spec
from durable.testing import AdminKey
from tests.agents.basic import applications
from tests.conftest import ApproverFactory, WorkerFactory, run_durable


def _waiting(client: Client, worker: WorkerFactory, run: str) -> str:
    """Drive ``run`` until it waits for approval (the worker is then stopped); its request."""
    w = worker()
    state = client.wait(run, 30)
    w.stop()
    assert state.state == "waiting_approval", state
    (request,) = [a.request for a in state.approvals.values() if a.decision is None]
    return request


def _paid(payer_files: Path) -> dict[str, int]:
    return applications(str(payer_files / "w.sqlite"))


def test_the_callers_environment_grants_nothing(client: Client, worker: WorkerFactory,
                                                payer_files: Path,
                                                approver: ApproverFactory) -> None:
    """The probe of the issue: ``DURABLE_APPROVERS='{"mallory":["finance"]}' durable approve
    ... --approver mallory`` published the payment. Now mallory's own key, unregistered,
    is refused with one line and exit 1, and so is a decision in alice's name signed with
    mallory's key; nothing is written and nothing is paid."""
    approver("alice", "finance")
    run = client.start("payer", {"amount": 42}, run_id="as-anyone").run_id
    request = _waiting(client, worker, run)
    version = client.status(run).version
    env = {**os.environ, "DURABLE_APPROVERS": json.dumps({"mallory": ["finance"]})}
    made = run_durable("approvers", "keygen", "mallory", "--dir", str(payer_files), env=env)
    assert made.returncode == 0, made.stderr
    for name, why in (("mallory", "unknown approver 'mallory'"),
                      ("alice", "the signature is not alice's")):
        res = run_durable("approve", run, "--request", request, "--decision", "approve",
                          "--approver", name, "--key", str(payer_files / "mallory.key"), env=env)
        assert res.returncode == 1, (res.stdout, res.stderr)
        lines = [x for x in res.stderr.splitlines() if not x.startswith("durable: warning")]
        assert len(lines) == 1 and why in lines[0], res.stderr
        assert "DURABLE_APPROVERS grants nothing" in res.stderr
    assert client.status(run).version == version
    assert client.status(run).state == "waiting_approval"
    worker(burst=True).wait(60)
    assert _paid(payer_files) == {}


def test_keygen_add_list_approve_from_the_command_line(client: Client, worker: WorkerFactory,
                                                       payer_files: Path,
                                                       admin_file: Path) -> None:
    """The way in for a user: ``keygen`` writes a 0600 private key and the public key,
    ``approvers add`` registers it, ``approve --key`` signs locally; the recorded decision
    names the key and carries the signature; ``verify`` re-checks it."""
    env = dict(os.environ)
    assert run_durable("approvers", "keygen", "alice", "--dir", str(payer_files),
                       env=env).returncode == 0
    assert stat.S_IMODE((payer_files / "alice.key").stat().st_mode) == 0o600
    again = run_durable("approvers", "keygen", "alice", "--dir", str(payer_files), env=env)
    assert again.returncode == 2 and "exists already" in again.stderr
    added = run_durable("approvers", "add", "alice", "--role", "finance", "--public-key",
                        str(payer_files / "alice.pub"), "--admin-key", str(admin_file),
                        "--json", env=env)
    assert added.returncode == 0, added.stderr
    key = json.loads(added.stdout)["key"]
    listed = run_durable("approvers", "list", "--json", env=env)
    assert [json.loads(x)["name"] for x in listed.stdout.splitlines()] == ["alice"]
    dup = run_durable("approvers", "add", "alice", "--role", "finance", "--public-key",
                      str(payer_files / "alice.pub"), "--admin-key", str(admin_file), env=env)
    assert dup.returncode == 2 and "exists already" in dup.stderr

    run = client.start("payer", {"amount": 7}, run_id="cli-ok").run_id
    request = _waiting(client, worker, run)
    res = run_durable("approve", run, "--request", request, "--decision", "approve",
                      "--approver", "alice", "--key", str(payer_files / "alice.key"), env=env)
    assert res.returncode == 0, res.stderr
    worker()
    final = client.wait(run, 30)
    assert final.state == "completed" and _paid(payer_files) == {f"{run}:1": 1}
    (decided,) = [e.event for e in client.events(run) if isinstance(e.event, ev.ApprovalDecided)]
    assert (decided.approver, decided.key) == ("alice", key) and decided.sig
    assert run_durable("verify", run, env=env).returncode == 0


def test_a_missing_or_wrong_key_file_is_one_line(client: Client, payer_files: Path,
                                                 admin_file: Path) -> None:
    env = dict(os.environ)
    (payer_files / "junk.key").write_text("not a key")
    for path, why in ((payer_files / "nope.key", "cannot read key file"),
                      (payer_files / "junk.key", "not a usable private key")):
        res = run_durable("approve", "r1", "--request", "x", "--decision", "approve",
                          "--approver", "alice", "--key", str(path), env=env)
        assert res.returncode == 2 and res.stderr.count("\n") == 1 and why in res.stderr, \
            res.stderr
    bad = run_durable("approvers", "add", "bob", "--role", "x", "--public-key",
                      str(payer_files / "junk.key"), "--admin-key", str(admin_file), env=env)
    assert bad.returncode == 2 and "not a usable public key" in bad.stderr
    bad = run_durable("approvers", "revoke", "bob", "--admin-key",
                      str(payer_files / "junk.key"), env=env)
    assert bad.returncode == 2 and "not a usable private key" in bad.stderr


@pytest.mark.parametrize("case", ["wrong role", "revoked", "another request", "no signature",
                                  "tampered decision"])
def test_a_decision_that_does_not_hold_is_refused_and_writes_nothing(
    case: str, client: Client, worker: WorkerFactory, payer_files: Path,
    approver: ApproverFactory, admin_key: AdminKey
) -> None:
    alice = approver("alice", "finance")
    bob = approver("bob", "support")
    run = client.start("payer", {"amount": 5}, run_id="refused").run_id
    request = _waiting(client, worker, run)
    appr = client.status(run).approvals[request]
    version = client.status(run).version
    name, sig, why = "alice", sign_decision(alice, run, request, appr.digest, "approve",
                                            appr.expires), ""
    if case == "wrong role":
        name, why = "bob", "bob does not have the role 'finance'"
        sig = sign_decision(bob, run, request, appr.digest, "approve", appr.expires)
    elif case == "revoked":
        client.approvers.revoke("alice", admin_key=admin_key.private)
        why = "was revoked"
    elif case == "another request":
        sig = sign_decision(alice, "other-run", request, appr.digest, "approve", appr.expires)
        why = "signature is not alice's"
    elif case == "no signature":
        sig, why = "", "carries no signature"
    elif case == "tampered decision":  # signed "reject", submitted as "approve"
        sig = sign_decision(alice, run, request, appr.digest, "reject", appr.expires)
        why = "signature is not alice's"
    with pytest.raises(Refused, match=why):
        client.approve(run, request, "approve", name, signature=sig)
    assert client.status(run).version == version


def test_a_decision_after_the_expiry_is_refused(client: Client, worker: WorkerFactory,
                                                payer_files: Path,
                                                approver: ApproverFactory) -> None:
    """The request's expiry is inside the signature and checked against the clock (the
    reconciler expiring the run is covered in test_waits)."""
    alice = approver("alice", "finance")
    run = client.start("payer", {"amount": 5}, run_id="late").run_id
    request = _waiting(client, worker, run)
    appr = client.status(run).approvals[request]
    sig = sign_decision(alice, run, request, appr.digest, "approve", appr.expires)
    entry = client.approvers.get("alice")
    assert check_decision(entry, "alice", run, appr, "approve", sig,
                          now=appr.expires - 1) is None
    assert "expired" in (check_decision(entry, "alice", run, appr, "approve", sig,
                                        now=appr.expires + 1) or "")


def _forge_decision(client: Client, run: str, request: str, approver: str = "alice",
                    sig: str = "", decision: str = "approve") -> None:
    """What any client that reaches Redis can do: write a decision through the append
    script without the client's checks."""
    handle = client.log.load(run, actor="mallory")
    client.log.commit(handle, [
        Spec(ev.ApprovalDecided, {"request": request, "decision": decision,
                                  "approver": approver, "sig": sig}),
        Spec(ev.WaitResolved, {"kind": "approval", "request": request, "response": decision,
                               "by": approver})])
    client.enqueue(run)


def test_the_worker_does_not_act_on_an_unsigned_decision(
    client: Client, worker: WorkerFactory, payer_files: Path, approver: ApproverFactory
) -> None:
    """Window: a decision written around the client (no signature) while the run waits; the
    worker checks it before sending the call, sends nothing and asks again; ``verify``
    names the forged decision."""
    alice = approver("alice", "finance")
    run = client.start("payer", {"amount": 9}, run_id="forged").run_id
    first = _waiting(client, worker, run)
    _forge_decision(client, run, first)
    assert client.status(run).state == "pending"
    second = _waiting(client, worker, run)
    assert second != first and _paid(payer_files) == {}
    state = client.status(run)
    assert "does not hold" in (state.wait.reason if state.wait else ""), state.wait
    report = verify(client.log, run)
    assert not report.ok and "carries no signature" in report.checks["approvals_signed"]
    client.sign_and_approve(run, second, "approve", "alice", alice)
    worker()
    assert client.wait(run, 30).state == "completed"
    assert _paid(payer_files) == {f"{run}:1": 1}


def test_an_unsigned_rejection_is_never_fed_to_the_agent(
    client: Client, worker: WorkerFactory, payer_files: Path, approver: ApproverFactory
) -> None:
    """Window: a rejection written around the client (no signature) while the run waits.
    The fold settles the action as rejected, so the worker checks every recorded rejection
    when it takes the run: this one does not hold, and the run is quarantined instead of
    finishing as rejected."""
    approver("alice", "finance")
    run = client.start("payer", {"amount": 9}, run_id="forged-reject").run_id
    request = _waiting(client, worker, run)
    _forge_decision(client, run, request, decision="reject")
    worker()
    state = client.wait(run, 30)
    assert state.state == "quarantined", state
    assert "the rejection of" in (state.reason or "") and "no signature" in (state.reason or "")
    assert _paid(payer_files) == {}


def test_a_key_revoked_before_the_worker_acts_is_asked_again_then_rotated(
    client: Client, worker: WorkerFactory, payer_files: Path, approver: ApproverFactory,
    admin_key: AdminKey
) -> None:
    """Window: alice approved while no worker ran, then her key was revoked. The worker
    sends nothing and asks again; alice's new key (rotation: added under a new name, the old
    one revoked) approves, and the call is sent once. ``verify`` accepts both decisions:
    the first was signed before the revocation."""
    alice = approver("alice", "finance")
    run = client.start("payer", {"amount": 11}, run_id="rotate").run_id
    first = _waiting(client, worker, run)
    client.sign_and_approve(run, first, "approve", "alice", alice)
    client.approvers.revoke("alice", admin_key=admin_key.private)
    second = _waiting(client, worker, run)
    assert second != first and _paid(payer_files) == {}
    with pytest.raises(Refused, match="revoked"):
        client.sign_and_approve(run, second, "approve", "alice", alice)
    alice2 = approver("alice-2027", "finance")
    client.sign_and_approve(run, second, "approve", "alice-2027", alice2)
    worker()
    assert client.wait(run, 30).state == "completed"
    assert _paid(payer_files) == {f"{run}:1": 1}
    report = verify(client.log, run)
    assert report.ok, report.checks
