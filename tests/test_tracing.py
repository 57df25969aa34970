"""OpenTelemetry traces: the producer's context travels in the run's log to the workers.

The producer (this process) exports to an ``InMemorySpanExporter``; each worker process
installs an SDK provider through the hook ``durable.testing.spans:SpansToFile=PATH``,
whose in-memory exporter also writes every finished span to a file this test reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from durable.client import Client
from durable.log import events as ev
from durable.testing import Server, wait_for
from durable.testing.spans import read
from tests.agents import traced
from tests.conftest import ReconcilerFactory, WorkerFactory

HOOK = "durable.testing.spans:SpansToFile"


@pytest.fixture()
def exporter() -> Iterator[InMemorySpanExporter]:
    """The producer's spans, in memory (one SDK provider per test process)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    memory = InMemorySpanExporter()
    processor = SimpleSpanProcessor(memory)
    provider.add_span_processor(processor)
    yield memory
    processor.shutdown()  # stops exporting to this test's exporter


def _started(client: Client, run: str) -> ev.RunStarted:
    first = client.events(run)[0].event
    assert isinstance(first, ev.RunStarted)
    return first


def test_one_span_per_step_under_the_producers_trace(client: Client, worker: WorkerFactory,
                                                     exporter: InMemorySpanExporter,
                                                     tmp_path: Path) -> None:
    spans_file = tmp_path / "spans.jsonl"
    with trace.get_tracer("test").start_as_current_span("request") as request:
        run = client.start("count", {"steps": 3}).run_id
    trace_id = f"{request.get_span_context().trace_id:032x}"
    assert _started(client, run).trace.startswith(f"00-{trace_id}-")
    worker(hooks=[f"{HOOK}={spans_file}"])
    assert client.wait(run, timeout=30).state == "completed"

    produced = {s.name: s for s in exporter.get_finished_spans()}
    start = produced["durable.start"]
    assert start.parent is not None and start.parent.span_id == request.get_span_context().span_id
    assert start.attributes is not None and start.attributes["durable.run_id"] == run

    def steps() -> list[dict[str, Any]]:
        return [s for s in read(spans_file) if s["name"].startswith("execute_tool ")]

    def run_spans() -> list[dict[str, Any]]:
        return [s for s in read(spans_file) if s["name"] == "durable.run"]

    # The run's span ends (and is written) after its last step's.
    assert wait_for(lambda: len(steps()) >= 3 and run_spans(), 10), read(spans_file)
    spans = read(spans_file)
    runs = run_spans()
    assert all(s["trace_id"] == trace_id for s in spans)
    assert all(r["parent_id"] == f"{start.context.span_id:016x}" for r in runs)
    by_step = sorted(steps(), key=lambda s: s["attributes"]["durable.step"])
    assert [s["attributes"]["durable.step"] for s in by_step] == [1, 2, 3]  # one per step
    run_span_ids = {r["span_id"] for r in runs}
    for n, span in enumerate(by_step, start=1):
        a = span["attributes"]
        assert span["name"] == "execute_tool noop" and span["kind"] == "INTERNAL"
        assert span["parent_id"] in run_span_ids
        assert a["durable.run_id"] == run and a["durable.agent"] == "count"
        assert a["durable.tool"] == "noop" and a["durable.key"] == f"{run}:{n}"
        assert a["durable.attempt"] == 1 and a["durable.outcome"] == "succeeded"
        # OpenTelemetry's generative-AI conventions for a tool call; no arguments, no result.
        assert (a["gen_ai.operation.name"], a["gen_ai.tool.name"], a["gen_ai.tool.type"],
                a["gen_ai.tool.call.id"]) == ("execute_tool", "noop", "function", f"{run}:{n}")
        assert set(a) == {"durable.run_id", "durable.agent", "durable.tool", "durable.key",
                          "durable.step", "durable.attempt", "durable.outcome",
                          "gen_ai.operation.name", "gen_ai.tool.name", "gen_ai.tool.type",
                          "gen_ai.tool.call.id"}


def test_the_trace_survives_a_crash(client: Client, worker: WorkerFactory,
                                    reconciler: ReconcilerFactory,
                                    exporter: InMemorySpanExporter, tmp_path: Path) -> None:
    """Window: the first worker is SIGKILLed after step 2's effect, before its outcome is
    recorded. The worker that recovers the run reads the context from the log: its spans
    join the producer's trace too."""
    spans_file = tmp_path / "spans.jsonl"
    with trace.get_tracer("test").start_as_current_span("request") as request:
        run = client.start("count", {"steps": 3}).run_id
    trace_id = f"{request.get_span_context().trace_id:032x}"
    first = worker(kill_at="after_effect:2", hooks=[f"{HOOK}={spans_file}"])
    assert first.wait(30) != 0
    reconciler(DURABLE_LEASE_TTL_MS="5000")  # no lease lost to a loaded machine's pauses
    worker(hooks=[f"{HOOK}={spans_file}"], DURABLE_LEASE_TTL_MS="5000")
    assert client.wait(run, timeout=60).state == "completed"
    assert wait_for(lambda: any(s["attributes"].get("durable.step") == 3
                                for s in read(spans_file)), 10)
    spans = read(spans_file)
    assert {s["trace_id"] for s in spans} == {trace_id}
    stepped = {s["attributes"]["durable.step"] for s in spans if s["name"].startswith(
        "execute_tool ")}
    assert stepped == {1, 2, 3}
    resent = [s for s in spans if s["attributes"].get("durable.step") == 2]
    assert len(resent) == 2  # before the kill, and sent again after lookup said not applied
    assert len({s["parent_id"] for s in resent}) == 2  # under each worker's run span


def test_without_opentelemetry_nothing_is_traced(server: Server, client: Client,
                                                 worker: WorkerFactory) -> None:
    """The extra is optional: with ``opentelemetry`` not importable, a producer starts a run
    (no context recorded) and a worker completes it."""
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from durable.telemetry import tracing\n"
        "assert tracing.trace is None and tracing.traceparent() == ''\n"
        "from durable.client import Client\n"
        "c = Client()\n"
        "print(c.start('count', {'steps': 1}).run_id)\n"
        "c.redis.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    run = done.stdout.strip()
    assert _started(client, run).trace == ""
    worker()
    assert client.wait(run, timeout=30).state == "completed"


def test_spans_a_tool_opens_are_children_of_its_step(client: Client, worker: WorkerFactory,
                                                     exporter: InMemorySpanExporter,
                                                     tmp_path: Path) -> None:
    """The tool runs on the worker's tool thread; the step's context goes with it."""
    assert traced.Tracer.name == "tracer"  # imported: this producer validates it
    spans_file = tmp_path / "spans.jsonl"
    with trace.get_tracer("test").start_as_current_span("request"):
        run = client.start("tracer", {"steps": 2}).run_id
    worker(hooks=[f"{HOOK}={spans_file}"],
           DURABLE_AGENTS=f"{os.environ['DURABLE_AGENTS']},tests.agents.traced")
    assert client.wait(run, timeout=30).state == "completed"
    assert wait_for(lambda: len([s for s in read(spans_file) if s["name"] == "tool work"]) == 2,
                    10)
    spans = read(spans_file)
    steps = {s["span_id"]: s for s in spans if s["name"] == "execute_tool traced"}
    work = [s for s in spans if s["name"] == "tool work"]
    assert len(steps) == 2 and {w["parent_id"] for w in work} == set(steps)


@pytest.mark.parametrize("asked", [False, True], ids=["no-content", "content-asked"])
def test_a_model_step_is_a_chat_span_with_its_model_and_usage_and_no_content(
        client: Client, worker: WorkerFactory, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, asked: bool) -> None:
    """The built-in ``chat`` step against a local OpenAI-compatible server: one ``CLIENT``
    span ``chat <model>`` per call, with the model asked for and the reply's model, id and
    token counts (OpenTelemetry's generative-AI conventions); the prompt and the reply's
    text appear nowhere on it, unless the worker's environment asks for content
    (``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``): then the messages sent
    and the reply's are on it."""
    from tests.servers.model import ModelServer

    if asked:
        monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    agents = "examples.agents,tests.agents.basic,tests.agents.model_steps"
    srv = ModelServer(tokens=20).start()
    try:
        monkeypatch.setenv("DURABLE_MODEL_BASE_URL", srv.url)
        monkeypatch.setenv("DURABLE_MODEL_NAME", "test-model-7")
        monkeypatch.setenv("DURABLE_AGENTS", agents)
        client.registry.load(agents)
        spans_file = tmp_path / "spans.jsonl"
        question = "what is the secret word, zebra-quartz?"
        run = client.start("model_asker", {"question": question}).run_id
        worker(hooks=[f"{HOOK}={spans_file}"])
        final = client.wait(run, timeout=60, waiting=False)
        assert final.state == "completed", (final.state, final.error)
        assert wait_for(lambda: any(s["name"].startswith("chat") for s in read(spans_file)),
                        10)
    finally:
        srv.stop()
    [span] = [s for s in read(spans_file) if s["name"].startswith("chat")]
    a = span["attributes"]
    assert span["name"] == "chat test-model-7" and span["kind"] == "CLIENT"
    assert (a["gen_ai.operation.name"], a["gen_ai.request.model"]) == ("chat", "test-model-7")
    assert a["gen_ai.provider.name"] == "openai"  # an OpenAI-compatible server
    assert (a["gen_ai.response.model"], a["gen_ai.response.id"]) == ("local", "c1")
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (5, 20)
    assert "gen_ai.tool.name" not in a and a["durable.outcome"] == "succeeded"
    answer = str(final.result["answer"])
    if not asked:
        assert answer and answer not in str(span) and "zebra-quartz" not in str(span)
        return
    sent = json.loads(a["gen_ai.input.messages"])
    assert any(question in str(m.get("content")) for m in sent), sent
    said = json.loads(a["gen_ai.output.messages"])
    assert said and said[0]["role"] == "assistant" and answer in str(said), said


def test_a_failed_call_names_its_error_class(client: Client, worker: WorkerFactory,
                                             tmp_path: Path) -> None:
    """A tool that raises ``ValueError``, alone (``failing_kid``) and in a parallel group
    (``partly_failing``): each failed call's span has ``error.type`` ``ValueError`` (the
    generative-AI conventions' error type: the error's class), not the outcome's word."""
    spans_file = tmp_path / "spans.jsonl"
    alone = client.start("failing_kid", {}).run_id
    grouped = client.start("partly_failing", {}).run_id
    worker(hooks=[f"{HOOK}={spans_file}"])
    assert client.wait(alone, timeout=30, waiting=False).state == "failed"
    assert client.wait(grouped, timeout=30, waiting=False).state == "completed"

    def failed() -> list[dict[str, Any]]:
        return [s for s in read(spans_file) if s["name"] == "execute_tool failing"]

    assert wait_for(lambda: len(failed()) == 3, 10), read(spans_file)
    by_run = sorted(s["attributes"]["durable.run_id"] for s in failed())
    assert by_run == sorted([alone, grouped, grouped])
    for span in failed():
        assert span["attributes"]["durable.outcome"] == "failed"
        assert span["attributes"]["error.type"] == "ValueError", span["attributes"]
