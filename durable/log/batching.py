"""Script calls of many threads sent together: one pipeline per batch instead of a round
trip each (a worker's run threads: their appends, ``EventLog.batch_appends``, their
lease acquisitions, ``Leases.batcher``, and their pops of the next ready run).

Why: a worker holding many runs spent most of a step's CPU in redis-py's per-command path
(taking a pooled connection and checking it, one send and one read per call) and in the
thread switches each socket call causes under the GIL. Here a run thread hands its
script call (``append.lua``, ``lease_acquire.lua``) to the batcher and sleeps on a lock;
the batcher thread takes every call waiting, sends them in one pipeline, and wakes each
caller with its own reply. Alone, a call goes out at once (a batch of one); under load,
batches grow by themselves.

Each call is still its own script call, atomic on its own run's keys: a batch is not a
transaction, and one call's refusal does not touch another's. A Redis error that ends the
batch (a lost connection) is raised in every caller of that batch, as it would have been
raised in each of them alone; whether a call ran is then unknown to its caller, exactly as
for a single call, and the caller reloads the run.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import redis
from hiredis import pack_command

from durable.log.scripts import source

log = logging.getLogger("durable.log")

T = TypeVar("T")

#: Most calls sent in one pipeline.
MAX_BATCH = 256

#: Times a batch's calls refused with NOSCRIPT are loaded and sent again.
NOSCRIPT_RETRIES = 5


@dataclass(eq=False)
class RedisCall:
    """One Redis call (a script's or a plain command's) waiting to be sent with others: by
    the batcher's thread for a caller that sleeps on it, or by whoever drives the coroutine
    that awaits it."""

    #: The script's name in ``durable/log/scripts``; None for a plain command.
    script: str | None
    #: What is sent: ``EVALSHA sha numkeys keys... args...``, or the plain command.
    command: tuple[Any, ...]
    reply: Any = None
    error: BaseException | None = None
    done: threading.Lock = field(default_factory=threading.Lock)
    #: The batcher that sends it when a coroutine's call is driven on a thread (``drive``).
    via: ScriptBatcher | None = None

    def __await__(self) -> Generator[RedisCall, None, Any]:
        """A coroutine's script call: it is handed to whoever drives the coroutine (a
        thread, ``drive``; or a worker's hub, ``workers.hub``), which sets its reply or
        error before resuming it."""
        yield self
        if self.error is not None:
            raise self.error
        return self.reply

    def settle(self) -> None:
        """Send it with the other threads' waiting calls (its batcher's) and wait for its
        reply or error (``drive``)."""
        assert self.via is not None, "a call without a batcher"
        self.via.resolve(self)


class Settles(Protocol):
    """What a coroutine driven by ``drive`` may wait on: a script call, or anything else
    that can be settled in place (a worker's user code, ``workers.loop.Offload``)."""

    def settle(self) -> None: ...


def drive(coro: Coroutine[Any, None, T]) -> T:
    """Run a coroutine on this thread: each script call it awaits goes with the other
    threads' waiting calls (its batcher's ``_wait``), and this thread waits for its reply;
    anything else it awaits is settled here too."""
    while True:
        try:
            item: Settles = coro.send(None)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        item.settle()


class ScriptBatcher:
    """Sends the script calls of many threads in pipelines (see the module doc)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._shas: dict[str, str] = {}
        self._inbox: queue.SimpleQueue[RedisCall] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        #: Per thread: ``rider`` (a command to send with its next call) and ``ridden``
        #: (that command once sent, with its reply or error).
        self._local = threading.local()

    def call(self, script: str, keys: list[str], args: list[Any]) -> Any:
        """The reply of the script ``script`` (its name in ``durable/log/scripts``) on
        ``keys`` and ``args``, sent with the other calls waiting; raises what the call (or
        its batch) raised."""
        return self._wait(self.script_call(script, keys, args))

    def script_call(self, script: str, keys: list[str], args: list[Any]) -> RedisCall:
        """The call of ``script`` on ``keys`` and ``args``, not sent yet: ``await`` it in a
        coroutine (see ``RedisCall.__await__``)."""
        sha = self._shas.get(script)
        if sha is None:
            sha = self._shas[script] = self.client.register_script(source(script)).sha
        return RedisCall(script, ("EVALSHA", sha, len(keys), *keys, *args), via=self)

    def command_call(self, *command: Any) -> RedisCall:
        """The plain ``command``, not sent yet: ``await`` it in a coroutine. Its reply is
        the raw one (no response callback: ``HMGET`` is a list of bytes or None, ``XRANGE``
        a list of ``[id, [field, value, ...]]``)."""
        return RedisCall(None, command, via=self)

    def command(self, *command: Any) -> Any:
        """The raw reply of a plain command (no response callback: ``LPOP key count`` is a
        list of bytes or None), sent with the calls waiting."""
        return self._wait(RedisCall(None, command))

    def ride_along(self, *command: Any) -> None:
        """Send the plain ``command`` with this thread's next call (one wait for both); its
        reply is kept for ``ridden``. Replaces a rider not sent yet; does nothing while
        the reply of one sent is not taken (it would be overwritten)."""
        if getattr(self._local, "ridden", None) is None:
            self._local.rider = RedisCall(None, command)

    def ridden(self) -> RedisCall | None:
        """The rider this thread sent since it last asked (its ``reply`` or ``error`` set),
        or None; a rider not sent yet is dropped."""
        self._local.rider = None
        sent: RedisCall | None = getattr(self._local, "ridden", None)
        self._local.ridden = None
        return sent

    def resolve(self, call: RedisCall) -> None:
        """Send ``call`` with the other threads' waiting calls and wait for its reply or
        error (set on the call, not raised)."""
        try:
            self._wait(call)
        except BaseException:
            if call.error is None:
                raise

    def send_now(self, batch: list[RedisCall]) -> None:
        """Send ``batch`` on this thread, in one pipeline, and set each call's reply or
        error (a worker's hub: it sends its own batches)."""
        try:
            self._send(batch)
        except BaseException as exc:  # every call gets its answer
            for call in batch:
                if call.reply is None and call.error is None:
                    call.error = exc
            if not isinstance(exc, Exception):
                raise

    def _wait(self, call: RedisCall) -> Any:
        call.done.acquire()
        if self._thread is None:
            self._start()
        rider: RedisCall | None = getattr(self._local, "rider", None)
        self._inbox.put(call)
        if rider is not None:
            self._local.rider = None
            rider.done.acquire()
            self._inbox.put(rider)
        call.done.acquire()  # released by the batcher once the reply is in
        if rider is not None:
            rider.done.acquire()
            self._local.ridden = rider
        if call.error is not None:
            raise call.error
        return call.reply

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="append-batcher",
                                                daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            batch = [self._inbox.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            try:
                self.send_now(batch)  # every call gets its answer: no caller is left waiting
            except BaseException:
                log.exception("append batcher")
            finally:
                for call in batch:
                    call.done.release()

    def _send(self, batch: list[RedisCall]) -> None:
        self.answer(batch, self._pipeline(batch))

    def answer(self, batch: list[RedisCall], replies: list[Any]) -> None:
        """Set each call's reply or error from what its pipeline read; calls refused with
        NOSCRIPT are sent again (on this thread) first."""
        for _ in range(NOSCRIPT_RETRIES):
            missing = [i for i, r in enumerate(replies)
                       if isinstance(r, redis.exceptions.NoScriptError)]
            if not missing:
                break
            # The server lost its scripts (a restart, SCRIPT FLUSH): nothing of those ran.
            # Load and send them again -- more than once, should it lose them meanwhile.
            for name in {batch[i].script for i in missing}:
                if name is not None:
                    self.client.script_load(source(name))
            again = self._pipeline([batch[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        for call, reply in zip(batch, replies, strict=True):
            if isinstance(reply, Exception):
                call.error = reply
            else:
                call.reply = reply

    def _pipeline(self, batch: list[RedisCall]) -> list[Any]:
        """Send ``batch`` on one pooled connection and read its replies: a refusal is the
        call's reply (an exception object), a lost connection is retried as redis-py's
        own pipelines retry it (the client's ``Retry``), then raised.

        Why not ``client.pipeline()``: its per-command bookkeeping (argument conversion,
        response callbacks, observability hooks) cost twice the socket work for these
        40-argument calls. The commands are packed by hiredis in one go instead."""
        pool = self.client.connection_pool
        conn = pool.get_connection()
        try:
            replies: list[Any] = conn.retry.call_with_retry(
                lambda: self._exchange(conn, batch), lambda _error: conn.disconnect())
            return replies
        except BaseException:
            conn.disconnect()  # replies may be left unread on it: never reuse it as is
            raise
        finally:
            pool.release(conn)

    def _exchange(self, conn: Any, batch: list[RedisCall]) -> list[Any]:
        conn.send_packed_command([packed(batch)])
        return read_replies(conn, batch)


def packed(batch: list[RedisCall]) -> bytes:
    """The commands of ``batch``, packed in one go (hiredis)."""
    return b"".join([pack_command(c.command) for c in batch])


def read_replies(conn: Any, batch: list[RedisCall]) -> list[Any]:
    """The replies of ``batch``, sent on ``conn``: a refusal is its call's reply (an
    exception object); a lost connection is raised."""
    replies: list[Any] = []
    for _ in batch:
        try:
            replies.append(conn.read_response())
        except redis.ResponseError as exc:
            replies.append(exc)
    return replies
