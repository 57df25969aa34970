"""Seals (``durable.audit.seals``): the process that ends a run signs its log's hash chain
head with a key an admin registered (role ``sealer``), so a writer with full access who
edits the log *and* recomputes the whole chain (every link, the head) is caught; a run
without a seal says so ("unsealed (chain only)"), and ``--require-seal`` fails it; a seal
not made by the registered key is a clear error, and nothing is written. Real Redis, real
worker processes, the real CLI."""

from __future__ import annotations

import base64
import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest
import redis

from durable.audit.verify import verify
from durable.client import Client
from durable.log import chain, keys
from durable.log import events as ev
from durable.log.sealer import Seal, Sealer
from durable.security.signing import keygen
from durable.testing import wait_for
from tests.conftest import ApproverFactory, ReconcilerFactory, WorkerFactory, run_durable

Raw = list[tuple[str, dict[bytes, bytes]]]


def _key_file(tmp_path: Path, name: str, pem: bytes) -> Path:
    path = tmp_path / f"{name}.key"
    path.write_bytes(pem)
    path.chmod(0o600)
    return path


@pytest.fixture()
def sealing(approver: ApproverFactory, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> bytes:
    """A key registered as ``sealer-1`` with the role ``sealer``, configured for the
    processes started after (``DURABLE_SEAL_KEY``, ``DURABLE_SEAL_SIGNER``)."""
    private = approver("sealer-1", "sealer")
    monkeypatch.setenv("DURABLE_SEAL_KEY", str(_key_file(tmp_path, "sealer-1", private)))
    monkeypatch.setenv("DURABLE_SEAL_SIGNER", "sealer-1")
    return private


def _ended(client: Client, worker: WorkerFactory, run_id: str, **opts: str) -> str:
    """A ``count`` run a worker (``opts``: its settings) drove to ``completed``, and sealed
    when it has a seal key (the seal follows the terminal append: waited for)."""
    run = client.start("count", {"steps": 3}, run_id=run_id).run_id
    worker(**opts)
    assert client.wait(run, 30).state == "completed"
    if os.environ.get("DURABLE_SEAL_KEY"):
        assert wait_for(lambda: client.redis.get(client.log.keys.seal(run)), 10)
    return run


def _raw(client: Client, run: str) -> Raw:
    return [(i.decode(), f) for i, f in client.redis.xrange(client.log.keys.log(run))]


def _rechained(client: Client, run: str, entries: Raw) -> None:
    """Write ``entries`` as the run's log with every link recomputed, and the head in the
    projection: a forger who can hash, without the seal's key."""
    head = chain.genesis(run)
    key = client.log.keys.log(run)
    pipe = client.redis.pipeline(transaction=True)
    pipe.delete(key)
    for entry_id, fields in entries:
        head = chain.link(head, entry_id, fields[b"e"])
        pipe.xadd(key, {"e": fields[b"e"], "h": chain.tag(head)}, id=entry_id)
    pipe.hset(client.log.keys.run(run), "last", f"{entries[-1][0]} {head}")
    pipe.execute()


def _edited(client: Client, run: str) -> Raw:
    """The run's entries with step 2's result changed."""
    entries = _raw(client, run)
    events = client.log.entries(run, entries)
    at = next(i for i, e in enumerate(events)
              if isinstance(e.event, ev.ActionSucceeded) and e.event.step == 2)
    entry_id, fields = entries[at]
    data = fields[b"e"].replace(b"\xa1n\x02", b"\xa1n\x63")
    assert data != fields[b"e"]
    entries[at] = (entry_id, {**fields, b"e": data})
    return entries


@pytest.mark.cluster
def test_a_worker_with_a_seal_key_seals_the_runs_it_ends(
        client: Client, worker: WorkerFactory, sealing: bytes, r: redis.Redis) -> None:
    run = _ended(client, worker, "sealed", DURABLE_RETENTION="1h")
    seal = Seal.parse(r.get(client.log.keys.seal(run)))
    # It expires with the run's other keys (DURABLE_RETENTION).
    assert 0 <= r.pttl(client.log.keys.run(run)) - r.pttl(client.log.keys.seal(run)) < 5000
    assert r.pttl(client.log.keys.seal(run)) > 3_500_000
    last = _raw(client, run)[-1][0]
    # A key of its own, beside the projection, which stays a small listpack hash.
    assert r.object("encoding", client.log.keys.run(run)) in (b"listpack", b"ziplist")
    assert seal is not None and seal.by == "sealer-1" and seal.entry == last
    report = verify(client.log, run, require_seal=True)
    assert report.ok, report
    assert report.checks["seal"].startswith("sealed by sealer-1 (ed25519:"), report.checks
    assert f"at entry {last}, its chain checked by its signer from" in report.checks["seal"]
    res = run_durable("verify", run, "--require-seal", "--json", env=dict(os.environ))
    assert res.returncode == 0 and json.loads(res.stdout)["ok"], res.stdout + res.stderr


def test_a_log_edited_and_rechained_is_caught_by_its_seal(
        client: Client, worker: WorkerFactory, sealing: bytes, r: redis.Redis,
        tmp_path: Path) -> None:
    """Window: a sealed, completed run. A forger edits step 2's result and recomputes the
    whole chain (every link, the head): the chain holds, the seal does not. Re-signing with
    a key of their own under the signer's name, naming a signer nobody registered, or
    cutting the tail (the chain recomputed) is caught the same way; deleting the seal
    leaves the run "unsealed (chain only)", which ``--require-seal`` fails."""
    run = _ended(client, worker, "rechained")
    _rechained(client, run, _edited(client, run))
    report = verify(client.log, run)
    assert report.checks["chain"] == "ok", report.checks  # the forger could hash
    assert report.failed == ["seal"], report.checks
    assert "rewritten after it was sealed" in report.checks["seal"]
    res = run_durable("verify", run, "--json", env=dict(os.environ))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "rewritten after it was sealed" in json.loads(res.stdout)["checks"]["seal"]

    _, head = chain.split_last(r.hget(client.log.keys.run(run), "last"))
    assert head is not None
    last = _raw(client, run)[-1][0]
    mallory, _ = keygen()
    forged = Sealer(mallory, "sealer-1").seal(run, last, head)
    real = Seal.parse(r.get(client.log.keys.seal(run)))
    assert real is not None
    for seal, why in ((Seal(forged.by, real.key, last, forged.sig), "rewritten after it"),
                      (forged, "is not sealer-1's registered key"),
                      (Sealer(mallory, "mallory").seal(run, last, head), "unknown signer")):
        r.set(client.log.keys.seal(run), seal.encode())
        report = verify(client.log, run)
        assert report.failed == ["seal"] and why in report.checks["seal"], report.checks

    r.delete(client.log.keys.seal(run))
    report = verify(client.log, run)
    assert report.ok and report.checks["seal"].startswith("unsealed (chain only)"), report
    report = verify(client.log, run, require_seal=True)
    assert report.failed == ["seal"], report.checks
    res = run_durable("verify", run, "--require-seal", "--json", env=dict(os.environ))
    assert res.returncode == 1, res.stdout + res.stderr
    assert json.loads(res.stdout)["checks"]["seal"].startswith("unsealed (chain only)")


def test_a_cut_tail_rechained_is_caught_by_its_seal(
        client: Client, worker: WorkerFactory, sealing: bytes, r: redis.Redis) -> None:
    """The last entries removed, the chain recomputed, the projection made to agree: the
    seal names an entry the log no longer has."""
    run = _ended(client, worker, "cut")
    entries = _raw(client, run)
    kept = entries[:-2]
    _rechained(client, run, kept)
    r.hset(client.log.keys.run(run), mapping={"version": len(kept), "state": "pending",
                                              "step": 3})
    report = verify(client.log, run)
    assert report.checks["chain"] == "ok" and "seal" in report.failed, report.checks
    assert f"covers entry {entries[-1][0]}, which is not in the log" in report.checks["seal"]


def test_an_unsealed_run_says_so_and_durable_seal_seals_it_with_a_registered_key_only(
        client: Client, worker: WorkerFactory, approver: ApproverFactory, r: redis.Redis,
        tmp_path: Path) -> None:
    """A run ended by a worker without a seal key verifies, shown "unsealed (chain only)".
    ``durable seal`` with a key that is not the signer's registered one (a forgery), or a
    signer without the role, is refused in one line, exit 1, and writes nothing; with the
    registered key the run is sealed and verifies with ``--require-seal``."""
    run = _ended(client, worker, "later")
    report = verify(client.log, run)
    assert report.ok and report.checks["seal"].startswith("unsealed (chain only)"), report
    assert not verify(client.log, run, require_seal=True).ok

    good = _key_file(tmp_path, "sealer-2", approver("sealer-2", "sealer"))
    other = _key_file(tmp_path, "other", keygen()[0])
    finance = _key_file(tmp_path, "fin", approver("fin", "finance"))
    env = dict(os.environ)
    for signer, key, why in (("sealer-2", other, "is not sealer-2's registered key"),
                             ("fin", finance, "does not have the role 'sealer'"),
                             ("nobody", other, "unknown signer")):
        res = run_durable("seal", run, "--signer", signer, "--key", str(key), env=env)
        assert res.returncode == 1 and res.stderr.count("\n") == 1, (res.stdout, res.stderr)
        assert why in res.stderr, res.stderr
        assert r.get(client.log.keys.seal(run)) is None  # nothing written

    res = run_durable("seal", run, "--signer", "sealer-2", "--key", str(good), env=env)
    assert res.returncode == 0, res.stderr
    report = verify(client.log, run, require_seal=True)
    assert report.ok and "sealed by sealer-2" in report.checks["seal"], report


def test_durable_seal_refuses_a_run_that_has_not_ended_or_does_not_chain(
        client: Client, worker: WorkerFactory, approver: ApproverFactory, r: redis.Redis,
        tmp_path: Path) -> None:
    key = _key_file(tmp_path, "sealer-3", approver("sealer-3", "sealer"))
    env = dict(os.environ)
    pending = client.start("count", {"steps": 1}, run_id="pending", enqueue=False).run_id
    res = run_durable("seal", pending, "--signer", "sealer-3", "--key", str(key), env=env)
    assert res.returncode == 1 and "has not ended" in res.stderr, res.stderr

    run = _ended(client, worker, "broken")
    entries = _edited(client, run)
    pipe = r.pipeline(transaction=True)
    pipe.delete(client.log.keys.log(run))
    for entry_id, fields in entries:
        pipe.xadd(client.log.keys.log(run), dict(fields), id=entry_id)
    pipe.execute()
    res = run_durable("seal", run, "--signer", "sealer-3", "--key", str(key), env=env)
    assert res.returncode == 1 and "does not chain" in res.stderr, res.stderr
    assert r.get(client.log.keys.seal(run)) is None


def test_a_process_whose_seal_key_is_not_its_signers_refuses_to_start(
        client: Client, worker: WorkerFactory, approver: ApproverFactory, r: redis.Redis,
        tmp_path: Path) -> None:
    """A seal key that is not the registered signer's would make seals no one can verify:
    the worker and the CLI stop at once with one line and write nothing."""
    approver("sealer-4", "sealer")
    wrong = _key_file(tmp_path, "wrong", keygen()[0])
    env = {**os.environ, "DURABLE_SEAL_KEY": str(wrong), "DURABLE_SEAL_SIGNER": "sealer-4"}
    res = run_durable("start", "count", "--input", '{"steps": 1}', "--run-id", "nope", env=env)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "DURABLE_SEAL_KEY" in res.stderr and "not sealer-4's registered key" in res.stderr
    assert not r.exists(client.log.keys.run("nope"))

    log = tmp_path / "worker.log"
    w = worker(log_path=log, DURABLE_SEAL_KEY=str(wrong), DURABLE_SEAL_SIGNER="sealer-4")
    assert w.wait(30) == 2, log.read_text()
    assert "not sealer-4's registered key" in log.read_text()


def _write_archive(path: Path, lines: list[dict[str, Any]]) -> None:
    with gzip.open(path, "wt") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


def _verify_archive(path: Path, *args: str) -> dict[str, Any]:
    res = run_durable("verify-archive", str(path), "--json", *args, env=dict(os.environ))
    out: dict[str, Any] = json.loads(res.stdout)
    assert res.returncode == (0 if out["ok"] else 1), res.stderr
    return out


def test_an_archived_run_verifies_from_its_file_and_tampering_with_it_is_named(
        client: Client, worker: WorkerFactory, sealing: bytes, r: redis.Redis,
        tmp_path: Path) -> None:
    """``durable archive`` takes a sealed run's keys away; its file keeps each entry's
    bytes and link, the head and the seal, and verifies on its own. The file's readable
    fields edited, an entry's bytes edited, an entry removed, or the bytes edited and the
    whole chain recomputed: each is named."""
    run = _ended(client, worker, "archived")
    out = tmp_path / "archive"
    done = run_durable("archive", "--older-than", "1ms", "--to", str(out), "--json",
                       env=dict(os.environ))
    assert done.returncode == 0 and json.loads(done.stdout)["archived"] == [run], done.stderr
    assert not r.exists(client.log.keys.log(run), client.log.keys.run(run),
                        client.log.keys.seal(run))
    path = out / f"{run}.jsonl.gz"
    report = _verify_archive(path, "--require-seal")
    assert report["ok"] and report["checks"]["chain"] == "ok", report
    assert report["checks"]["seal"].startswith("sealed by sealer-1"), report

    with gzip.open(path, "rt") as f:
        lines = [json.loads(line) for line in f]
    events = [i for i, line in enumerate(lines) if line["kind"] == "event"]
    succeeded = [i for i in events if lines[i]["type"] == "action_succeeded"]
    forged = tmp_path / "forged.jsonl.gz"

    shown = [dict(line) for line in lines]
    shown[succeeded[1]]["result"] = {"n": 99}  # the readable fields only
    _write_archive(forged, shown)
    report = _verify_archive(forged)
    assert report["failed"] == ["readable"], report
    assert lines[succeeded[1]]["id"] in report["checks"]["readable"]

    def edited(i: int, to: int = 0x63) -> list[dict[str, Any]]:
        copy = [dict(line) for line in lines]
        data = base64.b64decode(copy[i]["raw"]).replace(b"\xa1n\x02", b"\xa1n" + bytes([to]))
        copy[i]["raw"] = base64.b64encode(data).decode()
        copy[i]["result"] = {"n": to}
        return copy

    def breaks(copy: list[dict[str, Any]]) -> str | None:
        return _first_break(run, [(str(copy[i]["id"]), _fields(copy[i])) for i in events
                                  if copy[i]["kind"] == "event"])

    # (an edit its entry's 7 bits do not match by luck: see tests/test_log_chain.py; only
    # the entry whose result is n=2 changes, so the value tried is what varies)
    target, to = next((i, to) for to in range(0x63, 0x73) for i in succeeded
                      if breaks(edited(i, to)) == lines[i]["id"])
    _write_archive(forged, edited(target, to))
    report = _verify_archive(forged)
    assert report["bad_entry"] == lines[target]["id"] and "chain" in report["failed"], report

    gone = next(i for i in events[2:-2]
                if breaks(lines[:i] + lines[i + 1:]) == lines[i + 1]["id"])
    _write_archive(forged, lines[:gone] + lines[gone + 1:])
    report = _verify_archive(forged)
    assert report["bad_entry"] == lines[gone + 1]["id"], report
    assert {"chain", "contiguous"} <= set(report["failed"]), report

    rechained = edited(target, to)
    head = chain.genesis(run)
    for i in events:
        head = chain.link(head, str(rechained[i]["id"]), base64.b64decode(rechained[i]["raw"]))
        rechained[i]["h"] = chain.tag(head)
    (at,) = [i for i, line in enumerate(rechained) if line["kind"] == "chain"]
    rechained[at]["last"] = f"{rechained[events[-1]]['id']} {head}"
    _write_archive(forged, rechained)
    report = _verify_archive(forged)
    assert report["failed"] == ["seal"], report
    assert report["checks"]["chain"] == "ok"
    assert "rewritten after it was sealed" in report["checks"]["seal"]


def _fields(line: dict[str, Any]) -> dict[bytes, bytes]:
    fields = {b"e": base64.b64decode(str(line["raw"]))}
    if "h" in line:
        fields[b"h"] = str(line["h"]).encode()
    return fields


def _first_break(run: str, entries: Raw) -> str | None:
    """Where the chain breaks, by the construction alone (see tests/test_log_chain.py)."""
    head = None
    for entry_id, fields in entries:
        if b"h" not in fields:
            if head is None:
                continue
            return entry_id
        head = chain.link(head or chain.genesis(run), entry_id, fields[b"e"])
        if int(fields[b"h"]) != chain.tag(head):
            return entry_id
    return None


def test_a_reconciler_with_a_seal_key_seals_the_runs_that_ended_unsealed(
        client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory,
        approver: ApproverFactory, r: redis.Redis, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Window: the process that ended the run never wrote its seal (it died between the
    terminal append and the seal, or had no seal key: the same log either way). A
    reconciler started with a registered seal key seals it on a sweep, once the run has been
    terminal for the grace, and ``verify --require-seal`` passes. A run whose log no longer
    chains (an entry deleted) is refused, named in the reconciler's log, and left unsealed:
    a seal would vouch for the edit."""
    run = _ended(client, worker, "orphan-seal")
    edited = _ended(client, worker, "edited-unsealed")
    middle = _raw(client, edited)[2][0]
    r.xdel(client.log.keys.log(edited), middle)
    assert not verify(client.log, run, require_seal=True).ok

    private = approver("sealer-3", "sealer")
    monkeypatch.setenv("DURABLE_SEAL_KEY", str(_key_file(tmp_path, "sealer-3", private)))
    monkeypatch.setenv("DURABLE_SEAL_SIGNER", "sealer-3")
    out = tmp_path / "reconciler.log"
    reconciler(log_path=out)
    assert wait_for(lambda: r.get(client.log.keys.seal(run)), 30)
    report = verify(client.log, run, require_seal=True)
    assert report.ok and "sealed by sealer-3" in report.checks["seal"], report
    assert wait_for(lambda: f"run {edited} ended unsealed and is not sealed" in out.read_text(),
                    30), out.read_text()
    assert "does not chain" in out.read_text()
    assert r.get(client.log.keys.seal(edited)) is None
    assert int(r.hget(keys.STATS, "runs_sealed_by_reconciler") or 0) >= 1
