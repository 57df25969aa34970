"""Model calls as steps: the built-in ``chat`` tool (OpenAI-compatible chat completions).

Importing this module registers the tool ``chat``. A code agent calls it through the
helper::

    from durable.models import chat, tool_message

    reply = chat(ctx, messages, tools=TOOLS)        # one step: ctx.call("chat", ...)
    messages.append(reply.message)
    for call in reply.tool_calls:                   # id, name, parsed arguments
        messages.append(tool_message(call, ctx.call(call.name, call.arguments)))

What the step is, for the worker:

- ``effect_free = True``: a completion changes nothing outside, so after a crash an open
  call is sent again at once (no deadline wait, no ``lookup``); a recorded one is never
  sent again: re-execution returns its recorded reply.
- ``model = True``: every request sent (each dispatch, resends too) is counted against
  the run's ``model_calls`` budget, and a recorded reply's ``usage.total_tokens`` against
  ``tokens``; a resend the budget no longer allows ends the run ``budget_exhausted``.
- ``log_args = "digest"``: the request carries the whole conversation, so the log records
  its digest and size only (the code agent rebuilds the conversation on recovery).

Never paying twice blindly: each request is one dispatch in the log (no retries hidden
inside a step). Its timeout is the call's ``timeout_s`` argument, else
``DURABLE_MODEL_TIMEOUT_S`` read at each call. A request that timed out is sent again at
once (nothing outside changed), but one step sends at most ``max_attempts`` (the call's,
else ``DURABLE_MODEL_ATTEMPTS``) requests, counting refusals and lost replies: then it fails
with ``NoOutcome`` (timed out) or the last error. A 429 or 503 with ``Retry-After`` is sent
again no sooner than the server asked (at most ``DURABLE_MODEL_MAX_RETRY_AFTER_S``); other
retryable refusals wait ``1, 2, 4...`` s (``waiting_retry``, holding no worker).

The request goes to ``POST {DURABLE_MODEL_BASE_URL}/chat/completions`` with the step's
idempotency key as ``Idempotency-Key`` and its deadline (ms since the epoch) as
``X-Deadline-Ms``, for providers and proxies that honour them, on the HTTP client the
event loop keeps for that URL across calls (``durable.model_http``). Arguments: ``messages``
(required), ``tools`` (OpenAI tool schemas), and ``temperature``, ``max_tokens``,
``tool_choice``, ``top_p``, ``seed``, ``stop``, ``response_format``, ``model`` (overrides
``DURABLE_MODEL_NAME``), ``stream`` (overrides ``DURABLE_MODEL_STREAM``), passed through;
``timeout_s`` and ``max_attempts`` (see below), for the worker.

The recorded result::

    {"message": {"role": "assistant", "content": ..., "tool_calls": [...]},  # append it
     "tool_calls": [{"id": ..., "name": ..., "arguments": {...}}],            # parsed
     "finish_reason": "tool_calls" | "stop" | ..., "usage": {"prompt_tokens": ...,
     "completion_tokens": ..., "total_tokens": ...}, "model": ..., "id": ...}

A tool call whose arguments are not a JSON object carries ``"error"`` (and empty
``arguments``): tell the model, do not call the tool.

Streaming (``"stream": true``, server-sent events): each content delta is published with
``ctx.emit(text)`` as it arrives (``Client.follow`` yields it as a ``Partial``; never
logged), tool-call deltas are assembled and published as they arrive too
(``durable.streams.partials.tool_call_delta``: ``{"tool_call": {"index", "id", "name", "args"}}``),
and usage is asked for with
``stream_options.include_usage``. A stream that ends before ``data: [DONE]`` is a lost
reply: retried, like a 429, a 5xx, a 408 (refused past the deadline) or a connection
error (``ModelUnavailable``). Any other refusal (400, 401, 404...) fails the step
(``ModelError``).

Settings: ``durable.settings.ModelSettings`` (``Settings().models``), the ``DURABLE_MODEL_*``
variables of docs/reference.md (base URL, API key, model name, timeout, attempts, longest
Retry-After, streaming, fleet-wide limits), read at each call (the limits at import).

Tool schemas: :func:`tool_schemas` derives the ``tools`` argument from the registered
tools' ``args_model`` (pydantic), so nothing is written by hand twice.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# httpx is an extra, not a hard dependency: say so at import. It is imported by the first
# request (``durable.model_http``), not here.
if importlib.util.find_spec("httpx") is None:
    raise ModuleNotFoundError("durable.models (the built-in model step) needs httpx: pip "
                              "install 'durable-agents[models]'", name="httpx")

from durable import model_http
from durable.agents import Lookup, Tool, ToolContext, register
from durable.code import AsyncRunContext, RunContext
from durable.errors import RateLimited
from durable.flow.limits import Limit
from durable.model_http import ModelError, ModelUnavailable, retry_after
from durable.request_digest import ListDigest, around, canonical, digested
from durable.settings import ModelSettings
from durable.tool_schemas import agent_tool_schemas, tool_schema, tool_schemas

__all__ = ["TOOL_NAME", "Chat", "ChatReply", "ModelError", "ModelSettings",
           "ModelUnavailable", "ToolCall", "achat", "agent_tool_schemas", "chat", "chat_args",
           "completion_result", "request_body", "retry_after", "step_args", "tool_message",
           "tool_schema", "tool_schemas"]

#: The name the tool is registered under.
TOOL_NAME = "chat"
KEY_HEADER = "Idempotency-Key"
DEADLINE_HEADER = "X-Deadline-Ms"

#: Arguments passed through to the request body as they are.
PASSED_THROUGH = ("temperature", "max_tokens", "tool_choice", "top_p", "seed", "stop",
                  "response_format")

logging.getLogger("httpx").setLevel(logging.WARNING)  # not a log line per request


def model_limits(settings: ModelSettings) -> tuple[Limit, ...]:
    """The ``model`` limit of the chat step, shared by every worker (``durable.flow.limits``)."""
    if not (settings.rpm or settings.tpm or settings.in_flight):
        return ()
    return (Limit("model", rate=settings.rpm, tokens=settings.tpm,
                  in_flight=settings.in_flight, per_s=60.0),)


# The step ---------------------------------------------------------------------------------


def request_body(args: Mapping[str, Any], settings: ModelSettings) -> dict[str, Any]:
    """The chat completions request for the step's arguments."""
    messages = args.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ModelError("'messages' must be a non-empty list")
    _positive(args, "timeout_s", float)  # the worker's business, checked here
    _positive(args, "max_attempts", int)
    body: dict[str, Any] = {"model": args.get("model") or settings.name, "messages": messages}
    if args.get("tools"):
        body["tools"] = args["tools"]
    body.update({k: args[k] for k in PASSED_THROUGH if args.get(k) is not None})
    if args.get("stream", settings.stream):
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def _positive(args: Any, name: str, kind: type) -> Any:
    """The call's own ``name`` (a positive ``kind``), None when not given; ``ModelError``
    when it is given but unusable."""
    value = args.get(name) if isinstance(args, Mapping) else None
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value <= 0 or (kind is int and value % 1):
        raise ModelError(f"{name!r} must be a positive {kind.__name__}, not {value!r}")
    return kind(value)


def _arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    """A tool call's arguments (a JSON string, or an object from lax servers), parsed."""
    if isinstance(raw, dict):
        return raw, None
    try:
        parsed = json.loads(raw or "{}")
    except (TypeError, ValueError) as exc:
        return {}, f"arguments are not JSON: {exc}"
    if not isinstance(parsed, dict):
        return {}, "arguments are not a JSON object"
    return parsed, None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def completion_result(reply: Any) -> dict[str, Any]:
    """What the step records of a chat completion (see the module's doc)."""
    try:
        choice = reply["choices"][0]
        msg = choice["message"]
    except (TypeError, KeyError, IndexError) as exc:
        raise ModelError(f"not a chat completion: {str(reply)[:300]}") from exc
    message: dict[str, Any] = {"role": "assistant", "content": msg.get("content")}
    calls, sent = [], []
    for raw in msg.get("tool_calls") or []:
        fn = raw.get("function") or {}
        name, raw_args = str(fn.get("name") or ""), fn.get("arguments")
        arguments, error = _arguments(raw_args)
        call: dict[str, Any] = {"id": str(raw.get("id") or ""), "name": name,
                                "arguments": arguments}
        if error:
            call["error"] = error
        calls.append(call)
        sent.append({"id": call["id"], "type": "function", "function": {
            "name": name, "arguments": raw_args if isinstance(raw_args, str)
            else json.dumps(raw_args or {}, sort_keys=True)}})
    if sent:
        message["tool_calls"] = sent
    usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
    prompt, completion = _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
    return {
        "message": message,
        "tool_calls": calls,
        "finish_reason": choice.get("finish_reason") or ("tool_calls" if calls else "stop"),
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": _int(usage.get("total_tokens")) or prompt + completion},
        "model": str(reply.get("model") or ""),
        "id": str(reply.get("id") or ""),
    }


@register
class Chat(Tool):
    """One chat completion against an OpenAI-compatible API (see the module's doc)."""

    name = TOOL_NAME
    cancellable = True  # nothing to undo: a canceled completion changed nothing
    retryable = (ModelUnavailable,)
    #: Every request sent is a dispatch in the log (counted against "model_calls"): no
    #: retries inside a dispatch, where they would be paid for and not counted.
    max_quick_retries = 0
    retry_backoff_s = 1.0
    effect_free = True
    model = True
    log_args = "digest"
    limits = model_limits(ModelSettings())

    def timeout_for(self, args: Any) -> float:
        """The call's ``timeout_s``, else ``DURABLE_MODEL_TIMEOUT_S`` read now."""
        try:
            own = _positive(args, "timeout_s", float)
        except ModelError:
            own = None  # the call fails on it, with the reason (``request_body``)
        return own if own is not None else ModelSettings().timeout_s

    def attempts_for(self, args: Any) -> int:
        """The call's ``max_attempts``, else ``DURABLE_MODEL_ATTEMPTS`` read now."""
        try:
            own = _positive(args, "max_attempts", int)
        except ModelError:
            own = None
        return own if own is not None else ModelSettings().attempts

    def retry_delay_s(self, error: BaseException, attempts: int) -> float:
        """The server's ``Retry-After`` when it gave one (at most
        ``DURABLE_MODEL_MAX_RETRY_AFTER_S``), else exponential backoff."""
        after = getattr(error, "retry_after_s", None)
        if after is not None:
            return min(float(after), ModelSettings().max_retry_after_s)
        return super().retry_delay_s(error, attempts)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        ctx.check()
        settings = ModelSettings()
        body = request_body(args, settings)
        headers = {KEY_HEADER: ctx.key, DEADLINE_HEADER: str(ctx.deadline_ms)}
        if settings.api_key is not None:
            headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
        base = settings.base_url.rstrip("/")
        http = await model_http.client_for(base)  # the loop's, kept across calls
        import httpx

        # A little past the deadline: the worker's own timeout decides first (it records
        # the call as timed out, and an effect-free call is sent again at once).
        timeout = httpx.Timeout(ctx.remaining() + 1.0)
        url = f"{base}/chat/completions"
        try:
            if body.get("stream"):
                reply = await model_http.streamed(http, url, body, headers, timeout, ctx)
            else:
                resp = await http.post(url, json=body, headers=headers, timeout=timeout)
                model_http.check(resp)
                try:
                    reply = resp.json()
                except ValueError as exc:
                    raise ModelError(f"reply is not JSON: {resp.text[:300]}") from exc
        except httpx.TransportError as exc:  # not sent, or the reply lost: ask again
            raise ModelUnavailable(f"{type(exc).__name__}: {exc}") from exc
        except RateLimited as exc:  # a 429's wait, as long as the fleet honours one
            exc.retry_after_s = min(exc.retry_after_s, settings.max_retry_after_s)
            raise
        return completion_result(reply)

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()  # never asked: an effect-free call is sent again


# For code agents ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model asked for. ``error`` when its arguments could not be read."""

    id: str
    name: str
    arguments: dict[str, Any]
    error: str | None = None


@dataclass(frozen=True)
class ChatReply:
    """A recorded chat step, read: append ``message`` to the conversation, run
    ``tool_calls``; no tool calls means the model answered (``content``)."""

    message: dict[str, Any]
    content: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str
    usage: dict[str, int]
    result: dict[str, Any]

    @classmethod
    def from_result(cls, result: dict[str, Any]) -> ChatReply:
        calls = tuple(ToolCall(id=c["id"], name=c["name"], arguments=dict(c["arguments"]),
                               error=c.get("error")) for c in result.get("tool_calls", []))
        return cls(message=dict(result["message"]), content=result["message"].get("content"),
                   tool_calls=calls, finish_reason=str(result.get("finish_reason", "")),
                   usage=dict(result.get("usage", {})), result=result)


def chat_args(messages: Sequence[Mapping[str, Any]],
              tools: Sequence[Mapping[str, Any]] | None = None,
              **options: Any) -> dict[str, Any]:
    """The ``chat`` step's arguments."""
    args: dict[str, Any] = {"messages": [dict(m) for m in messages]}
    if tools:
        args["tools"] = [dict(t) for t in tools]
    args.update({k: v for k, v in options.items() if v is not None})
    return args


#: The digest of each execution's chat requests (``step_args``), by its context.
_DIGESTS: weakref.WeakKeyDictionary[RunContext, ListDigest] = weakref.WeakKeyDictionary()


def _encoded(message: Any) -> bytes:
    return canonical(message if isinstance(message, dict) else dict(message))


def step_args(ctx: Any, messages: Sequence[Mapping[str, Any]],
              tools: Sequence[Mapping[str, Any]] | None = None,
              **options: Any) -> dict[str, Any]:
    """The ``chat`` step's arguments as ``chat`` takes the step: ``chat_args`` with the digest
    and size the log keeps of them (``durable.call_identity.given_digest``), taken one new
    message at a time over the run's conversation (``durable.request_digest``), not over
    the whole conversation at each request; the digest is the whole arguments', as logs
    recorded before keep it. Without a code agent's context, ``chat_args``. In a
    counterfactual fork with ``--set model=...``, that model unless ``options`` name one."""
    if isinstance(ctx, RunContext) and ctx.overrides.get("model") and "model" not in options:
        options["model"] = ctx.overrides["model"]
    args = chat_args(messages, tools, **options)
    if not isinstance(ctx, RunContext):
        return args
    digest = _DIGESTS.get(ctx)
    if digest is None:
        digest = _DIGESTS[ctx] = ListDigest(_encoded)
    head, tail = around({k: v for k, v in args.items() if k != "messages"}, "messages")
    got, size = digested(digest, ctx, ctx.step + 1, lambda: digest.of(head, messages, tail))
    return {"_digest": got, "_bytes": size, **args}


def chat(ctx: RunContext, messages: Sequence[Mapping[str, Any]],
         tools: Sequence[Mapping[str, Any]] | None = None, **options: Any) -> ChatReply:
    """Take a ``chat`` step (``options``: temperature, max_tokens, stream...)."""
    return ChatReply.from_result(ctx.call(TOOL_NAME, step_args(ctx, messages, tools,
                                                               **options)))


async def achat(ctx: AsyncRunContext, messages: Sequence[Mapping[str, Any]],
                tools: Sequence[Mapping[str, Any]] | None = None,
                **options: Any) -> ChatReply:
    """``chat`` for an ``async def`` agent."""
    result = await ctx.call(TOOL_NAME, step_args(ctx, messages, tools, **options))
    return ChatReply.from_result(result)


def tool_message(call: ToolCall, result: Any) -> dict[str, Any]:
    """The message that gives the model a tool call's result (canonical JSON: the same
    result gives the same message, so the conversation is rebuilt identically)."""
    return {"role": "tool", "tool_call_id": call.id,
            "content": json.dumps(result, sort_keys=True, separators=(",", ":"))}
