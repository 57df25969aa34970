"""The log's hash chain (``durable.log.chain``): every entry the append script writes carries
its link, the chain's head is kept with the projection, and ``verify`` (the library and
``durable verify``) names the first entry that does not chain after someone with full
access to Redis edited, deleted, inserted, reordered or cut entries, even when they also
renumbered the entries' seqs and fixed the projection (which today's other checks cannot
see). A log written before the chain existed verifies as unchained, not failed.

Real Redis, a real worker process, the real CLI. Each entry carries only 7 bits of its
chain value, so a tampered entry has a 1 in 128 chance of matching by luck (it then shows
at the entry after it); each test picks what it tampers with so that it does not (checked
by ``_first_break``, the construction alone), and asserts the exact entry named.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import msgspec
import pytest
import redis

from durable.audit.verify import verify
from durable.client import Client
from durable.log import chain
from durable.log import events as ev
from durable.log.fold import fold
from durable.log.store import Spec
from tests.conftest import WorkerFactory, run_durable

Raw = list[tuple[str, dict[bytes, bytes]]]


@pytest.fixture()
def done(client: Client, worker: WorkerFactory) -> str:
    """A run of the ``count`` agent a real worker drove to ``completed``: 14 entries."""
    run = client.start("count", {"steps": 4}, run_id="chained").run_id
    worker()
    assert client.wait(run, 30).state == "completed"
    return run


def _raw(client: Client, run: str) -> Raw:
    return [(i.decode(), f) for i, f in client.redis.xrange(client.log.keys.log(run))]


def _write(client: Client, run: str, entries: Raw) -> None:
    """Replace the run's log with ``entries`` (ids and fields as given): what anyone who
    can write Redis can do (``DEL`` + ``XADD`` with explicit ids)."""
    key = client.log.keys.log(run)
    pipe = client.redis.pipeline(transaction=True)
    pipe.delete(key)
    for entry_id, fields in entries:
        pipe.xadd(key, dict(fields), id=entry_id)
    pipe.execute()


def _renumbered(client: Client, run: str, entries: Raw) -> Raw:
    """``entries`` with every seq made 1, 2, 3... again (each event re-encoded, its actor
    left out where it was), and the projection's version set to match: a forger covering
    a deletion or an insertion from the seq checks and the projection check."""
    events = client.log.entries(run, entries)
    out: Raw = []
    for pos, ((entry_id, fields), entry) in enumerate(zip(entries, events, strict=True), 1):
        event = entry.event
        assert event is not None
        if event.seq != pos:
            same = not ev.named_actor(fields[b"e"])
            fields = {**fields, b"e": ev.encode(msgspec.structs.replace(event, seq=pos),
                                                same_actor=same)}
        out.append((entry_id, fields))
    client.redis.hset(client.log.keys.run(run), "version", len(out))
    return out


def _first_break(run: str, entries: Raw) -> str | None:
    """Where the chain breaks in ``entries``, by the construction alone (it starts from h_0
    at the first entry with a link; the link; the 7 bits): what verify must name."""
    head = None
    for entry_id, fields in entries:
        if b"h" not in fields:
            if head is None:
                continue
            return entry_id
        head = head or chain.genesis(run)
        head = chain.link(head, entry_id, fields[b"e"])
        if int(fields[b"h"]) != chain.tag(head):
            return entry_id
    return None


def _pick(candidates: range, tamper: Callable[[int], Raw], run: str,
          expected: Callable[[int], str]) -> tuple[int, Raw]:
    """The first candidate whose tampered log breaks exactly where ``expected`` says (not
    one whose 7 bits match by luck), and that log."""
    for k in candidates:
        forged = tamper(k)
        if _first_break(run, forged) == expected(k):
            return k, forged
    raise AssertionError("every candidate matched its 7 bits by luck")


def _only_chain_fails(client: Client, run: str, entry_id: str) -> None:
    report = verify(client.log, run)
    assert not report.ok and report.bad_entry == entry_id, report
    assert entry_id in report.checks["chain"], report.checks
    assert report.failed == ["chain"], report.checks


@pytest.mark.cluster
def test_a_run_a_worker_drove_is_chained_and_verifies_clean(client: Client, done: str,
                                                            r: redis.Redis) -> None:
    entries = _raw(client, done)
    assert entries and all(b"h" in f for _, f in entries)
    assert _first_break(done, entries) is None
    last_id, head = chain.split_last(r.hget(client.log.keys.run(done), "last"))
    assert last_id == entries[-1][0] and head is not None
    found = chain.check(done, entries, r.hget(client.log.keys.run(done), "last"))
    assert found.ok and found.unchained == 0 and found.entries == len(entries)
    report = verify(client.log, done)
    assert report.ok and report.checks["chain"] == "ok" and report.bad_entry is None, report
    res = run_durable("verify", done, "--json", env=dict(os.environ))
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["ok"] and out["checks"]["chain"] == "ok" and out["bad_entry"] is None


def test_an_entry_edited_in_place_is_named(client: Client, done: str) -> None:
    """A step's recorded result changed, the entry put back under its own id with its own
    link: every other check still passes (seqs, fold, projection, ledger)."""
    entries = _raw(client, done)
    events = client.log.entries(done, entries)
    succeeded = [i for i, e in enumerate(events) if isinstance(e.event, ev.ActionSucceeded)]

    def edit(k: int) -> Raw:
        entry_id, fields = entries[succeeded[k % len(succeeded)]]
        value = 100 + k // len(succeeded)  # another result, the same size on the wire
        data = fields[b"e"].replace(b"\xa1n" + bytes([k % len(succeeded) + 1]),
                                    b"\xa1n" + bytes([value]))
        assert data != fields[b"e"]
        forged = list(entries)
        forged[succeeded[k % len(succeeded)]] = (entry_id, {**fields, b"e": data})
        return forged

    k, forged = _pick(range(40), edit, done,
                      lambda k: entries[succeeded[k % len(succeeded)]][0])
    _write(client, done, forged)
    target = entries[succeeded[k % len(succeeded)]][0]
    assert client.log.read(done, target, target)[0].event.result["n"] >= 100  # type: ignore
    _only_chain_fails(client, done, target)
    res = run_durable("verify", done, env=dict(os.environ))
    assert res.returncode == 1 and target in res.stdout, res.stdout


def test_a_deleted_entry_is_named_even_with_the_seqs_after_it_renumbered(
        client: Client, done: str) -> None:
    """An entry removed from the middle, every later seq moved down and the projection's
    version with them: the seq checks and the projection agree; the chain breaks at the
    entry that now follows the gap."""
    entries = _raw(client, done)

    def delete(k: int) -> Raw:
        return _renumbered(client, done, entries[:k] + entries[k + 1:])

    k, forged = _pick(range(3, len(entries) - 2), delete, done, lambda k: entries[k + 1][0])
    _write(client, done, forged)
    _only_chain_fails(client, done, entries[k + 1][0])
    assert entries[k - 1][0] in verify(client.log, done).checks["chain"]


def test_an_inserted_entry_is_named(client: Client, done: str) -> None:
    """An entry slipped in between two others, later seqs renumbered: one written without a
    link (a raw ``XADD``) is named for that; one given the link the chain expects there
    breaks the chain at the entry after it, and the report names both."""
    entries = _raw(client, done)
    gaps = [i for i in range(2, len(entries) - 2)
            if ev.entry_ms(entries[i][0]) < ev.entry_ms(entries[i + 1][0])]

    def insert(k: int, linked: bool) -> Raw:
        gap = gaps[k]
        ms, _, seq = entries[gap][0].partition("-")
        new_id = f"{ms}-{int(seq) + 1}"
        template = client.log.entries(done, entries)[gap].event
        assert template is not None
        fields = {b"e": ev.encode(msgspec.structs.replace(template, actor="mallory"))}
        forged = _renumbered(client, done, [*entries[:gap + 1], (new_id, fields),
                                            *entries[gap + 1:]])
        if linked:  # the link a forger computes from the chain before it
            head = chain.genesis(done)
            for entry_id, before in forged[:gap + 1]:
                head = chain.link(head, entry_id, before[b"e"])
            data = forged[gap + 1][1][b"e"]
            forged[gap + 1] = (new_id, {b"e": data, b"h": str(chain.tag(
                chain.link(head, new_id, data))).encode()})
        return forged

    forged = insert(0, False)
    new_id = forged[gaps[0] + 1][0]
    _write(client, done, forged)
    report = verify(client.log, done)
    assert report.bad_entry == new_id and "no chain link" in report.checks["chain"], report
    assert set(report.failed) <= {"chain", "one_success_per_key"}, report.checks  # (a copied
    # success repeats one)

    k, forged = _pick(range(len(gaps)), lambda k: insert(k, True), done,
                      lambda k: entries[gaps[k] + 1][0])
    _write(client, done, forged)
    report = verify(client.log, done)
    assert report.bad_entry == entries[gaps[k] + 1][0], report
    assert forged[gaps[k] + 1][0] in report.checks["chain"], report


def test_reordered_entries_are_named(client: Client, done: str) -> None:
    """Two neighbouring entries swapped (each keeping its place's id), seqs renumbered."""
    entries = _raw(client, done)

    def swap(k: int) -> Raw:
        forged = list(entries)
        (a_id, a), (b_id, b) = entries[k], entries[k + 1]
        forged[k], forged[k + 1] = (a_id, b), (b_id, a)
        return _renumbered(client, done, forged)

    k, forged = _pick(range(2, len(entries) - 2), swap, done, lambda k: entries[k][0])
    _write(client, done, forged)
    report = verify(client.log, done)
    assert not report.ok and report.bad_entry == entries[k][0], report
    assert entries[k][0] in report.checks["chain"]


def test_a_cut_tail_is_named(client: Client, done: str, r: redis.Redis) -> None:
    """The last entries removed: the entry the append script wrote last is named missing.
    Then the projection made to agree with the shorter log (state, version, step, the last
    id): the seq and projection checks pass, the chain's head does not."""
    entries = _raw(client, done)
    kept = entries[:-3]
    _write(client, done, kept)
    report = verify(client.log, done)
    assert not report.ok and report.bad_entry == entries[-1][0], report
    assert "missing" in report.checks["chain"] and kept[-1][0] in report.checks["chain"]

    state = fold([e.event for e in client.log.entries(done, kept) if e.event is not None])
    _, head = chain.split_last(r.hget(client.log.keys.run(done), "last"))
    r.hset(client.log.keys.run(done), mapping={
        "state": state.state, "version": state.version, "step": state.step,
        "last": f"{kept[-1][0]} {head}"})
    report = verify(client.log, done)
    assert not report.ok and report.checks["projection"] == "ok", report
    assert report.bad_entry == kept[-1][0] and "head" in report.checks["chain"], report


def test_a_log_written_before_the_chain_verifies_as_unchained_before_its_first_link(
        client: Client, r: redis.Redis) -> None:
    """A run whose entries carry no link and whose projection holds no head (written by the
    code before the chain) verifies, saying so; entries appended now are chained from
    ``h_0``, and the run verifies as unchained before the first of them. Taking the links
    off a chained run's first entries is not taken for an old run."""
    run = client.start("count", {"steps": 1}, run_id="old", enqueue=False).run_id
    handle = client.log.load(run, actor="w")
    client.log.commit(handle, [Spec(ev.LeaseAcquired, {"owner": "w", "epoch": 1})])
    old = [(i, {b"e": f[b"e"]}) for i, f in _raw(client, run)]
    _write(client, run, old)
    r.hset(client.log.keys.run(run), "last", old[-1][0])
    report = verify(client.log, run)
    assert report.ok and report.checks["chain"].startswith("unchained"), report

    handle = client.log.load(run, actor="w")
    client.log.commit(handle, [Spec(ev.Released, {"by": "w"})])
    entries = _raw(client, run)
    assert [b"h" in f for _, f in entries] == [False, False, True]
    report = verify(client.log, run)
    assert report.ok, report
    assert f"unchained before entry {entries[2][0]}" in report.checks["chain"], report

    chained = client.start("count", {"steps": 1}, run_id="new", enqueue=False).run_id
    handle = client.log.load(chained, actor="w")
    for epoch in range(1, 6):
        client.log.commit(handle, [Spec(ev.LeaseAcquired, {"owner": "w", "epoch": epoch}),
                                   Spec(ev.Released, {"by": "w"})])
    entries = _raw(client, chained)

    def strip(n: int) -> Raw:
        return [(i, {b"e": f[b"e"]}) if pos < n else (i, f)
                for pos, (i, f) in enumerate(entries)]

    n, stripped = _pick(range(1, len(entries) - 1), strip, chained, lambda n: entries[n][0])
    _write(client, chained, stripped)
    report = verify(client.log, chained)
    assert not report.ok and report.bad_entry == entries[n][0], report
