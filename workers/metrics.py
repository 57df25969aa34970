"""A worker process's own metrics, served on ``durable worker --metrics-port N``.

The system's totals (steps, lookups, runs by state...) are shared in Redis and served by
``durable.telemetry.metrics``; what a process serves here is its own: the calls it made, how long
they took, the runs it holds now, and prometheus-client's process and Python collectors
(memory, CPU, file descriptors, GC). Names start with ``durable_worker_`` so that summing
over processes never counts a step twice with the shared ``durable_steps_total``.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server

from durable.errors import UsageError
from durable.log.counters import STEP_BUCKETS_S

from .hooks import StepHooks
from .loop import StepLoop
from .slots import Driver

CALLS = Counter("durable_worker_steps", "Tool calls this worker process made, by outcome.",
                ("tool", "outcome"), registry=REGISTRY)
CALL_SECONDS = Histogram("durable_worker_step_duration_seconds",
                         "Duration of this process's tool calls (dispatch to return).",
                         ("tool",), buckets=STEP_BUCKETS_S, registry=REGISTRY)
HELD = Gauge("durable_worker_held_runs", "Runs this worker process holds now.",
             registry=REGISTRY)
SLOTS = Gauge("durable_worker_slots", "Run slots of this worker process (concurrency).",
              registry=REGISTRY)


class MetricsHook(StepHooks):
    """Counts each call this process made (the step loop's ``step_done`` window)."""

    def step_done(self, tool: str, outcome: str, seconds: float) -> None:
        CALLS.labels(tool, outcome).inc()
        CALL_SECONDS.labels(tool).observe(seconds)


def listen(host: str, port: int) -> None:
    """Serve ``/metrics`` on a daemon thread; first, so that a port in use stops the worker
    before it takes anything."""
    try:
        start_http_server(port, addr=host)
    except OSError as exc:
        raise UsageError(f"--metrics-port: cannot listen on {host}:{port}: "
                         f"{exc.strerror or exc}") from None


def watch(loop: StepLoop, pool: Driver) -> None:
    """The gauges read the loop and the pool (the counters come from a :class:`MetricsHook`
    in the loop's hooks)."""
    HELD.set_function(lambda: len(loop.held))
    SLOTS.set(pool.slots.size)
