"""OpenTelemetry spans for runs and steps, carried from the producer to the workers.

Optional: with the ``otel`` extra (``opentelemetry-api``; an SDK and an exporter configured
by the application) a producer's ``Client.start`` opens a ``durable.start`` span and records
its W3C ``traceparent`` in the run's ``run_started`` event. Each time a worker drives the run
it opens a ``durable.run`` span whose parent is that context, and one span per dispatched
call (below), so a run's steps appear in the trace of the request that started it,
whichever workers took them, after crashes and restarts too: the context is in the log,
not in a queue message that a recovery would not see again.

Step spans follow OpenTelemetry's generative-AI conventions: a model call is a ``CLIENT``
span ``chat {model}`` (``gen_ai.operation.name`` ``chat``, ``gen_ai.provider.name``,
``gen_ai.request.model``; from
its reply ``gen_ai.response.model``, ``gen_ai.response.id``, ``gen_ai.usage.input_tokens``
and ``gen_ai.usage.output_tokens``), any other call an ``INTERNAL`` span ``execute_tool
{tool}`` (``gen_ai.operation.name`` ``execute_tool``, ``gen_ai.tool.name``,
``gen_ai.tool.type`` ``function``, ``gen_ai.tool.call.id``: the step's idempotency key). A
model call also carries ``gen_ai.provider.name`` (``requested_provider``). A failed call
sets ``error.type`` to the error's class (``ModelUnavailable``, ``ValueError``), a timed-out
one to ``timeout``, an interrupted one to ``interrupted``. No prompt, completion, argument or result
is put on a span unless asked: what a call said stays in the log, under its sealing. Asked
with OpenTelemetry's own switch for generative-AI content,
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` in the worker's environment, a
model call's span also carries its messages (``gen_ai.input.messages``) and the reply's
(``gen_ai.output.messages``), as JSON, in clear.

Without opentelemetry installed, or without an SDK configured, every function here is a
no-op that costs a branch.

Attributes of this project: ``durable.run_id``, ``durable.agent``; on steps also
``durable.tool``, ``durable.key``, ``durable.step``, ``durable.attempt`` and
``durable.outcome``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

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


#: OpenTelemetry's switch for generative-AI content on spans (off unless "true").
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


def capturing_content() -> bool:
    """Whether model calls' messages go on their spans (read at each span: a worker's
    environment, not the one its code was imported under)."""
    return os.environ.get(CAPTURE_CONTENT, "").strip().lower() == "true"


def _messages(value: Any) -> str | None:
    """A list of messages as the JSON of a span attribute, or None when it is not one."""
    if not isinstance(value, list) or not value:
        return None
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return None


class StepSpan:
    """What a step's code may add to its span (nothing happens without a span)."""

    def __init__(self, span: Any = None, model: bool = False) -> None:
        self.span = span
        self.model = model

    def outcome(self, outcome: str, result: Any = None, error_type: str | None = None) -> None:
        """The call's outcome; a model call's reply (``result``) gives the response's
        model, id and token counts, never its content. A failed call's ``error.type`` is
        the error's class (``error_type``, as its outcome event records it), a timed-out
        one's ``timeout``, an interrupted one's ``interrupted``."""
        if self.span is None:
            return
        self.span.set_attribute("durable.outcome", outcome)
        if outcome in ("failed", "timed_out", "interrupted"):
            kind = {"timed_out": "timeout", "interrupted": "interrupted"}.get(
                outcome, error_type or "_OTHER")
            self.span.set_attribute("error.type", kind)
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, kind))
        if self.model and isinstance(result, Mapping):
            found = result.get("usage")
            usage: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
            for name, value in (("gen_ai.response.model", result.get("model")),
                                ("gen_ai.response.id", result.get("id")),
                                ("gen_ai.usage.input_tokens", usage.get("prompt_tokens")),
                                ("gen_ai.usage.output_tokens", usage.get("completion_tokens"))):
                if isinstance(value, (str, int)) and not isinstance(value, bool) and value != "":
                    self.span.set_attribute(name, value)
            # The built-in chat step records its reply's ``message``; a raw completion has
            # ``choices``.
            choices = result.get("choices")
            said = _messages([result["message"]] if isinstance(result.get("message"), Mapping)
                             else [c.get("message") for c in choices if isinstance(c, Mapping)]
                             if isinstance(choices, list) else None)
            if said is not None and capturing_content():
                self.span.set_attribute("gen_ai.output.messages", said)


    def recorded(self, outcome: str, fields: Mapping[str, Any]) -> None:
        """``outcome`` of the call whose outcome event has ``fields``."""
        self.outcome(outcome, fields.get("result"), fields.get("error_type"))


def requested_model(tool: Any, args: Any, chat_default: str) -> str | None:
    """A step's ``gen_ai.request.model``: None when its tool makes no model call; else the
    model its arguments name, or ``chat_default`` (``DURABLE_MODEL_NAME``) for the built-in
    ``chat`` step, or "" (unknown)."""
    if not getattr(tool, "model", False):
        return None
    named = args.get("model") if isinstance(args, Mapping) else None
    if isinstance(named, str) and named:
        return named
    return chat_default if getattr(tool, "name", "") == "chat" else ""


#: ``gen_ai.provider.name`` by the host of an API's base URL (OpenTelemetry's well-known
#: values); any other host speaks the OpenAI API the built-in step sends (``openai``).
PROVIDERS_BY_HOST = {
    "api.openai.com": "openai", "api.anthropic.com": "anthropic",
    "generativelanguage.googleapis.com": "gcp.gemini", "api.mistral.ai": "mistral_ai",
    "api.groq.com": "groq", "api.deepseek.com": "deepseek", "api.x.ai": "x_ai",
    "api.perplexity.ai": "perplexity", "api.cohere.com": "cohere"}


def requested_provider(tool: Any, model: str, base_url: str) -> str:
    """A model call's ``gen_ai.provider.name``: the step tool's own ``provider`` when it
    declares one; else the prefix of a model id that names it (``openai:gpt-4o``,
    ``anthropic/claude-...``); else, for the built-in ``chat`` step, what its base URL's
    host is (``DURABLE_MODEL_BASE_URL``; an OpenAI-compatible server is ``openai``); else
    ``_OTHER``."""
    declared = getattr(tool, "provider", "")
    if isinstance(declared, str) and declared:
        return declared
    for sep in (":", "/"):
        prefix, found, _ = model.partition(sep)
        if found and prefix:
            return prefix
    if getattr(tool, "name", "") == "chat":
        host = urlsplit(base_url).hostname or ""
        if host.endswith(".openai.azure.com"):
            return "azure.ai.openai"
        return PROVIDERS_BY_HOST.get(host, "openai")
    return "_OTHER"


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


def dispatch_span(run_id: str, agent: str, tool: Any, act: Any, args: Any,
                  models: Any) -> contextlib.AbstractContextManager[StepSpan]:
    """``step_span`` of a worker's dispatch of the step ``act`` (an ``Action``) to ``tool``,
    its model and provider found from the tool, its arguments and ``models`` (the
    ``ModelSettings`` of the built-in ``chat`` step)."""
    if not _recording():
        return _NO_STEP_SPAN
    model = requested_model(tool, args, models.name)
    provider = requested_provider(tool, model, models.base_url) if model is not None \
        else "_OTHER"
    return _step_span(run_id, agent, act.tool, act.key, act.step, act.attempts, model, args,
                      provider)


def step_span(run_id: str, agent: str, tool: str, key: str, step: int, attempt: int,
              model: str | None = None, args: Any = None, provider: str = "_OTHER"
              ) -> contextlib.AbstractContextManager[StepSpan]:
    """One dispatched call of a step, under the current run span: ``model`` (from
    :func:`requested_model`) not None for a model call; ``args`` the call's arguments (their
    ``messages`` go on a model call's span only when content is asked for)."""
    if not _recording():
        return _NO_STEP_SPAN  # every step enters it: no generator to set up
    return _step_span(run_id, agent, tool, key, step, attempt, model, args, provider)


@contextlib.contextmanager
def _step_span(run_id: str, agent: str, tool: str, key: str, step: int, attempt: int,
               model: str | None, args: Any, provider: str) -> Iterator[StepSpan]:
    attributes: dict[str, Any] = {
        "durable.run_id": run_id, "durable.agent": agent, "durable.tool": tool,
        "durable.key": key, "durable.step": step, "durable.attempt": attempt}
    if model is not None:
        name, kind = (f"chat {model}" if model else "chat"), trace.SpanKind.CLIENT
        attributes["gen_ai.operation.name"] = "chat"
        attributes["gen_ai.provider.name"] = provider
        if model:
            attributes["gen_ai.request.model"] = model
        asked = _messages(args.get("messages") if isinstance(args, Mapping) else None)
        if asked is not None and capturing_content():
            attributes["gen_ai.input.messages"] = asked
    else:
        name, kind = f"execute_tool {tool}", trace.SpanKind.INTERNAL
        attributes.update({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                           "gen_ai.tool.type": "function", "gen_ai.tool.call.id": key})
    tracer = trace.get_tracer(TRACER)
    with tracer.start_as_current_span(name, kind=kind, attributes=attributes) as span:
        yield StepSpan(span, model is not None)
