"""The reconciler's cancel listener: records published cancels for runs no worker holds (a
worker records the cancels of the runs it holds), then settles the run at once."""

from __future__ import annotations

import logging
import threading

import redis

from durable.cancellation import decode_message, record_cancel
from durable.errors import BadCancelMessage, RunNotFound
from durable.log import keys
from reconciler.sweep import Reconciler

log = logging.getLogger("durable.reconciler")


def listen(rec: Reconciler, stop: threading.Event) -> None:
    pubsub = rec.redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.CANCEL_CHANNEL)
    while not stop.is_set():
        message = pubsub.get_message(timeout=0.5)
        if not message:
            continue
        try:
            msg = decode_message(message["data"], rec.settings.cancel_secret)
        except BadCancelMessage as exc:
            rec.redis.hincrby(keys.STATS, f"cancel_{exc.kind}", 1)
            continue
        try:
            if rec.leases.holder(msg.run) is None:
                handle = record_cancel(rec.log, msg, rec.token)
                if handle is not None:
                    rec.reconcile(msg.run)
        except (RunNotFound, redis.RedisError):
            log.exception("cancel hint for %s", msg.run)
