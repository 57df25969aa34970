"""Worker liveness: a dead worker's runs resume within a second, not after each lease's TTL.

Every worker process keeps a short-lived key, ``dx:{workers}:alive:<worker id>`` (PX
``DURABLE_LIVENESS_TTL_MS``, 600 ms by default), set again every third of its TTL by a
thread of its own (``Presence``), and its id in ``dx:{workers}:all``. The reconciler looks
every sixth of the TTL (``dead_workers``): a registered worker whose key is gone died
(SIGKILL, OOM, a lost host) or stalled longer than the TTL. For each, ``release_worker``
finds the runs whose lease that worker holds -- every run with work left is in its shard's
due set, and a lease's value names its owner (``<worker id>|<epoch>``) -- and releases each
lease with ``lease_release.lua`` on that run's keys alone (one slot: the log stays on a
Cluster), then makes those runs ready again. Another worker takes them with a new fencing
epoch.

A worker that was only slow is treated as dead, and that is safe: every append compares the
whole lease value, so its late writes are refused (``LeaseLost``); its heartbeat finds the
leases gone and it drops the runs; its next beat announces it again. Releasing a lease
keeps nothing from the log: the worker that takes the run re-folds it, and an effect that
was in flight is found ``dispatched`` and resolved through its key and ``lookup``.

Both keys share one hash tag, so on a cluster they live on one master: a reconciler that
cannot read one cannot read the other, and an unreadable key is never taken for an expired
one. After the reconciler's own Redis calls failed, it waits ``AFTER_OUTAGE_S`` (3 s, at
least one TTL) before it believes a key gone: the workers' beats failed during the same
outage.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable

import redis

from durable.backend.outages import Backoff, Outage
from durable.contention import InPlace, RedisCalls
from durable.log import keys
from durable.log.batching import drive

log = logging.getLogger("durable.liveness")

#: Runs whose leases are read in one round trip while a dead worker's runs are looked for.
CHUNK = 1000

#: After its own calls failed, a reconciler believes a liveness key gone only this long
#: (seconds; at least one TTL) after the last failure: the workers' beats failed during the
#: same outage, and after a failover their clients find the new master a little later.
AFTER_OUTAGE_S = 3.0


class Presence(threading.Thread):
    """The worker side: sets the liveness key every third of its TTL until ``leave``."""

    def __init__(self, client: redis.Redis, worker_id: str, ttl_ms: int,
                 outage: Outage | None = None, serves: Iterable[str] = ()) -> None:
        super().__init__(name="liveness", daemon=True)
        self.client, self.worker_id, self.ttl_ms = client, worker_id, ttl_ms
        #: The key's value: the agents the worker has (routing: who may take whose runs).
        self.value = json.dumps(sorted(serves)).encode()
        self.outage = outage or Outage(log)
        self.stop = threading.Event()
        #: Beats that reached Redis.
        self.beats = 0

    def beat(self) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.set(keys.alive(self.worker_id), self.value, px=self.ttl_ms)
        pipe.sadd(keys.WORKERS, self.worker_id)
        pipe.execute()
        self.beats += 1

    def run(self) -> None:
        interval = self.ttl_ms / 3000
        backoff = Backoff(max_s=interval)
        while not self.stop.is_set():
            try:
                self.beat()
            except redis.RedisError as exc:
                self.outage.failed(exc)
                if backoff.wait(self.stop):
                    return
                continue
            backoff.reset()
            self.outage.ok()
            self.stop.wait(interval)

    def leave(self) -> None:
        """A clean exit: the reconciler has nothing to release (the runs were handed back)."""
        self.stop.set()
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.delete(keys.alive(self.worker_id))
            pipe.srem(keys.WORKERS, self.worker_id)
            pipe.execute()
        except redis.RedisError as exc:  # its key expires; the reconciler forgets it then
            log.warning("could not deregister worker %s: %r", self.worker_id, exc)


def dead_workers(client: redis.Redis) -> list[str]:
    """Registered workers whose liveness key is gone."""
    members = sorted(_s(m) for m in client.smembers(keys.WORKERS))
    if not members:
        return []
    pipe = client.pipeline(transaction=False)
    for wid in members:
        pipe.exists(keys.alive(wid))
    return [wid for wid, alive in zip(members, pipe.execute(), strict=True) if not alive]


def held_by(client: redis.Redis, layout: keys.KeyLayout, worker_id: str) -> list[tuple[str, str]]:
    """(run, lease value) of every run with work left whose lease ``worker_id`` holds."""
    prefix = f"{worker_id}|"
    found: list[tuple[str, str]] = []
    for shard in layout.shard_ids():
        runs = [_s(r) for r in client.zrange(layout.due(shard), 0, -1)]
        for start in range(0, len(runs), CHUNK):
            chunk = runs[start:start + CHUNK]
            pipe = client.pipeline(transaction=False)
            for run_id in chunk:
                pipe.get(layout.lease(run_id))
            for run_id, value in zip(chunk, pipe.execute(), strict=True):
                if value is not None and _s(value).startswith(prefix):
                    found.append((run_id, _s(value)))
    return found


def release_worker(client: redis.Redis, layout: keys.KeyLayout, release: Callable[[str, str], bool],
                   worker_id: str) -> list[str]:
    """Release every lease ``worker_id`` holds (``release(run, value)``, one script call on
    that run's keys) and forget the worker; returns the runs released (the caller makes
    them ready again). A lease renewed or taken meanwhile has another value and is kept."""
    released = [run_id for run_id, value in held_by(client, layout, worker_id)
                if release(run_id, value)]
    pipe = client.pipeline(transaction=False)
    pipe.srem(keys.WORKERS, worker_id)
    pipe.hincrby(keys.STATS, "dead_workers", 1)
    if released:
        pipe.hincrby(keys.STATS, "dead_worker_leases_released", len(released))
    pipe.execute()
    return released


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


async def served_agents_async(io: RedisCalls) -> dict[str, list[str]]:
    """The live workers and the agents each has (what their liveness keys say)."""
    ids = sorted(_s(w) for w in await io.command("SMEMBERS", keys.WORKERS) or ())
    if not ids:
        return {}
    found: dict[str, list[str]] = {}
    # One MGET: the keys share the ``{workers}`` hash tag (one slot on a cluster).
    alive = await io.command("MGET", *[keys.alive(w) for w in ids])
    for worker_id, raw in zip(ids, alive, strict=True):
        if raw is None:
            continue
        try:
            agents = json.loads(raw)
        except ValueError:
            agents = []
        found[worker_id] = [str(a) for a in agents] if isinstance(agents, list) else []
    return found


def served_agents(client: redis.Redis) -> dict[str, list[str]]:
    """``served_agents_async`` on this thread."""
    return drive(served_agents_async(InPlace(client)))
