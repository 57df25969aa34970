"""What operators look at across runs: counts per state, the leases held right now, the
worker processes, the queue's depth and the reconcilers' last sweeps.

All of it is read-only and derived (indexes, leases, RQ's worker registry, ``dx:sweeps``):
the logs stay the truth. ``durable.client.Client`` exposes each as a method.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from durable.log import keys
from durable.log.state import ALL_STATES
from durable.log.store import now_ms
from durable.queue import ready_depth

if TYPE_CHECKING:
    from rq import Queue

#: Most leases one ``leases()`` call reports (it SCANs the keyspace for lease keys).
MAX_LEASES = 5000

#: A worker's RQ name is its lease owner token, ``host:pid:hex``, with ``.N`` appended
#: after a reconnect (the host may contain dots).
_RQ_NAME = re.compile(r"^(?P<owner>.+:\d+:[0-9a-f]+)(?:\.\d+)?$")


def owner_of(rq_name: str) -> str:
    """The lease owner token of a worker's RQ name."""
    m = _RQ_NAME.match(rq_name)
    return m.group("owner") if m else rq_name


@dataclass(frozen=True)
class LeaseInfo:
    """Who holds a run right now. ``age_ms``: time since the holder's last heartbeat
    renewed it (the TTL minus what is left of it)."""

    run_id: str
    owner: str
    epoch: int
    ttl_left_ms: int
    age_ms: int


@dataclass(frozen=True)
class WorkerInfo:
    name: str
    state: str
    queues: list[str]
    #: ms since the epoch (0: unknown).
    last_heartbeat: int
    started: int
    #: Runs whose lease this worker holds.
    runs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Sweep:
    """One reconciler process's last sweep, and the last one that did something."""

    reconciler: str
    at: int
    examined: int
    did_at: int = 0
    did: dict[str, str] = field(default_factory=dict)


def counts(client: redis.Redis, layout: keys.KeyLayout) -> dict[str, int]:
    """Runs per state, from the state indexes of every shard (one pipeline)."""
    states = sorted(ALL_STATES)
    shards = layout.shard_ids()
    pipe = client.pipeline(transaction=False)
    for state in states:
        for shard in shards:
            pipe.zcard(layout.runs_in_state(state, shard))
    replies = [int(n) for n in pipe.execute()]
    return {s: sum(replies[i * len(shards):(i + 1) * len(shards)])
            for i, s in enumerate(states)}


def _lease(run_id: str, value: Any, pttl: Any, ttl_ms: int) -> LeaseInfo | None:
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else str(value)
    owner, _, epoch = text.rpartition("|")
    left = max(int(pttl), 0)
    return LeaseInfo(run_id, owner, int(epoch) if epoch.isdigit() else 0, left,
                     max(ttl_ms - left, 0))


def lease(client: redis.Redis, layout: keys.KeyLayout, run_id: str,
          ttl_ms: int) -> LeaseInfo | None:
    pipe = client.pipeline(transaction=False)
    pipe.get(layout.lease(run_id))
    pipe.pttl(layout.lease(run_id))
    value, pttl = pipe.execute()
    return _lease(run_id, value, pttl, ttl_ms)


def leases(client: redis.Redis, layout: keys.KeyLayout, ttl_ms: int,
           limit: int = MAX_LEASES) -> list[LeaseInfo]:
    """Every lease held right now (at most ``limit``): a ``SCAN`` of the keyspace, so its
    cost grows with the number of keys; meant for an operator's page, not a hot path."""
    found: list[str] = []
    for shard in layout.shard_ids():
        for key in client.scan_iter(match=layout.pattern("lease", shard), count=1000):
            found.append(key.decode() if isinstance(key, bytes) else str(key))
            if len(found) >= limit:
                break
        if len(found) >= limit:
            break
    return list(leases_of(client, layout, [layout.run_of(key) for key in found], ttl_ms).values())


def leases_of(client: redis.Redis, layout: keys.KeyLayout, run_ids: list[str],
              ttl_ms: int) -> dict[str, LeaseInfo]:
    """The leases held now of these runs (one round trip), by run id."""
    if not run_ids:
        return {}
    pipe = client.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.get(layout.lease(run_id))
        pipe.pttl(layout.lease(run_id))
    replies = pipe.execute()
    out = {}
    for i, run_id in enumerate(run_ids):
        info = _lease(run_id, replies[2 * i], replies[2 * i + 1], ttl_ms)
        if info is not None:
            out[run_id] = info
    return out


def _ms(when: Any) -> int:
    return int(when.timestamp() * 1000) if when is not None else 0


def workers(client: redis.Redis, queue: Queue, held: list[LeaseInfo]) -> list[WorkerInfo]:
    """The worker processes RQ knows (its registry drops one that stops heartbeating), with
    the runs each holds. A worker's RQ name is its lease owner token (``host:pid:hex``,
    ``.N`` appended after a reconnect)."""
    by_owner: dict[str, list[str]] = {}
    for info in held:
        by_owner.setdefault(info.owner, []).append(info.run_id)
    out = []
    from rq import Worker as RQWorker

    for w in RQWorker.all(connection=queue.connection, serializer=queue.serializer):
        base = owner_of(str(w.name))
        out.append(WorkerInfo(str(w.name), str(w.get_state()), list(w.queue_names()),
                              _ms(w.last_heartbeat), _ms(w.birth_date),
                              sorted(by_owner.get(base, []))))
    return sorted(out, key=lambda w: w.name)


def queue_depth(client: redis.Redis, layout: keys.KeyLayout, queue: Queue) -> dict[str, int]:
    """Runs on the ready list, commands on the RQ queue, runs in the reconciler's due-set
    (and those due now)."""
    now = now_ms()
    pipe = client.pipeline(transaction=False)
    for shard in layout.shard_ids():
        pipe.zcard(layout.due(shard))
        pipe.zcount(layout.due(shard), "-inf", now)
    replies = pipe.execute()
    ready = ready_depth(queue)  # every route's list, on the queue's own server
    return {"ready": int(ready), "jobs": int(queue.count), "due": sum(replies[0::2]),
            "due_now": sum(replies[1::2])}


def record_sweep(client: redis.Redis, reconciler: str, examined: int,
                 actions: dict[str, str], previous: Sweep | None = None) -> Sweep:
    """Record a reconciler's sweep in ``dx:sweeps`` (called by the reconciler process)."""
    now = now_ms()
    did_at, did = (now, dict(list(actions.items())[:20])) if actions else \
        ((previous.did_at, previous.did) if previous else (0, {}))
    sweep = Sweep(reconciler, now, examined, did_at, did)
    pipe = client.pipeline(transaction=False)
    pipe.hset(keys.SWEEPS, reconciler, json.dumps(
        {"at": now, "examined": examined, "did_at": did_at, "did": did}))
    pipe.expire(keys.SWEEPS, 300)
    pipe.execute()
    return sweep


def sweeps(client: redis.Redis) -> list[Sweep]:
    """Each reconciler's last sweep, the most recent first."""
    out = []
    for name, raw in client.hgetall(keys.SWEEPS).items():
        try:
            data = json.loads(raw)
            out.append(Sweep(name.decode(), int(data["at"]), int(data["examined"]),
                             int(data.get("did_at", 0)),
                             {str(k): str(v) for k, v in dict(data.get("did", {})).items()}))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # written by something else: not shown
    return sorted(out, key=lambda s: -s.at)
