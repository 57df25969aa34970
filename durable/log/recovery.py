"""Recovery: a run's state folded from its last checkpoint to the end of its log.

``EventLog.load`` reads the entries (the checkpoint id, then the log from it) and
``fold_from`` folds them into a :class:`RunHandle`: the checkpoint's snapshot, then every
entry after it, each checked for its sequence number. The state just before the last
intent is kept (``pre_intent``), since only that intent is re-observed on recovery. A
snapshot of another state layout is not used: the whole log is folded instead
(``fold_whole``). The log must end where the projection says, else ``DecodeError``.

The functions take the log as a :class:`RecoveringLog`, the part of ``EventLog`` they use:
the store imports this module, never the other way round.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import redis

from durable.errors import ChainBroken, DecodeError, RunNotFound
from durable.log import chain
from durable.log import events as ev
from durable.log.fold import apply, from_checkpoint
from durable.log.handle import Entry, RunHandle, check_seq
from durable.log.keys import KeyLayout
from durable.log.state import STATE_SCHEMAS, Action, RunState, copy_state


class RecoveringLog(Protocol):
    """What a recovery uses of the log (``durable.log.store.EventLog``)."""

    @property
    def redis(self) -> redis.Redis: ...
    @property
    def keys(self) -> KeyLayout: ...
    @property
    def window(self) -> int: ...
    @property
    def open_sealed(self) -> bool: ...

    def entries(self, run_id: str, raw: Any, actor: str = "") -> list[Entry]: ...
    def read(self, run_id: str, start: str = "-", end: str = "+",
             count: int | None = None) -> list[Entry]: ...
    def resolve(self, run_id: str, actions: Iterable[Action],
                states: Iterable[RunState] = ()) -> None: ...


def fold_from(log: RecoveringLog, run_id: str, version: int, raw: Any, *, lease: str = "",
              actor: str = "", at_least: bool = False,
              tail: chain.Tail | None = None) -> RunHandle:
    """Fold the entries ``raw`` read from a checkpoint to the end of the log.

    ``version`` is the projection's, read with them (``lease_acquire.lua``) or just
    before them (``at_least``: writers may have appended since). ``tail``: what was read
    with them to check their chain (``chain.check_loaded``): ``ChainBroken`` when it does
    not hold.
    """
    if not version:
        raise RunNotFound(run_id)
    handle = RunHandle(run_id, RunState(), lease=lease, actor=actor)
    fields = [(i, f if isinstance(f, dict) else dict(zip(f[::2], f[1::2], strict=True)))
              for i, f in raw]
    entries = log.entries(run_id, fields)
    # Only the last intent is re-observed on recovery: keep the state just before it.
    last_intent = max((i for i, e in enumerate(entries)
                       if isinstance(e.event, ev.StepDecided)), default=-1)
    for index, entry in enumerate(entries):
        event = entry.event
        if event is None:
            raise DecodeError(entry.id, entry.error or "undecodable")
        check_seq(entry.id, event, handle.state.version, first=index == 0)
        if isinstance(event, ev.Checkpoint) and handle.state.version == 0:
            if event.state_v not in STATE_SCHEMAS:
                # A snapshot of another layout: refold from the beginning instead.
                _check_chain(run_id, fields, tail)
                return fold_whole(log, run_id, int(version), lease, actor)
            handle.state = from_checkpoint(event)
            handle.ckpt_seq = event.seq
        else:
            if index == last_intent:
                handle.pre_intent = copy_state(handle.state)
            apply(handle.state, event, log.window)
        handle.last_id = entry.id
        handle.tail_actor = event.actor
    _check_chain(run_id, fields, tail)  # (an entry that cannot be read is named first)
    handle.base_version = handle.sealed_version = handle.state.version
    handle.base_state = handle.state.state
    if handle.state.version < version or (handle.state.version != version and not at_least):
        raise DecodeError(handle.last_id, f"log ends at seq {handle.state.version}, "
                          f"projection says {version}")
    if handle.state.version > version and projected_version(log, run_id) < \
            handle.state.version:
        # A writer may have appended between the two reads, but then the projection
        # (changed with the log, in one script) has moved too: entries past it were not
        # written by the append script.
        raise DecodeError(handle.last_id, f"log ends at seq {handle.state.version}, "
                          f"beyond the projection's {version}: an entry not written "
                          "by the append script")
    resolve_large(log, handle)
    return handle


def _check_chain(run_id: str, fields: Any, tail: chain.Tail | None) -> None:
    found = chain.check_loaded(run_id, fields, tail) if tail is not None else None
    if found is not None and not found.ok:
        raise ChainBroken(found.bad_entry or "", found.problem or "")


def projected_version(log: RecoveringLog, run_id: str) -> int:
    """The run's version as its projection has it now (0: no projection)."""
    version = log.redis.hget(log.keys.run(run_id), "version")
    return int(version) if version is not None else 0


def fold_whole(log: RecoveringLog, run_id: str, version: int, lease: str,
               actor: str) -> RunHandle:
    """Fold the whole log, from its first entry, past any checkpoint."""
    handle = RunHandle(run_id, RunState(), lease=lease, actor=actor)
    for index, entry in enumerate(log.read(run_id)):
        if entry.event is None:
            raise DecodeError(entry.id, entry.error or "undecodable")
        check_seq(entry.id, entry.event, handle.state.version, first=index == 0)
        apply(handle.state, entry.event, log.window)
        handle.last_id = entry.id
        handle.tail_actor = entry.event.actor
    handle.base_version = handle.sealed_version = handle.state.version
    handle.base_state = handle.state.state
    if handle.state.version != version:
        raise DecodeError(handle.last_id, "log and projection disagree")
    resolve_large(log, handle)
    return handle


def unreadable(exc: DecodeError) -> str:
    """The reason a run whose load raised ``exc`` is quarantined with."""
    if isinstance(exc, ChainBroken):
        return exc.quarantine_reason
    return f"unreadable log entry {exc.entry_id}: {exc.reason}"


def resolve_large(log: RecoveringLog, handle: RunHandle) -> None:
    """A log that runs agent code gives it the large values of the actions it folded, and
    the run's input when it is kept beside the run (``durable.log.blobs``); other readers
    keep the references."""
    if log.open_sealed:
        pre = handle.pre_intent
        before = pre.actions.values() if pre else ()
        log.resolve(handle.run_id, [*handle.state.actions.values(), *before],
                    [handle.state, *([pre] if pre else [])])
