"""Spans of a worker process, written to a file a test reads (``durable worker --hook
durable.testing.spans:SpansToFile=PATH``). Needs ``opentelemetry-sdk`` (the ``otel`` extra).

The hook installs an SDK ``TracerProvider`` whose exporter is an ``InMemorySpanExporter``
that also appends every finished span to ``PATH`` as one JSON object per line (name, trace
and span ids, parent span id, attributes), so a test in another process sees them as soon
as they end, even if the worker is later SIGKILLed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def as_dict(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.context
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}" if ctx else "",
        "span_id": f"{ctx.span_id:016x}" if ctx else "",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else "",
        "kind": span.kind.name,
        "attributes": dict(span.attributes or {}),
    }


class FileSpanExporter(InMemorySpanExporter):
    """Keeps spans in memory and appends each to a JSON-lines file."""

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = super().export(spans)
        with self._lock, self.path.open("a") as out:
            for span in spans:
                out.write(json.dumps(as_dict(span), default=str) + "\n")
        return result


class SpansToFile:
    """A worker hook that only installs the tracer provider (no step windows)."""

    def __init__(self, path: str) -> None:
        self.exporter = FileSpanExporter(path)
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        trace.set_tracer_provider(provider)


def read(path: str | Path) -> list[dict[str, Any]]:
    """The spans written so far."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
