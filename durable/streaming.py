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
arrive. Pass the last ``Entry.id`` seen as ``after`` to resume. ``afollow`` is its async
twin (``durable.async_streaming``); the log is read by both as ``durable.log.tail`` says.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import redis

from durable.async_streaming import afollow, async_twin
from durable.errors import RunNotFound
from durable.log import keys
from durable.log.entries import actor_at
from durable.log.state import TERMINAL
from durable.log.store import Entry
from durable.log.tail import BATCH, END, RETRIED, after_arg, ends, last_actor, xread_entries
from durable.partials import (
    CALL_ENDS,
    Barrier,
    Heard,
    Partial,
    Publisher,
    decode_partial,
    encode_partial,
    kept,
    pong_text,
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
        except RETRIED:
            stop.wait(0.2)

    def release() -> None:
        if not caught_up.is_set():
            for item in so_far:
                out.put(item)
            caught_up.set()

    while not stop.is_set():
        try:
            block = block_ms if caught_up.is_set() else None
            got = xread_entries(client.xread({key: last}, count=BATCH, block=block), run_id, actor)
            if not got and block is None:
                release()
                continue
            if not got:
                state = client.hget(run_key, "state")
                if state is not None and state.decode() not in TERMINAL:
                    continue
                # Terminal (or gone): what was appended since the last read, then stop.
                got = xread_entries(client.xread({key: last}, count=BATCH), run_id, actor)
                if not got:
                    out.put(END)
                    return
            failing_since = 0.0
            actor = last_actor(got, actor)
        except RETRIED as exc:
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
            if ends(entry):
                out.put(END)
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
