"""Evidence while a run still runs (``durable.log.chain``, ``durable.log.sealer``): a
worker checks a run's chain when it loads it and before it seals it, and seals a running
run at rest, so a writer with full access to Redis but no seal key who rewrites a running
run's history (every link and the head recomputed) or edits an entry in place is caught:
the run is quarantined, the entry named, and nothing is sealed over it. Real Redis, real
worker processes, the real CLI."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import redis

from durable.audit.verify import verify
from durable.client import Client
from durable.log import chain
from durable.log import events as ev
from durable.log.sealer import Seal
from durable.telemetry.metrics import exposition
from durable.testing import wait_for
from tests.conftest import ApproverFactory, WorkerFactory, run_durable
from tests.test_metrics import samples

Raw = list[tuple[str, dict[bytes, bytes]]]


@pytest.fixture()
def sealing(approver: ApproverFactory, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> bytes:
    """A key registered as ``sealer-1`` (role ``sealer``), configured for the processes
    started after."""
    private = approver("sealer-1", "sealer")
    path = tmp_path / "sealer-1.key"
    path.write_bytes(private)
    path.chmod(0o600)
    monkeypatch.setenv("DURABLE_SEAL_KEY", str(path))
    monkeypatch.setenv("DURABLE_SEAL_SIGNER", "sealer-1")
    return private


def _raw(client: Client, run: str) -> Raw:
    return [(i.decode(), f) for i, f in client.redis.xrange(client.log.keys.log(run))]


def _seal(client: Client, run: str) -> Seal | None:
    raw = client.redis.get(client.log.keys.seal(run))
    return Seal.parse(raw) if raw else None


def _at_rest(client: Client, worker: WorkerFactory, run_id: str) -> str:
    """A ``note-then-ask`` run that took its step and waits for input, held by no worker,
    sealed at rest by the worker that let go of it; the entry the seal covers."""
    run = client.start("note-then-ask", {"text": "hi"}, run_id=run_id).run_id
    worker()
    assert wait_for(lambda: client.status(run).state == "waiting_input", 30)
    last = _raw(client, run)[-1][0]
    assert wait_for(lambda: (s := _seal(client, run)) is not None and s.entry == last, 10)
    return last


def _entry(client: Client, run: str, entries: Raw, cls: type[ev.Event]) -> int:
    events = client.log.entries(run, entries)
    return next(i for i, e in enumerate(events) if isinstance(e.event, cls))


def _rechain(client: Client, run: str, entries: Raw) -> None:
    """Write ``entries`` as the run's log with every link recomputed, and the head and the
    checkpoint's chain value in the projection: a forger who can hash, without the seal's
    key."""
    head = chain.genesis(run)
    key, proj = client.log.keys.log(run), client.log.keys.run(run)
    ckpt = (client.redis.hget(proj, "ckpt") or b"").decode()
    pipe = client.redis.pipeline(transaction=True)
    pipe.delete(key)
    for entry_id, fields in entries:
        if entry_id == ckpt:
            pipe.hset(proj, "ckh", f"{ckpt} {head}")
        head = chain.link(head, entry_id, fields[b"e"])
        pipe.xadd(key, {"e": fields[b"e"], "h": chain.tag(head)}, id=entry_id)
    pipe.hset(proj, "last", f"{entries[-1][0]} {head}")
    pipe.execute()


def _edit_in_place(client: Client, run: str, entries: Raw, at: int) -> str:
    """Change step 1's result (``{"n": 1}``) in the entry ``entries[at]``, its link left as
    it was (an edit whose 7 bits differ, as 127 in 128 do: the entry itself is named)."""
    entry_id, fields = entries[at]
    before = chain.genesis(run)
    for i, f in entries[:at]:
        before = chain.link(before, i, f[b"e"])
    data = next(d for n in range(2, 100)
                if (d := fields[b"e"].replace(b"\xa1n\x01", b"\xa1n" + bytes([n]))) and
                chain.tag(chain.link(before, entry_id, d)) != int(fields[b"h"]))
    key = client.log.keys.log(run)
    pipe = client.redis.pipeline(transaction=True)
    pipe.delete(key)
    for i, f in entries:
        pipe.xadd(key, {**f, b"e": data} if i == entry_id else f, id=i)
    pipe.execute()
    assert verify(client.log, run).bad_entry == entry_id
    return entry_id


def _killed(client: Client, worker: WorkerFactory, run_id: str, **opts: str) -> str:
    """A ``count`` run of 3 steps whose worker was SIGKILLed once step 2's outcome was
    recorded, its lease expired: a running run no worker holds."""
    run = client.start("count", {"steps": 3}, run_id=run_id).run_id
    first = worker(kill_at="after_outcome:2", **opts)
    assert first.wait(30) == -signal.SIGKILL
    assert wait_for(lambda: client.redis.get(client.log.keys.lease(run)) is None, 10)
    return run


def _sent(client: Client, run: str, step: int) -> bool:
    """Whether the run's step ``step`` has an outcome in the log."""
    return any(isinstance(e.event, ev.ActionSucceeded) and e.event.step == step
               for e in client.log.read(run))


def _quarantined(client: Client, run: str) -> str:
    """The reason a run was quarantined with, once it is."""
    assert wait_for(lambda: client.status(run).state == "quarantined", 30), \
        client.status(run).state
    return str(client.log.projection(run).get("reason"))


def test_a_forged_history_of_a_running_run_is_quarantined_never_sealed(
        client: Client, worker: WorkerFactory, sealing: bytes, r: redis.Redis) -> None:
    """Window: a run at rest between its steps (its step 1 recorded, waiting for input, held
    by no worker). A forger rewrites step 1's intent (``n: 1`` -> ``n: 1001``) and
    recomputes every link and the head; then the run is answered and a worker resumes it.
    The seal its last worker made at rest signed the true chain value of its last entry:
    the worker's load finds the forged chain's value there, quarantines the run naming that
    entry, and seals nothing; ``verify --require-seal`` fails it."""
    sealed_at = _at_rest(client, worker, "forged-running")
    run = "forged-running"
    entries = _raw(client, run)
    at = _entry(client, run, entries, ev.StepDecided)
    entry_id, fields = entries[at]
    data = fields[b"e"].replace(b"\xa1n\x01", b"\xa1n\xcd\x03\xe9")  # msgpack 1 -> 1001
    assert data != fields[b"e"]
    entries[at] = (entry_id, {**fields, b"e": data})
    _rechain(client, run, entries)
    assert verify(client.log, run).checks["chain"] == "ok"  # the forger could hash

    client.respond(run, "go on")
    reason = _quarantined(client, run)
    assert f"entry {sealed_at}" in reason and "sealed" in reason, reason
    seal = _seal(client, run)
    assert seal is not None and seal.entry == sealed_at  # nothing sealed after the forgery
    res = run_durable("verify", run, "--require-seal", "--json", env=dict(os.environ))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "seal" in json.loads(res.stdout)["failed"], res.stdout
    assert not any(isinstance(e.event, ev.Completed) for e in client.log.read(run))


def test_an_entry_of_a_running_run_edited_in_place_is_named_and_never_sealed(
        client: Client, worker: WorkerFactory, sealing: bytes, r: redis.Redis) -> None:
    """Window: a run at rest between its steps. An entry (step 1's result, before the
    checkpoint and the seal its wait left) is edited in place, the chain left as it was;
    the run is answered and a worker resumes it. The part its load checks (from the
    checkpoint) holds; the append that ends it checks the short log whole before it seals,
    finds the edited entry, and the run is quarantined naming it; nothing is sealed."""
    sealed_at = _at_rest(client, worker, "edited-running")
    run = "edited-running"
    entries = _raw(client, run)
    at = _entry(client, run, entries, ev.ActionSucceeded)
    entry_id = _edit_in_place(client, run, entries, at)

    client.respond(run, "go on")
    reason = _quarantined(client, run)
    assert f"entry {entry_id}" in reason and "does not chain" in reason, reason
    seal = _seal(client, run)
    assert seal is not None and seal.entry == sealed_at
    assert not any(isinstance(e.event, ev.Completed) for e in client.log.read(run))


def test_a_killed_workers_run_edited_in_place_is_quarantined_on_load(
        client: Client, worker: WorkerFactory, sealing: bytes, r: redis.Redis) -> None:
    """Window: the worker SIGKILLed after step 2's outcome was recorded (no checkpoint, no
    seal yet). Step 1's result is edited in place; a fresh worker takes the run over. Its
    load checks the chain from the run's first entry, names the edited entry and
    quarantines the run: step 3 is never sent, nothing is sealed."""
    run = _killed(client, worker, "killed-edited")
    entries = _raw(client, run)
    entry_id = _edit_in_place(client, run, entries,
                              _entry(client, run, entries, ev.ActionSucceeded))
    worker()
    client.enqueue(run, force=True)
    reason = _quarantined(client, run)
    assert f"entry {entry_id}" in reason and "does not chain" in reason, reason
    assert _seal(client, run) is None
    assert not _sent(client, run, 3)
    assert samples(exposition(client)[0].decode())["durable_resume_failures_total"] == {
        (("reason", "chain_broken"),): 1.0}


def test_a_killed_workers_run_forged_before_its_periodic_seal_is_quarantined(
        client: Client, worker: WorkerFactory, sealing: bytes, r: redis.Redis) -> None:
    """Window: the worker SIGKILLed after step 2's outcome was recorded; it sealed the run
    every 2 entries while it ran (``DURABLE_SEAL_EVERY``). Step 1's intent is rewritten and
    every link and the head recomputed; a fresh worker takes the run over. The chain value
    at the last sealed entry is not the signed one: the run is quarantined naming it."""
    run = _killed(client, worker, "killed-forged", DURABLE_SEAL_EVERY="2")
    seal = _seal(client, run)
    assert seal is not None and seal.start is not None
    entries = _raw(client, run)
    at = _entry(client, run, entries, ev.StepDecided)
    entry_id, fields = entries[at]
    data = fields[b"e"].replace(b"\xa1n\x01", b"\xa1n\xcd\x03\xe9")
    assert data != fields[b"e"]
    entries[at] = (entry_id, {**fields, b"e": data})
    _rechain(client, run, entries)
    worker()
    client.enqueue(run, force=True)
    reason = _quarantined(client, run)
    assert f"entry {seal.entry}" in reason and "sealed" in reason, reason
    assert not _sent(client, run, 3)


@pytest.mark.parametrize("every", [{"DURABLE_SEAL_EVERY": "4"},
                                   {"DURABLE_SEAL_EVERY": "0",
                                    "DURABLE_SEAL_INTERVAL_MS": "300"}],
                         ids=["every-4-entries", "every-300-ms"])
def test_a_running_run_is_sealed_by_its_lease_holder_as_it_goes(
        client: Client, worker: WorkerFactory, sealing: bytes, every: dict[str, str]) -> None:
    """A run of slow steps, while a worker holds it: sealed every N entries (or T ms), each
    seal checked by its signer from the seal before it, and shown by ``verify`` of the
    running run. Its end is sealed too, checked from its first entry (a short log is
    checked whole)."""
    run = client.start("count", {"steps": 8, "sleep_s": 0.2}, run_id="sealed-as-it-goes").run_id
    worker(**every)
    assert wait_for(lambda: (s := _seal(client, run)) is not None and s.start is not None
                    and s.start != "", 60), _seal(client, run)
    seal = _seal(client, run)
    assert seal is not None and client.status(run).state == "pending"
    assert seal.start in {i for i, _ in _raw(client, run)}
    report = verify(client.log, run, require_seal=True)
    assert report.checks["chain"] == "ok", report.checks
    assert "sealed by sealer-1" in report.checks["seal"], report.checks
    assert client.wait(run, 60).state == "completed"
    assert wait_for(lambda: (s := _seal(client, run)) is not None and
                    s.entry == _raw(client, run)[-1][0], 10)
    ended = verify(client.log, run, require_seal=True)
    assert ended.ok, ended.checks
    assert "checked by its signer from the run's first entry" in ended.checks["seal"]
