"""The reconciler process: sweeps what is due at a fixed interval, and listens for cancels of
runs no worker holds. Safe to run as several copies (``due_claim.lua`` hands each due run to
one of them at a time)."""

from __future__ import annotations

import logging
import sys
import threading
import time

from durable.agents import registry
from durable.connection import connect
from durable.settings import Settings
from reconciler.listener import listen
from reconciler.sweep import Reconciler

log = logging.getLogger("durable.reconciler")


def build(settings: Settings) -> Reconciler:
    client = connect(settings)
    registry.load(settings.agents)
    return Reconciler(settings, client, registry)


def run_forever(rec: Reconciler, interval: float, stop: threading.Event | None = None) -> None:
    stop = stop or threading.Event()
    listener = threading.Thread(target=listen, args=(rec, stop), name="cancel-listener",
                                daemon=True)
    listener.start()
    while not stop.is_set():
        started = time.monotonic()
        report = rec.tick()
        if report.examined:
            log.info("examined %d: %s", report.examined, report.actions)
        stop.wait(max(0.0, interval - (time.monotonic() - started)))


def run_reconciler(settings: Settings, interval: float | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    rec = build(settings)
    log.info("reconciler %s: agents %s", rec.token, ", ".join(sorted(registry.agents)) or "none")
    run_forever(rec, interval or settings.reconcile_interval_s)
    return 0
