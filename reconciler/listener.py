"""The reconciler's cancel listener: records every published cancel in the run's log, held
runs included (a worker that missed the message then finds the request at its next write),
and settles a run no worker holds at once."""

from __future__ import annotations

import logging

import redis

from durable.backend.cancel_messages import CancelMessage
from durable.backend.subscriber import CancelSubscriber
from durable.controls.cancellation import record_cancel
from durable.errors import RunNotFound

from .sweep import Sweeper

log = logging.getLogger("durable.reconciler")


class ReconcilerListener(CancelSubscriber):
    def __init__(self, rec: Sweeper) -> None:
        super().__init__(rec.redis, rec.settings.cancel.secret, self.on_cancel,
                         lambda: None, log, rec.outage,
                         max_age_ms=rec.settings.cancel.max_age_ms,
                         report_interval_s=rec.settings.cancel.report_interval_s)
        self.rec = rec

    def on_cancel(self, msg: CancelMessage) -> None:
        try:
            handle = record_cancel(self.rec.log, msg, self.rec.token)
            if handle is not None and self.rec.leases.holder(msg.run) is None:
                self.rec.reconcile(msg.run)
        except (RunNotFound, redis.RedisError):
            log.exception("cancel hint for %s", msg.run)
