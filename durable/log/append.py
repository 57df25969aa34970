"""One ``append.lua`` call, typed: :class:`AppendCall` is the script's header as a dataclass.

Its fields are in the order of the header at the top of ``scripts/append.lua``: the KEYS,
then the scalar ARGV, then the variable-length groups; ``tests/test_append_call.py`` parses
the header and checks it against these fields, so the two cannot drift apart. The counts of
the groups (``n``, ``nops``...) are ARGV too, computed from the groups.

``prepare`` builds the call for a handle's batch (``EventLog.commit``); ``settle`` reads
the script's reply against it: it advances the handle, or raises what the script refused.
Both take the log as an :class:`AppendingLog`, the part of ``EventLog`` they use: the store
imports this module, never the other way round.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from itertools import chain
from typing import Any, Protocol

from durable.errors import (
    CancelPending,
    ChainBroken,
    Claimed,
    ConflictError,
    LeaseLost,
    Tampered,
    Terminal,
)
from durable.log import events as ev
from durable.log.handle import CommitOptions, RunHandle, Spec, now_ms, text
from durable.log.keys import KeyLayout
from durable.log.sealer import Sealer
from durable.log.state import TERMINAL, RunState

#: Field metadata: what part of the script's call a field is.
KEY, ARG, COUNT, GROUP = ({"part": p} for p in ("key", "arg", "count", "group"))


def _count(of: str) -> Any:
    return field(init=False, metadata={**COUNT, "of": of})


@dataclass(kw_only=True)
class AppendCall:
    """The keys and arguments of one ``append.lua`` call, in the header's order."""

    # KEYS
    log_key: str = field(metadata=KEY)
    run_key: str = field(metadata=KEY)
    lease_key: str = field(metadata=KEY)
    ledger_key: str = field(metadata=KEY)
    runs_key: str = field(metadata=KEY)
    due_key: str = field(metadata=KEY)
    old_index_key: str = field(metadata=KEY)
    new_index_key: str = field(metadata=KEY)
    free_index_key: str = field(metadata=KEY)
    metrics_key: str = field(metadata=KEY)
    blobs_key: str = field(metadata=KEY)
    seal_key: str = field(metadata=KEY)
    # ARGV, one value each
    expected_version: int = field(metadata=ARG)
    lease: str = field(metadata=ARG)
    new_state: str = field(metadata=ARG)
    new_step: int = field(metadata=ARG)
    now: int = field(metadata=ARG)
    due: str = field(metadata=ARG)
    checkpoint_pos: int = field(metadata=ARG)
    flags: str = field(metadata=ARG)
    n: int = _count("events")
    m: int = _count("free_events")
    free_state: str = field(metadata=ARG)
    cancel: str = field(metadata=ARG)
    run_id: str = field(metadata=ARG)
    nops: int = _count("ops")
    nextra: int = _count("extras")
    lease_ttl_ms: int = field(metadata=ARG)
    ncounts: int = _count("counts")
    nfree_counts: int = _count("free_counts")
    retention_ms: int = field(metadata=ARG)
    nblobs: int = _count("blobs")
    compact_max: int = field(metadata=ARG)
    ndrops: int = _count("drops")
    # ARGV, the variable-length groups: one item (a tuple is several ARGV) per entry
    events: list[tuple[int, bytes]] = field(metadata=GROUP)
    free_events: list[tuple[int, bytes]] = field(metadata=GROUP)
    ops: list[tuple[str, str, str]] = field(metadata=GROUP)
    extras: list[tuple[str, str]] = field(metadata=GROUP)
    counts: list[tuple[str, int]] = field(metadata=GROUP)
    free_counts: list[tuple[str, int]] = field(metadata=GROUP)
    blobs: list[tuple[str, bytes]] = field(metadata=GROUP)
    drops: list[tuple[str]] = field(default_factory=list, metadata=GROUP)

    def __post_init__(self) -> None:
        values = self.__dict__
        for name, of in _layout().counts:
            values[name] = len(values[of])

    @property
    def keys(self) -> list[str]:
        return _layout().list_keys(self)

    @property
    def args(self) -> list[Any]:
        return _layout().list_args(self)


@dataclass(frozen=True)
class _Layout:
    """``AppendCall``'s fields by part, read once (``dataclasses.fields`` on every append
    cost about 40 µs of a step), and its ``keys`` and ``args`` lists as functions compiled
    from them (see ``_lister``)."""

    keys: tuple[str, ...]
    argv: tuple[tuple[str, str], ...]  # (name, "arg" | "count" | "group"), in order
    counts: tuple[tuple[str, str], ...]  # (count field, the group it counts)
    list_keys: Callable[[Any], list[str]]
    list_args: Callable[[Any], list[Any]]


def _lister(name: str, items: Sequence[str]) -> Callable[[Any], list[Any]]:
    """``def name(self): return [items...]``, compiled once from the fields (as
    ``dataclasses`` writes a class's ``__init__``): one list display per append, where a
    ``getattr`` per field and a generator per group cost about 3 µs of each call. The
    items are ``self.<field>`` and ``*_flat(self.<group>)``: field names only."""
    scope: dict[str, Any] = {"_flat": chain.from_iterable}
    exec(f"def {name}(self):\n    return [{', '.join(items)}]\n", scope)
    fn: Callable[[Any], list[Any]] = scope[name]
    return fn


@functools.cache
def _layout() -> _Layout:
    fs = fields(AppendCall)
    keys = tuple(f.name for f in fs if f.metadata["part"] == "key")
    argv = tuple((f.name, f.metadata["part"]) for f in fs if f.metadata["part"] != "key")
    return _Layout(
        keys=keys, argv=argv,
        counts=tuple((f.name, f.metadata["of"]) for f in fs if f.metadata["part"] == "count"),
        list_keys=_lister("keys", [f"self.{name}" for name in keys]),
        list_args=_lister("args", [f"*_flat(self.{name})" if part == "group" else f"self.{name}"
                                   for name, part in argv]))


class AppendingLog(Protocol):
    """What ``prepare`` and ``settle`` use of the log (``durable.log.store.EventLog``)."""

    @property
    def keys(self) -> KeyLayout: ...
    @property
    def checkpoint_every(self) -> int: ...
    @property
    def lease_ttl_ms(self) -> int: ...
    @property
    def retention_ms(self) -> int: ...
    @property
    def compact_max(self) -> int: ...
    @property
    def sealer(self) -> Sealer | None: ...

    def stage(self, handle: RunHandle, specs: Sequence[Spec]) -> None: ...
    def stage_checkpoint(self, handle: RunHandle, ts: int) -> int: ...
    def encode_staged(self, handle: RunHandle, staged: Sequence[tuple[int, ev.Event | bytes]],
                      after: str | None) -> list[tuple[int, bytes]]: ...
    def due_for(self, state: RunState, ts: int) -> str: ...
    def load(self, run_id: str, *, lease: str = "", actor: str = "") -> RunHandle: ...
    def quarantine(self, run_id: str, reason: str, actor: str = "",
                   counts: Sequence[tuple[str, int]] = ()) -> bool: ...


@dataclass
class Prepared:
    """A call ready to send, and what its reply is read against."""

    call: AppendCall
    expected: int
    ckpt_pos: int
    #: The append is to be sealed (its chain is checked first, in the script).
    sealing: bool = False


def prepare(elog: AppendingLog, handle: RunHandle, specs: Sequence[Spec],
            options: CommitOptions) -> Prepared:
    """The ``append.lua`` call of ``EventLog.commit(handle, specs, **options)``."""
    if_free = options.get("if_free", ())
    extra = options.get("extra")
    state = handle.state
    expected = handle.base_version
    old_state = handle.base_state or state.state
    ts = now_ms()
    ckpt_pos = 0
    # Every K events, a checkpoint goes where no action is open: after the staged
    # outcome and before the next intent (so the tail a recovery folds stays short).
    if (state.version - handle.ckpt_seq >= elog.checkpoint_every and not if_free
            and state.current is None):
        ckpt_pos = elog.stage_checkpoint(handle, ts)
    elog.stage(handle, specs)
    costed = any(isinstance(e, ev.ActionSucceeded) and e.cost is not None
                 for _, e in handle.staged)
    if options.get("checkpoint", False) and not ckpt_pos:
        ckpt_pos = elog.stage_checkpoint(handle, ts)
    # A quarantine is written even after an entry nobody vouches for: name the actor.
    after = None if options.get("quarantine", False) else handle.tail_actor
    events = elog.encode_staged(handle, handle.staged, after)
    handle.staged = []
    main_state, main_step = state.state, state.step
    cancel_flag = "1" if state.cancel is not None else "0"
    due = elog.due_for(state, ts)
    free_state = main_state
    counts, handle.staged_counts = handle.staged_counts, []
    free_events: list[tuple[int, bytes]] = []
    free_counts: list[tuple[str, int]] = []
    if if_free:
        kept_ops, handle.staged_ops = handle.staged_ops, []
        elog.stage(handle, if_free)
        handle.staged_ops = kept_ops
        free_counts, handle.staged_counts = handle.staged_counts, []
        free_events = elog.encode_staged(handle, handle.staged,
                                         handle.actor if events else after)
        handle.staged = []
        free_state = state.state
        if state.state in TERMINAL:
            due = elog.due_for(state, ts)
    ops = handle.staged_ops + list(options.get("ledger", ()))
    handle.staged_ops = []
    large, handle.staged_blobs = handle.staged_blobs, []
    projected = dict(extra or {})
    if costed:  # what `durable runs --cost` shows: the run's money so far, its unknown calls
        projected["cost"] = f"{state.cost_usd or 0} {state.uncosted}"
    if state.state != old_state and "reason" not in projected:
        # What `durable runs` shows next to the state: why it waits, stopped or failed.
        why = state.wait.reason if state.wait else (state.reason or state.error or "")
        projected["reason"] = why[:500]
    quarantine = options.get("quarantine", False)
    sealing = elog.sealer is not None and not quarantine and elog.sealer.due(
        handle, ended=state.state in TERMINAL, release=options.get("release", False), now=ts)
    flags = ("V" if handle.seal_from_start else "v") if sealing else ""
    flags += ("d" if options.get("dispatch", False) else "") + (
        "t" if options.get("allow_terminal", False) else "") + (
        "r" if options.get("release", False) else "") + (
        "q" if quarantine else "")
    run_id = handle.run_id
    shard = elog.keys.shard_of(run_id)
    call = AppendCall(
        log_key=elog.keys.log(run_id), run_key=elog.keys.run(run_id),
        lease_key=elog.keys.lease(run_id),
        ledger_key=elog.keys.ledger(run_id), runs_key=elog.keys.runs_index(shard),
        due_key=elog.keys.due(shard), old_index_key=elog.keys.runs_in_state(old_state, shard),
        new_index_key=elog.keys.runs_in_state(main_state, shard),
        free_index_key=elog.keys.runs_in_state(free_state, shard),
        metrics_key=elog.keys.metrics(shard), blobs_key=elog.keys.blobs(run_id),
        seal_key=elog.keys.seal(run_id),
        expected_version=expected, lease=handle.lease, new_state=main_state,
        new_step=main_step, now=ts, due=due, checkpoint_pos=ckpt_pos, flags=flags,
        free_state=free_state, cancel=cancel_flag, run_id=run_id,
        lease_ttl_ms=elog.lease_ttl_ms,
        retention_ms=0 if options.get("keep_expiry", False) else elog.retention_ms,
        compact_max=elog.compact_max, events=events, free_events=free_events, ops=ops,
        extras=list(projected.items()), counts=counts, free_counts=free_counts, blobs=large,
        drops=[(f,) for f in options.get("drop_blobs", ())])
    return Prepared(call, expected, ckpt_pos, sealing)


def settle(elog: AppendingLog, handle: RunHandle, prepared: Prepared, reply: Any) -> str:
    """Apply ``append.lua``'s reply to the handle, or raise what it refused."""
    state = handle.state
    expected, ckpt_pos = prepared.expected, prepared.ckpt_pos
    tag = text(reply[0])
    if tag == "ok":
        version = int(reply[1])
        if text(reply[2]):  # (a call may append no entry at all)
            handle.last_id = text(reply[2])
            handle.tail_actor = handle.actor
        if ckpt_pos:
            handle.ckpt_seq = expected + ckpt_pos
        if version != state.version:
            # The conditional events were not appended: a lease was held.
            fresh = elog.load(handle.run_id, lease=handle.lease, actor=handle.actor)
            handle.state, handle.last_id = fresh.state, fresh.last_id
            handle.ckpt_seq, handle.tail_actor = fresh.ckpt_seq, fresh.tail_actor
        handle.base_version = handle.state.version
        handle.base_state = handle.state.state
        return handle.last_id
    handle.tail_actor = None
    if tag == "conflict":
        raise ConflictError(handle.run_id, expected, int(reply[1]))
    if tag == "lease":
        epoch = int(handle.lease.rsplit("|", 1)[-1]) if "|" in handle.lease else 0
        raise LeaseLost(handle.run_id, epoch)
    if tag == "terminal":
        raise Terminal(text(reply[1]))
    if tag == "canceled":
        raise CancelPending()
    if tag == "claimed":
        raise Claimed(text(reply[1]), text(reply[2]))
    if tag == "foreign":
        tail = text(reply[1])
        elog.quarantine(handle.run_id, f"log entry {tail} was not written by the append "
                        "script (appended around it); nothing is built on it", handle.actor)
        raise Tampered(handle.run_id, tail)
    if tag == "broken":  # checked before a seal (flag "v"): never sealed, quarantined
        entry = text(reply[1])
        broken = ChainBroken(entry, f"entry {entry} {text(reply[2])}")
        elog.quarantine(handle.run_id, broken.quarantine_reason, handle.actor)
        raise Tampered(handle.run_id, broken.entry_id, broken.quarantine_reason)
    raise RuntimeError(f"unexpected reply from append.lua: {reply!r}")
