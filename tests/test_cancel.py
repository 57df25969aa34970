"""Cancellation as a protocol: durable request first, pub/sub hint second."""

from __future__ import annotations

import json

import pytest
import redis

from durable.audit.verify import verify
from durable.backend.cancel_messages import CancelMessage, encode_message
from durable.client import Client
from durable.controls.cancellation import record_cancel
from durable.log import events as ev
from durable.log import keys
from durable.log.state import RunState
from durable.log.store import Spec, now_ms
from durable.testing import wait_for
from tests.conftest import WorkerFactory
from tests.runs import is_dispatched, types_of


def _assert_no_effect_after_cancel(client: Client, run: str) -> None:
    types = types_of(client, run)
    i = types.index("cancel_requested")
    assert "action_dispatched" not in types[i:], types
    assert types[-1] == "canceled"
    report = verify(client.log, run)
    assert report.ok, report.checks


@pytest.mark.cluster
def test_cancel_during_a_cancellable_tool(client: Client, worker: WorkerFactory) -> None:
    """Window: step 1 dispatched, its tool running (it checks its token); the cancel
    arrives as a pub/sub hint and the call ends canceled, nothing dispatched after it."""
    run = client.start("count", {"steps": 3, "sleep_s": 30}, run_id="c1").run_id
    worker()
    assert wait_for(lambda: is_dispatched(client, run, 1), 15)
    client.cancel(run, "user changed their mind")
    final = client.wait(run, timeout=10)
    assert final.state == "canceled"
    types = types_of(client, run)
    assert types[-3:] == ["cancel_requested", "call_canceled", "canceled"]
    _assert_no_effect_after_cancel(client, run)
    # The worker records the latency just after the terminal append the wait returned on.
    assert wait_for(lambda: client.redis.hget(keys.CANCEL_LATENCY, run) is not None, 5)
    assert int(client.redis.hget(keys.CANCEL_LATENCY, run) or -1) >= 0


@pytest.mark.cluster
def test_cancel_during_a_tool_that_ignores_the_token(client: Client,
                                                     worker: WorkerFactory) -> None:
    """Window: step 1 dispatched, its tool running; the tool swallows exceptions and never
    checks its token: after the grace period the worker interrupts it and records the call
    as interrupted, outcome unknown."""
    run = client.start("echo", {"steps": 2}, run_id="c2").run_id
    worker(ECHO_TOOL="stubborn", ECHO_SLEEP="20", DURABLE_CANCEL_GRACE_MS="300")
    assert wait_for(lambda: is_dispatched(client, run, 1), 15)
    client.cancel(run, "stop now")
    final = client.wait(run, timeout=10)
    assert final.state == "canceled"
    types = types_of(client, run)
    assert types[-3:] == ["cancel_requested", "action_interrupted", "canceled"], types
    assert final.actions[1].status == "unknown"
    _assert_no_effect_after_cancel(client, run)


@pytest.mark.cluster
def test_cancel_while_queued_cancels_at_once(client: Client) -> None:
    """Window: started and queued, no worker has taken it: canceled without a worker."""
    run = client.start("count", {"steps": 3}, run_id="c3").run_id
    state = client.cancel(run, "never mind")
    assert state.state == "canceled"
    assert types_of(client, run) == ["run_started", "cancel_requested", "canceled"]
    # Idempotent, and a terminal run is left as it is.
    assert client.cancel(run, "again").state == "canceled"
    assert len(types_of(client, run)) == 3


@pytest.mark.cluster
def test_cancel_while_waiting_cancels_at_once(client: Client, worker: WorkerFactory) -> None:
    """Window: the run waits for input, holding no lease: the cancel ends it at once."""
    run = client.start("asker", {"text": "hi"}, run_id="c4").run_id
    worker()
    assert client.wait(run, timeout=15).state == "waiting_input"
    assert client.redis.get(client.log.keys.lease(run)) is None  # a waiting run holds no lease
    assert client.cancel(run, "no answer coming").state == "canceled"
    _assert_no_effect_after_cancel(client, run)


@pytest.mark.cluster
def test_a_lost_message_delays_the_cancel_but_never_loses_it(client: Client,
                                                              worker: WorkerFactory) -> None:
    """Window: mid-run (step 2 or later); the request is in the log but no message is
    published (nobody heard it): the worker finds it at its next checkpoint boundary."""
    run = client.start("count", {"steps": 50, "sleep_s": 0.2}, run_id="c5").run_id
    worker()
    assert wait_for(lambda: client.status(run).step >= 2, 15)
    record_cancel(client.log, CancelMessage(run=run, reason="silent"), "test")
    final = client.wait(run, timeout=10)
    assert final.state == "canceled" and final.step < 50
    _assert_no_effect_after_cancel(client, run)


@pytest.mark.cluster
def test_call_scope_cancels_the_call_and_the_agent_goes_on(client: Client,
                                                           worker: WorkerFactory) -> None:
    """Window: step 1's tool running; a call-scoped cancel ends that call only, the agent
    dispatches step 2, and a run-scoped cancel there ends the run."""
    run = client.start("count", {"steps": 2, "sleep_s": 30}, run_id="c6").run_id
    worker()
    assert wait_for(lambda: is_dispatched(client, run, 1), 15)
    client.cancel(run, "skip this one", scope="call")
    assert wait_for(lambda: client.status(run).actions.get(1) is not None
                    and client.status(run).actions[1].status == "canceled", 10)
    assert wait_for(lambda: is_dispatched(client, run, 2), 10)
    client.cancel(run, "now all of it")
    final = client.wait(run, timeout=10)
    assert final.state == "canceled"
    assert verify(client.log, run).ok


@pytest.mark.parametrize("secret", ["s3cret"])
def test_published_messages_need_a_valid_hmac_when_a_secret_is_set(
    secret: str, client: Client, worker: WorkerFactory, r: redis.Redis
) -> None:
    """Window: step 1's tool running; a forged hint, a bad signature and junk change
    nothing; a signed hint cancels."""
    run = client.start("count", {"steps": 2, "sleep_s": 30}, run_id="c7").run_id
    worker(DURABLE_CANCEL_SECRET=secret, DURABLE_CANCEL_REPORT_INTERVAL_S="0.5")
    assert wait_for(lambda: is_dispatched(client, run, 1), 15)
    forged = json.dumps({"run": run, "reason": "forged", "scope": "run", "ts": 0})
    bad_sig = json.dumps({"run": run, "reason": "x", "scope": "run", "ts": 0, "sig": "00"})
    assert r.publish(keys.CANCEL_CHANNEL, forged) == 1  # one worker, one subscriber
    assert r.publish(keys.CANCEL_CHANNEL, bad_sig) == 1
    assert r.publish(keys.CANCEL_CHANNEL, b"\xff not json") == 1
    assert wait_for(lambda: int(r.hget(keys.STATS, "cancel_malformed") or 0) == 1, 15)
    assert wait_for(lambda: int(r.hget(keys.STATS, "cancel_forged") or 0) == 2, 15)
    state: RunState = client.status(run)
    assert state.cancel is None and state.state == "pending"
    good = encode_message(CancelMessage(run=run, reason="signed", scope="run", ts=now_ms()),
                          secret)
    assert r.publish(keys.CANCEL_CHANNEL, good) == 1
    final = client.wait(run, timeout=10)
    assert final.state == "canceled" and final.reason == "signed"
    assert int(r.hget(keys.STATS, "cancel_forged") or 0) == 2
    assert int(r.hget(keys.STATS, "cancel_malformed") or 0) == 1
    _assert_no_effect_after_cancel(client, run)


def test_a_call_cancel_read_after_its_call_ended_is_not_recorded_again(
    client: Client,
) -> None:
    """Window: the sender recorded a call-scoped cancel and published it; the worker
    stopped the call (the request is consumed) before another listener read the message.
    That listener finds the request in the log and records nothing, so the next call is
    not cancelled by it; a request nobody recorded is still recorded."""
    run = client.start("count", {"steps": 3}, enqueue=False).run_id
    handle = client.log.load(run, actor="w")
    client.log.commit(handle, [Spec(ev.StepDecided, {"step": 1, "tool": "noop", "key": "k1"}),
                               Spec(ev.ActionDispatched, {"step": 1, "key": "k1",
                                                          "deadline": now_ms() + 60_000})])
    client.cancel(run, "skip this one", scope="call")
    sent = CancelMessage(run=run, reason="skip this one", scope="call", ts=now_ms())
    handle = client.log.load(run, actor="w")
    client.log.commit(handle, [Spec(ev.CallCanceled, {"step": 1, "key": "k1"})])
    assert client.status(run).cancel is None
    record_cancel(client.log, sent, "reconciler:late")
    assert types_of(client, run).count("cancel_requested") == 1
    assert client.status(run).cancel is None
    other = CancelMessage(run=run, reason="another", scope="call", ts=now_ms())
    record_cancel(client.log, other, "reconciler:late")
    assert types_of(client, run).count("cancel_requested") == 2
