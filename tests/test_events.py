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
    decoded = [ev.decode(ev.encode(event)) for event in history]
    assert decoded == history
    assert fold(decoded, window=WINDOW) == fold(history, window=WINDOW)


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
    if isinstance(last, ev.WaitExpired) and last.outcome == "expired":
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
        "failed", "expired", "quarantined", "released",
    ])


@pytest.mark.parametrize("tag", sorted(ev.EVENT_TYPES))
def test_each_event_type_round_trips_with_only_its_required_fields(tag: str) -> None:
    """Each type alone, with only its required fields (the defaults of the others)."""
    cls = ev.EVENT_TYPES[tag]
    filler: dict[object, object] = {int: 1, str: "x", RunState: RunState()}
    fields = {f.name: filler[f.type] for f in msgspec.structs.fields(cls)
              if f.required and f.name not in common(1)}
    event = cls(**common(1), **fields)  # type: ignore[arg-type]
    decoded = ev.decode(ev.encode(event))
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
