"""OpenTelemetry spans for runs and steps, carried from the producer to the workers.

Optional: with the ``otel`` extra (``opentelemetry-api``; an SDK and an exporter configured
by the application) a producer's ``Client.start`` opens a ``durable.start`` span and records
its W3C ``traceparent`` in the run's ``run_started`` event. Each time a worker drives the run
it opens a ``durable.run`` span whose parent is that context, and one ``durable.step`` span
per dispatched call (attributes below), so a run's steps appear in the trace of the request
that started it, whichever workers took them, after crashes and restarts too: the context
is in the log, not in a queue message that a recovery would not see again.

Without opentelemetry installed, or without an SDK configured, every function here is a
no-op that costs a branch.

Attributes: ``durable.run_id``, ``durable.agent``; on steps also ``durable.tool``,
``durable.key``, ``durable.step``, ``durable.attempt`` and ``durable.outcome``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the optional extra is not installed: every function is a no-op
    trace = None  # type: ignore[assignment]

TRACER = "durable"

_propagator = TraceContextTextMapPropagator() if trace is not None else None


def _recording() -> bool:
    """Whether spans go anywhere: the API is installed and an SDK provider is set (the
    API's default proxy and no-op providers record nothing, yet cost a span each)."""
    if trace is None:
        return False
    return not isinstance(trace.get_tracer_provider(),
                          (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


class StepSpan:
    """What a step's code may add to its span (nothing happens without a span)."""

    def __init__(self, span: Any = None) -> None:
        self.span = span

    def outcome(self, outcome: str) -> None:
        if self.span is not None:
            self.span.set_attribute("durable.outcome", outcome)
            if outcome in ("failed", "timed_out", "interrupted"):
                self.span.set_status(trace.Status(trace.StatusCode.ERROR, outcome))


_NO_STEP_SPAN = contextlib.nullcontext(StepSpan())


def traceparent() -> str:
    """The W3C ``traceparent`` of the current span, or "" (no OTel, nothing recording)."""
    if _propagator is None or not _recording():
        return ""
    if not trace.get_current_span().get_span_context().is_valid:
        return ""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent", "")


@contextlib.contextmanager
def start_span(run_id: str, agent: str) -> Iterator[None]:
    """The producer's span around ``Client.start``: current while the run is recorded, so
    :func:`traceparent` names it."""
    if not _recording():
        yield
        return
    tracer = trace.get_tracer(TRACER)
    with tracer.start_as_current_span("durable.start", kind=trace.SpanKind.PRODUCER,
                                      attributes={"durable.run_id": run_id,
                                                  "durable.agent": agent}):
        yield


@contextlib.contextmanager
def run_span(run_id: str, agent: str, parent: str) -> Iterator[None]:
    """A worker driving a run: a span under the producer's context ``parent``."""
    if not _recording():
        yield
        return
    ctx = _propagator.extract({"traceparent": parent}) if parent and _propagator else None
    tracer = trace.get_tracer(TRACER)
    with tracer.start_as_current_span("durable.run", context=ctx, kind=trace.SpanKind.CONSUMER,
                                      attributes={"durable.run_id": run_id,
                                                  "durable.agent": agent}):
        yield


def step_span(run_id: str, agent: str, tool: str, key: str, step: int,
              attempt: int) -> contextlib.AbstractContextManager[StepSpan]:
    """One dispatched call of a step, under the current run span."""
    if not _recording():
        return _NO_STEP_SPAN  # every step enters it: no generator to set up
    return _step_span(run_id, agent, tool, key, step, attempt)


@contextlib.contextmanager
def _step_span(run_id: str, agent: str, tool: str, key: str, step: int,
               attempt: int) -> Iterator[StepSpan]:
    tracer = trace.get_tracer(TRACER)
    with tracer.start_as_current_span(f"durable.step {tool}", attributes={
            "durable.run_id": run_id, "durable.agent": agent, "durable.tool": tool,
            "durable.key": key, "durable.step": step, "durable.attempt": attempt}) as span:
        yield StepSpan(span)
