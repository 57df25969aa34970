"""The run log: appends through ``append.lua``, reads, and recovery from the last checkpoint.

A :class:`RunHandle` is a writer's view of one run: the folded state at a version, and the
lease it writes under (if any). ``commit`` stamps a batch of events with the next sequence
numbers, applies them to the state, and calls the script once; on a conflict the handle is
stale and the caller reloads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

import msgspec
import redis

from durable.clock import now_ms as now_ms  # the time every writer records
from durable.durations import parse_duration_ms
from durable.errors import (
    CancelPending,
    Claimed,
    ConflictError,
    DecodeError,
    LeaseLost,
    RunNotFound,
    SealError,
    Tampered,
    Terminal,
)
from durable.log import blobs, counters, keys
from durable.log import events as ev
from durable.log.batching import ScriptBatcher
from durable.log.fold import apply, from_checkpoint
from durable.log.replicas import Replicated
from durable.log.scripts import Scripts
from durable.log.state import STATE_SCHEMA, TERMINAL, WAITING, Action, RunState, copy_state
from durable.sealing import (
    TAG,
    Keyring,
    contains_envelope,
    open_all,
    seal_payloads,
    settings_keyring,
)
from durable.signing import parse_public_keys


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class Entry:
    """One stream entry: its id and the event, or the reason it could not be decoded."""

    id: str
    event: ev.Event | None
    error: str | None = None


#: Every envelope's bytes hold its tag (msgpack keeps map keys as they are).
TAG_BYTES = TAG.encode()

#: Events whose payload may hold sensitive fields (``durable.sealing.PAYLOAD_FIELDS``).
_SEALABLE: frozenset[type[ev.Event]] = frozenset({
    ev.RunStarted, ev.StepDecided, ev.ActionSucceeded, ev.ActionReconciled, ev.WaitEntered,
    ev.WaitResolved, ev.Completed, ev.Checkpoint})

#: Events that settle a key, and the status the ledger records for it.
_LEDGER_OUTCOME: dict[type[ev.Event], str] = {
    ev.ActionSucceeded: "succeeded",
    ev.ActionFailed: "failed",
    ev.CallCanceled: "canceled",
    ev.ActionReconciled: "succeeded",
}


@dataclass
class Spec:
    """An event not yet stamped with its sequence number: the type and its own fields."""

    cls: type[ev.Event]
    fields: dict[str, Any]


@dataclass
class RunHandle:
    run_id: str
    state: RunState
    last_id: str = "0-0"
    ckpt_seq: int = 0
    lease: str = ""
    actor: str = ""
    #: State just before the last ``step_decided`` read from the log (for replay checks).
    pre_intent: RunState | None = None
    #: Version of the last event known to be in Redis; the state may be ahead (staged).
    base_version: int = 0
    staged: list[bytes] = field(default_factory=list)
    base_state: str = ""
    staged_ops: list[tuple[str, str, str]] = field(default_factory=list)
    #: What the staged events add to the shared counters (``durable.log.counters``).
    staged_counts: list[tuple[str, int]] = field(default_factory=list)
    #: Arguments of steps whose log entry keeps only their digest (``Tool.log_args``), as
    #: the agent gave them: what is sent. Never written anywhere.
    live_args: dict[int, Any] = field(default_factory=dict)
    #: Large values of the staged outcomes (hash field, bytes): written with them.
    staged_blobs: list[tuple[str, bytes]] = field(default_factory=list)


def _check_seq(entry_id: str, event: ev.Event, version: int, *, first: bool) -> None:
    """Every entry the append script writes carries the next sequence number: a gap or a
    repeat is an entry written some other way (a raw ``XADD``), and the log is not
    trusted (``DecodeError``: the run is quarantined). The first entry read is the
    checkpoint a load starts from, or the run's first event."""
    if first and isinstance(event, ev.Checkpoint):
        return
    if event.seq != version + 1:
        what = "repeats" if event.seq <= version else "skips to"
        raise DecodeError(entry_id, f"seq {event.seq} {what} after seq {version}: an entry "
                          "not written by the append script (log not continuous)")


def continuity(entries: Sequence[Entry]) -> str | None:
    """Why a whole log is not one continuous sequence 1, 2, 3... (None when it is). An
    undecodable entry is taken to hold its place (whether it can be read is another
    question, which a load answers)."""
    for expected, entry in enumerate(entries, start=1):
        if entry.event is not None and entry.event.seq != expected:
            return f"entry {entry.id} has seq {entry.event.seq} where seq {expected} belongs"
    return None


class CommitOptions(TypedDict, total=False):
    """How ``EventLog.commit`` writes its batch."""

    #: Ledger operations (op, key, value) made in the same script call.
    ledger: Iterable[tuple[str, str, str]]
    #: The batch dispatches a call (its key's claim is checked).
    dispatch: bool
    #: Written even to a terminal run.
    allow_terminal: bool
    #: Appended after the others only when no lease is held.
    if_free: Sequence[Spec]
    #: A checkpoint goes with the batch.
    checkpoint: bool
    #: Fields set on the run's projection.
    extra: dict[str, str] | None
    #: The batch also lets go of the lease.
    release: bool
    #: The batch quarantines the run, and is written even then.
    quarantine: bool


@dataclass
class _Prepared:
    """One ``append.lua`` call, ready to send: its keys and arguments, and what the reply
    is read against."""

    keys: list[str]
    args: list[Any]
    expected: int
    ckpt_pos: int


class EventLog:
    def __init__(
        self,
        client: redis.Redis,
        *,
        window: int = 32,
        checkpoint_every: int = 200,
        lease_ttl_ms: int = 5000,
        min_replicas: int = 0,
        replica_timeout_ms: int = 2000,
        keyring: Keyring | None = None,
        open_sealed: bool = False,
        sealed_names: Iterable[str] = (),
        retention_ms: int = 0,
        admin_keys: Iterable[bytes] = (),
        limits: blobs.Limits | None = None,
        lean_agents: Iterable[str] = (),
    ) -> None:
        self.redis = client
        self.scripts = Scripts(client)
        self.replicas = Replicated(client, self.scripts, min_replicas, replica_timeout_ms)
        self.window = window
        self.checkpoint_every = checkpoint_every
        self.lease_ttl_ms = lease_ttl_ms
        #: Keys for sensitive fields (``durable.sealing``); empty = none configured.
        self.keyring = keyring or Keyring({}, None)
        #: Open sealed fields when reading (the worker and the reconciler, which run agent
        #: and tool code); other readers keep them sealed in what they fold.
        self.open_sealed = open_sealed
        #: Field names sealed in every event written (the registry's sensitive names, and
        #: those found sealed in the logs read), so a checkpoint seals them again.
        self.sealed_names: set[str] = set(sealed_names)
        #: Terminal runs' keys expire after this many ms (``DURABLE_RETENTION``); 0 = never.
        self.retention_ms = retention_ms
        #: Public keys of the approver registry's admins (``DURABLE_ADMIN_KEYS``): what a
        #: reader of the log checks recorded approvals' registry entries against.
        self.admin_keys: list[bytes] = list(admin_keys)
        #: Agents whose runs' checkpoints keep only the latest decision's actions: a code
        #: agent rebuilds its history by executing its function again, so the window of
        #: settled actions is never read back (``Registry.rebuilt_agents``).
        self.lean_agents = frozenset(lean_agents)
        #: Where a step's result goes: inline, beside the run, or refused
        #: (``durable.log.blobs``).
        self.limits = limits or blobs.Limits()

    @classmethod
    def from_settings(cls, client: redis.Redis, settings: Any, *, open_sealed: bool = False,
                      sealed_names: Iterable[str] = (),
                      lean_agents: Iterable[str] = ()) -> EventLog:
        keys.use_shards(settings.layout_shards)
        return cls(client, window=settings.action_window,
                   checkpoint_every=settings.checkpoint_every,
                   lease_ttl_ms=settings.lease_ttl_ms, min_replicas=settings.min_replicas,
                   replica_timeout_ms=settings.replica_timeout_ms,
                   keyring=settings_keyring(settings),
                   open_sealed=open_sealed, sealed_names=sealed_names,
                   retention_ms=parse_duration_ms(settings.retention) if settings.retention
                   else 0, admin_keys=parse_public_keys(settings.admin_keys),
                   lean_agents=lean_agents,
                   limits=blobs.Limits.from_settings(settings))

    def batch_appends(self) -> ScriptBatcher | None:
        """Send the appends of this process's threads together (``durable.log.batching``):
        for a worker, whose run threads append at once, where ``_pipelines_appends``.
        Returns the batcher, for other script calls of the same threads (None: not
        batched)."""
        if not self._pipelines_appends():
            return None
        self.replicas.batcher = ScriptBatcher(self.redis)
        return self.replicas.batcher

    def _pipelines_appends(self) -> bool:
        """Whether appends may go out several to a pipeline: not on a cluster (its
        pipelines carry no scripts), nor with ``DURABLE_MIN_REPLICAS`` (each append waits
        for its own replicas on its own connection)."""
        return not self.replicas.min_replicas and not hasattr(self.redis, "nodes_manager")

    # Reading ---------------------------------------------------------------------------

    def read(
        self, run_id: str, start: str = "-", end: str = "+", count: int | None = None
    ) -> list[Entry]:
        raw = self.redis.xrange(keys.log(run_id), start, end, count=count)
        return [self._opened(self._entry(i, f), f.get(b"e")) for i, f in raw]

    @staticmethod
    def _entry(entry_id: Any, fields: dict[Any, Any]) -> Entry:
        eid = _s(entry_id)
        data = fields.get(b"e")
        if data is None:
            return Entry(eid, None, "entry has no 'e' field")
        try:
            return Entry(eid, ev.decode(data, eid))
        except DecodeError as exc:
            return Entry(eid, None, exc.reason)

    def _opened(self, entry: Entry, blob: Any = None) -> Entry:
        """The entry with its sealed fields opened, when this log opens them; one that
        cannot be opened is an undecodable entry (the run is quarantined, never guessed).
        ``blob``: the entry's bytes, to skip at once the entries without an envelope."""
        event = entry.event
        if not self.open_sealed or event is None or type(event) not in _SEALABLE:
            return entry
        if isinstance(blob, bytes) and TAG_BYTES not in blob:
            return entry
        data = msgspec.to_builtins(event)
        if not contains_envelope(data):
            return entry
        try:
            opened = open_all(data, self.keyring, self.sealed_names)
        except SealError as exc:
            return Entry(entry.id, None, str(exc))
        return Entry(entry.id, msgspec.convert(opened, type(event)))

    def _encode(self, event: ev.Event) -> bytes:
        """The event as written: its sensitive fields sealed."""
        if not self.sealed_names or type(event) not in _SEALABLE:
            return ev.encode(event)
        data = msgspec.to_builtins(event)
        seal_payloads(data, self.sealed_names, self.keyring)
        return ev.encode(msgspec.convert(data, type(event)))

    def exists(self, run_id: str) -> bool:
        return bool(self.redis.exists(keys.run(run_id)))

    def projection(self, run_id: str) -> dict[str, str]:
        raw = self.redis.hgetall(keys.run(run_id))
        return {_s(k): _s(v) for k, v in raw.items()}

    def load(self, run_id: str, *, lease: str = "", actor: str = "") -> RunHandle:
        """Recover a run: fold from its last checkpoint. Raises ``DecodeError`` on a bad entry.

        Two plain reads (the checkpoint id, then the log from it) rather than one script:
        Lua's copy of a long XRANGE reply costs more than the second round trip (measured
        in ``bench/whatif.py``). The log and the projection change together, so the entries
        read are always a consistent prefix of the run, whatever was appended in between.
        """
        version, ckpt = self.redis.hmget(keys.run(run_id), "version", "ckpt")
        if version is None:
            raise RunNotFound(run_id)
        start = ckpt.decode() if ckpt else "-"
        raw = self.redis.xrange(keys.log(run_id), start, "+")
        return self.handle_from(run_id, int(version), raw, lease=lease, actor=actor,
                                at_least=True)

    def handle_from(self, run_id: str, version: int, raw: Any, *, lease: str = "",
                    actor: str = "", at_least: bool = False) -> RunHandle:
        """Fold the entries read from a checkpoint to the end of the log.

        ``version`` is the projection's, read with them (``lease_acquire.lua``) or just
        before them (``at_least``: writers may have appended since).
        """
        if not version:
            raise RunNotFound(run_id)
        handle = RunHandle(run_id, RunState(), lease=lease, actor=actor)
        fields = [(i, f if isinstance(f, dict) else dict(zip(f[::2], f[1::2], strict=True)))
                  for i, f in raw]
        entries = [self._opened(self._entry(i, f), f.get(b"e")) for i, f in fields]
        # Only the last intent is re-observed on recovery: keep the state just before it.
        last_intent = max((i for i, e in enumerate(entries)
                           if isinstance(e.event, ev.StepDecided)), default=-1)
        for index, entry in enumerate(entries):
            event = entry.event
            if event is None:
                raise DecodeError(entry.id, entry.error or "undecodable")
            _check_seq(entry.id, event, handle.state.version, first=index == 0)
            if isinstance(event, ev.Checkpoint) and handle.state.version == 0:
                if event.state_v != STATE_SCHEMA:
                    # A snapshot of another layout: refold from the beginning instead.
                    return self._load_without_checkpoint(run_id, int(version), lease, actor)
                handle.state = from_checkpoint(event)
                handle.ckpt_seq = event.seq
            else:
                if index == last_intent:
                    handle.pre_intent = copy_state(handle.state)
                apply(handle.state, event, self.window)
            handle.last_id = entry.id
        handle.base_version = handle.state.version
        handle.base_state = handle.state.state
        if handle.state.version < version or (handle.state.version != version and not at_least):
            raise DecodeError(handle.last_id, f"log ends at seq {handle.state.version}, "
                              f"projection says {version}")
        if handle.state.version > version and self._projected_version(run_id) < \
                handle.state.version:
            # A writer may have appended between the two reads, but then the projection
            # (changed with the log, in one script) has moved too: entries past it were not
            # written by the append script.
            raise DecodeError(handle.last_id, f"log ends at seq {handle.state.version}, "
                              f"beyond the projection's {version}: an entry not written "
                              "by the append script")
        self._resolve(handle)
        return handle

    def _projected_version(self, run_id: str) -> int:
        version = self.redis.hget(keys.run(run_id), "version")
        return int(version) if version is not None else 0

    def _load_without_checkpoint(self, run_id: str, version: int, lease: str,
                                 actor: str) -> RunHandle:
        handle = RunHandle(run_id, RunState(), lease=lease, actor=actor)
        for index, entry in enumerate(self.read(run_id)):
            if entry.event is None:
                raise DecodeError(entry.id, entry.error or "undecodable")
            _check_seq(entry.id, entry.event, handle.state.version, first=index == 0)
            apply(handle.state, entry.event, self.window)
            handle.last_id = entry.id
        handle.base_version = handle.state.version
        handle.base_state = handle.state.state
        if handle.state.version != version:
            raise DecodeError(handle.last_id, "log and projection disagree")
        self._resolve(handle)
        return handle

    def _resolve(self, handle: RunHandle) -> None:
        """A log that runs agent code gives it the large values of the actions it folded
        (``durable.log.blobs``); other readers keep the references."""
        if self.open_sealed:
            before = handle.pre_intent.actions.values() if handle.pre_intent else ()
            self.resolve(handle.run_id, [*handle.state.actions.values(), *before])

    def resolve(self, run_id: str, actions: Iterable[Action]) -> None:
        """Fill in the results of ``actions`` kept beside the run, checked against their
        digests (``DecodeError`` when one is missing or altered)."""
        blobs.resolve(self.redis, run_id, actions, self.keyring, self.sealed_names)

    # Writing ---------------------------------------------------------------------------

    def stamp(self, handle: RunHandle, spec: Spec, seq: int, ts: int) -> ev.Event:
        return spec.cls(
            v=ev.SCHEMA_VERSION, run=handle.run_id, seq=seq, ts=ts, actor=handle.actor,
            **spec.fields,
        )

    def stage(self, handle: RunHandle, specs: Sequence[Spec]) -> None:
        """Stamp and apply events now (so a decision can see them); ``commit`` sends them."""
        ts = now_ms()
        for spec in specs:
            seq = handle.state.version + 1
            # A result over the inline limit goes beside the run, or fails the step.
            cls, fields, large = blobs.place(spec.cls, spec.fields, handle.state, seq,
                                             self.limits, self.sealed_names, self.keyring)
            event = self.stamp(handle, Spec(cls, fields) if large or cls is not spec.cls
                               else spec, seq, ts)
            handle.staged_counts.extend(counters.for_event(handle.state, event))
            apply(handle.state, event, self.window)
            handle.staged.append(self._encode(event))
            if large is not None:
                handle.staged_blobs.append((large.field, large.data))
                act = handle.state.actions.get(fields["step"])
                if act is not None:  # the agent is given the value, not the reference
                    act.result = large.value
            settled = _LEDGER_OUTCOME.get(type(event))
            if settled is not None and not (
                isinstance(event, ev.ActionReconciled) and event.resolution != "applied"
            ) and not (isinstance(event, ev.ActionFailed) and event.retry_at):
                key = event.key  # type: ignore[attr-defined]
                handle.staged_ops.append(("p", key, f"done|{settled}|{event.seq}"))

    def commit(self, handle: RunHandle, specs: Sequence[Spec] = (),
               **options: Unpack[CommitOptions]) -> str:
        """Append the staged events, then ``specs`` (and ``if_free`` when no lease is held),
        as one script call.

        The handle's state is advanced in place. On any refusal it is stale: the caller
        must reload it. Raises ConflictError, LeaseLost, Terminal, CancelPending, Claimed,
        and ``Tampered`` (a ``Terminal``) after quarantining a run whose log ends with an
        entry the script did not write. ``options``: see ``CommitOptions``.
        """
        prepared = self._prepare(handle, specs, options)
        reply = self.replicas.append(handle.run_id, keys=prepared.keys, args=prepared.args)
        return self._settle(handle, prepared, reply)

    async def commit_async(self, handle: RunHandle, specs: Sequence[Spec] = (),
                           **options: Unpack[CommitOptions]) -> str:
        """``commit``, as a coroutine: its script call is sent by whoever drives it (with
        the other runs' calls, ``durable.log.batching``)."""
        prepared = self._prepare(handle, specs, options)
        reply = await self.replicas.append_async(handle.run_id, keys=prepared.keys,
                                                 args=prepared.args)
        return self._settle(handle, prepared, reply)

    def commit_many(self, batch: Sequence[tuple[RunHandle, Sequence[Spec], dict[str, str]]]
                    ) -> list[str | Exception]:
        """``commit(handle, specs, extra=extra)`` for many runs in one pipeline: the first
        batch of new runs (``Client.start_many``). Each item's answer is its last entry id,
        or the exception ``commit`` would have raised. On a cluster, or with
        ``DURABLE_MIN_REPLICAS``, the appends are made one by one."""
        out: list[str | Exception] = []
        if not self._pipelines_appends():
            for handle, specs, extra in batch:
                try:
                    out.append(self.commit(handle, specs, extra=extra))
                except Exception as exc:  # handed back to the caller
                    out.append(exc)
            return out
        prepared = [self._prepare(h, specs, {"extra": extra}) for h, specs, extra in batch]
        with self.redis.pipeline(transaction=False) as pipe:
            for p in prepared:
                self.scripts.append(keys=p.keys, args=p.args, client=pipe)
            replies = pipe.execute(raise_on_error=False)
        for (handle, _, _), p, reply in zip(batch, prepared, replies, strict=True):
            try:
                if isinstance(reply, Exception):
                    raise reply
                out.append(self._settle(handle, p, reply))
            except Exception as exc:  # handed back to the caller
                out.append(exc)
        return out

    def _prepare(self, handle: RunHandle, specs: Sequence[Spec],
                 options: CommitOptions) -> _Prepared:
        """The keys and arguments of one ``append.lua`` call (see ``commit``)."""
        ledger = options.get("ledger", ())
        if_free = options.get("if_free", ())
        checkpoint = options.get("checkpoint", False)
        extra = options.get("extra")
        dispatch, release = options.get("dispatch", False), options.get("release", False)
        allow_terminal = options.get("allow_terminal", False)
        quarantine = options.get("quarantine", False)
        state = handle.state
        expected = handle.base_version
        old_state = handle.base_state or state.state
        ts = now_ms()
        ckpt_pos = 0
        # Every K events, a checkpoint goes where no action is open: after the staged
        # outcome and before the next intent (so the tail a recovery folds stays short).
        if (state.version - handle.ckpt_seq >= self.checkpoint_every and not if_free
                and state.current is None):
            ckpt_pos = self._checkpoint(handle, ts)
        self.stage(handle, specs)
        if checkpoint and not ckpt_pos:
            ckpt_pos = self._checkpoint(handle, ts)
        encoded = handle.staged
        handle.staged = []
        n = len(encoded)
        main_state, main_step = state.state, state.step
        cancel_flag = "1" if state.cancel is not None else "0"
        due = self.due_for(state, ts)
        free_state = main_state
        counts, handle.staged_counts = handle.staged_counts, []
        free_counts: list[tuple[str, int]] = []
        if if_free:
            kept_ops = handle.staged_ops
            handle.staged_ops = []
            self.stage(handle, if_free)
            handle.staged_ops = kept_ops
            free_counts, handle.staged_counts = handle.staged_counts, []
            encoded.extend(handle.staged)
            handle.staged = []
            free_state = state.state
            if state.state in TERMINAL:
                due = self.due_for(state, ts)
        ops = handle.staged_ops + list(ledger)
        handle.staged_ops = []
        large, handle.staged_blobs = handle.staged_blobs, []
        fields = dict(extra or {})
        if state.state != old_state and "reason" not in fields:
            # What `durable runs` shows next to the state: why it waits, stopped or failed.
            why = state.wait.reason if state.wait else (state.reason or state.error or "")
            fields["reason"] = why[:500]
        extra_pairs = [x for kv in fields.items() for x in kv]
        flags = ("d" if dispatch else "") + ("t" if allow_terminal else "") + (
            "r" if release else "") + ("q" if quarantine else "")
        args: list[Any] = [
            expected, handle.lease, main_state, main_step, ts, due, ckpt_pos, flags, n,
            len(encoded) - n, free_state, cancel_flag, handle.run_id, len(ops),
            len(extra_pairs) // 2,
            self.lease_ttl_ms, len(counts), len(free_counts), self.retention_ms, len(large),
            *encoded, *[x for op in ops for x in op], *extra_pairs,
            *[x for c in counts for x in c], *[x for c in free_counts for x in c],
            *[x for b in large for x in b],
        ]
        shard = keys.shard_of(handle.run_id)
        return _Prepared([
            keys.log(handle.run_id), keys.run(handle.run_id), keys.lease(handle.run_id),
            keys.ledger(handle.run_id), keys.runs_index(shard), keys.due(shard),
            keys.runs_in_state(old_state, shard), keys.runs_in_state(main_state, shard),
            keys.runs_in_state(free_state, shard), keys.metrics(shard),
            keys.blobs(handle.run_id),
        ], args, expected, ckpt_pos)

    def _settle(self, handle: RunHandle, prepared: _Prepared, reply: Any) -> str:
        """Apply ``append.lua``'s reply to the handle, or raise what it refused."""
        state = handle.state
        expected, ckpt_pos = prepared.expected, prepared.ckpt_pos
        tag = _s(reply[0])
        if tag == "ok":
            version = int(reply[1])
            handle.last_id = _s(reply[2])
            if ckpt_pos:
                handle.ckpt_seq = expected + ckpt_pos
            if version != state.version:
                # The conditional events were not appended: a lease was held.
                fresh = self.load(handle.run_id, lease=handle.lease, actor=handle.actor)
                handle.state, handle.last_id = fresh.state, fresh.last_id
                handle.ckpt_seq = fresh.ckpt_seq
            handle.base_version = handle.state.version
            handle.base_state = handle.state.state
            return handle.last_id
        if tag == "conflict":
            raise ConflictError(handle.run_id, expected, int(reply[1]))
        if tag == "lease":
            epoch = int(handle.lease.rsplit("|", 1)[-1]) if "|" in handle.lease else 0
            raise LeaseLost(handle.run_id, epoch)
        if tag == "terminal":
            raise Terminal(_s(reply[1]))
        if tag == "canceled":
            raise CancelPending()
        if tag == "claimed":
            raise Claimed(_s(reply[1]), _s(reply[2]))
        if tag == "foreign":
            tail = _s(reply[1])
            self.quarantine(handle.run_id, f"log entry {tail} was not written by the append "
                            "script (appended around it); nothing is built on it",
                            handle.actor)
            raise Tampered(handle.run_id, tail)
        raise RuntimeError(f"unexpected reply from append.lua: {reply!r}")

    def _checkpoint(self, handle: RunHandle, ts: int) -> int:
        """Stage a snapshot of the state as it is now; returns its position in the batch."""
        state = handle.state
        window = state.actions
        if state.agent in self.lean_agents:
            state.actions = latest_actions(state)
        try:
            with blobs.unresolved(state):  # the snapshot keeps references, not large values
                handle.staged.append(self._encode(ev.Checkpoint(
                    v=ev.SCHEMA_VERSION, run=handle.run_id, seq=state.version + 1, ts=ts,
                    actor=handle.actor, state=state, state_v=STATE_SCHEMA,
                )))
        finally:
            state.actions = window
        state.version += 1
        return len(handle.staged)

    def due_for(self, state: RunState, ts: int) -> str:
        """When the reconciler must next look at a run in this state ("-" = never)."""
        unknown = [a.deadline for a in state.actions.values()
                   if a.status in ("unknown", "dispatched")]
        if state.state in TERMINAL:
            return str(max(unknown) + 1) if unknown else "-"
        if state.state == "quarantined":  # until an operator acts; a cancel ends it
            cancel = state.cancel is not None and state.cancel.scope == "run"
            return str(ts + self.lease_ttl_ms) if cancel else "-"
        if state.state in WAITING:
            if state.wait is not None and state.wait.until:
                return str(state.wait.until)
            return "-"
        return str(ts + 2 * self.lease_ttl_ms)

    def quarantine(self, run_id: str, reason: str, actor: str = "") -> bool:
        """Mark a run quarantined without folding it (its log may be unreadable)."""
        proj = self.projection(run_id)
        if not proj:
            raise RunNotFound(run_id)
        if proj.get("state") == "quarantined":
            return False
        version = int(proj.get("version", "0"))
        state = RunState(run_id=run_id, state=proj.get("state", "pending"), version=version,
                         step=int(proj.get("step", "0")))
        handle = RunHandle(run_id, state, actor=actor, base_version=version,
                           base_state=state.state)
        try:
            self.commit(handle, [Spec(ev.Quarantined, {"reason": reason})],
                        extra={"reason": reason[:500]}, quarantine=True)
        except (ConflictError, Terminal):
            return False
        self.redis.hset(keys.QUARANTINE, run_id, reason[:500])
        return True


def latest_actions(state: RunState) -> dict[int, Action]:
    """The actions of the run's latest decision (its step, or its whole parallel group)
    and every open one: what a lean checkpoint keeps."""
    last = state.actions.get(state.step)
    first = (last.group or last.step) if last is not None else state.step
    return {step: act for step, act in state.actions.items()
            if step >= first or not act.settled}
