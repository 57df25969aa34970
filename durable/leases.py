"""Per-run leases with fencing: who may write a run's log right now.

A lease is ``dx:{R}:lease = "<owner token>|<epoch>"`` with a PX time to live. The epoch
comes from ``dx:{R}:fence`` and grows on every acquisition, and ``append.lua`` compares the
whole value on every worker append: a worker that lost its lease (paused, partitioned,
expired) cannot write, even if nobody else took the lease yet. Lease state is never
business state: it is not in the log's fold.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from durable.backend.outages import Backoff
from durable.errors import RegionFenced
from durable.log import chain, counters, keys
from durable.log.batching import ScriptBatcher, drive
from durable.log.scripts import Scripts, source
from durable.log.sealer import Seal
from durable.settings import Settings


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass
class Lease:
    run_id: str
    value: str  # "<token>|<epoch>"
    #: What was read with it to check the chain of the entries read (``chain.check_loaded``).
    tail: chain.Tail | None = field(default=None, compare=False, repr=False)

    @property
    def epoch(self) -> int:
        return int(self.value.rsplit("|", 1)[1])

    @property
    def owner(self) -> str:
        return self.value.rsplit("|", 1)[0]


class Leases:
    def __init__(self, client: redis.Redis, ttl_ms: int,
                 layout: keys.KeyLayout = keys.UNSHARDED, *, region: str = "") -> None:
        self.scripts = Scripts(client)
        self.redis = client
        #: The keys of the log the leases guard (``EventLog.keys``).
        self.keys = layout
        self.ttl_ms = ttl_ms
        #: This process's region (``DURABLE_REGION``): acquisitions are refused while
        #: another region owns the run's shard (``RegionFenced``). "": regions are off.
        self.region = region
        #: Sends ``acquire`` together with other threads' script calls (a worker's).
        self.batcher: ScriptBatcher | None = None

    @classmethod
    def of(cls, client: redis.Redis, settings: Settings, layout: keys.KeyLayout) -> Leases:
        """The leases of a process with ``settings`` (its TTL and its region)."""
        return cls(client, settings.leases.ttl_ms, layout, region=settings.cluster.region)

    def acquire(self, run_id: str, token: str, *,
                take_queued: bool = False) -> tuple[Lease | None, int, Any]:
        """See ``acquire_async``; on this thread."""
        return drive(self.acquire_async(run_id, token, take_queued=take_queued))

    async def acquire_async(self, run_id: str, token: str, *,
                            take_queued: bool = False) -> tuple[Lease | None, int, Any]:
        """Take the lease (a new epoch) and read the log from the last checkpoint, in one
        round trip: (lease, projection version, raw entries), or (None, 0, None) while
        another owner holds it. Version 0: the run does not exist.

        ``take_queued`` also drops the run's "queued" marker: a worker starting a command
        makes a new enqueue no longer a duplicate. Raises ``RegionFenced`` (nothing
        written) while another region owns the run.
        """
        run_keys = [self.keys.lease(run_id), self.keys.fence(run_id), self.keys.queued(run_id),
                    self.keys.log(run_id), self.keys.run(run_id), self.keys.seal(run_id)]
        args: list[Any] = [token, self.ttl_ms, "1" if take_queued else "0"]
        if self.region:  # (regions off: the call is the same as before regions existed)
            run_keys.append(self.keys.region_of(run_id))
            args.append(self.region)
        if self.batcher is not None:
            reply = await self.batcher.script_call("lease_acquire", run_keys, args)
        else:
            reply = self.scripts.lease_acquire(keys=run_keys, args=args)
        if _s(reply[0]) == "region":
            raise RegionFenced(run_id, self.region, _s(reply[1]), int(reply[2]), _s(reply[3]))
        if _s(reply[0]) != "ok":
            return None, 0, None
        if int(reply[4]):
            # The lease before this one ran out. Counted here, not in the script, which
            # touches one run's keys only; with the acquisition's batcher when there is one
            # (a worker's hub must not wait on it in place).
            if self.batcher is not None:
                await self.batcher.command_call(
                    "HINCRBY", self.keys.metrics(), counters.field(counters.LEASE_EXPIRIES), 1)
            else:
                counters.incr(self.redis, counters.LEASE_EXPIRIES)
        lease = Lease(run_id, _s(reply[1]))
        if len(reply) > 8:
            seal = Seal.parse(reply[8]) if reply[8] else None
            lease.tail = chain.Tail(reply[5], _s(reply[6]), _s(reply[7]),
                                    seal.anchor if seal else None)
        return lease, int(reply[2]), reply[3]

    def renew_all(self, leases: list[Lease]) -> list[bool]:
        """Renew many leases in one round trip; one flag per lease, in order."""
        if hasattr(self.redis, "get_node_from_key"):
            return self._renew_on_cluster(leases)
        for attempt in range(2):
            pipe = self.redis.pipeline(transaction=False)
            for lease in leases:
                self.scripts.lease_renew(keys=[self.keys.lease(lease.run_id)],
                                         args=[lease.value, self.ttl_ms], client=pipe)
            try:
                return [bool(ok) for ok in pipe.execute()]
            except redis.exceptions.NoScriptError:
                # A cluster pipeline does not load scripts first (a plain one does): a
                # master that never saw it (new, or promoted) gets it on all masters now.
                if attempt:
                    raise
                self.redis.script_load(source("lease_renew"))
        raise AssertionError("unreachable")

    def _renew_on_cluster(self, leases: list[Lease]) -> list[bool]:
        """A cluster pipeline refuses scripts: one plain pipeline per master instead, each
        with the leases of the slots it serves (a moved slot raises: the next beat asks
        again, the TTL has slack for two). A master that fails does not keep the others'
        leases from being renewed: its error is raised after every master was asked."""
        cluster: Any = self.redis
        by_node: dict[str, list[int]] = {}
        nodes: dict[str, Any] = {}
        for i, lease in enumerate(leases):
            node = cluster.get_node_from_key(self.keys.lease(lease.run_id))
            by_node.setdefault(node.name, []).append(i)
            nodes[node.name] = node
        out = [False] * len(leases)
        sha = self.scripts.lease_renew.sha
        failed: redis.RedisError | None = None
        for name, positions in by_node.items():
            conn = cluster.get_redis_connection(nodes[name])
            try:
                replies = self._renew_on(conn, sha, [leases[i] for i in positions])
            except redis.RedisError as exc:
                failed = failed or exc
                continue
            for i, ok in zip(positions, replies, strict=True):
                out[i] = bool(ok)
        if failed is not None:
            raise failed
        return out

    def _renew_on(self, conn: Any, sha: str, leases: list[Lease]) -> list[Any]:
        """``lease_renew.lua`` for ``leases`` in one pipeline on one master's client."""
        for attempt in range(2):
            with conn.pipeline(transaction=False) as pipe:
                for lease in leases:
                    pipe.evalsha(sha, 1, self.keys.lease(lease.run_id), lease.value, self.ttl_ms)
                try:
                    replies: list[Any] = pipe.execute()
                    return replies
                except redis.exceptions.NoScriptError:
                    if attempt:
                        raise
                    conn.script_load(source("lease_renew"))
        raise AssertionError("unreachable")

    def release(self, lease: Lease) -> bool:
        return bool(self.scripts.lease_release(
            keys=[self.keys.lease(lease.run_id), self.keys.run(lease.run_id)], args=[lease.value]))

    def holder(self, run_id: str) -> str | None:
        value = self.redis.get(self.keys.lease(run_id))
        return _s(value) if value is not None else None


class Heartbeats:
    """One thread per worker process renewing every lease it holds, every third of the TTL,
    all in one round trip (a pipeline of ``lease_renew.lua`` calls). A lease its holder
    renewed by writing (``append.lua`` sets the TTL again) within the last third of a beat
    (``written``) is left out of that beat: a run that steps faster than the beat costs no
    renewal at all, where a worker holding 5,000 runs renewed 5,000 leases every beat.

    ``on_lost`` is called once for a lease that could not be renewed (expired, or taken by
    a newer epoch, or released because the worker's liveness key expired: ``durable.
    liveness``): the worker must stop writing for that run. A renewal that fails because
    Redis did not answer is tried again with backoff (at most a beat later): the TTL has
    slack for two.
    """

    def __init__(self, leases: Leases) -> None:
        self.leases = leases
        #: By (run, lease value): a value alone ("<worker>|<epoch>") repeats across runs.
        self._held: dict[tuple[str, str], tuple[Lease, Callable[[], object]]] = {}
        #: By (run, lease value): when a write by the holder last renewed it (monotonic s,
        #: taken before the write was sent: the renewal came later).
        self._written: dict[tuple[str, str], float] = {}
        #: Seconds between two beats.
        self.interval = leases.ttl_ms / 3000
        self._lock = threading.Lock()
        #: The last renewal failed (Redis did not answer): the next is tried with backoff,
        #: not a third of the TTL later, so leases Redis kept through a restart are renewed
        #: (or found lost) as soon as it answers.
        self.failing = False
        self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)
        self._thread.start()

    def hold(self, lease: Lease, on_lost: Callable[[], object]) -> None:
        with self._lock:
            self._held[(lease.run_id, lease.value)] = (lease, on_lost)

    def drop(self, lease: Lease) -> None:
        with self._lock:
            self._held.pop((lease.run_id, lease.value), None)
            self._written.pop((lease.run_id, lease.value), None)

    def written(self, run_id: str, value: str, at: float) -> None:
        """A write by the holder of lease ``value`` of ``run_id``, sent at ``at``
        (``time.monotonic()``), renewed it. A lease is left out of a beat only while such a
        renewal is under a third of a beat old: its TTL then outlasts the next two beats, as
        a beat's own renewal does less a third (slack for a failed beat, and a second one
        a third of a beat late)."""
        key = (run_id, value)
        with self._lock:  # (under the lock: a lease dropped meanwhile is not kept for ever)
            if key in self._held:
                self._written[key] = at

    def beat(self) -> int:
        """Renew every held lease not renewed by a write just before; returns how many were
        lost."""
        fresh_since = time.monotonic() - self.interval / 3
        with self._lock:
            written = self._written
            held = [entry for key, entry in self._held.items()
                    if written.get(key, 0.0) < fresh_since]
        if not held:
            return 0
        try:
            renewed = self.leases.renew_all([lease for lease, _ in held])
        except Exception:  # a blip: try again soon (``_run``), the TTL has slack
            self.failing = True
            return 0
        self.failing = False
        lost = 0
        for (lease, on_lost), ok in zip(held, renewed, strict=True):
            if not ok:
                self.drop(lease)
                on_lost()
                lost += 1
        return lost

    def _run(self) -> None:
        interval = self.interval
        backoff = Backoff(max_s=interval)
        stop = threading.Event()
        while not stop.wait(backoff.next() if self.failing else interval):
            self.beat()
            if not self.failing:
                backoff.reset()
