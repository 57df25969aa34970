"""The reconciler process: sweeps what is due at a fixed interval, listens for cancels, and
watches the workers' liveness keys (``reconciler.liveness``: a dead worker's leases are
released at once). Safe to run as several copies (``due_claim.lua`` hands each due run to
one of them at a time). Redis going away is ordinary: the sweep waits with backoff and says
so once per outage."""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import threading
import time

import redis

from durable.agents import registry
from durable.backend.connection import client_url, connect, safe_url
from durable.backend.outages import Backoff
from durable.security.sealing import require_keys
from durable.settings import Settings
from durable.telemetry.overview import Sweep, record_sweep

from .listener import ReconcilerListener
from .liveness import LivenessWatch
from .probe import Heartbeat, serve
from .sweep import Sweeper

log = logging.getLogger("durable.reconciler")


def build(settings: Settings) -> Sweeper:
    client = connect(settings)
    registry.load(settings.worker.agents)
    require_keys(registry.sensitive_names(), settings)
    return Sweeper(settings, client, registry)


def run_forever(rec: Sweeper, interval: float, stop: threading.Event | None = None,
                heart: Heartbeat | None = None) -> None:
    stop = stop or threading.Event()
    heart = heart or Heartbeat(float("inf"), lambda: rec.outage.down)
    listener = ReconcilerListener(rec)
    listener.start()
    watch = LivenessWatch(rec)
    watch.start()
    last: Sweep | None = None
    backoff = Backoff()
    try:
        while not stop.is_set():
            started = time.monotonic()
            try:
                report = rec.tick()
            except redis.RedisError as exc:
                # On a cluster a ping may answer while a master is down: wait first, so a
                # sweep that fails at once is not retried in a loop.
                rec.outage.failed(exc)
                heart.beat()
                if not backoff.wait(stop):
                    rec.outage.wait_until_up(rec.redis, stop, backoff)
                continue
            backoff.reset()
            rec.outage.ok()
            heart.beat(report.examined)
            try:  # for operators (the console's workers page); never stops a sweep
                last = record_sweep(rec.redis, rec.token, report.examined, report.actions, last)
            except redis.RedisError as exc:
                log.warning("could not record the sweep: %r", exc)
            if report.examined:
                log.info("examined %d: %s", report.examined, report.actions)
            stop.wait(max(0.0, interval - (time.monotonic() - started)))
    finally:
        listener.stop.set()
        watch.stop.set()


def run_reconciler(settings: Settings, interval: float | None = None, *,
                   probe: tuple[str, int] | None = None, stale_after_s: float = 0.0) -> int:
    """Sweep until interrupted; ``probe`` (host, port) serves ``/healthz`` and ``/metrics``
    (``reconciler.probe``), stale once no pass went round for ``stale_after_s``."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    interval = interval or settings.reconciler.interval_s
    # SIGUSR1 prints every thread's stack to the log: what an operator (or a test) asks
    # of a process that looks stuck, without stopping it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    rec = build(settings)
    heart = Heartbeat(stale_after_s or max(60.0, 20 * interval), lambda: rec.outage.down)
    if probe is not None:
        serve(*probe, heart)
    log.info("reconciler %s started: agents %s, Redis %s%s", rec.token,
             ", ".join(sorted(registry.agents)) or "none", safe_url(client_url(rec.redis)),
             f", probe on {probe[0]}:{probe[1]}" if probe else "")
    try:
        run_forever(rec, interval, heart=heart)
    except KeyboardInterrupt:
        pass
    return 0
