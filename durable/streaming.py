"""Following a run: every log event in order, with the partial output its steps emit.

Two sources, two guarantees:

- **Log events** are read from the run's stream with ``XREAD BLOCK`` from the last entry id
  seen, so a follower that joins late, or reconnects, gets every event in order, each once.
  Following ends after a terminal event (completed, failed, canceled, expired).
- **Partial outputs** (``ToolContext.emit`` in a tool) are published by the worker on the
  run's pub/sub channel ``dx:{R}:stream`` as JSON ``{"run", "step", "attempt", "seq",
  "data"}`` and never logged, and kept (bounded) while their step runs
  (``durable.partials``): a follower that joins mid-step first gets what the step in
  flight said so far, then the rest as it comes, each message once. Best-effort: the
  partial output of steps that ended is not kept (their results are in the log).

A follower yields :class:`durable.log.store.Entry` items (``id``, the decoded ``event``, or
``error`` when the entry cannot be decoded) and :class:`Partial` items, in the order they
arrive. Pass the last ``Entry.id`` seen as ``after`` to resume.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio

from durable.errors import RunNotFound
from durable.log import events as ev
from durable.log import keys
from durable.log.entries import aactor_at, actor_at
from durable.log.state import TERMINAL
from durable.log.store import Entry, EventLog
from durable.partials import (
    CALL_ENDS,
    AsyncBarrier,
    Barrier,
    Heard,
    Partial,
    Publisher,
    akept,
    decode_partial,
    encode_partial,
    kept,
    pong_text,
)

__all__ = ["Follower", "Partial", "Publisher", "afollow", "async_twin", "decode_partial",
           "encode_partial"]

#: Entries read per XREAD.
BATCH = 256


# Reading the log -------------------------------------------------------------------------


def _entries(reply: Any, run_id: str, actor: str = "") -> list[Entry]:
    """An XREAD reply for ``run_id``'s log as entries (RESP2: ``[[key, rows]]``; RESP3:
    ``{key: [rows]}``). ``actor``: that of the entry before the first (an entry whose actor
    is the previous one's leaves it out)."""
    if not reply:
        return []
    out = []
    if isinstance(reply, dict):
        groups = [(key, rows) for key, value in reply.items() for rows in value]
    else:
        groups = [(key, rows) for key, rows in reply]
    for _key, rows in groups:
        for entry_id, fields in rows:
            entry = EventLog._entry(entry_id, fields, run_id, actor)
            actor = entry.event.actor if entry.event is not None else actor
            out.append(entry)
    return out


def _last_actor(got: list[Entry], actor: str) -> str:
    return next((e.event.actor for e in reversed(got) if e.event is not None), actor)


def _ends(entry: Entry) -> bool:
    return isinstance(entry.event, ev.TERMINAL_EVENTS)


def _after_arg(after: str) -> str:
    return "0-0" if after in ("", "0", "-") else after


class _Stop:
    """Marks the end of a follow (a terminal event was read, or the run is gone)."""


_END = _Stop()


class Follower:
    """A sync iterator over a run's log events and partial outputs (see the module doc).

    Subscribes to partial output at once, then reads the log on a thread of its own;
    ``close()`` (or leaving a ``with`` block) stops both. A Redis connection fault is
    retried from the last entry read for ``reconnect_s`` seconds, then raised from
    ``next()``.
    """

    def __init__(self, client: redis.Redis, layout: keys.KeyLayout, run_id: str, *,
                 after: str = "0", partial: bool = True, block_ms: int = 1000,
                 reconnect_s: float = 30.0) -> None:
        self._stop = threading.Event()
        self._done = False
        if not client.exists(layout.run(run_id)):
            raise RunNotFound(run_id)
        self.run_id = run_id
        #: The id of the last log entry returned: pass it as ``after`` to resume.
        self.last = _after_arg(after)
        self._items: queue.SimpleQueue[object] = queue.SimpleQueue()
        # Set once the log is read up to now: then the partial output kept of the steps
        # in flight follows, then what is heard (in that order, after the events before).
        caught_up = threading.Event()
        if partial:
            pubsub = client.pubsub()
            pubsub.subscribe(layout.stream(run_id))
            _await_confirmation(pubsub)  # partials published from now on are seen
            so_far = kept(client, layout, run_id)  # ...and those of the steps in flight, before
            barrier: Barrier | None = Barrier()
            threading.Thread(target=_pump_partials, daemon=True,
                             args=(pubsub, self._items, self._stop, Heard(so_far), caught_up,
                                   barrier), name=f"follow-partials-{run_id}").start()
        else:
            so_far, barrier = [], None
        threading.Thread(target=_pump_log, daemon=True, name=f"follow-log-{run_id}",
                         args=(client, layout, run_id, self.last, block_ms, reconnect_s,
                               self._items, self._stop, so_far, caught_up, barrier)).start()

    def __iter__(self) -> Follower:
        return self

    def __next__(self) -> Entry | Partial:
        if self._done:
            raise StopIteration
        item = self._items.get()
        if isinstance(item, Entry):
            self.last = item.id
            return item
        if isinstance(item, Partial):
            return item
        self.close()
        if isinstance(item, BaseException):
            raise item
        raise StopIteration

    def close(self) -> None:
        self._done = True
        self._stop.set()

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self._stop.set()


_RETRIED = (redis.ConnectionError, redis.TimeoutError)

def _pump_log(client: redis.Redis, layout: keys.KeyLayout, run_id: str, last: str, block_ms: int,
              reconnect_s: float, out: queue.SimpleQueue[object], stop: threading.Event,
              so_far: list[Partial], caught_up: threading.Event, barrier: Barrier | None) -> None:
    """Puts the log's entries after ``last`` on ``out``, then the end marker after a
    terminal event (or an error); once it has read up to now, ``so_far``, then sets
    ``caught_up``; from then on, the partial output of a call before the call's end."""
    try:
        _read_log(client, layout, run_id, last, block_ms, reconnect_s, out, stop, so_far, caught_up,
                  barrier)
    finally:
        caught_up.set()


def _read_log(client: redis.Redis, layout: keys.KeyLayout, run_id: str, last: str, block_ms: int,
              reconnect_s: float, out: queue.SimpleQueue[object], stop: threading.Event,
              so_far: list[Partial], caught_up: threading.Event, barrier: Barrier | None) -> None:
    key, run_key = layout.log(run_id), layout.run(run_id)
    failing_since = 0.0
    actor = ""
    while not stop.is_set():
        try:  # (the actor of the entry followed from: the next may leave it out)
            actor = actor_at(client, layout, run_id, last) if last != "0-0" else ""
            break
        except _RETRIED:
            stop.wait(0.2)

    def release() -> None:
        if not caught_up.is_set():
            for item in so_far:
                out.put(item)
            caught_up.set()

    while not stop.is_set():
        try:
            block = block_ms if caught_up.is_set() else None
            got = _entries(client.xread({key: last}, count=BATCH, block=block), run_id, actor)
            if not got and block is None:
                release()
                continue
            if not got:
                state = client.hget(run_key, "state")
                if state is not None and state.decode() not in TERMINAL:
                    continue
                # Terminal (or gone): what was appended since the last read, then stop.
                got = _entries(client.xread({key: last}, count=BATCH), run_id, actor)
                if not got:
                    out.put(_END)
                    return
            failing_since = 0.0
            actor = _last_actor(got, actor)
        except _RETRIED as exc:
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > reconnect_s:
                out.put(exc)
                return
            stop.wait(0.2)
            continue
        except Exception as exc:
            out.put(exc)
            return
        for entry in got:
            if barrier is not None and caught_up.is_set() and \
                    isinstance(entry.event, CALL_ENDS):
                barrier.wait()
            out.put(entry)
            last = entry.id
            if _ends(entry):
                out.put(_END)
                return
        if len(got) < BATCH:
            release()


def _pump_partials(pubsub: Any, out: queue.SimpleQueue[object], stop: threading.Event,
                   heard: Heard, caught_up: threading.Event, barrier: Barrier) -> None:
    try:
        while not caught_up.wait(0.2):  # what is heard meanwhile waits in the connection
            if stop.is_set():
                return
        pong = ""
        while not stop.is_set():
            try:
                if barrier.wanted.is_set() and not pong:
                    barrier.wanted.clear()
                    barrier.count += 1
                    pong = f"durable-barrier-{barrier.count}"
                    pubsub.ping(pong)
                msg = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.05)
            except redis.RedisError:
                stop.wait(0.2)  # the next call reconnects and resubscribes
                continue
            except (TypeError, AttributeError, ValueError):
                # redis-py reading a connection another thread closed (its client closed,
                # the follower dropped): no message will come; a live follower reconnects.
                if stop.is_set():
                    break
                stop.wait(0.2)
                continue
            if msg and msg.get("type") == "pong" and pong and pong_text(msg["data"]) == pong:
                pong = ""
                barrier.done.set()
            if msg and msg.get("type") == "message":
                found = decode_partial(msg["data"])
                if found is not None and heard.fresh(found):
                    out.put(found)
    finally:
        barrier.done.set()
        try:
            pubsub.close()
        except redis.RedisError:
            pass


def _await_confirmation(pubsub: Any, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        msg = pubsub.get_message(timeout=0.1)
        if msg and msg.get("type") == "subscribe":
            return


async def afollow(client: redis.asyncio.Redis, layout: keys.KeyLayout, run_id: str, *,
                  after: str = "0",
                  partial: bool = True, block_ms: int = 1000, reconnect_s: float = 30.0,
                  close_client: bool = False) -> AsyncIterator[Entry | Partial]:
    """The async twin of :class:`Follower` (``redis.asyncio``): the same items, in the
    same order, ending after a terminal event. Raises ``RunNotFound`` on first iteration
    when the run does not exist. ``close_client``: close ``client`` at the end."""
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
        tasks.append(asyncio.create_task(_apump_log(client, layout, run_id, _after_arg(after),
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
        except _RETRIED:
            await asyncio.sleep(0.2)

    def release() -> None:
        if not caught_up.is_set():
            for item in so_far:
                out.put_nowait(item)
            caught_up.set()

    while True:
        try:
            block = block_ms if caught_up.is_set() else None
            got = _entries(await client.xread({key: last}, count=BATCH, block=block), run_id,
                           actor)
            if not got and block is None:
                release()
                continue
            if not got:
                state = await client.hget(run_key, "state")
                if state is not None and state.decode() not in TERMINAL:
                    continue
                got = _entries(await client.xread({key: last}, count=BATCH), run_id, actor)
                if not got:
                    out.put_nowait(_END)
                    return
            failing_since = 0.0
            actor = _last_actor(got, actor)
        except _RETRIED as exc:
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
            if _ends(entry):
                out.put_nowait(_END)
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
