"""The queue: command names and how runs are made ready for a worker.

Commands are RQ jobs, serialized as JSON (never pickle), that carry a run id or a queue name
alone. The functions they name are the worker's handlers (``workers.handlers``); they are
named here as strings, so producers enqueue without importing the worker. A worker refuses
any job whose function is not in ``HANDLERS`` before RQ imports anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import redis

from durable.flow import fairness
from durable.log import keys

if TYPE_CHECKING:
    from rq import Queue

ADVANCE = "durable.workers.handlers.advance"
DRAIN = "durable.workers.handlers.drain"

#: Every function name a job may carry.
HANDLERS = frozenset({ADVANCE, DRAIN})

#: Names earlier releases enqueued under (the first release's, and the top-level
#: ``workers`` package's before it became ``durable.workers``): still run, as the handler
#: they became, for one release (jobs queued before an upgrade). Remove in the release
#: after next.
LEGACY_HANDLERS = {
    "durable.commands.advance": ADVANCE,
    "durable.commands.drain": DRAIN,
    "workers.handlers.advance": ADVANCE,
    "workers.handlers.drain": DRAIN,
}

#: How long (ms) the "queued" marker of a run lives: enqueues within it are deduplicated.
QUEUED_TTL_MS = 60_000

#: How long (ms) a pending ``drain`` command suppresses enqueueing another one.
DRAIN_PENDING_TTL_MS = 5_000


def make_queue(client: redis.Redis, name: str) -> Queue:
    """The RQ queue ``name`` (RQ is imported here, on first use: a producer that only reads
    runs, and the CLI's read commands, never load it)."""
    from rq import Queue
    from rq.serializers import JSONSerializer

    return Queue(name, connection=client, serializer=JSONSerializer)


def make_ready(client: redis.Redis, layout: keys.KeyLayout, queue: Queue, run_id: str, *,
               force: bool = False, route: str | None = None) -> bool:
    """Make ``run_id`` ready for a worker unless it already is.

    The run id goes on its route's ready list ``dx:ready:<queue>:<agent>`` (``route``, or
    its agent looked up); an RQ ``drain`` command is put
    on the queue when none is pending. A worker's ``drain`` takes runs from the list one at a
    time, so one RQ job serves many runs instead of one (RQ's own bookkeeping costs about
    two thirds of a short run's time otherwise).

    ``client`` is the log's server (the run's "queued" marker lives with its lease); the
    ready list and the command go to the queue's (``queue.connection``, which may be
    another server: ``DURABLE_QUEUE_URL``). Losing the queue's server loses no run: the
    reconciler finds every run with work left in its due set, sees it on no ready list,
    and enqueues it again.
    """
    marker = layout.queued(run_id)
    pipe = client.pipeline(transaction=False)
    pipe.set(marker, b"1", nx=True, px=QUEUED_TTL_MS)
    pipe.hmget(layout.run(run_id), ["agent", "tenant", "priority"])
    fresh, (agent, tenant, priority) = pipe.execute()
    if not fresh:
        if not force:
            return False
        client.set(marker, b"1", px=QUEUED_TTL_MS)
    if route is None:
        route = agent.decode() if agent else ""
    push(queue, route, [run_id], {run_id: _who(tenant, priority)})
    return True


def _who(tenant: bytes | None, priority: bytes | None) -> tuple[str, int]:
    """A run's tenant and priority, from its projection (``durable.flow.fairness``)."""
    try:
        prio = int(priority) if priority else 0
    except ValueError:
        prio = 0
    return (tenant.decode() if tenant else "", prio)


def push(queue: Queue, route: str, run_ids: list[str],
         who: dict[str, tuple[str, int]] | None = None) -> None:
    """Put ``run_ids`` on ``route``'s ready list (recording the route for readers), and a
    ``drain`` command on RQ unless one is pending. ``who``: run id -> (tenant, priority);
    a run with either goes on the list's fair side (``durable.flow.fairness``)."""
    who = who or {}
    ready = keys.ready(queue.name, route)
    plain = [r for r in run_ids if fairness.is_plain(*who.get(r, ("", 0)))]
    pipe = queue.connection.pipeline(transaction=False)
    if plain:
        pipe.rpush(ready, *plain)
    if len(plain) < len(run_ids):
        fairness.push(queue.connection, ready, [
            (r, *who[r]) for r in run_ids if not fairness.is_plain(*who.get(r, ("", 0)))],
            pipe)
    if route:
        pipe.sadd(keys.routes(queue.name), route)
    pipe.execute()
    ensure_drain(queue)


def ready_depth(queue: Queue) -> int:
    """Runs waiting on every ready list of ``queue``."""
    conn = queue.connection
    lists = [keys.ready(queue.name)] + [keys.ready(queue.name, r.decode())
                                        for r in conn.smembers(keys.routes(queue.name))]
    pipe = conn.pipeline(transaction=False)
    for name in lists:
        fairness.depth(pipe, name)
    return sum(int(n) for n in pipe.execute())


def enqueue_many(client: redis.Redis, layout: keys.KeyLayout, queue: Queue, run_ids: list[str], *,
                 force: bool = False, route: str | None = None) -> list[str]:
    """``make_ready`` for many runs: their markers in one pipeline, the ready ones in
    one push per route, one drain command. Returns the runs made ready (not queued already;
    every one with ``force``). ``route``: theirs when they share one (else looked up)."""
    pipe = client.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.set(layout.queued(run_id), b"1", nx=not force, px=QUEUED_TTL_MS)
        pipe.hmget(layout.run(run_id), ["agent", "tenant", "priority"])
    replies = pipe.execute()
    by_route: dict[str, list[str]] = {}
    who: dict[str, tuple[str, int]] = {}
    for i, run_id in enumerate(run_ids):
        if not replies[i * 2]:
            continue
        agent, tenant, priority = replies[i * 2 + 1]
        name = route if route is not None else (agent.decode() if agent else "")
        by_route.setdefault(name, []).append(run_id)
        who[run_id] = _who(tenant, priority)
    for name, ids in by_route.items():
        push(queue, name, ids, who)
    return [run_id for ids in by_route.values() for run_id in ids]


def ensure_drain(queue: Queue) -> bool:
    """Put a ``drain`` command on the queue unless one is pending already."""
    client = queue.connection
    if not client.set(keys.drain_pending(queue.name), b"1", nx=True, px=DRAIN_PENDING_TTL_MS):
        return False
    queue.enqueue_call(
        func=DRAIN, args=(queue.name,), result_ttl=0, failure_ttl=7 * 86400, timeout=-1,
        description=f"drain {queue.name}",
    )
    return True
