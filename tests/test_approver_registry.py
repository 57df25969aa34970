"""The approver registry is rooted in an admin key held outside Redis: an entry counts only
with a signature by a key of ``DURABLE_ADMIN_KEYS``. Whoever writes Redis directly (here an
admin-level Redis client, the test's own) without that key registers nobody: the client,
the worker and ``verify`` all refuse the entry. Real Redis, real worker processes, the real
CLI."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
import redis
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from durable.audit.verify import verify
from durable.client import Client
from durable.controls.approvals import sign_decision
from durable.controls.approvers import DOMAIN, Approvers
from durable.errors import Refused, UsageError
from durable.security.signing import (
    fingerprint,
    keygen,
    load_public_key,
    parse_public_keys,
    sign,
    statement,
)
from durable.testing import AdminKey
from tests.conftest import ApproverFactory, WorkerFactory, run_durable
from tests.test_approvals import _forge_decision, _paid, _waiting


def _raw_entry(public_pem: bytes, roles: list[str], **extra: object) -> str:
    """An entry in the registry's own format, as a Redis writer without the admin key
    would put it there."""
    raw = load_public_key(public_pem)
    return json.dumps({"roles": roles, "public_key": base64.b64encode(raw).decode(),
                       "fingerprint": fingerprint(raw), "added": 1, "by": "mallory",
                       "revoked": 0, **extra})


@pytest.mark.parametrize("forgery", ["no admin signature", "signed by mallory's own key",
                                     "a role added after signing"])
def test_an_entry_no_admin_signed_is_refused_by_client_worker_and_verify(
    forgery: str, client: Client, r: redis.Redis, worker: WorkerFactory, payer_files: Path,
    approver: ApproverFactory
) -> None:
    """The probe of the issue: a Redis user with write access registered its own key with
    role finance and approved a payment with it. Window: the forged entry is in the registry
    while the run waits for approval. The client refuses mallory's decision; a decision
    written around the client is not acted on by the worker (nothing paid, asked again);
    ``verify`` names the untrusted entry."""
    private, public = keygen()
    if forgery == "no admin signature":
        entry = _raw_entry(public, ["finance"])
    elif forgery == "signed by mallory's own key":
        # Mallory signs the entry's very statement with her own key, as if she were admin.
        body = json.loads(_raw_entry(public, ["finance"]))
        statement_ = statement(DOMAIN, {**body, "name": "mallory"})
        entry = json.dumps({**body, "admin_key": fingerprint(load_public_key(public)),
                            "admin_sig": sign(private, statement_)})
    else:
        # A genuine entry for mallory with role "support", then "finance" added by HSET.
        approver("mallory-support", "support")
        genuine = json.loads(r.hget("dx:approvers", "mallory-support"))
        entry = json.dumps({**genuine, "roles": ["finance", "support"],
                            "public_key": base64.b64encode(load_public_key(public)).decode(),
                            "fingerprint": fingerprint(load_public_key(public))})
    r.hset("dx:approvers", "mallory", entry)
    assert client.approvers.get("mallory").distrust  # type: ignore[union-attr]

    run = client.start("payer", {"amount": 13}, run_id="forged-entry").run_id
    first = _waiting(client, worker, run)
    version = client.status(run).version
    with pytest.raises(Refused, match="approver 'mallory' is not trusted"):
        client.sign_and_approve(run, first, "approve", "mallory", private)
    assert client.status(run).version == version

    appr = client.status(run).approvals[first]
    _forge_decision(client, run, first, approver="mallory",
                    sig=sign_decision(private, run, first, appr.digest, "approve",
                                      appr.expires))
    second = _waiting(client, worker, run)
    assert second != first and _paid(payer_files) == {}
    report = verify(client.log, run)
    assert not report.ok and "not trusted" in report.checks["approvals_signed"], report.checks


def test_without_admin_keys_no_entry_is_trusted(r: redis.Redis, admin_key: AdminKey,
                                                approver: ApproverFactory) -> None:
    """A process configured with no admin key trusts nobody, and says why."""
    approver("alice", "finance")
    assert Approvers(r, [base64.b64decode(admin_key.public)]).get("alice").distrust == ""  # type: ignore[union-attr]
    blind = Approvers(r, []).get("alice")
    assert blind is not None and "DURABLE_ADMIN_KEYS" in blind.distrust
    with pytest.raises(UsageError, match="not one of DURABLE_ADMIN_KEYS"):
        Approvers(r, []).add("bob", ["x"], load_public_key(keygen()[1]),
                             admin_key=admin_key.private)


def test_the_registry_refuses_reuse_and_reads_every_key_format(client: Client, r: redis.Redis,
                                                               admin_key: AdminKey) -> None:
    reg, admin = client.approvers, admin_key.private
    _private, public = keygen()
    raw = load_public_key(public)
    ssh = Ed25519PublicKey.from_public_bytes(raw).public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    assert load_public_key(ssh) == raw
    assert parse_public_keys(f" {ssh.decode()} , {admin_key.public}") == [
        raw, base64.b64decode(admin_key.public)]
    reg.add("carol", ["ops"], raw, admin_key=admin)
    with pytest.raises(UsageError, match="exists already"):
        reg.add("carol", ["ops"], raw, admin_key=admin)
    with pytest.raises(UsageError, match="at least one"):
        reg.add("dave", [], raw, admin_key=admin)
    assert reg.grant("carol", ["finance"], admin_key=admin).roles == ["finance", "ops"]
    assert reg.get("carol").distrust == ""  # type: ignore[union-attr]
    assert reg.revoke("carol", admin_key=admin).revoked > 0
    assert reg.get("carol").distrust == ""  # type: ignore[union-attr]
    with pytest.raises(UsageError, match="revoked"):
        reg.grant("carol", ["more"], admin_key=admin)
    with pytest.raises(UsageError, match="exists already"):
        reg.add("carol", ["ops"], raw, admin_key=admin)  # a revoked name is never re-used
    with pytest.raises(UsageError, match="revoke it instead"):
        reg.remove_untrusted("carol")
    r.hset("dx:approvers", "eve", "{not json")
    eve = reg.get("eve")
    assert eve is not None and eve.revoked and eve.distrust == "unreadable entry"
    with pytest.raises(UsageError, match="cannot grant roles to 'eve'"):
        reg.grant("eve", ["ops"], admin_key=admin)
    assert reg.remove_untrusted("eve").name == "eve" and reg.get("eve") is None


def test_admin_key_rotation(client: Client, r: redis.Redis, worker: WorkerFactory,
                            payer_files: Path, admin_key: AdminKey, approver: ApproverFactory,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Rotation as the docs give it: the new admin key beside the old in every process's
    DURABLE_ADMIN_KEYS, ``durable approvers resign --admin-key NEW`` (which re-signs only
    entries that verify: a forged one is left alone and named), then the old key dropped.
    A decision made before the rotation still verifies, and a new one is acted on."""
    alice = approver("alice", "finance")
    r.hset("dx:approvers", "mallory", _raw_entry(keygen()[1], ["finance"]))
    run = client.start("payer", {"amount": 3}, run_id="before-rotation").run_id
    client.sign_and_approve(run, _waiting(client, worker, run), "approve", "alice", alice)

    new = AdminKey.make()
    (payer_files / "new-admin.key").write_bytes(new.private)
    both = {**os.environ, "DURABLE_ADMIN_KEYS": f"{admin_key.public},{new.public}"}
    done = run_durable("approvers", "resign", "--admin-key", str(payer_files / "new-admin.key"),
                       env=both)
    assert done.returncode == 1, done.stderr  # mallory's entry is left alone, and said so
    assert "approver alice: re-signed by admin key " + new.fingerprint in done.stdout
    assert "approver mallory: left alone" in done.stderr

    monkeypatch.setenv("DURABLE_ADMIN_KEYS", new.public)  # the old admin key retired
    rotated = Client()
    try:
        assert rotated.approvers.get("alice").admin_key == new.fingerprint  # type: ignore[union-attr]
        assert rotated.approvers.get("mallory").distrust  # type: ignore[union-attr]
        worker()
        assert rotated.wait(run, 30).state == "completed"
        assert verify(rotated.log, run).ok
        later = rotated.start("payer", {"amount": 4}, run_id="after-rotation").run_id
        assert rotated.wait(later, 30).state == "waiting_approval"
        request = next(iter(rotated.status(later).approvals))
        rotated.sign_and_approve(later, request, "approve", "alice", alice)
        assert rotated.wait(later, 30).state == "completed"
        assert verify(rotated.log, later).ok
        listed = run_durable("approvers", "list", "--json", env=dict(os.environ))
        rows = [json.loads(x) for x in listed.stdout.splitlines()]
        trust = {row["name"]: row["trusted"] for row in rows}
        assert trust == {"alice": True, "mallory": False}
    finally:
        rotated.close()
    assert _paid(payer_files) == {f"{run}:1": 1, f"{later}:1": 1}


def test_the_command_line_names_a_wrong_admin_key(client: Client, payer_files: Path,
                                                  admin_file: Path) -> None:
    """An admin key that is not one of DURABLE_ADMIN_KEYS signs nothing (one line, exit 2),
    and ``list`` shows an untrusted entry as such."""
    env = dict(os.environ)
    stranger = keygen()[0]
    (payer_files / "stranger.key").write_bytes(stranger)
    assert run_durable("approvers", "keygen", "bob", "--dir", str(payer_files),
                       env=env).returncode == 0
    wrong = run_durable("approvers", "add", "bob", "--role", "ops", "--public-key",
                        str(payer_files / "bob.pub"), "--admin-key",
                        str(payer_files / "stranger.key"), env=env)
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1, wrong.stderr
    assert "is not one of DURABLE_ADMIN_KEYS" in wrong.stderr
    added = run_durable("approvers", "add", "bob", "--role", "ops", "--public-key",
                        str(payer_files / "bob.pub"), "--admin-key", str(admin_file), env=env)
    assert added.returncode == 0, added.stderr
    granted = run_durable("approvers", "grant", "bob", "--role", "finance", "--admin-key",
                          str(admin_file), env=env)
    assert granted.returncode == 0 and "roles now finance, ops" in granted.stdout
    client.redis.hset("dx:approvers", "eve", _raw_entry(keygen()[1], ["finance"]))
    shown = run_durable("approvers", "list", env={**env, "COLUMNS": "200"})
    assert shown.returncode == 0
    assert "UNTRUSTED" in next(line for line in shown.stdout.splitlines() if "eve" in line)
    assert "active" in next(line for line in shown.stdout.splitlines() if "bob" in line)
