"""Following a run from ``redis.asyncio``: the async twin of ``durable.streaming``'s
:class:`~durable.streaming.Follower`, with the same items in the same order (log events
read with ``XREAD BLOCK``, partial outputs of the steps in flight, then as they are heard),
and ``async_twin``, an asyncio client for the server a sync client talks to. Both are
importable from ``durable.streaming`` too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio

from durable.errors import RunNotFound
from durable.log import keys
from durable.log.entries import aactor_at
from durable.log.state import TERMINAL
from durable.log.store import Entry
from durable.log.tail import BATCH, END, RETRIED, after_arg, ends, last_actor, xread_entries
from durable.partials import (
    CALL_ENDS,
    AsyncBarrier,
    Heard,
    Partial,
    akept,
    decode_partial,
    pong_text,
)

__all__ = ["afollow", "async_twin"]


async def afollow(client: redis.asyncio.Redis, layout: keys.KeyLayout, run_id: str, *,
                  after: str = "0",
                  partial: bool = True, block_ms: int = 1000, reconnect_s: float = 30.0,
                  close_client: bool = False) -> AsyncIterator[Entry | Partial]:
    """The async twin of ``durable.streaming.Follower`` (``redis.asyncio``): the same
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
            so_far = await akept(client, layout, run_id)
            barrier = AsyncBarrier()
            tasks.append(asyncio.create_task(_apump_partials(pubsub, items, Heard(so_far),
                                                             caught_up, barrier)))
        tasks.append(asyncio.create_task(_apump_log(client, layout, run_id, after_arg(after),
                                                    block_ms, reconnect_s, items, so_far,
                                                    caught_up, barrier)))
        while True:
            item = await items.get()
            if isinstance(item, Entry | Partial):
                yield item
                continue
            if isinstance(item, BaseException):
                raise item
            return
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if pubsub is not None:
            try:
                await pubsub.aclose()
            except redis.RedisError:
                pass
        if close_client:
            await client.aclose()


async def _apump_log(client: redis.asyncio.Redis, layout: keys.KeyLayout, run_id: str, last: str,
                     block_ms: int, reconnect_s: float, out: asyncio.Queue[object],
                     so_far: list[Partial], caught_up: asyncio.Event,
                     barrier: AsyncBarrier | None) -> None:
    try:
        await _aread_log(client, layout, run_id, last, block_ms, reconnect_s, out, so_far,
                         caught_up,
                         barrier)
    finally:
        caught_up.set()


async def _aread_log(client: redis.asyncio.Redis, layout: keys.KeyLayout, run_id: str, last: str,
                     block_ms: int, reconnect_s: float, out: asyncio.Queue[object],
                     so_far: list[Partial], caught_up: asyncio.Event,
                     barrier: AsyncBarrier | None) -> None:
    key, run_key = layout.log(run_id), layout.run(run_id)
    failing_since = 0.0
    actor = ""
    while True:
        try:  # (the actor of the entry followed from: the next may leave it out)
            actor = await aactor_at(client, layout, run_id, last) if last != "0-0" else ""
            break
        except RETRIED:
            await asyncio.sleep(0.2)

    def release() -> None:
        if not caught_up.is_set():
            for item in so_far:
                out.put_nowait(item)
            caught_up.set()

    while True:
        try:
            block = block_ms if caught_up.is_set() else None
            got = xread_entries(await client.xread({key: last}, count=BATCH, block=block), run_id,
                           actor)
            if not got and block is None:
                release()
                continue
            if not got:
                state = await client.hget(run_key, "state")
                if state is not None and state.decode() not in TERMINAL:
                    continue
                got = xread_entries(await client.xread({key: last}, count=BATCH), run_id, actor)
                if not got:
                    out.put_nowait(END)
                    return
            failing_since = 0.0
            actor = last_actor(got, actor)
        except RETRIED as exc:
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > reconnect_s:
                out.put_nowait(exc)
                return
            await asyncio.sleep(0.2)
            continue
        except Exception as exc:
            out.put_nowait(exc)
            return
        for entry in got:
            if barrier is not None and caught_up.is_set() and \
                    isinstance(entry.event, CALL_ENDS):
                await barrier.wait()
            out.put_nowait(entry)
            last = entry.id
            if ends(entry):
                out.put_nowait(END)
                return
        if len(got) < BATCH:
            release()


async def _apump_partials(pubsub: Any, out: asyncio.Queue[object], heard: Heard,
                          caught_up: asyncio.Event, barrier: AsyncBarrier) -> None:
    await caught_up.wait()  # what is heard meanwhile waits in the connection
    pong = ""
    while True:
        try:
            if barrier.wanted.is_set() and not pong:
                barrier.wanted.clear()
                barrier.count += 1
                pong = f"durable-barrier-{barrier.count}"
                await pubsub.ping(pong)
            msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.05)
        except redis.RedisError:
            await asyncio.sleep(0.2)
            continue
        if msg and msg.get("type") == "pong" and pong and pong_text(msg["data"]) == pong:
            pong = ""
            barrier.done.set()
        if msg and msg.get("type") == "message":
            found = decode_partial(msg["data"])
            if found is not None and heard.fresh(found):
                out.put_nowait(found)


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
