"""Optimistic updates (``durable.contention.update_run``) against a real log: a writer that
loses the race folds again and decides again, and one that loses every time gives up with
``RunContended`` having written nothing."""

from __future__ import annotations

import inspect

import pytest
import redis

import durable
from durable import client as client_module
from durable.audit.verify import verify
from durable.client import Client
from durable.contention import ATTEMPTS, update_run
from durable.controls import answers, cancellation, children, quarantine, settling
from durable.errors import DurableError, RunContended
from durable.log import events as ev
from durable.log.state import RunState
from durable.log.store import EventLog, RunHandle, Spec
from durable.workers import family
from tests.agents import basic  # noqa: F401 - registers the test agents


def _rival(elog: EventLog, run_id: str, n: int) -> None:
    """Another writer appending between our fold and our commit."""
    elog.commit(elog.load(run_id, actor="rival"),
                [Spec(ev.LeaseAcquired, {"owner": "rival", "epoch": n})])


def _ours(elog: EventLog, handle: RunHandle) -> int:
    elog.commit(handle, [Spec(ev.CancelRequested, {"reason": "ours", "scope": "call",
                                                   "requested_ts": 1, "by": "us"})])
    return handle.state.version


def _ours_in_log(elog: EventLog, run_id: str) -> int:
    return sum(1 for e in elog.read(run_id) if isinstance(e.event, ev.CancelRequested))


@pytest.mark.cluster
def test_a_writer_that_loses_three_races_folds_again_and_lands_once(client: Client,
                                                                     r: redis.Redis) -> None:
    client.start("count", {"steps": 1}, run_id="race3", enqueue=False)
    elog, seen = EventLog(r, layout=client.log.keys), []

    def write(handle: RunHandle) -> int:
        seen.append(handle.state.version)  # each attempt decides from a fresh fold
        if len(seen) <= 3:
            _rival(elog, "race3", len(seen))
        return _ours(elog, handle)

    version = update_run(elog, "race3", "us", write)
    assert seen == [1, 2, 3, 4] and version == 5
    assert _ours_in_log(elog, "race3") == 1
    assert verify(elog, "race3").ok


@pytest.mark.cluster
def test_a_writer_that_always_loses_gives_up_with_run_contended_and_writes_nothing(
        client: Client, r: redis.Redis) -> None:
    client.start("count", {"steps": 1}, run_id="race_all", enqueue=False)
    elog, attempts = EventLog(r, layout=client.log.keys), []

    def write(handle: RunHandle) -> int:
        attempts.append(handle.state.version)
        _rival(elog, "race_all", len(attempts))
        return _ours(elog, handle)

    with pytest.raises(RunContended) as caught:
        update_run(elog, "race_all", "us", write)
    assert len(attempts) == ATTEMPTS
    assert (caught.value.run_id, caught.value.attempts) == ("race_all", ATTEMPTS)
    assert "nothing was written" in str(caught.value)
    assert isinstance(caught.value, DurableError) and durable.RunContended is RunContended
    assert _ours_in_log(elog, "race_all") == 0  # the rival's appends only
    assert elog.load("race_all").state.version == 1 + ATTEMPTS


def test_a_write_that_decides_to_write_nothing_returns_at_once(client: Client,
                                                               r: redis.Redis) -> None:
    client.start("count", {"steps": 1}, run_id="noop", enqueue=False)
    elog = EventLog(r, layout=client.log.keys)
    before = r.xlen(client.log.keys.log("noop"))
    calls: list[int] = []

    def write_nothing(handle: RunHandle) -> str:
        calls.append(1)
        return "left"

    assert update_run(elog, "noop", "us", write_nothing) == "left"
    assert calls == [1] and elog.load("noop").state.version == 1
    assert r.xlen(client.log.keys.log("noop")) == before == 1


def test_every_operator_update_gives_up_the_same_way() -> None:
    """Cancel, answers, approvals, settle, release, a parent's wake-up and its children's
    cancel all go through ``update_run`` (or ``update_run_async``, the same loop awaited):
    none of them keeps a retry loop (and a give-up) of its own, the worker's side included."""
    for module in (answers, cancellation, children, client_module, quarantine, settling):
        source = inspect.getsource(module)
        assert "update_run(" in source or "update_run_async(" in source, module.__name__
        assert "except ConflictError:" not in source, module.__name__
    assert "ConflictError" not in inspect.getsource(family)  # it awaits the library's


def test_a_wake_up_that_always_loses_gives_up_with_run_contended(client: Client,
                                                                 r: redis.Redis,
                                                                 monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    """A parent's wake-up that finds its parent moved on every time raises
    ``RunContended`` (it used to return None, as if there were nothing to wake), having
    written nothing; the reconciler's and the worker's callers take it as "not woken now"."""
    client.start("count", {"steps": 1}, run_id="kid_parent", enqueue=False)
    elog = EventLog(r, layout=client.log.keys)
    parent = elog.load("kid_parent").state
    child = RunState(run_id="kid", agent="count", state="completed", parent="kid_parent",
                     parent_step=1)
    rivals: list[int] = []

    def waiting_then_rival(kid: RunState, state: RunState) -> Spec:
        rivals.append(1)
        _rival(elog, "kid_parent", len(rivals))
        return Spec(ev.WaitResolved, {"kind": "child", "request": "x", "response": {},
                                      "by": kid.run_id})

    monkeypatch.setattr(children, "parent_wake", waiting_then_rival)
    with pytest.raises(RunContended) as caught:
        children.wake_parent(elog, child, "us")
    assert (caught.value.run_id, caught.value.attempts) == ("kid_parent", children.WAKE_ATTEMPTS)
    assert len(rivals) == children.WAKE_ATTEMPTS
    assert elog.load("kid_parent").state.version == parent.version + children.WAKE_ATTEMPTS
