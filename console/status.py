"""What the console shows beside a run's state and a worker's name: who holds a run right
now, and whether a worker is busy, idle or gone. Derived, never written: "running" is not a
state of the log (DESIGN: whether a worker is active is the lease's business), so it comes
from the lease key (``dx:{R}:lease``), with the holder and since when (the ``lease_acquired``
event of the lease's epoch).

Workers: RQ's registry knows each worker process and its RQ heartbeat, but a hub worker
holds many runs with no RQ job in progress, and RQ beats only when it dequeues (every
second when idle, ``workers.runtime.DEQUEUE_POLL_S``; once per command when busy): RQ says
"idle" for a worker that is driving runs. A worker's leases are its real heartbeat
(renewed every third of ``DURABLE_LEASE_TTL_MS``): a worker holding any is busy, and its
heartbeat is its latest renewal; one holding none is idle, and shown stale once its RQ
heartbeat is older than RQ's worker TTL (RQ itself forgets it 60 s later).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rq.defaults import DEFAULT_WORKER_TTL

from durable.client import Client, RunSummary
from durable.errors import DecodeError
from durable.log import events as ev
from durable.log.state import TERMINAL
from durable.log.store import Entry, now_ms
from durable.telemetry import overview
from durable.telemetry.overview import LeaseInfo, WorkerInfo, leases_of, owner_of

#: Entries read back from a listed run's end to find when its lease was taken.
LOOK_BACK = 200


@dataclass(frozen=True)
class Holder:
    """The lease of a run, as shown: ``since`` is when this epoch's lease was taken (ms
    since the epoch; 0 while its ``lease_acquired`` is not in the log yet)."""

    owner: str
    epoch: int
    since: int
    heartbeat_ms: int
    ttl_left_ms: int


def display_status(state: str, holder: Holder | LeaseInfo | None) -> str:
    """``running`` for a run that is not over and whose lease is held; else its state."""
    return "running" if holder is not None and state not in TERMINAL else state


def acquired_at(entries: list[Entry], epoch: int) -> int:
    """When the lease of ``epoch`` was first recorded taken (0: not in these entries)."""
    found = [e.event.ts for e in entries
             if isinstance(e.event, ev.LeaseAcquired) and e.event.epoch == epoch]
    return min(found, default=0)


def holder(lease: LeaseInfo | None, entries: list[Entry]) -> Holder | None:
    return None if lease is None else _holder(lease, entries)


def _holder(lease: LeaseInfo, entries: list[Entry]) -> Holder:
    return Holder(lease.owner, lease.epoch, acquired_at(entries, lease.epoch), lease.age_ms,
                  lease.ttl_left_ms)


def _decoded(raw: list[Any]) -> list[Entry]:
    out = []
    for entry_id, fields in raw:
        data = fields.get(b"e")
        if data is None:
            continue
        eid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        try:
            out.append(Entry(eid, ev.decode(data, eid)))
        except DecodeError:
            continue
    return out


def holders(c: Client, runs: list[RunSummary]) -> dict[str, Holder]:
    """The holders of the listed runs that are not over: their leases in one round trip,
    then the last ``LOOK_BACK`` entries of each held one in another."""
    live = [r.run_id for r in runs if r.state not in TERMINAL]
    leases = leases_of(c.redis, c.log.keys, live, c.settings.leases.ttl_ms)
    if not leases:
        return {}
    pipe = c.redis.pipeline(transaction=False)
    for run_id in leases:
        pipe.xrevrange(c.log.keys.log(run_id), count=LOOK_BACK)
    tails = pipe.execute()
    return {run_id: _holder(lease, _decoded(tail))
            for (run_id, lease), tail in zip(leases.items(), tails, strict=True)}


@dataclass(frozen=True)
class WorkerView:
    name: str
    #: ``busy`` (holds runs), ``idle``, or ``stale`` (no sign of life for RQ's worker TTL).
    status: str
    queues: list[str]
    started: int
    #: RQ's last heartbeat (ms since the epoch) and its state (``idle`` for a hub worker
    #: between commands, even while it drives runs).
    rq_heartbeat: int
    rq_state: str
    #: ms since the worker last renewed a lease it holds (None: it holds none).
    renewed_ms: int | None
    runs: list[str] = field(default_factory=list)

    @property
    def heartbeat_ms(self) -> int:
        """ms since the latest sign of life: a lease renewal, or RQ's heartbeat."""
        rq = max(now_ms() - self.rq_heartbeat, 0) if self.rq_heartbeat else 2**62
        return min(rq, self.renewed_ms) if self.renewed_ms is not None else rq


def worker_views(workers: list[WorkerInfo], leases: list[LeaseInfo], *,
                 now: int | None = None, rq_ttl_s: int = DEFAULT_WORKER_TTL
                 ) -> list[WorkerView]:
    now = now_ms() if now is None else now
    by_owner: dict[str, list[LeaseInfo]] = {}
    for lease in leases:
        by_owner.setdefault(lease.owner, []).append(lease)
    out = []
    for w in workers:
        held = by_owner.get(owner_of(w.name), [])
        renewed = min((x.age_ms for x in held), default=None)
        if held:
            status = "busy"
        elif not w.last_heartbeat or now - w.last_heartbeat > rq_ttl_s * 1000:
            status = "stale"
        else:
            status = "idle"
        out.append(WorkerView(w.name, status, w.queues, w.started, w.last_heartbeat,
                              w.state, renewed, sorted(x.run_id for x in held)))
    return out


def workers(c: Client) -> list[WorkerView]:
    """The worker processes RQ knows, with their status from the leases held now."""
    leases = c.leases()  # one SCAN for both
    return worker_views(overview.workers(c.redis, c.queue, leases), leases)
