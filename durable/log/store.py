"""The run log: appends through ``append.lua``, reads, and recovery from the last checkpoint
(folded by ``durable.log.recovery``).

A :class:`RunHandle` (``durable.log.handle``) is a writer's view of one run: the folded
state at a version, and the lease it writes under (if any). ``commit`` stamps a batch of
events with the next sequence numbers, applies them to the state, and calls the script once
(``durable.log.append``); on a conflict the handle is stale and the caller reloads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Unpack

import redis

from durable.durations import parse_duration_ms
from durable.errors import ConflictError, RunNotFound, Terminal
from durable.log import blobs, counters, keys, recovery
from durable.log import events as ev
from durable.log.append import prepare, settle
from durable.log.batching import ScriptBatcher
from durable.log.chain import Tail
from durable.log.entries import actor_before, decode_entry, encode_event, open_entry
from durable.log.fold import apply
from durable.log.handle import (
    CommitOptions,
    Entry,
    RunHandle,
    Spec,
    continuity,
    latest_actions,
    now_ms,
    text,
)
from durable.log.replicas import Replicated
from durable.log.scripts import Scripts
from durable.log.sealer import Sealer, seal_call, sealed, unsealed
from durable.log.state import (
    STATE_INPUT_REF,
    STATE_SCHEMA,
    TERMINAL,
    WAITING,
    Action,
    RunState,
)
from durable.security.sealing import Keyring, settings_keyring
from durable.security.signing import parse_public_keys
from durable.settings import Settings

__all__ = ["COMPACT_MAX_ENTRIES", "Entry", "EventLog", "RunHandle", "Spec", "continuity",
           "latest_actions", "now_ms"]

#: Events that settle a key, and the status the ledger records for it.
_LEDGER_OUTCOME: dict[type[ev.Event], str] = {
    ev.ActionSucceeded: "succeeded",
    ev.ActionFailed: "failed",
    ev.CallCanceled: "canceled",
    ev.ActionReconciled: "succeeded",
}

#: A run that ends with at most this many entries has its log rewritten to its exact size
#: (``append.lua``): Redis gives a stream's newest node 4 KB ahead of need, which is most
#: of a short run's bytes; a longer log's last node is a small part of it.
COMPACT_MAX_ENTRIES = 500


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
        compact_max: int = COMPACT_MAX_ENTRIES,
        layout: keys.KeyLayout = keys.UNSHARDED,
        sealer: Sealer | None = None,
    ) -> None:
        self.redis = client
        #: The keys of this log's data (``durable.log.keys``): its layout, unsharded or N
        #: shards, fixed for the life of the data.
        self.keys = layout
        self.scripts = Scripts(client)
        self.replicas = Replicated(client, self.scripts, min_replicas, replica_timeout_ms)
        self.window = window
        self.checkpoint_every = checkpoint_every
        self.lease_ttl_ms = lease_ttl_ms
        #: Keys for sensitive fields (``durable.security.sealing``); empty = none configured.
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
        #: A terminal run's log of at most this many entries is rewritten to its exact size.
        self.compact_max = compact_max
        #: Seals the chain head of every run this log's writes end (``DURABLE_SEAL_KEY``);
        #: None: they stay unsealed.
        self.sealer = sealer

    @classmethod
    def from_settings(cls, client: redis.Redis, settings: Settings, *, open_sealed: bool = False,
                      sealed_names: Iterable[str] = (),
                      lean_agents: Iterable[str] = ()) -> EventLog:
        retention = settings.log.retention
        return cls(client, window=settings.log.action_window,
                   checkpoint_every=settings.log.checkpoint_every,
                   lease_ttl_ms=settings.leases.ttl_ms,
                   min_replicas=settings.cluster.min_replicas,
                   replica_timeout_ms=settings.cluster.replica_timeout_ms,
                   keyring=settings_keyring(settings),
                   open_sealed=open_sealed, sealed_names=sealed_names,
                   retention_ms=parse_duration_ms(retention) if retention else 0,
                   admin_keys=parse_public_keys(settings.security.admin_keys),
                   lean_agents=lean_agents,
                   limits=blobs.Limits.from_settings(settings),
                   layout=keys.KeyLayout.of(settings),
                   sealer=Sealer.from_settings(settings))

    def batch_appends(self, everywhere: bool = False) -> ScriptBatcher | None:
        """Send the appends of this process's threads together (``durable.log.batching``):
        for a worker, whose run threads append at once. Returns the batcher, for other
        script calls of the same threads (None: not batched).

        On a cluster, or with ``DURABLE_MIN_REPLICAS``, only when ``everywhere`` (a
        worker's hub: a pipeline per master, one ``WAIT`` per pipeline); the run threads
        there keep one call each, as before batching."""
        if not everywhere and (self.replicas.min_replicas or
                               hasattr(self.redis, "nodes_manager")):
            return None
        self.replicas.batcher = ScriptBatcher(self.redis, self.replicas.min_replicas,
                                              self.replicas.timeout_ms)
        return self.replicas.batcher

    def _pipelines_appends(self) -> bool:
        """Whether a redis-py pipeline may carry several appends (``commit_many``): not on
        a cluster, nor with ``DURABLE_MIN_REPLICAS`` (each append waits for its own
        replicas)."""
        return not self.replicas.min_replicas and not hasattr(self.redis, "nodes_manager")

    # Reading ---------------------------------------------------------------------------

    def read(
        self, run_id: str, start: str = "-", end: str = "+", count: int | None = None
    ) -> list[Entry]:
        raw = self.redis.xrange(self.keys.log(run_id), start, end, count=count)
        actor = self._actor_before(run_id, raw) if start not in ("-", "0", "0-0") else ""
        return self.entries(run_id, raw, actor)

    def entries(self, run_id: str, raw: Any, actor: str = "") -> list[Entry]:
        """Stream entries of the run, read in order, as events. ``actor``: the actor of
        the entry before the first (an entry with the same actor leaves its own out)."""
        out = []
        for entry_id, fields in raw:
            entry = decode_entry(entry_id, fields, run_id, actor)
            if entry.event is not None:
                actor = entry.event.actor
            out.append(self._opened(entry, fields.get(b"e")))
        return out

    def _actor_before(self, run_id: str, raw: Any) -> str:
        return actor_before(self.redis, self.keys, run_id, raw)

    def _opened(self, entry: Entry, blob: Any = None) -> Entry:
        if not self.open_sealed:
            return entry
        return open_entry(entry, blob, self.keyring, self.sealed_names)

    def _encode(self, event: ev.Event, *, same_actor: bool = False) -> bytes:
        """The event as written: its sensitive fields sealed."""
        return encode_event(event, self.sealed_names, self.keyring, same_actor=same_actor)

    def encode_staged(self, handle: RunHandle, staged: Sequence[tuple[int, ev.Event | bytes]],
                      after: str | None) -> list[tuple[int, bytes]]:
        """The staged events as written, in order: each leaves out its actor when the
        entry before it (``after``: the actor of the log's last entry, None if unknown)
        has the same. A checkpoint is encoded when staged, naming its actor."""
        out = []
        # Nothing to seal (most logs): the codec directly, not through the sealing path.
        encode = self._encode if self.sealed_names else ev.encode
        for ts, item in staged:
            if isinstance(item, bytes):
                out.append((ts, item))
            else:
                out.append((ts, encode(item, same_actor=after == item.actor)))
                after = item.actor
                continue
            after = handle.actor
        return out

    def exists(self, run_id: str) -> bool:
        return bool(self.redis.exists(self.keys.run(run_id)))

    def projection(self, run_id: str) -> dict[str, str]:
        raw = self.redis.hgetall(self.keys.run(run_id))
        return {text(k): text(v) for k, v in raw.items()}

    def load(self, run_id: str, *, lease: str = "", actor: str = "") -> RunHandle:
        """Recover a run: fold from its last checkpoint. Raises ``DecodeError`` on a bad entry.

        Two plain reads (the checkpoint id, then the log from it) rather than one script:
        Lua's copy of a long XRANGE reply costs more than the second round trip (measured
        in ``bench/whatif.py``). The log and the projection change together, so the entries
        read are always a consistent prefix of the run, whatever was appended in between.
        """
        version, ckpt = self.redis.hmget(self.keys.run(run_id), "version", "ckpt")
        if version is None:
            raise RunNotFound(run_id)
        start = ckpt.decode() if ckpt else "-"
        raw = self.redis.xrange(self.keys.log(run_id), start, "+")
        return self.handle_from(run_id, int(version), raw, lease=lease, actor=actor,
                                at_least=True)

    def handle_from(self, run_id: str, version: int, raw: Any, *, lease: str = "",
                    actor: str = "", at_least: bool = False,
                    tail: Tail | None = None) -> RunHandle:
        """Fold the entries read from a checkpoint to the end of the log
        (``durable.log.recovery.fold_from``).

        ``version`` is the projection's, read with them (``lease_acquire.lua``) or just
        before them (``at_least``: writers may have appended since); ``tail``: what their
        chain is checked against (``ChainBroken``).
        """
        return recovery.fold_from(self, run_id, version, raw, lease=lease, actor=actor,
                                  at_least=at_least, tail=tail)

    def resolve(self, run_id: str, actions: Iterable[Action],
                states: Iterable[RunState] = ()) -> None:
        """Fill in the results of ``actions`` and the inputs of ``states`` kept beside the
        run, checked against their digests (``DecodeError`` when one is missing or
        altered)."""
        blobs.resolve(self.redis, self.keys, run_id, actions, self.keyring, self.sealed_names,
                      states)

    # Writing ---------------------------------------------------------------------------

    def stamp(self, handle: RunHandle, spec: Spec, seq: int, ts: int) -> ev.Event:
        return spec.cls(
            v=ev.SCHEMA_VERSION, run=handle.run_id, seq=seq, ts=ts, actor=handle.actor,
            **spec.fields,
        )

    @staticmethod
    def stamp_time(handle: RunHandle) -> int:
        """The time (ms) of the next entry: now, but never before the log's last entry or
        a staged one, since it is also the entry's id (``append.lua``)."""
        last = handle.staged[-1][0] if handle.staged else ev.entry_ms(handle.last_id)
        return max(now_ms(), last)

    def stage(self, handle: RunHandle, specs: Sequence[Spec]) -> None:
        """Stamp and apply events now (so a decision can see them); ``commit`` sends them."""
        ts = self.stamp_time(handle)
        for spec in specs:
            seq = handle.state.version + 1
            # A result over the inline limit goes beside the run, or fails the step.
            cls, fields, large = blobs.place(spec.cls, spec.fields, handle.state, seq,
                                             self.limits, self.sealed_names, self.keyring)
            event = self.stamp(handle, Spec(cls, fields) if large or cls is not spec.cls
                               else spec, seq, ts)
            handle.staged_counts.extend(counters.for_event(handle.state, event))
            before = handle.state.state
            apply(handle.state, event, self.window)
            handle.staged_counts.extend(counters.for_end(before, handle.state))
            handle.staged.append((ts, event))
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
        prepared = prepare(self, handle, specs, options)
        reply = self.replicas.append(handle.run_id, keys=prepared.call.keys,
                                     args=prepared.call.args)
        last_id = settle(self, handle, prepared, reply)
        call = seal_call(self.sealer, self.keys, handle, reply, prepared.sealing)
        if call is not None:
            with unsealed(handle.run_id):
                sealed(handle, self.scripts.seal(keys=call[0], args=call[1]))
        return last_id

    async def commit_async(self, handle: RunHandle, specs: Sequence[Spec] = (),
                           **options: Unpack[CommitOptions]) -> str:
        """``commit``, as a coroutine: its script call is sent by whoever drives it (with
        the other runs' calls, ``durable.log.batching``)."""
        prepared = prepare(self, handle, specs, options)
        reply = await self.replicas.append_async(handle.run_id, keys=prepared.call.keys,
                                                 args=prepared.call.args)
        last_id = settle(self, handle, prepared, reply)
        call = seal_call(self.sealer, self.keys, handle, reply, prepared.sealing)
        if call is not None:
            with unsealed(handle.run_id):
                batcher = self.replicas.batcher
                if batcher is not None:
                    sealed(handle, await batcher.script_call("seal", call[0], call[1]))
                else:
                    sealed(handle, self.scripts.seal(keys=call[0], args=call[1]))
        return last_id

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
        prepared = [prepare(self, h, specs, {"extra": extra}) for h, specs, extra in batch]
        with self.redis.pipeline(transaction=False) as pipe:
            for p in prepared:
                self.scripts.append(keys=p.call.keys, args=p.call.args, client=pipe)
            replies = pipe.execute(raise_on_error=False)
        for (handle, _, _), p, reply in zip(batch, prepared, replies, strict=True):
            try:
                if isinstance(reply, Exception):
                    raise reply
                out.append(settle(self, handle, p, reply))
            except Exception as exc:  # handed back to the caller
                out.append(exc)
                continue
            call = seal_call(self.sealer, self.keys, handle, reply, p.sealing)
            if call is not None:
                with unsealed(handle.run_id):
                    sealed(handle, self.scripts.seal(keys=call[0], args=call[1]))
        return out

    def stage_checkpoint(self, handle: RunHandle, ts: int) -> int:
        """Stage a snapshot of the state as it is now (encoded now: the state moves on,
        naming its actor: a reader may start from it); returns its position in the batch."""
        state = handle.state
        window = state.actions
        if state.agent in self.lean_agents:
            state.actions = latest_actions(state)
        try:
            with blobs.unresolved(state):  # the snapshot keeps references, not large values
                handle.staged.append((ts, self._encode(ev.Checkpoint(
                    v=ev.SCHEMA_VERSION, run=handle.run_id, seq=state.version + 1, ts=ts,
                    actor=handle.actor, state=state,
                    state_v=STATE_INPUT_REF if state.input_blob is not None else STATE_SCHEMA,
                ))))
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

    def quarantine(self, run_id: str, reason: str, actor: str = "",
                   counts: Sequence[tuple[str, int]] = ()) -> bool:
        """Mark a run quarantined without folding it (its log may be unreadable); ``counts``
        (``durable.log.counters``) are added with its event."""
        handle = quarantine_handle(run_id, self.projection(run_id), actor)
        if handle is None:
            return False
        handle.staged_counts.extend(counts)
        try:
            self.commit(handle, [Spec(ev.Quarantined, {"reason": reason})],
                        extra={"reason": reason[:500]}, quarantine=True)
        except (ConflictError, Terminal):
            return False
        self.redis.hset(keys.QUARANTINE, run_id, reason[:500])
        return True


def quarantine_handle(run_id: str, proj: dict[str, str], actor: str) -> RunHandle | None:
    """A handle on a run to quarantine, built from its projection alone (its log may be
    unreadable); None when it is quarantined already. Raises ``RunNotFound``."""
    if not proj:
        raise RunNotFound(run_id)
    if proj.get("state") == "quarantined":
        return None
    version = int(proj.get("version", "0"))
    state = RunState(run_id=run_id, state=proj.get("state", "pending"), version=version,
                     step=int(proj.get("step", "0")))
    return RunHandle(run_id, state, actor=actor, base_version=version, base_state=state.state)
