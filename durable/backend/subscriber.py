"""A cancel-channel subscription that outlives Redis faults.

A subscriber is deaf while its connection is down: after a Redis restart, ``CLIENT KILL TYPE
pubsub``, or an output buffer that overflowed. It resubscribes (with backoff while Redis does
not answer) and, after every (re)subscription, calls ``on_subscribed`` so that its owner
re-reads from the logs what it may have missed: a published message is only a hint, and the
log holds every cancel request.

Messages it cannot use (malformed, forged, too old, replayed: ``durable.controls.cancellation``)
change nothing and cost no Redis write and no log line each: they are counted here, and
once per ``report_interval_s`` the counts of that interval go to ``dx:stats`` in one round
trip and to the log in one line ("1200 forged cancel message(s) refused in the last 10 s").
A flood of forged messages therefore costs each subscriber a JSON parse and an HMAC each.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis

from durable.backend.cancel_messages import CancelMessage, ReplayGuard, decode_message
from durable.backend.outages import Backoff, Outage
from durable.errors import BadCancelMessage
from durable.log import keys

#: A subscription that fails twice in a row sooner than this (seconds) after it was taken
#: is taken again only after a backoff.
STEADY_S = 1.0


class CancelSubscriber(threading.Thread):
    def __init__(self, client: redis.Redis, secret: str | None,
                 on_message: Callable[[CancelMessage], object],
                 on_subscribed: Callable[[], object], logger: logging.Logger,
                 outage: Outage | None = None, name: str = "cancel-listener", *,
                 max_age_ms: int = 5000, report_interval_s: float = 10.0) -> None:
        super().__init__(name=name, daemon=True)
        self.client, self.secret = client, secret
        #: Signed messages: accepted once, while fresh (only with a secret).
        self.guard = ReplayGuard(max_age_ms)
        self.report_interval_s = report_interval_s
        #: Rejected messages by kind, since the start (this process's subscriber).
        self.rejected: Counter[str] = Counter()
        self._unreported: Counter[str] = Counter()
        self._last_rejection = ""
        self._interval_start = time.monotonic()
        self.on_message, self.on_subscribed = on_message, on_subscribed
        self.log = logger
        self.outage = outage or Outage(logger)
        #: Set once the first subscription is in place.
        self.ready = threading.Event()
        self.stop = threading.Event()
        #: (Re)subscriptions so far.
        self.subscriptions = 0
        self._reconnected = threading.Event()
        #: When the subscription was last taken (monotonic; 0: never).
        self._since = 0.0
        #: Failures in a row soon after subscribing (or before it).
        self._quick = 0

    def run(self) -> None:
        backoff = Backoff()
        while not self.stop.is_set():
            try:
                self._listen(backoff)
            except Exception:  # the thread never ends early: a dead listener is a deaf process
                self.log.exception("cancel listener")
                self.stop.wait(0.5)

        try:
            self.report(force=True)
        except redis.RedisError:
            pass

    def _listen(self, backoff: Backoff) -> None:
        """One subscription, from taking it to losing it (then the wait before the next)."""
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(keys.CANCEL_CHANNEL)
            # redis-py reconnects and resubscribes by itself on the next read after a
            # dropped connection; this callback tells us it did (we were deaf meanwhile).
            # It is taken off again below: the connection goes back to the pool.
            if pubsub.connection is not None:
                pubsub.connection.register_connect_callback(self._on_reconnect)
            self._subscribed()
            while not self.stop.is_set():
                message = pubsub.get_message(timeout=1.0)
                if self._reconnected.is_set():
                    self._subscribed()
                if message:
                    self._handle(message.get("data", b""))
                self.report()
                self.outage.ok()  # listening works: an outage can end here
        except redis.RedisError as exc:
            # Subscribe again at once (deaf meanwhile), unless the last attempt failed too,
            # or soon after it subscribed: then wait first, even when a ping answers (on a
            # cluster it reaches another node than the channel's).
            self.outage.failed(exc)
            if not self._since or time.monotonic() - self._since < STEADY_S:
                self._quick += 1
            else:
                self._quick = 0
                backoff.reset()
            self._since = 0.0
            if self._quick > 1 and backoff.wait(self.stop):
                return
            _refresh_slots(self.client)
            self.outage.wait_until_up(self.client, self.stop, backoff)
        finally:
            _close(pubsub, self._on_reconnect)

    def _on_reconnect(self, connection: Any) -> None:
        # redis-py keeps connect callbacks as weak methods: a bound method of this thread.
        self._reconnected.set()

    def _subscribed(self) -> None:
        self._since = time.monotonic()
        self._reconnected.clear()
        self.subscriptions += 1
        self.outage.ok()
        self.ready.set()
        if self.subscriptions > 1:
            self.log.info("cancel listener subscribed again; re-reading held runs")
        self.on_subscribed()

    def _handle(self, data: Any) -> None:
        try:
            msg = decode_message(data, self.secret)
            if self.secret:
                self.guard.admit(msg)
        except BadCancelMessage as exc:
            self.rejected[exc.kind] += 1
            self._unreported[exc.kind] += 1
            self._last_rejection = exc.detail
            return
        self.on_message(msg)

    def report(self, force: bool = False) -> dict[str, int]:
        """Once per interval (or now, with ``force``): add the rejections of the interval to
        ``dx:stats`` in one round trip and log them in one line. Returns what it reported."""
        now = time.monotonic()
        if not self._unreported or (not force and
                                    now - self._interval_start < self.report_interval_s):
            if not self._unreported:
                self._interval_start = now
            return {}
        counts, self._unreported = dict(self._unreported), Counter()
        elapsed, self._interval_start = now - self._interval_start, now
        pipe = self.client.pipeline(transaction=False)
        for kind, n in counts.items():
            pipe.hincrby(keys.STATS, f"cancel_{kind}", n)
        try:
            pipe.execute()
        except redis.RedisError:
            self._unreported.update(counts)  # counted again at the next report
            raise
        what = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
        self.log.warning("%s cancel message(s) refused in the last %.0f s (last: %s)", what,
                         elapsed, self._last_rejection)
        return counts


def _close(pubsub: Any, callback: Callable[[Any], None]) -> None:
    """Close a subscription and hand its connection back to the pool without our connect
    callback: another user of that pooled connection reconnecting it is not a
    resubscription of ours (before, it made the listener re-read every held run)."""
    connection = pubsub.connection
    if connection is not None:
        connection.deregister_connect_callback(callback)
    try:
        pubsub.close()
    except Exception:  # the connection is gone already
        pass


def _refresh_slots(client: redis.Redis) -> None:
    """On a cluster, read the slot map again: a pub/sub connection picks its node from the
    client's map, which only its other commands refresh, so a listener with a client of its
    own would go on trying the dead master after a failover."""
    nodes = getattr(client, "nodes_manager", None)
    if nodes is None:
        return
    try:
        nodes.initialize()
    except (redis.RedisError, redis.exceptions.RedisClusterException):
        pass  # the next attempt asks again
