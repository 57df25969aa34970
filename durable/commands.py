"""Commands on RQ: the only functions a queue payload may name, and how they are enqueued.

Jobs are serialized as JSON (never pickle) and carry a run id alone. The worker refuses any
job whose function is not in ``HANDLERS`` before RQ imports anything.
"""

from __future__ import annotations

from typing import Any

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from durable import keys

ADVANCE = "durable.commands.advance"
DRAIN = "durable.commands.drain"

#: Every function name a job may carry.
HANDLERS = frozenset({ADVANCE, DRAIN})

#: How long (ms) the "queued" marker of a run lives: enqueues within it are deduplicated.
QUEUED_TTL_MS = 60_000

#: How long (ms) a pending ``drain`` command suppresses enqueueing another one.
DRAIN_PENDING_TTL_MS = 5_000


def advance(run_id: str) -> dict[str, Any]:
    """RQ entry point: drive one run forward in the current worker process."""
    from durable.worker_runtime import current_driver

    return current_driver().advance(run_id)


def drain(queue_name: str) -> dict[str, Any]:
    """RQ entry point: drive ready runs, one after the other, for a bounded time."""
    from durable.worker_runtime import current_driver

    return current_driver().drain(queue_name)


def make_queue(client: redis.Redis, name: str) -> Queue:
    return Queue(name, connection=client, serializer=JSONSerializer)


def enqueue_advance(client: redis.Redis, queue: Queue, run_id: str, *, force: bool = False) -> bool:
    """Make ``run_id`` ready for a worker unless it already is.

    The run id goes on the ready list ``dx:ready:<queue>``; an RQ ``drain`` command is put
    on the queue when none is pending. A worker's ``drain`` takes runs from the list one at a
    time, so one RQ job serves many runs instead of one (RQ's own bookkeeping costs about
    two thirds of a short run's time otherwise).
    """
    marker = keys.queued(run_id)
    if not client.set(marker, b"1", nx=True, px=QUEUED_TTL_MS):
        if not force:
            return False
        client.set(marker, b"1", px=QUEUED_TTL_MS)
    client.rpush(keys.ready(queue.name), run_id)
    ensure_drain(client, queue)
    return True


def ensure_drain(client: redis.Redis, queue: Queue) -> bool:
    """Put a ``drain`` command on the queue unless one is pending already."""
    if not client.set(keys.drain_pending(queue.name), b"1", nx=True, px=DRAIN_PENDING_TTL_MS):
        return False
    queue.enqueue_call(
        func=DRAIN, args=(queue.name,), result_ttl=0, failure_ttl=7 * 86400, timeout=-1,
        description=f"drain {queue.name}",
    )
    return True
