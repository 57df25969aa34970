"""The reconciler's sweep: brings every run that no worker is driving back to a valid next step.

It works from the due-set (``dx:due``: lease checks, wait deadlines, retry timers, late
reconciliations), which every append keeps up to date, and is safe to run as several
copies: ``due_claim.lua`` hands each due run to one reconciler at a time, and any write it
makes is version-checked under a lease like a worker's.

For a due run it:
- leaves it alone while a worker holds its lease (and looks again after the lease's TTL);
- resolves *outcome unknown* actions with the tool's ``lookup`` once their deadline passed;
- finishes a pending cancel when nothing is in flight (of a quarantined run too);
- wakes retry timers and expires waits past their deadline;
- re-enqueues runs with work left and nothing queued (a crashed worker, or a stuck run).

It also starts the runs of due schedule slots (``durable.controls.schedules``: the schedules'
due-set; a slot's run id is deterministic, so several reconcilers start it once).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

import redis

from durable.agents import Registry
from durable.backend.connection import connect_queue
from durable.backend.outages import Outage
from durable.client import Client
from durable.controls.cancellation import cancel_children, finish_specs
from durable.controls.children import (
    CHILD_POLL_MS,
    child_state,
    quarantined_child,
    wake_parent,
)
from durable.durations import parse_duration_ms
from durable.errors import (
    ChainBroken,
    ConflictError,
    DecodeError,
    LeaseLost,
    RegionFenced,
    RunContended,
    RunNotFound,
    Terminal,
    UnknownTool,
)
from durable.flow import fairness
from durable.leases import Leases
from durable.log import context, counters, keys
from durable.log import events as ev
from durable.log.recovery import unreadable
from durable.log.state import TERMINAL, CancelInfo, RunState
from durable.log.store import EventLog, RunHandle, Spec, now_ms
from durable.outcomes import LOOKUP_RETRY_MS, resolve_unknown
from durable.queue import ensure_drain, make_queue, make_ready, ready_depth
from durable.settings import Settings

from .resealing import Resealer

log = logging.getLogger("durable.reconciler")


@dataclass
class Tick:
    examined: int = 0
    actions: dict[str, str] = field(default_factory=dict)


class Sweeper:
    """One reconciler's sweeps (see the module doc): ``tick`` sweeps what is due now,
    ``reconcile`` one run at once."""

    def __init__(self, settings: Settings, client: redis.Redis, registry: Registry) -> None:
        self.settings = settings
        self.redis = client
        self.registry = registry
        # Agent and tool code runs here: sealed fields are opened when read, and sealed
        # again when written (checkpoints too).
        self.log = EventLog.from_settings(client, settings, open_sealed=True,
                                          sealed_names=registry.sensitive_names(),
                                          lean_agents=registry.rebuilt_agents())
        self.leases = Leases.of(client, settings, self.log.keys)
        #: RQ and the ready list: on DURABLE_QUEUE_URL's server, else the log's.
        self.queue = make_queue(connect_queue(settings, client), settings.worker.queue)
        self.token = f"reconciler:{uuid.uuid4().hex[:8]}"
        context_retention = settings.log.context_retention
        #: Ended runs' model context is removed this long after their last write (0: kept).
        self.context_ms = parse_duration_ms(context_retention) if context_retention else 0
        self.outage = Outage(log)
        #: Starts the runs of due schedule slots, validated and recorded as any start.
        own = Client(settings, client, registry)
        self.schedules = own.schedules
        #: Seals the runs that ended without a seal (with a seal key only).
        self.resealer = Resealer(self.log, own.approvers)

    def tick(self, now: int | None = None, limit: int = 200) -> Tick:
        now = now if now is not None else now_ms()
        if ready_depth(self.queue):
            ensure_drain(self.queue)  # ready runs, and the drain command was lost
        ids: list[bytes | str] = []
        for shard in self.log.keys.shard_ids():  # each shard's due set is in its own slot
            ids += self.log.scripts.due_claim(keys=[self.log.keys.due(shard)],
                                              args=[now, limit, self.settings.leases.ttl_ms])
        report = Tick()
        for name, what in self.schedules.sweep(now).items():
            report.examined += 1
            report.actions[f"schedule {name}"] = what
        if self.log.retention_ms:
            report.examined += self.prune_expired(now)
        for run_id, what in self.resealer.sweep(now).items():
            report.actions[f"seal {run_id}"] = what
        if self.context_ms:
            report.examined += self.trim_context(now)
        for raw in ids:
            run_id = raw.decode() if isinstance(raw, bytes) else str(raw)
            report.examined += 1
            try:
                report.actions[run_id] = self.reconcile(run_id, now)
            except redis.RedisError:
                raise  # Redis itself: the process waits for it, then sweeps again
            except Exception as exc:  # one bad run must not stop the others
                log.exception("reconciling %s", run_id)
                report.actions[run_id] = f"error: {exc!r}"
        return report

    def prune_expired(self, now: int, limit: int = 100) -> int:
        """Drop from the global indexes the terminal runs whose keys expired
        (``DURABLE_RETENTION``: their projection is gone), and their fence counter.
        Returns how many were dropped."""
        cutoff = now - self.log.retention_ms
        dropped = 0
        for state in sorted(TERMINAL):
            for shard in self.log.keys.shard_ids():  # the runs of one shard share its slot
                index = self.log.keys.runs_in_state(state, shard)
                ids = [i.decode() for i in
                       self.redis.zrangebyscore(index, "-inf", cutoff, 0, limit)]
                if not ids:
                    continue
                pipe = self.redis.pipeline(transaction=False)
                for run_id in ids:
                    pipe.exists(self.log.keys.run(run_id))
                gone = [rid for rid, alive in zip(ids, pipe.execute(), strict=True)
                        if not alive]
                if gone:
                    pipe.zrem(index, *gone)
                    pipe.zrem(self.log.keys.runs_index(shard), *gone)
                    pipe.zrem(self.log.keys.due(shard), *gone)
                    pipe.hdel(keys.QUARANTINE, *gone)
                    pipe.hdel(keys.CANCEL_LATENCY, *gone)
                    # the fence outlives the run's keys
                    pipe.delete(*[self.log.keys.fence(rid) for rid in gone])
                    pipe.execute()
                    dropped += len(gone)
        if dropped:
            self.redis.hincrby(keys.STATS, "expired_runs_pruned", dropped)
        return dropped

    def trim_context(self, now: int, limit: int = 100) -> int:
        """Remove the model context of the runs that ended more than
        ``DURABLE_CONTEXT_RETENTION`` ago (``durable.log.context``): each state index is
        walked from where the last sweep stopped (``context_swept``), oldest first, and each
        run trimmed by one script call on its keys. Returns how many runs were trimmed.
        Another reconciler doing the same at once is harmless: a run is trimmed by one
        call only (the other's is refused, and finds nothing left when it reads again)."""
        setting = f"DURABLE_CONTEXT_RETENTION={self.settings.log.context_retention}"
        cutoff = now - self.context_ms
        trimmed = 0
        for state in sorted(TERMINAL):
            for shard in self.log.keys.shard_ids():
                index = self.log.keys.runs_in_state(state, shard)
                mark = self.log.keys.context_swept(state, shard)
                since = int(self.redis.get(mark) or 0)
                found = self.redis.zrangebyscore(index, since, cutoff, 0, limit,
                                                 withscores=True)
                if not found:
                    continue
                last = int(found[-1][1])
                if len(found) == limit:
                    # Every run of the last score, however many: the mark moves past it.
                    found = [f for f in found if int(f[1]) < last] + \
                        self.redis.zrangebyscore(index, last, last, withscores=True)
                for raw, _ in found:
                    run_id = raw.decode() if isinstance(raw, bytes) else str(raw)
                    if context.trim(self.log, run_id, setting, actor=self.token) is not None:
                        trimmed += 1
                        self._did("trimmed_context")
                # Past the cutoff, no run gets a score this low any more (a write scores
                # its run now): the next sweep starts after the last one looked at. A run
                # trimmed here is scored now, and found once more, with nothing to trim.
                self.redis.set(mark, last + 1)
        return trimmed

    def _stat(self, name: str) -> None:
        self.redis.hincrby(keys.STATS, name, 1)

    def _did(self, action: str) -> None:
        """Count what the sweep did (``durable_reconciler_actions_total``)."""
        counters.incr(self.redis, counters.RECONCILER_ACTIONS, action)

    def reconcile(self, run_id: str, now: int | None = None) -> str:
        """Do what one run needs now; returns what was done."""
        now = now if now is not None else now_ms()
        if not self.log.exists(run_id):
            self.redis.zrem(self.log.keys.due_of(run_id), run_id)
            return "gone"
        holder = self.leases.holder(run_id)
        if holder is not None:
            ttl = max(int(self.redis.pttl(self.log.keys.lease(run_id))), 0)
            self.redis.zadd(self.log.keys.due_of(run_id),
                            {run_id: now + ttl + self.settings.leases.ttl_ms})
            return "held"
        try:
            lease, version, raw = self.leases.acquire(run_id, self.token)
        except RegionFenced:  # another region owns the run: its reconciler sees to it
            return "another region owns it"
        if lease is None:
            return "held"
        try:
            try:
                handle = self.log.handle_from(run_id, version, raw, lease=lease.value,
                                              actor=self.token, tail=lease.tail)
            except RunNotFound:
                return "gone"
            except DecodeError as exc:
                self.log.quarantine(run_id, unreadable(exc), self.token,
                                    [] if isinstance(exc, ChainBroken)
                                    else counters.migration_error(exc.reason))
                self._did("quarantined")
                return "quarantined"
            try:
                result = self._settle(handle, now)
            except (ConflictError, Terminal, LeaseLost) as exc:
                self.redis.zadd(self.log.keys.due_of(run_id), {run_id: now + 100})
                return f"retry later ({type(exc).__name__})"
        finally:
            self.leases.release(lease)
        self._after(handle.state)
        if result == "enqueue":
            # Queued only if the run id is still on the ready list: a worker killed after
            # taking it (or RQ losing a job) would otherwise stall the run for the marker's TTL.
            ready = keys.ready(self.queue.name, handle.state.agent)
            if self.redis.exists(self.log.keys.queued(run_id)) and \
                    fairness.is_ready(self.queue.connection, ready, run_id):
                self.redis.zadd(self.log.keys.due_of(run_id),
                                {run_id: now + 2 * self.settings.leases.ttl_ms})
                return "queued"
            make_ready(self.redis, self.log.keys, self.queue, run_id, force=True,
                            route=handle.state.agent)
            self._stat("requeued")
            self._did("requeued")
            return "requeued"
        return result

    def _settle(self, handle: RunHandle, now: int) -> str:
        state = handle.state
        skew = self.settings.worker.clock_skew_ms
        # Unknown outcomes first: nothing else may happen to a step whose effect is unknown.
        for act in list(state.actions.values()):
            if act.status not in ("dispatched", "unknown"):
                continue
            known = self.registry.tools.get(act.tool)
            if known is not None and known.effect_free:
                # Nothing outside changed: no deadline to wait for, nothing to ask.
                specs = [Spec(ev.ActionReconciled, {"step": act.step, "key": act.key,
                                                    "resolution": "not_applied",
                                                    "by": "effect_free"})]
            else:
                if act.deadline + skew > now:
                    if state.state == "quarantined" and state.cancel is not None:
                        break  # the cancel records it interrupted, below
                    if state.terminal or state.state == "outcome_unknown":
                        self.redis.zadd(self.log.keys.due_of(handle.run_id),
                                        {handle.run_id: act.deadline + skew + 1})
                        return "awaiting deadline"
                    return "enqueue"
                try:
                    tool = self.registry.tool(act.tool)
                except UnknownTool:
                    self.log.commit(handle, [Spec(ev.Quarantined, {
                        "reason": f"unknown tool {act.tool!r} for unknown outcome {act.key}"})])
                    self._did("quarantined")
                    return "quarantined"
                specs = resolve_unknown(self.redis, tool, act, handle.run_id)
                if not specs:
                    self.redis.zadd(self.log.keys.due_of(handle.run_id),
                                    {handle.run_id: now + LOOKUP_RETRY_MS})
                    return "lookup failed; asking again later"
                cancel = _cancel_to_finish(state)
                if cancel is not None and specs[-1].cls is ev.WaitEntered:
                    # Nobody can tell, and the run is to end: it ends canceled with the
                    # outcome left unknown (an operator may still settle it), rather than
                    # waiting for an operator a cancel already answered.
                    *fates, canceled = finish_specs(state, cancel.reason, cancel.requested_ts)
                    specs = [*fates, specs[0], canceled]
            self.log.commit(handle, specs,
                            checkpoint=not state.terminal and specs[-1].cls is not ev.Canceled,
                            allow_terminal=state.terminal)
            self._stat("unknown_resolved")
            self._did("resolved_unknown")
            if specs[-1].cls is ev.Canceled:
                self.redis.hset(keys.CANCEL_LATENCY, handle.run_id,
                                specs[-1].fields["latency_ms"])
                self._did("finished_cancel")
                return "canceled"
            if handle.state.terminal or handle.state.waiting:
                return f"resolved {act.key}"
            return "enqueue"
        if state.terminal:
            self.redis.zrem(self.log.keys.due_of(handle.run_id), handle.run_id)
            return "terminal"
        quarantined = state.state == "quarantined"
        cancel = _cancel_to_finish(state)
        if cancel is not None:
            # A quarantined run too: no worker will drive it, and a cancel always ends it.
            specs = finish_specs(state, cancel.reason, cancel.requested_ts)
            self.log.commit(handle, specs)
            self.redis.hset(keys.CANCEL_LATENCY, handle.run_id, specs[-1].fields["latency_ms"])
            if quarantined:
                self.redis.hdel(keys.QUARANTINE, handle.run_id)
            self._did("finished_cancel")
            return "canceled"
        if state.state == "quarantined":
            self.redis.zrem(self.log.keys.due_of(handle.run_id), handle.run_id)
            return "quarantined"
        if state.waiting and state.wait is not None:
            if state.wait.until and state.wait.until <= now:
                if state.wait.kind == "child":
                    return self._child_wait(handle, now)
                if state.wait.kind in ("retry", "timer"):  # a timer's end is its answer
                    kind = state.wait.kind
                    self.log.commit(handle, [Spec(ev.WaitResolved, {
                        "kind": kind, "request": state.wait.request, "by": "timer"})])
                    self._stat(f"{kind}_timers_woken")
                    self._did(f"woke_{kind}")
                    return "enqueue"
                self.log.commit(handle, [Spec(ev.WaitExpiry, {
                    "kind": state.wait.kind, "request": state.wait.request,
                    "outcome": self._expiry_outcome(state.agent)})])
                self._stat("waits_expired")
                self._did("expired_wait")
                return "enqueue" if not handle.state.terminal else "expired"
            return "waiting"
        self._stat("stuck_runs" if not self._had_worker(handle) else "lease_expired")
        return "enqueue"

    def _after(self, state: RunState) -> None:
        """A child that ended here wakes its parent; a parent canceled here cancels its
        children (``durable.controls.children``)."""
        if state.terminal and state.parent_step:
            parent = self._wake_parent(state)
            if parent is not None:
                make_ready(self.redis, self.log.keys, self.queue, parent, force=True)
                self._did("woke_parent")
        if state.state == "canceled" and state.children:
            cancel_children(self.log, self.redis, state, state.reason or "canceled",
                            self.token, self.settings.cancel.secret)

    def _wake_parent(self, child: RunState) -> str | None:
        """``durable.controls.children.wake_parent``; a parent other writers kept appending to
        (``RunContended``) is not woken now, but looked at again within ``CHILD_POLL_MS``
        like any parent waiting for a child."""
        try:
            return wake_parent(self.log, child, self.token)
        except RunContended as exc:
            log.warning("run %s ended, its parent %s not woken now: %s", child.run_id,
                        child.parent, exc)
            return None

    def _child_wait(self, handle: RunHandle, now: int) -> str:
        """A parent waiting for a child, looked at every ``CHILD_POLL_MS``: woken when the
        child has ended (its end did not wake it), expired past its expiry."""
        wait = handle.state.wait
        assert wait is not None
        data = wait.data if isinstance(wait.data, dict) else {}
        child = child_state(self.log, str(data.get("child", "")))
        if child is not None and child.terminal:
            if self._wake_parent(child) is not None:
                self._did("woke_parent")
                return "enqueue"
            return "waiting"
        if child is not None and child.state == "quarantined":
            policy = self._policy(handle.state.agent, "on_child_quarantined", "wait")
            done = quarantined_child(self.log, handle, child, policy, self.token)
            if done != "waiting":
                self._did(f"child_quarantined_{done}")
                return "enqueue" if done == "woken" else "canceled"
        expires = int(data.get("expires", 0) or 0)
        if expires and expires <= now:
            self.log.commit(handle, [Spec(ev.WaitExpiry, {
                "kind": "child", "request": wait.request,
                "outcome": self._expiry_outcome(handle.state.agent)})])
            self._did("expired_wait")
            return "enqueue" if not handle.state.terminal else "expired"
        self.redis.zadd(self.log.keys.due_of(handle.run_id), {handle.run_id: now + CHILD_POLL_MS})
        return "waiting"

    def _expiry_outcome(self, agent_name: str) -> str:
        return self._policy(agent_name, "on_wait_expired", "expired")

    def _policy(self, agent_name: str, name: str, default: str) -> str:
        """The agent's policy ``name``; ``default`` for an agent this reconciler lacks."""
        try:
            agent = self.registry.agent(agent_name)
        except Exception:
            return default
        return str(getattr(agent, name, default))

    @staticmethod
    def _had_worker(handle: RunHandle) -> bool:
        return handle.state.version > 1


def _cancel_to_finish(state: RunState) -> CancelInfo | None:
    """The run's pending cancel (scope ``run``) when the sweep ends the run for it, rather
    than a worker (which compensates first, when the cancel asks it to and the run is not
    quarantined)."""
    cancel = state.cancel
    if cancel is None or cancel.scope != "run" or (
            cancel.compensate and state.state != "quarantined"):
        return None
    return cancel
