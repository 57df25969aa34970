"""One region at a time: which region may advance runs, and the takeover that moves them.

Every process has a region (``DURABLE_REGION``; "" turns regions off, and nothing here is
read or written then). Each shard of the key layout has a record ``dx:region`` (in the
shard's slot: ``KeyLayout.region``): ``owner``, ``epoch``, ``state``. ``lease_acquire.lua``
reads the record of the run's shard and refuses a process of another region, or any while
the state is ``taking-over`` (``RegionFenced``, nothing written): a worker of another region
is fenced like a stale lease holder. Appends need no check of their own: a takeover breaks
every live run's lease, and a lease can only be taken again by the owning region.

``takeover`` moves the runs to a region after its primary failed (``durable region
takeover``). It refuses, writing nothing, while the old primary still answers (named with
``from_url``, or the local server still a replica with its link up). Otherwise it promotes
the local server (``REPLICAOF NO ONE``), records the new owner at a new epoch in state
``taking-over`` on every shard, and then, run by run (every run not terminal): breaks the
old region's lease and takes one, verifies the log (``durable.audit.verify``: the chain,
the checkpoints against the fold, the ledger), looks up every claimed key without an
outcome through the tool's ``lookup`` (``durable.outcomes``; after the dispatch's deadline
and the clock-skew margin, so that a slow first attempt cannot land after the answer),
and records the new owner in the run's log (``lease_acquired`` with ``region`` and
``region_epoch``). A run whose log does not verify is quarantined, never driven. Only then
is every record set ``active`` and the runs put on the ready list: the new region's workers
acquire nothing before.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from durable.agents import Registry
from durable.audit.verify import verify
from durable.backend.connection import connect_queue
from durable.errors import RegionError, UnknownTool
from durable.leases import Leases
from durable.log import events as ev
from durable.log import keys
from durable.log.keys import KeyLayout
from durable.log.state import TERMINAL, WAITING
from durable.log.store import EventLog, Spec, now_ms
from durable.outcomes import resolve_unknown
from durable.queue import make_queue, make_ready
from durable.settings import Settings

#: The record's states: runs are acquired only while it is ``ACTIVE``.
ACTIVE, TAKING_OVER = "active", "taking-over"

#: The time to live of the lease a takeover holds on each run while it checks it (ms).
TAKEOVER_LEASE_MS = 600_000


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass(frozen=True)
class Ownership:
    """One shard's record: who may advance its runs."""

    shard: int | None
    owner: str
    epoch: int
    state: str


def status(client: redis.Redis, layout: KeyLayout) -> list[Ownership]:
    """Every shard's record ("" and 0 where no region claimed it yet)."""
    out = []
    for shard in layout.shard_ids():
        owner, epoch, state = client.hmget(layout.region(shard), "owner", "epoch", "state")
        out.append(Ownership(shard, _s(owner) if owner else "", int(epoch or 0),
                             _s(state) if state else ""))
    return out


@dataclass
class TakeoverReport:
    """What a takeover did; ``applied_twice`` is counted by whoever can see the effects."""

    region: str
    epoch: int
    promoted: bool = False
    runs: int = 0
    verified: int = 0
    unverified: dict[str, list[str]] = field(default_factory=dict)
    #: Claimed keys without an outcome that were looked up, and what the lookups said.
    looked_up: int = 0
    found_applied: int = 0
    resent: int = 0
    still_unknown: int = 0
    lookup_failed: list[str] = field(default_factory=list)
    #: Runs put on the ready list of the new region.
    enqueued: int = 0
    #: Time spent waiting for dispatch deadlines before a lookup (ms), and in all (ms).
    waited_ms: int = 0
    duration_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def old_primary_answers(client: redis.Redis, from_url: str | None) -> str | None:
    """Why the old primary counts as alive (a takeover must not run), or None."""
    if from_url:
        old = redis.Redis.from_url(from_url, socket_timeout=1, socket_connect_timeout=1)
        try:
            old.ping()
            return f"the old primary at {from_url} still answers"
        except redis.RedisError:
            pass
        finally:
            old.close()
    if hasattr(client, "get_node_from_key"):
        return None  # a cluster promotes its replicas itself
    info = client.info("replication")
    if info.get("role") == "slave" and info.get("master_link_status") == "up":
        return (f"this server is still a replica of {info.get('master_host')}:"
                f"{info.get('master_port')}, which answers")
    return None


def takeover(client: redis.Redis, settings: Settings, registry: Registry, region: str, *,
             from_url: str | None = None) -> TakeoverReport:
    """Move every run to ``region`` (see the module doc). Raises ``RegionError``, having
    written nothing, while the old primary answers or ``region`` is empty."""
    started = time.monotonic()
    if not region:
        raise RegionError("a takeover needs the region that takes over (--region)")
    why = old_primary_answers(client, from_url)
    if why is not None:
        raise RegionError(f"takeover refused: {why}; nothing written (stop it, or make it a "
                          "replica of this server, first)")
    elog = EventLog.from_settings(client, settings, open_sealed=True,
                                  sealed_names=registry.sensitive_names())
    layout = elog.keys
    report = TakeoverReport(region, 0)
    if not hasattr(client, "get_node_from_key") and \
            client.info("replication").get("role") == "slave":
        client.execute_command("REPLICAOF", "NO", "ONE")
        report.promoted = True
    report.epoch = max((o.epoch for o in status(client, layout)), default=0) + 1
    _record(client, layout, region, report.epoch, TAKING_OVER)
    # No region: it may always. No heartbeat either: nobody else acquires while the state
    # is "taking-over", so the lease only has to outlast a wait for a dispatch deadline.
    leases = Leases(client, TAKEOVER_LEASE_MS, layout)
    token = f"takeover:{region}"
    runnable = []
    for run_id in _live_runs(client, layout):
        report.runs += 1
        if _take(client, elog, leases, registry, settings, report, run_id, token):
            runnable.append(run_id)
    _record(client, layout, region, report.epoch, ACTIVE)
    queue = make_queue(connect_queue(settings, client), settings.worker.queue)
    # The old region's workers may have taken the pending drain command: send a new one.
    queue.connection.delete(keys.drain_pending(queue.name))
    for run_id in runnable:
        make_ready(client, layout, queue, run_id, force=True)
        report.enqueued += 1
    report.duration_ms = int((time.monotonic() - started) * 1000)
    return report


def _record(client: redis.Redis, layout: KeyLayout, region: str, epoch: int,
            state: str) -> None:
    for shard in layout.shard_ids():
        client.hset(layout.region(shard), mapping={"owner": region, "epoch": epoch,
                                                   "state": state})


def _live_runs(client: redis.Redis, layout: KeyLayout) -> list[str]:
    """Every run of the indexes that is not terminal, in the projections' word."""
    found = []
    for shard in layout.shard_ids():
        ids = [_s(m) for m in client.zrange(layout.runs_index(shard), 0, -1)]
        pipe = client.pipeline(transaction=False)
        for run_id in ids:
            pipe.hget(layout.run(run_id), "state")
        for run_id, state in zip(ids, pipe.execute(), strict=True):
            if state is not None and _s(state) not in TERMINAL:
                found.append(run_id)
    return found


def _take(client: redis.Redis, elog: EventLog, leases: Leases, registry: Registry,
          settings: Settings, report: TakeoverReport, run_id: str, token: str) -> bool:
    """Fence, verify and settle one run for the new region; whether it is to be driven."""
    client.delete(elog.keys.lease(run_id))  # the old region's holder: its writes now fail
    lease, version, raw = leases.acquire(run_id, token)
    if lease is None:
        raise RegionError(f"run {run_id}: its lease was taken during the takeover by "
                          f"{leases.holder(run_id)} (a process with no region?)")
    try:
        found = verify(elog, run_id, settle_role=settings.security.settle_role)
        if not found.ok:
            report.unverified[run_id] = found.failed
            elog.quarantine(run_id, "did not verify at the region takeover: "
                            + ", ".join(found.failed), token)
            return False
        report.verified += 1
        handle = elog.handle_from(run_id, version, raw, lease=lease.value, actor=token)
        skew = settings.worker.clock_skew_ms
        for act in list(handle.state.actions.values()):
            if act.status not in ("dispatched", "unknown"):
                continue
            try:
                tool = registry.tool(act.tool)
            except UnknownTool:
                report.lookup_failed.append(act.key)
                continue
            if not tool.effect_free:
                # Before its deadline a slow first attempt could still land: wait it out.
                wait_ms = act.deadline + skew - now_ms()
                if wait_ms > 0:
                    time.sleep(wait_ms / 1000)
                    report.waited_ms += wait_ms
            report.looked_up += 1
            specs = resolve_unknown(client, tool, act, run_id) if not tool.effect_free else [
                Spec(ev.ActionReconciled, {"step": act.step, "key": act.key,
                                           "resolution": "not_applied", "by": "effect_free"})]
            if not specs:
                report.lookup_failed.append(act.key)
                continue
            resolution = specs[0].fields["resolution"]
            report.found_applied += resolution == "applied"
            report.resent += resolution == "not_applied"
            report.still_unknown += resolution == "unknown"
            elog.commit(handle, specs, checkpoint=True)
        elog.commit(handle, [Spec(ev.LeaseAcquired, {
            "owner": token, "epoch": lease.epoch, "region": report.region,
            "region_epoch": report.epoch})])
        return handle.state.state not in WAITING and handle.state.state != "quarantined"
    finally:
        leases.release(lease)
