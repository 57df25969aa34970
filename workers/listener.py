"""The worker's cancel listener: signals the cancel token of runs this worker holds.

A published message is a hint: it is authenticated, then recorded in the run's log (or found
there) before the token is signalled. After any (re)subscription the listener re-reads the
held runs' projections, so a cancel published while it was deaf still interrupts the call
in flight.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from durable.backend.cancel_messages import CancelMessage
from durable.backend.subscriber import CancelSubscriber
from durable.controls.cancellation import record_cancel
from durable.errors import DecodeError, RunNotFound
from durable.log import keys
from durable.settings import Settings

from .loop import StepLoop

log = logging.getLogger("durable.worker")


class CancelListener(CancelSubscriber):
    def __init__(self, settings: Settings, client: redis.Redis, loop: StepLoop) -> None:
        super().__init__(client, settings.cancel.secret, self.on_cancel, self.recheck_held,
                         log, loop.outage, max_age_ms=settings.cancel.max_age_ms,
                         report_interval_s=settings.cancel.report_interval_s)
        self.loop = loop

    def handle(self, data: Any) -> None:
        """One published message (as received from the channel)."""
        self._handle(data)

    def on_cancel(self, msg: CancelMessage) -> None:
        slot = self.loop.held.get(msg.run)
        if slot is None:
            return
        handle = record_cancel(self.loop.log, msg, self.loop.worker_id)
        if handle is not None and handle.state.cancel is not None:
            slot.token.cancel(handle.state.cancel.reason or "canceled")

    def recheck_held(self) -> int:
        """Signal every held run whose log holds a cancel request; returns how many."""
        held = list(self.loop.held.items())
        if not held:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for run_id, _slot in held:
            pipe.hget(self.loop.log.keys.run(run_id), "state")
        signalled = 0
        for (run_id, slot), state in zip(held, pipe.execute(), strict=True):
            if state != b"cancel_requested" or slot.token.cancelled:
                continue
            try:
                cancel = self.loop.log.load(run_id, actor=self.loop.worker_id).state.cancel
            except (RunNotFound, DecodeError):
                continue
            if cancel is not None:
                slot.token.cancel(cancel.reason or "canceled")
                signalled += 1
        if signalled:
            self.client.hincrby(keys.STATS, "cancels_found_on_resubscribe", signalled)
        return signalled
