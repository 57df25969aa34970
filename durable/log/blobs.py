"""Large values: a step's result over the inline limit, kept whole beside the run.

A result whose JSON is larger than ``DURABLE_MAX_PAYLOAD_BYTES`` (the inline limit) is not
put in its outcome event. Its JSON (sensitive fields sealed, as they would be inline) goes
to a field of the run's ``dx:{R}:blobs`` hash, and the event records a :class:`BlobRef`:
the field, the SHA-256 and the size of the bytes stored. ``append.lua`` writes the value in
the same call as the event that refers to it, so there is never an outcome without its
value, and the hash shares the run's hash tag (its slot, on a cluster), expires with the
run (``DURABLE_RETENTION``), is archived with it (``durable archive``) and is checked by
``durable verify``.

Two limits make a step fail instead, with a ``PayloadTooLarge`` the agent sees (a code
agent's ``StepFailed``, a ``decide()`` agent's failed action, ``error_type`` naming it):

- one result over ``DURABLE_MAX_RESULT_BYTES`` (the hard ceiling);
- a result that would bring the run's large values over ``DURABLE_BLOB_BUDGET_BYTES``
  (counted in the folded state, ``RunState.blob_bytes``).

Nothing is ever replaced silently: a result is in the log, beside it, or the step failed.

A run's input over the inline limit is kept the same way, in the field ``input``
(:func:`place_input`, called by the start before anything is written): ``run_started``
holds the reference (``input_blob``) and ``input`` None, and the value is written by the
same script call. It counts against the run's budget, and past the ceiling the start is
refused (``PayloadTooLarge``), nothing written. The readers that run agent code fill
``RunState.input`` in when they load the run, with the results and in the same read.

The fold keeps the reference (``Action.blob``) with ``result`` None: checkpoints stay
small, and readers that do not run agent code (``durable status``, ``log``, ``export``)
show the reference, not megabytes. The readers that run agent code (the worker and the
reconciler: ``EventLog(open_sealed=True)``) fill ``result`` in when they load a run
(:func:`resolve`), after checking each value against its digest; a value missing or
altered makes the run unreadable (quarantined), never guessed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import msgspec
import redis

from durable.errors import DecodeError, PayloadTooLarge, SealError
from durable.log import events as ev
from durable.log import keys
from durable.log.fold import tokens_of
from durable.log.state import Action, BlobRef, RunState
from durable.security.sealing import (
    Keyring,
    contains_envelope,
    contains_sensitive,
    open_all,
    seal_fields,
)
from durable.settings import Settings

#: The outcome events whose result may be kept beside the run.
OUTCOMES: frozenset[type[ev.Event]] = frozenset({ev.ActionSucceeded, ev.ActionReconciled})

#: The field of ``dx:{R}:blobs`` that holds a run's input kept beside it (a result's field
#: is ``<step>.<seq>``: the two never meet).
INPUT = "input"


def ref_of(event: ev.Event) -> BlobRef | None:
    """The large value ``event`` refers to: an outcome's result, or a run's input."""
    ref = event.input_blob if isinstance(event, ev.RunStarted) else getattr(event, "blob", None)
    return ref if isinstance(ref, BlobRef) else None


@dataclass(frozen=True)
class Limits:
    """``inline``: largest result kept in its event; ``ceiling``: largest result at all;
    ``budget``: the bytes of large values one run may keep."""

    inline: int = 256 * 1024
    ceiling: int = 16 * 1024 * 1024
    budget: int = 64 * 1024 * 1024
    #: Model context is kept beside the run whatever its size, so that it can be removed
    #: before the run's evidence (``DURABLE_CONTEXT_RETENTION`` is set).
    context: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(settings.payloads.max_payload_bytes, settings.payloads.max_result_bytes,
                   settings.payloads.blob_budget_bytes,
                   settings.log.context_retention is not None)


@dataclass(frozen=True)
class Stored:
    """A large value to write with its event: the hash field, the bytes, and the value in
    clear (for the writer's own state: what the agent is given next)."""

    field: str
    data: bytes
    value: Any


def place(cls: type[ev.Event], fields: dict[str, Any], state: RunState, seq: int,
          limits: Limits, sealed: Iterable[str], keyring: Keyring
          ) -> tuple[type[ev.Event], dict[str, Any], Stored | None]:
    """Where an outcome's result goes: in the event (returned as given), beside the run
    (the fields carry a reference, ``Stored`` the value), or nowhere because it is too
    large (an ``ActionFailed`` naming ``PayloadTooLarge``). ``seq``: the event's."""
    value = fields.get("result")
    if cls not in OUTCOMES or value is None:
        return cls, fields, None
    try:
        data = msgspec.json.encode(value)
    except (TypeError, ValueError) as exc:
        return ev.ActionFailed, _failed(fields, f"the result is not plain data: {exc}"[:500],
                                        "TypeError"), None
    step = fields["step"]
    if len(data) > limits.ceiling:  # before the inline check: the ceiling may be the lower
        too_large = PayloadTooLarge(f"the result of step {step}", len(data), limits.ceiling)
        return ev.ActionFailed, _failed(fields, f"{too_large} (DURABLE_MAX_RESULT_BYTES)",
                                        "PayloadTooLarge"), None
    act = state.actions.get(step)
    context = limits.context and act is not None and act.context
    if len(data) <= limits.inline and not context:
        return cls, fields, None
    names = frozenset(sealed)
    stored = data
    if names and contains_sensitive(value, names):
        stored = msgspec.json.encode(seal_fields(value, names, keyring))
    total = state.blob_bytes + len(stored)
    if total > limits.budget:
        over = PayloadTooLarge(f"the run's large values with the result of step {step}",
                               total, limits.budget)
        return ev.ActionFailed, _failed(fields, f"{over} (DURABLE_BLOB_BUDGET_BYTES)",
                                        "PayloadTooLarge"), None
    ref = BlobRef(field=f"{step}.{seq}", sha256=hashlib.sha256(stored).hexdigest(),
                  size=len(stored), context=context)
    placed = {**fields, "result": None, "blob": ref}
    if act is not None and act.model and cls is ev.ActionSucceeded:
        placed["tokens"] = tokens_of(value)  # the fold cannot read it from the reference
    return cls, placed, Stored(ref.field, stored, msgspec.json.decode(data))


def check_input(plain: Any, limits: Limits) -> None:
    """Refuse (``PayloadTooLarge``) an input, in clear, too large to keep beside its run:
    past the ceiling or the run's budget."""
    size = len(msgspec.json.encode(plain))
    for limit, setting in ((limits.ceiling, "DURABLE_MAX_RESULT_BYTES"),
                           (limits.budget, "DURABLE_BLOB_BUDGET_BYTES")):
        if size > limit:
            raise PayloadTooLarge(f"the input (kept beside the run up to {setting})", size,
                                  limit)


def place_input(data: Any, limits: Limits) -> tuple[BlobRef, bytes]:
    """A run's input kept beside it (checked by ``check_input``): its reference and the
    bytes to store. ``data``: the input as recorded (sensitive fields sealed)."""
    stored = msgspec.json.encode(data)
    return BlobRef(field=INPUT, sha256=hashlib.sha256(stored).hexdigest(), size=len(stored),
                   context=limits.context), stored


def _failed(fields: dict[str, Any], error: str, error_type: str) -> dict[str, Any]:
    return {"step": fields["step"], "key": fields["key"], "error": error,
            "error_type": error_type}


def resolve(client: redis.Redis, layout: keys.KeyLayout, run_id: str, actions: Iterable[Action],
            keyring: Keyring, learned: set[str] | None = None,
            states: Iterable[RunState] = ()) -> None:
    """Fill in, in place, the result of every action whose value is kept beside the run
    and not yet read, and the input of each of ``states`` kept beside it, in one read.
    Raises ``DecodeError`` for a value missing or unlike its digest."""
    wanted = [a for a in actions if a.blob is not None and a.result is None and not a.trimmed]
    inputs = [s for s in states if s.input_blob is not None and s.input is None]
    if not wanted and not inputs:
        return
    fields = sorted({a.blob.field for a in wanted if a.blob is not None} |
                    {s.input_blob.field for s in inputs if s.input_blob is not None})
    raw = dict(zip(fields, client.hmget(layout.blobs(run_id), fields), strict=True))
    values: dict[str, Any] = {}
    for act in wanted:
        ref = act.blob
        assert ref is not None
        if ref.field not in values:
            values[ref.field] = value_of(ref, raw[ref.field], keyring, learned, act.step)
        act.result = values[ref.field]
    for state in inputs:
        ref = state.input_blob
        assert ref is not None
        if ref.field not in values:
            values[ref.field] = value_of(ref, raw[ref.field], keyring, learned)
        state.input = values[ref.field]


def value_of(ref: BlobRef, data: bytes | None, keyring: Keyring,
             learned: set[str] | None = None, step: int = 0) -> Any:
    """The value stored for ``ref``, checked against its digest, sealed fields opened."""
    where = f"blob {ref.field}"
    problem = check(ref, data)
    if problem is not None:
        what = f"the result of step {step}" if step or ref.field != INPUT else "the input"
        raise DecodeError(where, f"{what}: {problem}")
    assert data is not None
    value = msgspec.json.decode(data)
    if contains_envelope(value):
        try:
            value = open_all(value, keyring, learned)
        except SealError as exc:
            raise DecodeError(where, str(exc)) from None
    return value


def check(ref: BlobRef, data: bytes | None) -> str | None:
    """Why ``data`` is not the value ``ref`` names (None when it is)."""
    if data is None:
        return "its large value is missing (dx:{R}:blobs field " + ref.field + ")"
    if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
        return (f"its large value ({len(data)} bytes) does not match the digest its outcome "
                f"recorded ({ref.size} bytes, sha256 {ref.sha256[:12]}...)")
    return None


def raw_value(client: redis.Redis, layout: keys.KeyLayout, run_id: str, ref: BlobRef,
              entry_id: str = "?") -> Any:
    """The value stored for ``ref``, checked against its digest, sealed fields kept sealed
    (a fork copies it as it is)."""
    return msgspec.json.decode(raw_bytes(client, layout, run_id, ref, entry_id))


def raw_bytes(client: redis.Redis, layout: keys.KeyLayout, run_id: str, ref: BlobRef,
              entry_id: str = "?") -> bytes:
    """The bytes stored for ``ref``, checked against its digest."""
    data = client.hget(layout.blobs(run_id), ref.field)
    problem = check(ref, data)
    if problem is not None:
        raise DecodeError(entry_id, problem)
    assert data is not None
    return bytes(data)


def stored(client: redis.Redis, layout: keys.KeyLayout, run_id: str) -> dict[str, bytes]:
    """Every large value of a run, field -> bytes as stored (for an archive)."""
    raw = client.hgetall(layout.blobs(run_id))
    return {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in raw.items()}


@contextmanager
def unresolved(state: RunState) -> Iterator[None]:
    """The state with the large values it was given taken out again, for as long as a
    snapshot of it is encoded (a checkpoint keeps the references, not the values)."""
    kept = {step: act.result for step, act in state.actions.items()
            if act.blob is not None and act.result is not None}
    for step in kept:
        state.actions[step].result = None
    given = state.input if state.input_blob is not None else None
    if given is not None:
        state.input = None
    try:
        yield
    finally:
        for step, value in kept.items():
            if step in state.actions:
                state.actions[step].result = value
        if given is not None:
            state.input = given
