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

On a Redis Cluster a batch goes out as one pipeline per master (``durable.log.routes``); a
call refused with ``MOVED``, ``ASK``, ``TRYAGAIN`` or ``CLUSTERDOWN`` (a failover, a
resharding) did not run, and is sent again where the cluster now says, as redis-py's
cluster client sends one call again. With ``DURABLE_MIN_REPLICAS`` each pipeline that holds
an append ends with one ``WAIT``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import redis
from hiredis import pack_command

from durable.log.routes import Part, Routes
from durable.log.scripts import source

log = logging.getLogger("durable.log")

T = TypeVar("T")

#: Most calls sent in one pipeline.
MAX_BATCH = 256

#: Times a batch's calls refused with NOSCRIPT (scripts lost), or redirected by a cluster
#: (MOVED, ASK, TRYAGAIN, CLUSTERDOWN), are sent again (redis-py's cluster client: 16).
NOSCRIPT_RETRIES = 16

#: Refusals that say "not here, not now" on a cluster: the call did not run.
_REDIRECTS = (redis.exceptions.AskError, redis.exceptions.TryAgainError,
              redis.exceptions.ClusterDownError)


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
    #: The run whose append this is: with ``DURABLE_MIN_REPLICAS`` its ``ok`` stands only
    #: once its pipeline's ``WAIT`` confirmed enough replicas (``durable.log.routes``).
    acks: str | None = None
    #: Its reply or error is set (a reply may be None: a nil).
    answered: bool = False

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

    def __init__(self, client: redis.Redis, min_replicas: int = 0,
                 timeout_ms: int = 2000) -> None:
        self.client = client
        #: Where each call goes, and the ``WAIT`` its pipeline ends with.
        self.routes = Routes(client, min_replicas, timeout_ms)
        self._shas: dict[str, str] = {}
        self._inbox: queue.SimpleQueue[RedisCall] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        #: Per thread: ``rider`` (a command to send with its next call) and ``ridden``
        #: (that command once sent, with its reply or error).
        self._local = threading.local()

    def call(self, script: str, keys: list[str], args: list[Any], *,
             acks: str | None = None) -> Any:
        """The reply of the script ``script`` (its name in ``durable/log/scripts``) on
        ``keys`` and ``args``, sent with the other calls waiting; raises what the call (or
        its batch) raised. ``acks``: as for ``script_call``."""
        return self._wait(self.script_call(script, keys, args, acks=acks))

    def script_call(self, script: str, keys: list[str], args: list[Any], *,
                    acks: str | None = None) -> RedisCall:
        """The call of ``script`` on ``keys`` and ``args``, not sent yet: ``await`` it in a
        coroutine (see ``RedisCall.__await__``). ``acks``: the run whose append it is
        (acknowledged by replicas with ``DURABLE_MIN_REPLICAS``)."""
        sha = self._shas.get(script)
        if sha is None:
            sha = self._shas[script] = self.client.register_script(source(script)).sha
        return RedisCall(script, ("EVALSHA", sha, len(keys), *keys, *args), via=self,
                         acks=acks)

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
        error (a worker's hub: it sends its own batches). Calls answered already are not
        sent again."""
        batch = [call for call in batch if not call.answered]
        if not batch:
            return
        try:
            self._send(batch)
        except BaseException as exc:  # every call gets its answer
            for call in batch:
                if not call.answered:
                    call.error, call.answered = exc, True
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
        NOSCRIPT, or redirected by a cluster, are sent again (on this thread) first."""
        for _ in range(NOSCRIPT_RETRIES):
            again = [i for i, r in enumerate(replies)
                     if isinstance(r, redis.exceptions.NoScriptError) or
                     (self.routes.cluster is not None and isinstance(r, _REDIRECTS))]
            if not again:
                break
            # Nothing of those ran: the server lost its scripts (a restart, SCRIPT FLUSH, a
            # replica that took over), or the slot is served elsewhere now.
            asking = self._redirected({i: replies[i] for i in again})
            for name in {batch[i].script for i in again
                         if isinstance(replies[i], redis.exceptions.NoScriptError)}:
                if name is not None:
                    self.client.script_load(source(name))
            plain = [i for i in again if i not in asking]
            for i, reply in zip(plain, self._pipeline([batch[i] for i in plain]),
                                strict=True):
                replies[i] = reply
            for node in set(asking.values()):
                sent = [i for i in asking if asking[i] == node]
                for i, reply in zip(sent, self._pipeline([batch[i] for i in sent],
                                                         asking=node), strict=True):
                    replies[i] = reply
        for call, reply in zip(batch, replies, strict=True):
            if isinstance(reply, Exception):
                call.error = reply
            else:
                call.reply = reply
            call.answered = True

    def _redirected(self, replies: dict[int, Any]) -> dict[int, str]:
        """What the cluster's refusals among ``replies`` (by the call's place in its batch)
        say: the slots moved are moved in the client's map, a cluster down or busy is
        waited on; returns the calls to send once with ``ASKING`` to the node named."""
        cluster = self.routes.cluster
        asking: dict[int, str] = {}
        waited = False
        for i, reply in replies.items():
            if isinstance(reply, redis.exceptions.MovedError):
                cluster.nodes_manager.move_slot(reply)
            elif isinstance(reply, redis.exceptions.AskError):
                asking[i] = f"{reply.host}:{reply.port}"
            elif isinstance(reply, _REDIRECTS) and not waited:
                waited = True
                time.sleep(0.05 if isinstance(reply, redis.exceptions.TryAgainError)
                           else 0.25)
                if isinstance(reply, redis.exceptions.ClusterDownError):
                    cluster.nodes_manager.initialize()
        return asking

    def _pipeline(self, batch: list[RedisCall], *, asking: str | None = None) -> list[Any]:
        """Send ``batch`` -- one pipeline per server it goes to -- and read its replies: a
        refusal is the call's reply (an exception object). A lost connection is retried as
        redis-py retries it (the client's ``Retry``); on a cluster the calls not answered
        yet are routed again after a refresh of the cluster's map, as its client does for
        one call; once the retries are spent, the error is the reply of those calls.

        Why not ``client.pipeline()``: its per-command bookkeeping (argument conversion,
        response callbacks, observability hooks) cost twice the socket work for these
        40-argument calls. The commands are packed by hiredis in one go instead."""
        cluster = self.routes.cluster
        if cluster is None:
            return self._send_part(self.routes.parts(batch)[0])
        done: dict[int, Any] = {}

        def attempt() -> None:
            todo = [call for call in batch if id(call) not in done]
            for part in self.routes.parts(todo, asking=asking):
                for call, reply in zip(part.calls, self._send_part(part), strict=True):
                    done[id(call)] = reply

        try:
            cluster.retry.call_with_retry(attempt, self.refresh_map)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            for call in batch:
                done.setdefault(id(call), exc)
        return [done[id(call)] for call in batch]

    def refresh_map(self, _error: BaseException | None = None) -> None:
        """A cluster node could not be reached: learn the cluster's map again."""
        if self.routes.cluster is None:
            return
        try:
            self.routes.cluster.nodes_manager.initialize()
        except redis.RedisError:
            pass  # the next attempt routes on the map as it is, or fails the same way

    def _send_part(self, part: Part[RedisCall]) -> list[Any]:
        """The replies of ``part``'s calls, sent on one pooled connection of its server."""
        pool = self.routes.pool(part.node)
        conn = pool.get_connection()
        try:
            replies: list[Any] = conn.retry.call_with_retry(
                lambda: self._exchange(conn, part.wire), lambda _error: conn.disconnect())
            return self.routes.unwire(part, replies)
        except BaseException:
            conn.disconnect()  # replies may be left unread on it: never reuse it as is
            raise
        finally:
            pool.release(conn)

    def _exchange(self, conn: Any, wire: list[Any]) -> list[Any]:
        conn.send_packed_command([pack_wire(wire)])
        return read_replies(conn, wire)


def pack_wire(commands: list[Any]) -> bytes:
    """``commands`` (tuples of arguments), packed in one go (hiredis)."""
    return b"".join([pack_command(c) for c in commands])


def packed(batch: list[RedisCall]) -> bytes:
    """The commands of ``batch``, packed in one go (hiredis)."""
    return b"".join([pack_command(c.command) for c in batch])


def read_replies(conn: Any, batch: list[Any]) -> list[Any]:
    """The replies of ``batch`` (calls or commands), sent on ``conn``: a refusal is its
    call's reply (an exception object); a lost connection is raised."""
    replies: list[Any] = []
    for _ in batch:
        try:
            replies.append(conn.read_response())
        except redis.ResponseError as exc:
            replies.append(exc)
    return replies
