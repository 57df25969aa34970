"""The worker's cancel listener: signals the cancel token of runs this worker holds.

A published message is a hint: it is authenticated, then recorded in the run's log (or found
there) before the token is signalled.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis

from durable.cancellation import decode_message, record_cancel
from durable.errors import BadCancelMessage
from durable.log import keys
from durable.settings import Settings
from workers.loop import StepLoop

log = logging.getLogger("durable.worker")


class CancelListener(threading.Thread):
    """Subscribes to the cancel channel; signals the token of runs this worker holds."""

    def __init__(self, settings: Settings, client: redis.Redis, loop: StepLoop) -> None:
        super().__init__(name="cancel-listener", daemon=True)
        self.settings, self.client, self.loop = settings, client, loop
        self.ready = threading.Event()

    def run(self) -> None:
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(keys.CANCEL_CHANNEL)
        self.ready.set()
        for message in pubsub.listen():
            try:
                self.handle(message.get("data", b""))
            except Exception:
                log.exception("cancel listener")

    def handle(self, data: Any) -> None:
        try:
            msg = decode_message(data, self.settings.cancel_secret)
        except BadCancelMessage as exc:
            self.client.hincrby(keys.STATS, f"cancel_{exc.kind}", 1)
            log.warning("%s", exc)
            return
        slot = self.loop.held.get(msg.run)
        if slot is None:
            return
        handle = record_cancel(self.loop.log, msg, self.loop.worker_id)
        if handle is not None and handle.state.cancel is not None:
            slot.token.cancel(handle.state.cancel.reason or "canceled")
