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

#: Every function name a job may carry.
HANDLERS = frozenset({ADVANCE})

#: How long (ms) the "queued" marker of a run lives: enqueues within it are deduplicated.
QUEUED_TTL_MS = 60_000


def advance(run_id: str) -> dict[str, Any]:
    """RQ entry point: drive ``run_id`` forward in the current worker process."""
    from durable.worker_runtime import current_driver

    return current_driver().advance(run_id)


def make_queue(client: redis.Redis, name: str) -> Queue:
    return Queue(name, connection=client, serializer=JSONSerializer)


def enqueue_advance(client: redis.Redis, queue: Queue, run_id: str, *, force: bool = False) -> bool:
    """Put one ``advance(run_id)`` on the queue unless one is already waiting there."""
    marker = keys.queued(run_id)
    if not client.set(marker, b"1", nx=True, px=QUEUED_TTL_MS) and not force:
        return False
    if force:
        client.set(marker, b"1", px=QUEUED_TTL_MS)
    queue.enqueue_call(
        func=ADVANCE, args=(run_id,), result_ttl=0, failure_ttl=7 * 86400, timeout=-1,
        description=f"advance {run_id}",
    )
    return True
