"""Following a run from ``redis.asyncio``: the async twin of ``durable.streams.streaming``'s
:class:`~durable.streams.streaming.Follower`, with the same items in the same order (log events
read with ``XREAD BLOCK``, partial outputs of the steps in flight, then as they are heard),
and ``async_twin``, an asyncio client for the server a sync client talks to. Both are
importable from ``durable.streams.streaming`` too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Protocol

import redis
import redis.asyncio

from durable.errors import RunNotFound
from durable.log import keys
from durable.log.entries import aactor_at
from durable.log.state import TERMINAL
from durable.log.store import Entry
from durable.log.tail import BATCH, END, RETRIED, after_arg, ends, last_actor, xread_entries
from durable.streams.partials import (
    CALL_ENDS,
    AsyncBarrier,
    Barrier,
    Heard,
    Partial,
    akept,
    decode_partial,
    pong_text,
)

__all__ = ["afollow", "async_twin", "pump_partials", "read_log"]


def last_id(newest: Any) -> str | None:
    """The entry id in ``XREVRANGE log + - COUNT 1``'s reply (None: the log is empty)."""
    if not newest:
        return None
    raw = newest[0][0]
    return raw.decode() if isinstance(raw, bytes) else str(raw)


async def afollow(client: redis.asyncio.Redis, layout: keys.KeyLayout, run_id: str, *,
                  after: str = "0",
                  partial: bool = True, block_ms: int = 1000, reconnect_s: float = 30.0,
                  close_client: bool = False) -> AsyncIterator[Entry | Partial]:
    """The async twin of ``durable.streams.streaming.Follower`` (``redis.asyncio``): the same
    items, in the same order, ending after a terminal event. Raises ``RunNotFound`` on
    first iteration when the run does not exist. ``close_client``: close ``client`` at the
    end."""
    items: asyncio.Queue[object] = asyncio.Queue()
    tasks: list[asyncio.Task[None]] = []
    pubsub: Any = None
    caught_up = asyncio.Event()  # as for ``Follower``
    so_far: list[Partial] = []
    barrier: AsyncBarrier | None = None
    try:
        if not await client.exists(layout.run(run_id)):
            raise RunNotFound(run_id)
        if partial:
            pubsub = client.pubsub()
            await pubsub.subscribe(layout.stream(run_id))
            end = time.monotonic() + 5.0
            while time.monotonic() < end:
                msg = await pubsub.get_message(timeout=0.1)
                if msg and msg.get("type") == "subscribe":
                    break
            since = last_id(await client.xrevrange(layout.log(run_id), count=1))
            so_far = await akept(client, layout, run_id)
            barrier = AsyncBarrier(so_far, since)
        io = _Awaited(client, layout, run_id, items, barrier, pubsub)
        if barrier is not None:
            tasks.append(asyncio.create_task(_apump_partials(io, Heard(so_far), barrier)))
        tasks.append(asyncio.create_task(_apump_log(io, after_arg(after), block_ms,
                                                    reconnect_s, so_far, caught_up)))
        while True:
            item = await items.get()
            if isinstance(item, Entry | Partial):
                yield item
                continue
            if isinstance(item, BaseException):
                raise item
            return
    finally:
        await _stop(tasks)
        if pubsub is not None:
            try:
                await pubsub.aclose()
            except redis.RedisError:
                pass
        if close_client:
            await client.aclose()


async def _stop(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel a follower's pumps and wait for them to end. A cancel that lands while
    redis-py awaits the reply of a blocking ``XREAD`` can be lost (the read returns its reply,
    the pump reads on): each pump is cancelled again until it has ended, else a follower
    closed before its run's end would wait for that end."""
    pending = set(tasks)
    while pending:
        for task in pending:
            task.cancel()
        done, pending = await asyncio.wait(pending, timeout=0.05)
        for task in done:
            if not task.cancelled():
                task.exception()  # retrieved: a pump hands its errors over as items


async def _apump_log(io: _Awaited, last: str, block_ms: int, reconnect_s: float,
                     so_far: list[Partial], caught_up: asyncio.Event) -> None:
    try:
        await read_log(io, last, block_ms, reconnect_s, so_far, caught_up)
    finally:
        caught_up.set()


class Flag(Protocol):
    """``threading.Event`` or ``asyncio.Event``: set once the log is read up to now."""

    def is_set(self) -> bool: ...

    def set(self) -> None: ...


class FollowIO(Protocol):
    """What a follower reads a run's log and its subscription with, and hands its items
    to (``read_log``, ``pump_partials``): awaited from ``redis.asyncio`` (``afollow``), or
    made at once on a follower's own threads (``durable.streams.streaming.Follower``, which drives
    the same coroutines there)."""

    run_id: str
    #: The errors of a subscription that a later call recovers from.
    faults: tuple[type[BaseException], ...]

    @property
    def barrier(self) -> Barrier | AsyncBarrier | None:
        """Set when the partial output of a call must be out before the call's end."""
        ...

    def stopped(self) -> bool: ...

    def put(self, item: object) -> None: ...

    def actor_at(self, last: str) -> Awaitable[str]: ...

    def xread(self, last: str, block: int | None) -> Awaitable[Any]: ...

    def state(self) -> Awaitable[Any]: ...

    def log_end(self) -> Awaitable[str | None]: ...

    def pause(self, seconds: float) -> Awaitable[None]: ...

    def partials_out(self) -> Awaitable[None]: ...

    def ping(self, text: str) -> Awaitable[Any]: ...

    def message(self) -> Awaitable[Any]: ...


class _Awaited:
    """``FollowIO`` on ``redis.asyncio``."""

    faults: tuple[type[BaseException], ...] = (redis.RedisError,)

    def __init__(self, client: redis.asyncio.Redis, layout: keys.KeyLayout, run_id: str,
                 out: asyncio.Queue[object], barrier: AsyncBarrier | None,
                 pubsub: Any) -> None:
        self.client, self.layout, self.run_id = client, layout, run_id
        self.out, self.barrier, self.pubsub = out, barrier, pubsub

    def stopped(self) -> bool:
        return False  # the task is cancelled instead

    def put(self, item: object) -> None:
        self.out.put_nowait(item)

    async def actor_at(self, last: str) -> str:
        return await aactor_at(self.client, self.layout, self.run_id, last)

    async def xread(self, last: str, block: int | None) -> Any:
        return await self.client.xread({self.layout.log(self.run_id): last}, count=BATCH,
                                       block=block)

    async def state(self) -> Any:
        return await self.client.hget(self.layout.run(self.run_id), "state")

    async def log_end(self) -> str | None:
        return last_id(await self.client.xrevrange(self.layout.log(self.run_id), count=1))

    async def pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def partials_out(self) -> None:
        assert self.barrier is not None
        await self.barrier.wait()

    async def ping(self, text: str) -> Any:
        return await self.pubsub.ping(text)

    async def message(self) -> Any:
        return await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=0.05)


async def read_log(reader: FollowIO, last: str, block_ms: int, reconnect_s: float,
                   so_far: list[Partial], caught_up: Flag) -> None:
    """Hand the log's entries after ``last`` to ``reader.put``, then the end marker after
    a terminal event (or an error); once it has read up to now, ``so_far``, then set
    ``caught_up``; from then on, the partial output of a call before the call's end."""
    run_id = reader.run_id
    failing_since = 0.0
    actor = ""
    while not reader.stopped():
        try:  # (the actor of the entry followed from: the next may leave it out)
            actor = await reader.actor_at(last) if last != "0-0" else ""
            break
        except RETRIED:
            await reader.pause(0.2)

    def release() -> None:
        if not caught_up.is_set():
            if reader.barrier is not None:
                reader.barrier.order.caught_up(reader.put)  # with what was kept
            else:
                for item in so_far:
                    reader.put(item)
            caught_up.set()

    while not reader.stopped():
        try:
            block = block_ms if caught_up.is_set() else None
            got = xread_entries(await reader.xread(last, block), run_id, actor)
            if not got and block is None:
                release()
                continue
            if not got:
                state = await reader.state()
                if state is not None and state.decode() not in TERMINAL:
                    continue
                # Terminal (or gone): what was appended since the last read, then stop.
                got = xread_entries(await reader.xread(last, None), run_id, actor)
                if not got:
                    reader.put(END)
                    return
            failing_since = 0.0
            actor = last_actor(got, actor)
        except RETRIED as exc:
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > reconnect_s:
                reader.put(exc)
                return
            await reader.pause(0.2)
            continue
        except Exception as exc:
            reader.put(exc)
            return
        for entry in got:
            if reader.barrier is None:
                reader.put(entry)
            else:
                if isinstance(entry.event, CALL_ENDS) and reader.barrier.order.heard(entry):
                    await reader.partials_out()
                reader.barrier.order.entry(entry, reader.put)
            last = entry.id
            if ends(entry):
                reader.put(END)
                return
        if len(got) < BATCH:
            release()


async def _apump_partials(io: _Awaited, heard: Heard, barrier: AsyncBarrier) -> None:
    await pump_partials(io, heard, barrier)  # held in order until the log reader catches up


async def pump_partials(reader: FollowIO, heard: Heard, barrier: Barrier | AsyncBarrier) -> None:
    """Hand the partial output heard on ``reader``'s subscription to ``reader.put`` (that
    of ``heard`` already, once), answering the log reader's ``barrier``; until stopped."""
    pong = ""
    while not reader.stopped():
        try:
            if barrier.wanted.is_set() and not pong:
                barrier.wanted.clear()
                barrier.count += 1
                pong = f"durable-barrier-{barrier.count}"
                await reader.ping(pong)
            msg = await reader.message()
        except reader.faults:
            await reader.pause(0.2)  # the next call reconnects and resubscribes
            continue
        if msg and msg.get("type") == "pong" and pong and pong_text(msg["data"]) == pong:
            pong = ""
            barrier.done.set()
        if msg and msg.get("type") == "message":
            found = decode_partial(msg["data"])
            if found is not None and heard.fresh(found):
                end = None if barrier.order.ready(found) else await _log_end(reader)
                barrier.order.partial(found, end, reader.put)


async def _log_end(reader: FollowIO) -> str | None:
    """The id of the log's last entry (None: it cannot be read now, or is empty)."""
    try:
        return await reader.log_end()
    except reader.faults:
        return None


def async_twin(client: redis.Redis) -> redis.asyncio.Redis:
    """A ``redis.asyncio`` client for the server ``client`` talks to (address, database,
    credentials, TLS files; other options are not carried over: pass your own client
    then)."""
    if isinstance(client, redis.RedisCluster):
        return _async_cluster_twin(client)
    kw = client.connection_pool.connection_kwargs
    common: dict[str, Any] = {k: kw[k] for k in ("db", "username", "password")
                              if kw.get(k) is not None}
    common.update({k: v for k, v in kw.items() if k.startswith("ssl_") and v is not None})
    if kw.get("path"):
        return redis.asyncio.Redis(unix_socket_path=kw["path"], **common)
    ssl = "SSL" in client.connection_pool.connection_class.__name__
    return redis.asyncio.Redis(host=kw.get("host", "localhost"), port=kw.get("port", 6379),
                               ssl=ssl, **common)


def _async_cluster_twin(client: redis.RedisCluster) -> redis.asyncio.Redis:
    """A ``redis.asyncio.RedisCluster`` on the nodes ``client`` knows (same credentials
    and TLS files): a cluster's readers follow runs on it as on one server."""
    kw = client.nodes_manager.connection_kwargs
    common: dict[str, Any] = {k: kw[k] for k in ("username", "password")
                              if kw.get(k) is not None}
    common.update({k: v for k, v in kw.items() if k.startswith("ssl") and v is not None})
    nodes = [redis.asyncio.cluster.ClusterNode(n.host, n.port)
             for n in client.get_nodes()]
    twin: Any = redis.asyncio.RedisCluster(startup_nodes=nodes, **common)
    return twin  # the cluster client answers the calls afollow makes
