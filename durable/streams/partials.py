"""Partial output of the steps in flight: published to followers, and kept while the step
runs so a follower that joins late gets what was said so far.

A tool's ``ctx.emit(data)`` becomes one message ``{"run", "step", "attempt", "seq",
"data"}`` (``seq`` from 1 within one dispatch). ``partial_emit.lua`` appends it to the
step's list ``dx:{R}:partial:<step>`` and publishes it on the run's channel
``dx:{R}:stream`` in one call; the list is bounded (the oldest messages are dropped past
``DURABLE_PARTIAL_KEEP_BYTES`` per step), emptied when a new dispatch of the step emits its
first message, deleted when the call ends (its outcome goes to the log) and expires
anyway (``KEPT_TTL_MS``) after a crash. Partial output never enters the log.

What a model step emits while the model streams: its text as plain strings (each the next
piece), and each tool call the reply makes as ``tool_call_delta(...)``'s
``{"tool_call": {"index", "id", "name", "args"}}``: ``index`` the call's place in the reply,
``id`` and ``name`` once known, ``args`` the next piece of its JSON arguments. The built-in
``chat`` step, pydantic-ai's and the OpenAI Agents SDK's model steps emit the same shapes.

A follower subscribes first, then reads what is kept (:func:`kept`), then hears the rest;
:class:`Heard` drops a message it got both ways. So it gets the text so far, then the rest,
in order, each message once: nothing is lost between the read and the subscription, as a
message is kept before it is published. And the output of a call comes before the call's
end: a follower's log reader, about to yield an outcome, waits on a :class:`Barrier` until
its subscription has taken in everything published before; and a message heard before the
log reader has yielded its call's dispatch waits for it (:class:`Order`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import redis
import redis.asyncio

from durable.log import events as ev
from durable.log import keys
from durable.log.scripts import Scripts
from durable.log.store import Entry

#: Bytes of partial output kept per step in flight, by default.
DEFAULT_KEEP_BYTES = 1024 * 1024
#: Expiry of what is kept (renewed at each emit): the leftovers of a call that crashed.
KEPT_TTL_MS = 10 * 60 * 1000


@dataclass(frozen=True)
class Partial:
    """Partial output a step emitted (``ToolContext.emit``): not in the log."""

    run: str
    step: int
    seq: int
    data: Any
    attempt: int = 1


def tool_call_delta(index: int, *, call_id: str | None = None, name: str | None = None,
                    args: str = "") -> dict[str, Any]:
    """The partial output of a tool call the model is streaming (see the module's doc)."""
    call: dict[str, Any] = {"index": index, "args": args}
    if call_id:
        call["id"] = call_id
    if name:
        call["name"] = name
    return {"tool_call": call}


def encode_partial(run_id: str, step: int, attempt: int, seq: int, data: Any,
                   max_bytes: int) -> bytes:
    """The message published for one ``emit``. Data that is not plain JSON, or that is
    larger than ``max_bytes``, is replaced by ``{"_omitted": why}``: an emit never fails
    its step."""
    try:
        body = msgspec.json.encode(data)
    except (TypeError, ValueError) as exc:
        body = msgspec.json.encode({"_omitted": f"not plain data: {exc}"[:300]})
    if len(body) > max_bytes:
        body = msgspec.json.encode({"_omitted": f"{len(body)} bytes exceeds {max_bytes}"})
    head = msgspec.json.encode({"run": run_id, "step": step, "attempt": attempt, "seq": seq})
    return head[:-1] + b',"data":' + body + b"}"


def decode_partial(raw: Any) -> Partial | None:
    """A published message as a ``Partial``; None when it is not one."""
    try:
        msg = json.loads(raw)
        return Partial(run=str(msg["run"]), step=int(msg["step"]), seq=int(msg["seq"]),
                       data=msg.get("data"), attempt=int(msg.get("attempt", 1)))
    except (ValueError, TypeError, KeyError):
        return None


class CallOutput:
    """The ``publish`` of one dispatch's ``ToolContext``: keeps and publishes each emit;
    ``close()`` when the call ended forgets what was kept. Best-effort: a Redis fault drops
    the message and the tool goes on."""

    def __init__(self, publisher: Publisher, run_id: str, step: int, attempt: int) -> None:
        self.publisher, self.run_id, self.step, self.attempt = publisher, run_id, step, attempt
        self._seq = itertools.count(1)
        self.emitted = 0

    def __call__(self, data: Any) -> None:
        pub = self.publisher
        seq = next(self._seq)
        msg = encode_partial(self.run_id, self.step, self.attempt, seq, data, pub.max_bytes)
        try:
            pub.scripts.partial_emit(
                keys=[self.publisher.keys.partials(self.run_id),
                      self.publisher.keys.partial(self.run_id, self.step)],
                args=[self.step, msg, "1" if seq == 1 else "0", pub.keep_bytes, KEPT_TTL_MS,
                      self.publisher.keys.stream(self.run_id)])
            self.emitted += 1
        except redis.RedisError:
            pass

    def close(self) -> None:
        if not self.emitted:
            return  # nothing kept: no round trip
        try:
            self.publisher.scripts.partial_done(
                keys=[self.publisher.keys.partials(self.run_id),
                      self.publisher.keys.partial(self.run_id, self.step)],
                args=[self.step])
        except redis.RedisError:
            pass  # it expires


class Publisher:
    """Gives each tool call its :class:`CallOutput`: messages of at most ``max_bytes`` of
    data, ``keep_bytes`` kept per step in flight."""

    def __init__(self, client: redis.Redis, max_bytes: int,
                 keep_bytes: int = DEFAULT_KEEP_BYTES,
                 layout: keys.KeyLayout = keys.UNSHARDED) -> None:
        self.redis = client
        self.keys = layout
        self.scripts = Scripts(client)
        self.max_bytes = max_bytes
        self.keep_bytes = keep_bytes

    def for_call(self, run_id: str, step: int, attempt: int) -> CallOutput:
        return CallOutput(self, run_id, step, attempt)


def _decoded(run_id: str, steps: list[Any], lists: list[Any]) -> list[Partial]:
    out = []
    for raw_list in lists:
        for raw in raw_list or []:
            found = decode_partial(raw)
            if found is not None and found.run == run_id:
                out.append(found)
    return sorted(out, key=lambda p: (p.step, p.attempt, p.seq))


def _steps(index: Any) -> list[int]:
    steps = []
    for field in index or {}:
        try:
            steps.append(int(field))
        except ValueError:
            continue
    return sorted(steps)


def kept(client: redis.Redis, layout: keys.KeyLayout, run_id: str) -> list[Partial]:
    """The partial output kept of the run's steps in flight, by step, in order."""
    steps = _steps(client.hgetall(layout.partials(run_id)))
    pipe = client.pipeline(transaction=False)
    for step in steps:
        pipe.lrange(layout.partial(run_id, step), 0, -1)
    return _decoded(run_id, steps, pipe.execute() if steps else [])


async def akept(client: redis.asyncio.Redis, layout: keys.KeyLayout, run_id: str) -> list[Partial]:
    """``kept`` on a ``redis.asyncio`` client."""
    steps = _steps(await client.hgetall(layout.partials(run_id)))
    lists = [await client.lrange(layout.partial(run_id, step), 0, -1) for step in steps]
    return _decoded(run_id, steps, lists)


class Heard:
    """Which messages a follower has had: each is yielded once, whether it was read from
    what is kept or heard on the channel (or both)."""

    def __init__(self, read: list[Partial]) -> None:
        self._last: dict[tuple[int, int], int] = {}
        for p in read:
            self.fresh(p)

    def fresh(self, p: Partial) -> bool:
        """True the first time ``p`` is seen (its seq beyond the last of its dispatch)."""
        at = (p.step, p.attempt)
        if p.seq <= self._last.get(at, 0):
            return False
        self._last[at] = p.seq
        return True


#: The events that end a call: the partial output it published comes before them.
CALL_ENDS = (ev.ActionSucceeded, ev.ActionFailed, ev.ActionTimedOut, ev.ActionInterrupted,
             ev.CallCanceled, *ev.TERMINAL_EVENTS)


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class Order:
    """A follower's partial output in its place among the log's events, whichever of its
    two readers is ahead: after its call's dispatch, before its call's end.

    A worker publishes a call's output after it logged the dispatch, but the subscription
    can hear it before the log reader has read that far (or, while the log reader has not
    yet caught up with the log, before what was kept of the calls in flight is out). Such
    a message is held, with the log's last entry id when it was heard (the dispatch is at
    or before it), and handed out once the log reader has yielded that entry or the
    dispatch, and before its call's end in any case; what was kept (``kept``) comes out at
    the catch-up, or before its call's end if that comes first. Shared by the two readers
    (threads or tasks); each hands its items out through it."""

    def __init__(self, kept: list[Partial] | None = None, since: str | None = None) -> None:
        self._lock = threading.Lock()
        self._kept = list(kept or [])
        # The log's last entry when the subscription began: a call that ended at or before
        # it has no output to wait for (a late follower reads a long log without pausing).
        self._since = _id(since) if since is not None else (0, 0)
        self._caught_up = False
        self._dispatches: dict[int, int] = {}  # step -> dispatches read (an attempt's number)
        self._read_to = (0, 0)
        self._held: list[tuple[tuple[int, int], Partial]] = []

    def heard(self, entry: Entry) -> bool:
        """Whether ``entry`` was appended after the subscription began (its call's output,
        if any, was heard)."""
        return _id(entry.id) > self._since

    def ready(self, p: Partial) -> bool:
        """Whether ``p`` can go out now without asking where the log ends."""
        with self._lock:
            return self._caught_up and p.attempt <= self._dispatches.get(p.step, 0)

    def partial(self, p: Partial, log_end: str | None, put: Callable[[object], None]) -> None:
        """Hand ``p`` out, or hold it until the log reader reaches ``log_end`` (the log's
        last entry id when ``p`` was heard; None: nothing to wait for in the log)."""
        until = _id(log_end) if log_end is not None else (0, 0)
        with self._lock:
            if self._caught_up and self._due(until, p):
                put(p)
            else:
                self._held.append((until, p))

    def caught_up(self, put: Callable[[object], None]) -> None:
        """The log reader has read the log up to now: what was kept, then what was held."""
        with self._lock:
            if self._caught_up:
                return
            self._caught_up = True
            for p in self._kept:
                put(p)
            self._kept = []
            self._release(put, self._due)

    def entry(self, entry: Entry, put: Callable[[object], None]) -> None:
        """Hand a log entry out, with the output that goes with it: before a call's end,
        what its call said; after a dispatch, what was held for it or for an entry up to
        it."""
        event = entry.event
        with self._lock:
            if isinstance(event, CALL_ENDS):
                step = getattr(event, "step", None)  # a run's end: every call's

                def ended(until: tuple[int, int], p: Partial) -> bool:
                    return step is None or p.step == step

                for p in [p for p in self._kept if ended((0, 0), p)]:
                    put(p)
                self._kept = [p for p in self._kept if not ended((0, 0), p)]
                self._release(put, ended)
            put(entry)
            self._read_to = _id(entry.id)
            if isinstance(event, ev.ActionDispatched):
                self._dispatches[event.step] = self._dispatches.get(event.step, 0) + 1
            if self._caught_up:
                self._release(put, self._due)

    def _due(self, until: tuple[int, int], p: Partial) -> bool:
        return until <= self._read_to or p.attempt <= self._dispatches.get(p.step, 0)

    def _release(self, put: Callable[[object], None],
                 due: Callable[[tuple[int, int], Partial], bool]) -> None:
        if not self._held:
            return
        kept: list[tuple[tuple[int, int], Partial]] = []
        for until, p in self._held:
            if due(until, p):
                put(p)
            else:
                kept.append((until, p))
        self._held = kept


class Barrier:
    """The log reader, about to yield the end of a call, has the partial reader take in
    first what was published before it: a ``PING`` on the subscription, whose reply comes
    after every message published earlier. ``order`` puts what it took in after the call's
    dispatch."""

    def __init__(self, kept: list[Partial] | None = None, since: str | None = None) -> None:
        self.wanted = threading.Event()
        self.done = threading.Event()
        self.count = 0
        self.order = Order(kept, since)

    def wait(self, timeout: float = 2.0) -> None:
        self.done.clear()
        self.wanted.set()
        self.done.wait(timeout)


class AsyncBarrier:
    """``Barrier`` for ``afollow``'s tasks."""

    def __init__(self, kept: list[Partial] | None = None, since: str | None = None) -> None:
        self.wanted = asyncio.Event()
        self.done = asyncio.Event()
        self.count = 0
        self.order = Order(kept, since)

    async def wait(self, timeout: float = 2.0) -> None:
        self.done.clear()
        self.wanted.set()
        try:
            await asyncio.wait_for(self.done.wait(), timeout)
        except TimeoutError:
            pass


def pong_text(data: Any) -> str:
    """A pong's payload as text."""
    return data.decode() if isinstance(data, bytes) else str(data)
