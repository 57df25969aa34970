"""The step protocol's Redis calls, as awaitables: the protocol never blocks its driver.

A run's coroutine (``workers.loop``) ``await``s every Redis call it makes. Where the log's
script calls are batched (``EventLog.batch_appends``: always for a worker's hub; for the
run threads on one server without ``DURABLE_MIN_REPLICAS``), each call here is a plain
command of that batcher (``ScriptBatcher.command_call``): a run thread sends it with the
other threads' calls and a worker's hub sends it in its own pipelines, with the other
runs' calls, while it resumes them. On a Redis Cluster those pipelines are one per master:
each command names one key (one slot), or none. Several commands a library function makes
in a row (making a run ready, a whole quarantine) are made here as a sequence of such
awaits, each on the keys of one run or one global key, so each is one call in a pipeline.

What cannot be one command -- RQ's own enqueue of a ``drain``, a ready list on another
server (``DURABLE_QUEUE_URL``, always so on a cluster), every call where nothing is batched
(the run threads on a cluster or with ``DURABLE_MIN_REPLICAS``: a thread per run) -- is the
library's own function, run on a thread of its own (an ``Offload`` named ``BLOCKING``: a
hub never runs one on its driving thread). Folding a log is an ``Offload`` named ``FOLD``:
a hub runs it inline, and the rare fold that reads more (a large value beside the run, a
layout refolded from the start) hands the driving over as slow user code does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis
from rq import Queue

from durable.errors import ConflictError, RunNotFound, Terminal
from durable.leases import Lease, Leases
from durable.log import chain, counters, keys
from durable.log import events as ev
from durable.log.batching import ScriptBatcher
from durable.log.store import EventLog, RunHandle, Spec, quarantine_handle
from durable.queue import QUEUED_TTL_MS, ensure_drain, make_ready
from durable.telemetry.liveness import served_agents, served_agents_async

from .turns import BLOCKING, FOLD, Offload

T = TypeVar("T")

def _s(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


class RedisIO:
    """The Redis calls of one worker's step protocol (see the module doc)."""

    def __init__(self, client: redis.Redis, batcher: ScriptBatcher | None, leases: Leases,
                 queue: Queue) -> None:
        self.redis = client
        self.batcher = batcher
        self.leases = leases
        self.queue = queue
        #: The ready lists live on the log's server: making a run ready is batched too.
        self._queue_here = batcher is not None and queue.connection is client

    def elsewhere(self, fn: Callable[[], T]) -> Awaitable[T]:
        """``fn`` (library code making its own Redis calls) on a thread of its own."""
        return Offload(BLOCKING, fn)

    def command(self, *command: Any) -> Awaitable[Any]:
        """One plain command; its reply is the raw one when batched (no response
        callback)."""
        if self.batcher is not None:
            return self.batcher.command_call(*command)
        return self.elsewhere(lambda: self.redis.execute_command(*command))

    # Counters and indexes ---------------------------------------------------------------

    async def stat(self, name: str, amount: int = 1) -> None:
        """Add to a worker statistic (``Client.stats``)."""
        await self.command("HINCRBY", keys.STATS, name, amount)

    async def count(self, metric: str, *labels: str) -> None:
        """``counters.incr``: a counter the log does not record."""
        await self.command("HINCRBY", keys.METRICS, counters.field(metric, *labels), 1)

    async def look_again_at(self, run_id: str, when_ms: int) -> None:
        """Put ``run_id`` in the due set at ``when_ms`` (the reconciler looks at it then)."""
        await self.command("ZADD", self.leases.keys.due_of(run_id), when_ms, run_id)

    async def hset(self, key: str, field: str, value: Any) -> None:
        await self.command("HSET", key, field, value)

    async def publish(self, channel: str, message: str) -> None:
        await self.command("PUBLISH", channel, message)

    # Leases and the ready lists ---------------------------------------------------------

    async def release(self, lease: Lease) -> bool:
        """``Leases.release``: let go of ``lease`` (a no-op when it is no longer held)."""
        if self.batcher is None:
            return await self.elsewhere(lambda: self.leases.release(lease))
        reply = await self.batcher.script_call(
            "lease_release", [self.leases.keys.lease(lease.run_id),
                              self.leases.keys.run(lease.run_id)], [lease.value])
        return bool(reply)

    async def enqueue(self, run_id: str, *, force: bool = False,
                      route: str | None = None) -> bool:
        """``make_ready``: make ``run_id`` ready, the same commands one at a time."""
        queue = self.queue
        if not self._queue_here:
            return await self.elsewhere(lambda: make_ready(
                self.redis, self.leases.keys, queue, run_id, force=force, route=route))
        marker = self.leases.keys.queued(run_id)
        if await self.command("SET", marker, b"1", "NX", "PX", QUEUED_TTL_MS) is None:
            if not force:
                return False
            await self.command("SET", marker, b"1", "PX", QUEUED_TTL_MS)
        if route is None:
            agent = await self.command("HGET", self.leases.keys.run(run_id), "agent")
            route = _s(agent) if agent else ""
        await self.command("RPUSH", keys.ready(queue.name, route), run_id)
        if route:
            await self.command("SADD", keys.routes(queue.name), route)
        if not await self.command("EXISTS", keys.drain_pending(queue.name)):
            # No drain command pending: RQ enqueues one (its own bookkeeping, several
            # commands), on a thread of its own. ``ensure_drain`` checks again, atomically.
            await self.elsewhere(lambda: ensure_drain(queue))
        return True

    async def served_agents(self) -> dict[str, list[str]]:
        """``durable.telemetry.liveness.served_agents_async``: the live workers and the agents each
        has (on a thread of its own where nothing is batched)."""
        if self.batcher is None:
            return await self.elsewhere(lambda: served_agents(self.redis))
        return await served_agents_async(self)

    # Reading and marking a run ----------------------------------------------------------

    async def load(self, elog: EventLog, run_id: str, *, lease: str = "",
                   actor: str = "") -> RunHandle:
        """``EventLog.load``: the projection's version and checkpoint, then the log from
        it (two reads, as ``load`` makes them), folded."""
        if self.batcher is None:
            return await self.elsewhere(lambda: elog.load(run_id, lease=lease, actor=actor))
        version, ckpt = await self.command("HMGET", self.leases.keys.run(run_id), "version", "ckpt")
        if version is None:
            raise RunNotFound(run_id)
        raw = await self.command("XRANGE", self.leases.keys.log(run_id),
                                 _s(ckpt) if ckpt else "-", "+")
        return await self.fold(elog, run_id, int(version), raw, lease=lease, actor=actor,
                               at_least=True)

    def fold(self, elog: EventLog, run_id: str, version: int, raw: Any, *, lease: str,
             actor: str, at_least: bool = False,
             tail: chain.Tail | None = None) -> Awaitable[RunHandle]:
        """``EventLog.handle_from``: fold entries read already (see the module doc), their
        chain checked against ``tail``."""
        return Offload(FOLD, lambda: elog.handle_from(run_id, version, raw, lease=lease,
                                                      actor=actor, at_least=at_least,
                                                      tail=tail))

    async def quarantine_unread(self, elog: EventLog, run_id: str, reason: str,
                                actor: str, counts: Sequence[tuple[str, int]] = ()) -> bool:
        """``EventLog.quarantine``: mark a run quarantined without folding it (its log may
        be unreadable), adding ``counts`` with its event. False when it was quarantined
        already, or someone wrote first."""
        if self.batcher is None:
            return await self.elsewhere(lambda: elog.quarantine(run_id, reason, actor, counts))
        raw = await self.command("HGETALL", self.leases.keys.run(run_id))
        proj = {_s(k): _s(v) for k, v in zip(raw[::2], raw[1::2], strict=True)} \
            if isinstance(raw, list) else {_s(k): _s(v) for k, v in (raw or {}).items()}
        handle = quarantine_handle(run_id, proj, actor)
        if handle is None:
            return False
        handle.staged_counts.extend(counts)
        try:
            await elog.commit_async(handle, [Spec(ev.Quarantined, {"reason": reason})],
                                    extra={"reason": reason[:500]}, quarantine=True)
        except (ConflictError, Terminal):
            return False
        await self.hset(keys.QUARANTINE, run_id, reason[:500])
        return True
