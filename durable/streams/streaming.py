"""Following a run: every log event in order, with the partial output its steps emit.

Two sources, two guarantees:

- **Log events** are read from the run's stream with ``XREAD BLOCK`` from the last entry id
  seen, so a follower that joins late, or reconnects, gets every event in order, each once.
  Following ends after a terminal event (completed, failed, canceled, expired).
- **Partial outputs** (``ToolContext.emit`` in a tool) are published by the worker on the
  run's pub/sub channel ``dx:{R}:stream`` as JSON ``{"run", "step", "attempt", "seq",
  "data"}`` and never logged, and kept (bounded) while their step runs
  (``durable.streams.partials``): a follower that joins mid-step first gets what the step in
  flight said so far, then the rest as it comes, each message once. Best-effort: the
  partial output of steps that ended is not kept (their results are in the log).

A follower yields :class:`durable.log.store.Entry` items (``id``, the decoded ``event``, or
``error`` when the entry cannot be decoded) and :class:`Partial` items, in the order they
arrive. Pass the last ``Entry.id`` seen as ``after`` to resume. ``afollow`` is its async
twin (``durable.streams.async_streaming``); the log is read by both as ``durable.log.tail`` says.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import redis

from durable.errors import RunNotFound
from durable.log import keys
from durable.log.batching import drive
from durable.log.entries import actor_at
from durable.log.store import Entry
from durable.log.tail import BATCH, after_arg
from durable.streams.async_streaming import (
    afollow,
    async_twin,
    last_id,
    pump_partials,
    read_log,
)
from durable.streams.partials import (
    Barrier,
    Heard,
    Partial,
    Publisher,
    decode_partial,
    encode_partial,
    kept,
)

__all__ = ["Follower", "Partial", "Publisher", "afollow", "async_twin", "decode_partial",
           "encode_partial"]

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
        self.last = after_arg(after)
        self._items: queue.SimpleQueue[object] = queue.SimpleQueue()
        # Set once the log is read up to now: then the partial output kept of the steps
        # in flight follows, then what is heard (in that order, after the events before).
        caught_up = threading.Event()
        pubsub: Any = None
        barrier: Barrier | None = None
        so_far: list[Partial] = []
        if partial:
            pubsub = client.pubsub()
            pubsub.subscribe(layout.stream(run_id))
            _await_confirmation(pubsub)  # partials published from now on are seen
            since = last_id(client.xrevrange(layout.log(run_id), count=1))
            so_far = kept(client, layout, run_id)  # ...and those of the steps in flight, before
            barrier = Barrier(so_far, since)
        io = _Blocking(client, layout, run_id, self._items, self._stop, barrier, pubsub)
        if barrier is not None:
            threading.Thread(target=_pump_partials, daemon=True,
                             args=(io, Heard(so_far), barrier),
                             name=f"follow-partials-{run_id}").start()
        threading.Thread(target=_pump_log, daemon=True, name=f"follow-log-{run_id}",
                         args=(io, self.last, block_ms, reconnect_s, so_far,
                               caught_up)).start()

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


def _pump_log(io: _Blocking, last: str, block_ms: int, reconnect_s: float,
              so_far: list[Partial], caught_up: threading.Event) -> None:
    """Puts the log's entries after ``last`` on the follower's queue, then the end marker
    after a terminal event (or an error); once it has read up to now, ``so_far``, then
    sets ``caught_up``; from then on, the partial output of a call before the call's end
    (``durable.streams.async_streaming.read_log``)."""
    try:
        drive(read_log(io, last, block_ms, reconnect_s, so_far, caught_up))
    finally:
        caught_up.set()


class _Blocking:
    """``durable.streams.async_streaming.FollowIO`` on a follower's own threads: each call made at
    once, so that ``drive`` runs ``read_log`` (or ``pump_partials``) to its end without an
    event loop."""

    #: A connection another thread closed (its client closed, the follower dropped) is read
    #: by redis-py with these: no message will come; a live follower reconnects.
    faults: tuple[type[BaseException], ...] = (redis.RedisError, TypeError, AttributeError,
                                               ValueError)

    def __init__(self, client: redis.Redis, layout: keys.KeyLayout, run_id: str,
                 out: queue.SimpleQueue[object], stop: threading.Event,
                 barrier: Barrier | None, pubsub: Any = None) -> None:
        self.client, self.layout, self.run_id = client, layout, run_id
        self.out, self.stop, self.barrier, self.pubsub = out, stop, barrier, pubsub

    def stopped(self) -> bool:
        return self.stop.is_set()

    def put(self, item: object) -> None:
        self.out.put(item)

    async def actor_at(self, last: str) -> str:
        return actor_at(self.client, self.layout, self.run_id, last)

    async def xread(self, last: str, block: int | None) -> Any:
        return self.client.xread({self.layout.log(self.run_id): last}, count=BATCH,
                                 block=block)

    async def state(self) -> Any:
        return self.client.hget(self.layout.run(self.run_id), "state")

    async def log_end(self) -> str | None:
        return last_id(self.client.xrevrange(self.layout.log(self.run_id), count=1))

    async def pause(self, seconds: float) -> None:
        self.stop.wait(seconds)

    async def partials_out(self) -> None:
        assert self.barrier is not None
        self.barrier.wait()

    async def ping(self, text: str) -> Any:
        return self.pubsub.ping(text)

    async def message(self) -> Any:
        return self.pubsub.get_message(ignore_subscribe_messages=True, timeout=0.05)


def _pump_partials(io: _Blocking, heard: Heard, barrier: Barrier) -> None:
    try:
        drive(pump_partials(io, heard, barrier))  # held in order until the log is read
    finally:
        barrier.done.set()
        try:
            io.pubsub.close()
        except redis.RedisError:
            pass


def _await_confirmation(pubsub: Any, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        msg = pubsub.get_message(timeout=0.1)
        if msg and msg.get("type") == "subscribe":
            return
