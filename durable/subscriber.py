"""A cancel-channel subscription that outlives Redis faults.

A subscriber is deaf while its connection is down: after a Redis restart, ``CLIENT KILL TYPE
pubsub``, or an output buffer that overflowed. It resubscribes (with backoff while Redis does
not answer) and, after every (re)subscription, calls ``on_subscribed`` so that its owner
re-reads from the logs what it may have missed: a published message is only a hint, and the
log holds every cancel request.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis

from durable.cancellation import CancelMessage, decode_message
from durable.errors import BadCancelMessage
from durable.log import keys
from durable.outages import Outage


class CancelSubscriber(threading.Thread):
    def __init__(self, client: redis.Redis, secret: str | None,
                 on_message: Callable[[CancelMessage], object],
                 on_subscribed: Callable[[], object], logger: logging.Logger,
                 outage: Outage | None = None, name: str = "cancel-listener") -> None:
        super().__init__(name=name, daemon=True)
        self.client, self.secret = client, secret
        self.on_message, self.on_subscribed = on_message, on_subscribed
        self.log = logger
        self.outage = outage or Outage(logger)
        #: Set once the first subscription is in place.
        self.ready = threading.Event()
        self.stop = threading.Event()
        #: (Re)subscriptions so far.
        self.subscriptions = 0
        self._reconnected = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(keys.CANCEL_CHANNEL)
                # redis-py reconnects and resubscribes by itself on the next read after a
                # dropped connection; this callback tells us it did (we were deaf meanwhile).
                if pubsub.connection is not None:
                    pubsub.connection.register_connect_callback(self._on_reconnect)
                self._subscribed()
                while not self.stop.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if self._reconnected.is_set():
                        self._subscribed()
                    if message:
                        self._handle(message.get("data", b""))
            except redis.RedisError as exc:
                self.outage.failed(exc)
                self.outage.wait_until_up(self.client, self.stop)
            except Exception:
                self.log.exception("cancel listener")
                self.stop.wait(0.5)
            finally:
                try:
                    pubsub.close()
                except Exception:  # the connection is gone already
                    pass

    def _on_reconnect(self, connection: Any) -> None:
        # redis-py keeps connect callbacks as weak methods: a bound method of this thread.
        self._reconnected.set()

    def _subscribed(self) -> None:
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
        except BadCancelMessage as exc:
            self.client.hincrby(keys.STATS, f"cancel_{exc.kind}", 1)
            self.log.warning("%s", exc)
            return
        self.on_message(msg)
