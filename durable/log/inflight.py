"""Batches in flight: sent without waiting for their replies, on a driver's own
connections (one per server: each master of a cluster), and read later in the order sent.
A worker's hub (``workers.hub``) builds its next batch while Redis works on the last.

A lost connection on one server:

- *One server*: raised to the driver, which drops every connection and sends the batches
  not read again as the batcher sends one (``ScriptBatcher.send_now``: retried as redis-py
  retries a pipeline; an append sent twice is refused by its version check the second
  time, and its run reloads).
- *A cluster*: only the calls sent on that master's connection are answered with the
  error, at once, and the cluster's map is read again; the parts on the other masters are
  read as usual. Retrying in place would stall every run of the worker for as long as the
  failover takes (the driving thread would sleep in the retries), and their leases would
  run out on the healthy masters too; instead the runs whose calls failed are set aside
  and taken again once Redis answers (``Slots.dropped``), each reloaded from its log, as
  the run threads do once their own retries are spent.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import redis

from durable.log.batching import RedisCall, ScriptBatcher, pack_wire, read_replies
from durable.log.routes import Part

_LOST = (redis.ConnectionError, redis.TimeoutError)

#: Connections per server with ``DURABLE_MIN_REPLICAS``, taken in turn batch after batch:
#: a ``WAIT`` holds back the commands sent after it on its own connection (Redis serves a
#: blocked client's pipeline in order), so the next batches go on other connections and
#: their waits overlap. One connection per server otherwise.
WAIT_LANES = 4


class Stream:
    """Batches sent without waiting for their replies (see the module doc). Only one thread
    at a time uses it."""

    def __init__(self, batcher: ScriptBatcher) -> None:
        self.batcher = batcher
        self.routes = batcher.routes
        #: Per server and lane: its pool and the connection the batches go on.
        self._conns: dict[tuple[str, int], tuple[Any, Any]] = {}
        #: Parts sent on each of those connections and not read yet.
        self._unread: dict[tuple[str, int], int] = {}
        self._lanes = WAIT_LANES if self.routes.min_replicas else 1
        self._turn = 0
        self._sent: deque[tuple[list[RedisCall], list[Part[RedisCall]]]] = deque()
        #: Connections lost on a cluster (by ``id``), and why: the parts sent on one are
        #: answered with its error, never read.
        self._lost: dict[int, BaseException] = {}

    @property
    def servers(self) -> int:
        """The servers a batch may be split over: a cluster's masters, else 1."""
        cluster = self.routes.cluster
        return 1 if cluster is None else max(1, len(cluster.get_primaries()))

    def send(self, batch: list[RedisCall]) -> None:
        """Send ``batch`` (a part per server); its replies are read by ``read_oldest``."""
        try:
            parts = self.routes.parts(batch)
        except _LOST as exc:  # a cluster's slot not covered (a failover under way)
            _answer(batch, exc)
            self._sent.append((batch, []))
            self.batcher.refresh_map()
            return
        self._sent.append((batch, parts))
        self._turn = lane = (self._turn + 1) % self._lanes
        for part in parts:
            where = (part.node, lane)
            try:
                conn = self._conn(where)
                unread = self._unread.get(where, 0)
                # No health check with replies pending: its PING would read theirs.
                conn.send_packed_command([pack_wire(part.wire)], check_health=not unread)
            except _LOST as exc:
                if self.routes.cluster is None:
                    raise
                self._lose(part.node, exc)
                _answer(part.calls, exc)
                continue
            part.sent_on, part.lane = conn, lane
            self._unread[where] = unread + 1

    def read_oldest(self) -> list[RedisCall]:
        """Read the replies of the oldest batch sent and answer its calls (NOSCRIPT and
        cluster redirections are sent again first); returns the batch. On one server a
        lost connection is raised (the calls of the parts read before it are answered)."""
        batch, parts = self._sent[0]
        for part in parts:
            if part.sent_on is None:  # answered when its send failed
                continue
            error = self._lost.get(id(part.sent_on))
            if error is None:
                try:
                    got = read_replies(part.sent_on, part.wire)
                except _LOST as exc:
                    if self.routes.cluster is None:
                        raise
                    self._lose(part.node, exc)
                    error = exc
            if error is not None:
                _answer(part.calls, error)
                continue
            self._unread[(part.node, part.lane)] -= 1
            replies = self.routes.unwire(part, got)
            try:
                self.batcher.answer(part.calls, replies)
            except Exception as exc:  # every call gets an answer, every run goes on
                _answer(part.calls, exc)
        self._sent.popleft()
        if not self._sent:
            self._lost.clear()
        return batch

    def close(self) -> None:
        """Drop the connections (replies may be left unread on them) and what was sent."""
        for pool, conn in self._conns.values():
            _drop(pool, conn)
        self._conns.clear()
        self._unread.clear()
        self._sent.clear()
        self._lost.clear()

    def _conn(self, where: tuple[str, int]) -> Any:
        held = self._conns.get(where)
        if held is None:
            pool = self.routes.pool(where[0])
            held = self._conns[where] = (pool, pool.get_connection())
        return held[1]

    def _lose(self, node: str, error: BaseException) -> None:
        """A connection to ``node`` failed: what was sent on its connections is answered
        with ``error``; the next batch there goes on a new one, on the map read again."""
        for where in [w for w in self._conns if w[0] == node]:
            held = self._conns.pop(where)
            self._unread.pop(where, None)
            self._lost[id(held[1])] = error
            _drop(*held)
        self.batcher.refresh_map()


def _answer(calls: list[RedisCall], error: BaseException) -> None:
    for call in calls:
        if not call.answered:
            call.error, call.answered = error, True


def _drop(pool: Any, conn: Any) -> None:
    try:
        conn.disconnect()
        pool.release(conn)
    except Exception:  # a pool of a node the cluster forgot
        pass
