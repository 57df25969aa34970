"""Events and the fold: codec round trips, incremental fold == whole fold, bad entries."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable.errors import DecodeError
from durable.log import events as ev
from durable.log.fold import apply, fold, from_checkpoint
from durable.log.state import RunState, copy_state
from tests.histories import WINDOW, common, histories, tags


def test_the_generated_histories_hold_every_event_type() -> None:
    """The properties below hold for the fold of every type only if some history has it."""
    seen: set[str] = set()

    @given(histories())
    @settings(max_examples=300, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    def collect(history: list[ev.Event]) -> None:
        seen.update(tags(history))

    collect()
    assert sorted(set(ev.EVENT_TYPES) - seen) == []


@given(histories())
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
def test_fold_all_at_once_equals_incremental(history: list[ev.Event]) -> None:
    whole = fold(history, window=WINDOW)
    state = RunState()
    for event in history:
        apply(state, event, WINDOW)
        state = copy_state(state)  # as if a reader reloaded between events
    assert state == whole
    assert whole.version == len(history)


@given(histories())
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
def test_fold_from_any_checkpoint_equals_whole_fold(history: list[ev.Event]) -> None:
    whole = fold(history, window=WINDOW)
    for i, event in enumerate(history):
        if isinstance(event, ev.Checkpoint):
            resumed = fold(history[i + 1:], start=from_checkpoint(event), window=WINDOW)
            assert resumed == whole


@given(histories())
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
def test_every_event_round_trips_through_the_codec(history: list[ev.Event]) -> None:
    """Read back as a run's stream is read: its run id, the entry id of its time, and the
    previous entry's actor for one that leaves its own out."""
    for event in history:
        assert _read_back(event) == event
        assert _read_back(event, same_actor=True) == event
    decoded = [_read_back(event) for event in history]
    assert fold(decoded, window=WINDOW) == fold(history, window=WINDOW)


def _read_back(event: ev.Event, *, same_actor: bool = False) -> ev.Event:
    data = ev.encode(event, same_actor=same_actor)
    return ev.decode(data, f"{event.ts}-0", event.run, event.actor if same_actor else "")


@given(histories())
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
def test_the_fold_ends_where_the_history_does(history: list[ev.Event]) -> None:
    """The state names what the last events say: a terminal event, an open wait, a
    quarantine; a rejected approval settles its action; every approval asked is kept."""
    state = fold(history, window=WINDOW)
    last = history[-1]
    if isinstance(last, ev.TERMINAL_EVENTS):
        assert state.terminal and state.state == last.__struct_config__.tag
    if isinstance(last, ev.WaitEntered):
        assert state.state == f"waiting_{last.kind}" and state.wait is not None
    if isinstance(last, ev.Quarantined):
        assert state.state == "quarantined" and state.reason == last.reason
    if isinstance(last, ev.WaitExpiry) and last.outcome == "expired":
        assert state.state == "expired" and state.wait is None
    asked = {e.request for e in history if isinstance(e, ev.ApprovalRequested)}
    assert set(state.approvals) == asked
    for e in history:
        if isinstance(e, ev.ApprovalDecided):
            assert state.approvals[e.request].decision in (e.decision, None)
            act = state.actions.get(state.approvals[e.request].step)
            if e.decision == "reject" and act is not None:
                assert act.status == "rejected"


def test_the_union_is_exactly_the_known_event_types() -> None:
    """A new event type must be added here on purpose (and to the fold, the codec and
    ``verify``); a vanished one would make recorded logs unreadable."""
    assert sorted(ev.EVENT_TYPES) == sorted([
        "run_started", "step_decided", "action_dispatched", "action_succeeded",
        "action_failed", "action_timed_out", "action_interrupted", "action_reconciled",
        "call_canceled", "cancel_requested", "canceled", "wait_entered", "wait_resolved",
        "wait_expired", "approval_requested", "approval_decided", "revalidation_failed",
        "agent_upgraded", "lease_acquired", "lease_lost", "checkpoint", "completed",
        "failed", "expired", "quarantined", "released", "context_trimmed",
        "resume_validated", "evidence_checked",
    ])


@pytest.mark.parametrize("tag", sorted(ev.EVENT_TYPES))
def test_each_event_type_round_trips_with_only_its_required_fields(tag: str) -> None:
    """Each type alone, with only its required fields (the defaults of the others)."""
    cls = ev.EVENT_TYPES[tag]
    filler: dict[object, Any] = {int: 1, str: "x", RunState: RunState(), list[str]: ["x"]}
    fields = {f.name: filler[f.type] for f in msgspec.structs.fields(cls)
              if f.required and f.name not in common(1)}
    event = cls(**common(1), **fields)
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
    ([ev.CODES["completed"], ev.SCHEMA_VERSION, 1, 0, "w", "r", "extra"], "more than"),
    ([ev.CODES["canceled"], ev.SCHEMA_VERSION, "one", 0, "w"], "invalid entry"),
    (["canceled", ev.SCHEMA_VERSION, 1, 0, "w"], "not an event"),
])
def test_a_malformed_wire_entry_is_refused_with_the_reason(raw: list[object],
                                                           reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        ev.decode(msgspec.msgpack.encode(raw), "5-0", "r")
