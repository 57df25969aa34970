"""Events and the fold: codec round trips, incremental fold == whole fold, bad entries."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable.errors import DecodeError
from durable.log import events as ev
from durable.log.fold import apply, fold, from_checkpoint
from durable.log.state import RunState, copy_state

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=8,
)


def _common(seq: int) -> dict[str, object]:
    return {"v": ev.SCHEMA_VERSION, "run": "r1", "seq": seq, "ts": 1000 + seq, "actor": "w"}


@st.composite
def histories(draw: st.DrawFn) -> list[ev.Event]:
    """Valid event sequences as a worker and operators could write them."""
    out: list[ev.Event] = []
    seq = 0

    def add(cls: type[ev.Event], **fields: object) -> None:
        nonlocal seq
        seq += 1
        out.append(cls(**_common(seq), **fields))  # type: ignore[arg-type]

    add(ev.RunStarted, agent="a", agent_version="1", input=draw(json_values), tools=["t"])
    step = 0
    for _ in range(draw(st.integers(0, 12))):
        step += 1
        key = f"r1:{step}"
        add(ev.StepDecided, step=step, tool="t", args={"x": draw(json_values)}, key=key)
        add(ev.ActionDispatched, step=step, key=key, deadline=5000)
        kind = draw(st.sampled_from(["ok", "fail", "timeout", "interrupt", "cancel_call"]))
        if kind == "ok":
            add(ev.ActionSucceeded, step=step, key=key, result=draw(json_values))
        elif kind == "fail":
            add(ev.ActionFailed, step=step, key=key, error="boom", error_type="E")
        elif kind == "cancel_call":
            add(ev.CallCanceled, step=step, key=key, reason="op")
        else:
            cls = ev.ActionTimedOut if kind == "timeout" else ev.ActionInterrupted
            add(cls, step=step, key=key)
            res = draw(st.sampled_from(["applied", "not_applied"]))
            add(ev.ActionReconciled, step=step, key=key, resolution=res, result=1)
            if res == "not_applied":
                add(ev.ActionDispatched, step=step, key=key, deadline=9000)
                add(ev.ActionSucceeded, step=step, key=key, result=2)
        if draw(st.booleans()) and draw(st.booleans()):
            add(ev.Checkpoint, state=fold(out, window=4))
        if draw(st.integers(0, 9)) == 0:
            add(ev.WaitEntered, kind="input", until=10_000, request="q")
            add(ev.WaitResolved, kind="input", request="q", response=draw(json_values))
    end = draw(st.sampled_from(["none", "completed", "failed", "cancel", "quarantine"]))
    if end == "completed":
        add(ev.Completed, result=draw(json_values))
    elif end == "failed":
        add(ev.Failed, error="no")
    elif end == "cancel":
        add(ev.CancelRequested, reason="stop", scope="run", requested_ts=1)
        add(ev.Canceled, reason="stop", latency_ms=3)
    elif end == "quarantine":
        add(ev.Quarantined, reason="why")
        add(ev.Released, by="op")
    return out


@given(histories())
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
def test_fold_all_at_once_equals_incremental(history: list[ev.Event]) -> None:
    whole = fold(history, window=4)
    state = RunState()
    for event in history:
        apply(state, event, 4)
        state = copy_state(state)  # as if a reader reloaded between events
    assert state == whole
    assert whole.version == len(history)


@given(histories())
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
def test_fold_from_any_checkpoint_equals_whole_fold(history: list[ev.Event]) -> None:
    whole = fold(history, window=4)
    for i, event in enumerate(history):
        if isinstance(event, ev.Checkpoint):
            resumed = fold(history[i + 1:], start=from_checkpoint(event), window=4)
            assert resumed == whole


@given(histories())
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
def test_every_event_round_trips_through_the_codec(history: list[ev.Event]) -> None:
    """Read back as a run's stream is read: its run id, the entry id of its time, and the
    previous entry's actor for one that leaves its own out."""
    for event in history:
        assert _read_back(event) == event
        assert _read_back(event, same_actor=True) == event


def _read_back(event: ev.Event, *, same_actor: bool = False) -> ev.Event:
    data = ev.encode(event, same_actor=same_actor)
    return ev.decode(data, f"{event.ts}-0", event.run, event.actor if same_actor else "")


def test_the_union_is_exactly_the_known_event_types() -> None:
    """A new event type must be added here on purpose (and to the fold, the codec and
    ``verify``); a vanished one would make recorded logs unreadable."""
    assert sorted(ev.EVENT_TYPES) == sorted([
        "run_started", "step_decided", "action_dispatched", "action_succeeded",
        "action_failed", "action_timed_out", "action_interrupted", "action_reconciled",
        "call_canceled", "cancel_requested", "canceled", "wait_entered", "wait_resolved",
        "wait_expired", "approval_requested", "approval_decided", "revalidation_failed",
        "agent_upgraded", "lease_acquired", "lease_lost", "checkpoint", "completed",
        "failed", "expired", "quarantined", "released",
    ])


@pytest.mark.parametrize("tag", sorted(ev.EVENT_TYPES))
def test_each_event_type_round_trips_with_only_its_required_fields(tag: str) -> None:
    """Covers the types the generated histories never write (approvals, leases, upgrades)."""
    cls = ev.EVENT_TYPES[tag]
    filler: dict[object, object] = {int: 1, str: "x", RunState: RunState()}
    fields = {f.name: filler[f.type] for f in msgspec.structs.fields(cls)
              if f.required and f.name not in _common(1)}
    event = cls(**_common(1), **fields)  # type: ignore[arg-type]
    decoded = _read_back(event)
    assert decoded == event and decoded.__struct_config__.tag == tag


@given(st.binary(max_size=64))
def test_garbage_bytes_raise_decode_error_never_anything_else(data: bytes) -> None:
    try:
        ev.decode(data, "1-0")
    except DecodeError as exc:
        assert exc.entry_id == "1-0" and exc.reason
    # (a random byte string that is a valid event is fine too)


def test_future_schema_version_is_refused_with_the_reason() -> None:
    raw = msgspec.msgpack.encode({"type": "completed", "v": ev.SCHEMA_VERSION + 1, "run": "r",
                                  "seq": 3, "ts": 1, "new_field": [1, 2]})
    with pytest.raises(DecodeError, match="newer schema version"):
        ev.decode(raw, "5-0")


def test_unknown_event_type_is_refused() -> None:
    raw = msgspec.msgpack.encode({"type": "teleported", "v": 1, "run": "r", "seq": 1, "ts": 1})
    with pytest.raises(DecodeError, match="unknown event type 'teleported'"):
        ev.decode(raw)


def test_every_event_type_has_its_own_wire_code() -> None:
    """Codes are the types' names on the wire (v4): one each, none shared."""
    assert set(ev.CODES) == set(ev.EVENT_TYPES)
    assert len(set(ev.CODES.values())) == len(ev.CODES)


def test_the_wire_form_leaves_out_what_the_entry_s_place_says() -> None:
    """No run id, no time, no actor when the previous entry has it, no default key; a
    deadline counted from the entry's time; trailing defaults cut off."""
    step = ev.ActionDispatched(v=ev.SCHEMA_VERSION, run="order-42", seq=4, ts=1_700_000_000_000,
                               actor="worker-1", step=2, key="order-42:2",
                               deadline=1_700_000_010_000)
    assert msgspec.msgpack.decode(ev.encode(step, same_actor=True)) == [
        ev.CODES["action_dispatched"], ev.SCHEMA_VERSION, 4, 0, None, 2, None, 10_000]
    other = msgspec.structs.replace(step, key="elsewhere:7")
    assert msgspec.msgpack.decode(ev.encode(other))[4:7] == ["worker-1", 2, "elsewhere:7"]
    assert _read_back(other) == other
    v3 = msgspec.msgpack.encode(msgspec.structs.replace(step, v=3))
    assert len(ev.encode(step, same_actor=True)) * 5 < len(v3)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_entries_of_every_older_version_read_as_before(version: int) -> None:
    """Maps holding every field by name (v1-v3, written with ``XADD *``) are read whatever
    the stream says: their own run id and time are kept."""
    raw = msgspec.msgpack.encode({
        "type": "step_decided", "v": version, "run": "old", "seq": 3, "ts": 1234,
        "actor": "w0", "step": 1, "tool": "t", "args": {"a": 1}, "key": "old:1"})
    event = ev.decode(raw, "99999-0", "old", "someone else")
    assert isinstance(event, ev.StepDecided)
    assert (event.v, event.run, event.ts, event.actor, event.key) == (
        ev.SCHEMA_VERSION, "old", 1234, "w0", "old:1")


def test_a_future_version_in_the_wire_form_is_refused_with_the_reason() -> None:
    raw = msgspec.msgpack.encode([ev.CODES["completed"], ev.SCHEMA_VERSION + 1, 3, 0, "w",
                                  None, "a field of the future"])
    with pytest.raises(DecodeError, match="newer schema version"):
        ev.decode(raw, "5-0", "r")


@pytest.mark.parametrize("raw, reason", [
    ([99, ev.SCHEMA_VERSION, 1, 0, "w"], "unknown event type code 99"),
    ([ev.CODES["canceled"], ev.SCHEMA_VERSION, 1, 0, "w", "r", 1, "extra"], "more than"),
    ([ev.CODES["canceled"], ev.SCHEMA_VERSION, "one", 0, "w"], "invalid entry"),
    (["canceled", ev.SCHEMA_VERSION, 1, 0, "w"], "not an event"),
])
def test_a_malformed_wire_entry_is_refused_with_the_reason(raw: list[object],
                                                           reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        ev.decode(msgspec.msgpack.encode(raw), "5-0", "r")
