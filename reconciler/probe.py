"""The reconciler's probe and metrics, served on ``durable reconciler --probe-port N``.

``GET /healthz`` answers 200 while the sweep loop goes round: each pass (one that swept,
or one that found Redis down and backed off) beats, and the loop is healthy while its last
beat is younger than ``stale_after_s``, or while it waits out a Redis outage it has seen
(restarting the process would not bring Redis back). A loop wedged in user code (a tool's
``lookup`` that never returns) stops beating, the probe answers 503, and an orchestrator's
liveness probe restarts the process; the run it was looking at is swept again by the next
reconciler.

``GET /metrics`` serves prometheus-client's process collectors and the reconciler's own
figures (``durable_reconciler_*``): passes, runs examined, the age of the last beat. The
system's totals are ``durable metrics``' business.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, generate_latest

from durable.errors import UsageError

PASSES = Counter("durable_reconciler_sweeps", "Sweep passes this reconciler completed.",
                 registry=REGISTRY)
EXAMINED = Counter("durable_reconciler_examined_runs", "Runs this reconciler's sweeps examined.",
                   registry=REGISTRY)
BEAT_AGE = Gauge("durable_reconciler_last_beat_age_seconds",
                 "Seconds since the sweep loop last went round.", registry=REGISTRY)


class Heartbeat:
    """When the sweep loop last went round, and whether that is recent enough."""

    def __init__(self, stale_after_s: float, waiting_for_redis: Callable[[], bool]) -> None:
        self.stale_after_s = stale_after_s
        self.waiting_for_redis = waiting_for_redis
        self._last = time.monotonic()
        BEAT_AGE.set_function(self.age_s)

    def beat(self, examined: int | None = None) -> None:
        """One pass of the loop; ``examined`` when it swept (None: it backed off)."""
        self._last = time.monotonic()
        if examined is not None:
            PASSES.inc()
            EXAMINED.inc(examined)

    def age_s(self) -> float:
        return time.monotonic() - self._last

    def report(self) -> tuple[bool, dict[str, Any]]:
        age, outage = self.age_s(), self.waiting_for_redis()
        healthy = age < self.stale_after_s or outage
        return healthy, {"ok": healthy, "last_beat_age_s": round(age, 3),
                         "stale_after_s": self.stale_after_s, "waiting_for_redis": outage}


def serve(host: str, port: int, heart: Heartbeat) -> ThreadingHTTPServer:
    """Serve ``/healthz`` and ``/metrics`` on a daemon thread; first, so that a port in use
    stops the reconciler before it sweeps anything."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # probes are frequent
            pass

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                healthy, body = heart.report()
                self._reply(200 if healthy else 503, "application/json",
                            json.dumps(body).encode())
            elif path == "/metrics":
                self._reply(200, CONTENT_TYPE_LATEST, generate_latest(REGISTRY))
            else:
                self._reply(404, "text/plain", b"not found: /healthz or /metrics\n")

        def _reply(self, code: int, kind: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        raise UsageError(f"--probe-port: cannot listen on {host}:{port}: "
                         f"{exc.strerror or exc}") from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="reconciler-probe", daemon=True).start()
    return server
