"""Signed cancel messages: accepted once and only while fresh, signed over the whole message,
and refused ones counted and reported once per interval, at no Redis write each. Real
Redis, real worker and reconciler processes, messages captured from the real channel."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from durable.backend.cancel_messages import (
    CancelMessage,
    ReplayGuard,
    decode_message,
    encode_message,
)
from durable.client import Client
from durable.errors import BadCancelMessage
from durable.log import events as ev
from durable.log import keys
from durable.log.store import now_ms
from durable.testing import wait_for
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.runs import cancel_listeners, is_dispatched, stat_of

SECRET = "s3cret"


def _hincrby_calls(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_hincrby", {}).get("calls", 0))


@pytest.fixture()
def secret(monkeypatch: pytest.MonkeyPatch, client: Client) -> str:
    """The cancel secret, for the test's client and every process it starts."""
    monkeypatch.setenv("DURABLE_CANCEL_SECRET", SECRET)
    monkeypatch.setenv("DURABLE_CANCEL_REPORT_INTERVAL_S", "0.5")
    client.settings.cancel.secret = SECRET
    return SECRET


def test_a_captured_call_cancel_replayed_later_cancels_nothing(
    client: Client, worker: WorkerFactory, reconciler: ReconcilerFactory, r: redis.Redis,
    secret: str,
) -> None:
    """The probe of the issue: a signed ``scope=call`` message captured from the channel and
    published again cancelled later calls. Window: step 1's tool running, cancelled by the
    call-scoped cancel; step 2's tool running when the captured message is published again
    at once (replayed: each of the two subscribers refuses it) and 6 s after its ``ts``
    (too old, DURABLE_CANCEL_MAX_AGE_MS=5000). Step 2 is never cancelled."""
    run = client.start("count", {"steps": 2, "sleep_s": 30}, run_id="replay").run_id
    worker()
    reconciler()
    assert wait_for(lambda: is_dispatched(client, run, 1), 20)
    assert wait_for(lambda: cancel_listeners(r) == 2, 30)  # the worker's and the reconciler's
    spy = r.pubsub(ignore_subscribe_messages=True)
    spy.subscribe(keys.CANCEL_CHANNEL)
    try:
        client.cancel(run, "skip this one", scope="call")
        captured = None
        end = time.monotonic() + 10
        while captured is None and time.monotonic() < end:
            message = spy.get_message(timeout=1.0)
            captured = message["data"] if message else None
    finally:
        spy.close()
    assert captured is not None and json.loads(captured)["scope"] == "call"
    assert wait_for(lambda: client.status(run).actions[1].status == "canceled", 15)
    assert wait_for(lambda: is_dispatched(client, run, 2), 15)
    subscribers = r.publish(keys.CANCEL_CHANNEL, captured)
    assert subscribers == 2  # the worker's listener and the reconciler's
    assert wait_for(lambda: stat_of(r, "cancel_replayed") == 2, 15)
    sent = json.loads(captured)["ts"]
    time.sleep(max(0.0, (sent + 6000 - now_ms()) / 1000))
    assert r.publish(keys.CANCEL_CHANNEL, captured) == 2
    assert wait_for(lambda: stat_of(r, "cancel_stale") == 2, 15)
    state = client.status(run)
    assert state.cancel is None and state.actions[2].status == "dispatched", \
        (state.cancel, [f"{e.event!r}"[:200] for e in client.events(run) if e.event])
    assert [e.event.scope for e in client.events(run)
            if isinstance(e.event, ev.CancelRequested)] == ["call"]


def test_a_cancel_with_a_long_reason_is_not_taken_for_a_forgery(
    client: Client, worker: WorkerFactory, r: redis.Redis, secret: str
) -> None:
    """Window: step 1's tool running (30 s); the project's own signed cancel with a reason
    of 800 characters. The HMAC was checked over ``reason[:500]``, so the worker refused it
    as forged and the run went on; now it is cancelled at once."""
    run = client.start("count", {"steps": 2, "sleep_s": 30}, run_id="long").run_id
    worker()
    assert wait_for(lambda: is_dispatched(client, run, 1), 20)
    client.cancel(run, "r" * 800)
    final = client.wait(run, timeout=15)
    assert final.state == "canceled"
    # A forged message after it, as a marker: the listener reads the channel in order and
    # reports an interval's refusals together, so once the marker is counted, a refusal of
    # the long reason would be counted too.
    r.publish(keys.CANCEL_CHANNEL, json.dumps(
        {"run": run, "reason": "marker", "scope": "run", "ts": now_ms(), "sig": "0"}))
    assert wait_for(lambda: stat_of(r, "cancel_forged") >= 1, 15)
    assert stat_of(r, "cancel_forged") == 1


def test_a_flood_of_forged_cancels_is_counted_and_logged_once_per_interval(
    client: Client, worker: WorkerFactory, r: redis.Redis, secret: str, tmp_path: Path
) -> None:
    """Window: step 1's tool running while 5,000 forged messages arrive. Each used to cost
    a warning line and a Redis write per subscriber. Now the worker counts them, writes the
    counts once per interval (DURABLE_CANCEL_REPORT_INTERVAL_S=0.5) and logs a line per
    interval; a genuine cancel sent after the flood still cancels."""
    log = tmp_path / "worker.log"
    run = client.start("count", {"steps": 2, "sleep_s": 60}, run_id="flood").run_id
    worker(log_path=log)
    assert wait_for(lambda: is_dispatched(client, run, 1), 20)
    writes_before = _hincrby_calls(r)
    flood = 5000
    pipe = r.pipeline(transaction=False)
    for i in range(flood):
        pipe.publish(keys.CANCEL_CHANNEL, json.dumps(
            {"run": run, "reason": f"forged {i}", "scope": "run", "ts": now_ms(), "sig": "0"}))
    pipe.execute()
    assert wait_for(lambda: stat_of(r, "cancel_forged") == flood, 60)
    writes = _hincrby_calls(r) - writes_before
    assert writes < 200, writes  # one per interval and kind, not one per message
    lines = [x for x in log.read_text().splitlines() if "cancel message" in x]
    assert 1 <= len(lines) <= 60, lines[:5]
    assert "forged" in lines[0] and "refused in the last" in lines[0]
    assert client.status(run).cancel is None
    client.cancel(run, "the real one")
    assert client.wait(run, timeout=15).state == "canceled"


def test_the_signature_covers_every_field_and_the_guard_remembers_the_window() -> None:
    now = now_ms()
    msg = CancelMessage(run="r1", reason="x" * 900, scope="call", ts=now)
    good = encode_message(msg, SECRET)
    decoded = decode_message(good, SECRET)
    assert len(decoded.reason) == 500 and decoded.sig  # kept short in the log, checked whole
    body = json.loads(good)
    for field, value in (("reason", "y"), ("scope", "run"), ("ts", now + 1), ("run", "r2")):
        with pytest.raises(BadCancelMessage) as exc:
            decode_message(json.dumps({**body, field: value}), SECRET)
        assert exc.value.kind == "forged"
    with pytest.raises(BadCancelMessage) as exc:
        decode_message(json.dumps({**body, "extra": 1}), SECRET)
    assert exc.value.kind == "malformed"
    guard = ReplayGuard(max_age_ms=5000)
    guard.admit(decoded, now=now + 10)
    with pytest.raises(BadCancelMessage) as exc:
        guard.admit(decoded, now=now + 4000)
    assert exc.value.kind == "replayed"
    with pytest.raises(BadCancelMessage) as exc:
        guard.admit(decoded, now=now + 6000)
    assert exc.value.kind == "stale"
    future = decode_message(encode_message(CancelMessage(run="r1", ts=now + 60_000), SECRET),
                            SECRET)
    with pytest.raises(BadCancelMessage) as exc:
        guard.admit(future, now=now)
    assert exc.value.kind == "stale"
    small = ReplayGuard(max_age_ms=5000, limit=10)
    for i in range(25):  # a full memory forgets the oldest, never grows past its limit
        small.admit(CancelMessage(run="r", ts=now, sig=f"s{i}"), now=now)
    assert len(small._seen) <= 10
