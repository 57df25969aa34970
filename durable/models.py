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
- ``model = True``: counted against the run's ``model_calls`` budget, and its recorded
  ``usage.total_tokens`` against ``tokens``.
- ``log_args = "digest"``: the request carries the whole conversation, so the log records
  its digest and size only (the code agent rebuilds the conversation on recovery).

The request goes to ``POST {DURABLE_MODEL_BASE_URL}/chat/completions`` with the step's
idempotency key as ``Idempotency-Key`` and its deadline (ms since the epoch) as
``X-Deadline-Ms``, for providers and proxies that honour them. Arguments: ``messages``
(required), ``tools`` (OpenAI tool schemas), and ``temperature``, ``max_tokens``,
``tool_choice``, ``top_p``, ``seed``, ``stop``, ``response_format``, ``model`` (overrides
``DURABLE_MODEL_NAME``), ``stream`` (overrides ``DURABLE_MODEL_STREAM``), passed through.

The recorded result::

    {"message": {"role": "assistant", "content": ..., "tool_calls": [...]},  # append it
     "tool_calls": [{"id": ..., "name": ..., "arguments": {...}}],            # parsed
     "finish_reason": "tool_calls" | "stop" | ..., "usage": {"prompt_tokens": ...,
     "completion_tokens": ..., "total_tokens": ...}, "model": ..., "id": ...}

A tool call whose arguments are not a JSON object carries ``"error"`` (and empty
``arguments``): tell the model, do not call the tool.

Streaming (``"stream": true``, server-sent events): each content delta is published with
``ctx.emit(text)`` as it arrives (``Client.follow`` yields it as a ``Partial``; never
logged), tool-call deltas are assembled, and usage is asked for with
``stream_options.include_usage``. A stream that ends before ``data: [DONE]`` is a lost
reply: retried, like a 429, a 5xx, a 408 (refused past the deadline) or a connection
error (``ModelUnavailable``). Any other refusal (400, 401, 404...) fails the step
(``ModelError``).

Settings (environment, read at each call; the timeout when the module is imported):

=============================  ==============================  ==========================
``DURABLE_MODEL_BASE_URL``     ``https://api.openai.com/v1``   the API's base URL
``DURABLE_MODEL_API_KEY``      unset                           sent as ``Bearer`` token
``DURABLE_MODEL_NAME``         ``gpt-4o-mini``                 the ``model`` field
``DURABLE_MODEL_TIMEOUT_S``    ``60``                          the step's timeout
``DURABLE_MODEL_STREAM``       ``false``                       stream unless told not to
=============================  ==============================  ==========================
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from durable.agents import Lookup, Tool, ToolContext, register
from durable.code import AsyncRunContext, RunContext
from durable.errors import RateLimited
from durable.limits import Limit

#: The name the tool is registered under.
TOOL_NAME = "chat"
KEY_HEADER = "Idempotency-Key"
DEADLINE_HEADER = "X-Deadline-Ms"

#: Arguments passed through to the request body as they are.
PASSED_THROUGH = ("temperature", "max_tokens", "tool_choice", "top_p", "seed", "stop",
                  "response_format")

logging.getLogger("httpx").setLevel(logging.WARNING)  # not a log line per request


class ModelSettings(BaseSettings):
    """Where the model is: each field reads ``DURABLE_MODEL_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="DURABLE_MODEL_", extra="ignore")

    base_url: str = Field(default="https://api.openai.com/v1",
                          description="OpenAI-compatible API base URL (.../v1).")
    api_key: SecretStr | None = Field(default=None, description="Sent as a Bearer token.")
    name: str = Field(default="gpt-4o-mini", description="The request's model field.")
    timeout_s: float = Field(default=60.0, gt=0,
                             description="The chat step's timeout (read at import).")
    stream: bool = Field(default=False, description="Stream replies (SSE) by default.")
    rpm: int = Field(default=0, ge=0, description="Requests per minute the whole fleet may "
                     "send (the provider's quota; 0: no limit; read at import).")
    tpm: int = Field(default=0, ge=0, description="Tokens per minute the whole fleet may "
                     "use (0: no limit; read at import).")
    in_flight: int = Field(default=0, ge=0, description="Requests in flight at once across "
                           "the fleet (0: no limit; read at import).")

    def limits(self) -> tuple[Limit, ...]:
        """The ``model`` limit of the chat step, shared by every worker (``durable.limits``)."""
        if not (self.rpm or self.tpm or self.in_flight):
            return ()
        return (Limit("model", rate=self.rpm, tokens=self.tpm, in_flight=self.in_flight,
                      per_s=60.0),)


class ModelUnavailable(Exception):
    """The model did not answer (429, 5xx, 408 past the deadline, connection error, lost
    reply). A completion changes nothing: retryable."""


class ModelError(Exception):
    """The request was refused for good (400, 401, 404...) or the reply is not a chat
    completion. Not retried: the step fails."""


# The step ---------------------------------------------------------------------------------


def request_body(args: Mapping[str, Any], settings: ModelSettings) -> dict[str, Any]:
    """The chat completions request for the step's arguments."""
    messages = args.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ModelError("'messages' must be a non-empty list")
    body: dict[str, Any] = {"model": args.get("model") or settings.name, "messages": messages}
    if args.get("tools"):
        body["tools"] = args["tools"]
    body.update({k: args[k] for k in PASSED_THROUGH if args.get(k) is not None})
    if args.get("stream", settings.stream):
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def _check(resp: httpx.Response) -> None:
    if resp.status_code == 200:
        return
    text = resp.text[:300]
    after = resp.headers.get("retry-after", "")
    if resp.status_code == 429 and after.replace(".", "", 1).isdigit():
        # The fleet waits as the provider asks, and its limits lower their rate.
        raise RateLimited(float(after), f"model answered 429: {text}")
    if resp.status_code in (408, 409, 429) or resp.status_code >= 500:
        raise ModelUnavailable(f"model answered {resp.status_code}: {text}")
    raise ModelError(f"model refused the request ({resp.status_code}): {text}")


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


async def _streamed(http: httpx.AsyncClient, url: str, body: dict[str, Any],
                    headers: dict[str, str], ctx: ToolContext) -> dict[str, Any]:
    """Read a streamed completion (SSE), emitting content deltas; returns it assembled in
    the shape of a non-streamed one."""
    parts: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish: str | None = None
    usage: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    async with http.stream("POST", url, json=body, headers=headers) as resp:
        if resp.status_code != 200:
            await resp.aread()
            _check(resp)
        done = False
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data)
            except ValueError as exc:
                raise ModelError(f"malformed stream chunk: {data[:200]}") from exc
            meta.setdefault("id", chunk.get("id"))
            meta.setdefault("model", chunk.get("model"))
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    parts.append(delta["content"])
                    ctx.emit(delta["content"])
                for tc in delta.get("tool_calls") or []:
                    slot = calls.setdefault(int(tc.get("index", 0)), {
                        "id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                    slot["id"] = tc.get("id") or slot["id"]
                    fn = tc.get("function") or {}
                    slot["function"]["name"] += fn.get("name") or ""
                    slot["function"]["arguments"] += fn.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
    if not done:
        raise ModelUnavailable("the stream ended before [DONE]: the reply was lost")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(parts) if parts else None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {"id": meta.get("id"), "model": meta.get("model"), "usage": usage,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}]}


@register
class Chat(Tool):
    """One chat completion against an OpenAI-compatible API (see the module's doc)."""

    name = TOOL_NAME
    timeout_s = ModelSettings().timeout_s
    cancellable = True  # nothing to undo: a canceled completion changed nothing
    retryable = (ModelUnavailable,)
    effect_free = True
    model = True
    log_args = "digest"
    limits = ModelSettings().limits()

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        ctx.check()
        settings = ModelSettings()
        body = request_body(args, settings)
        headers = {KEY_HEADER: ctx.key, DEADLINE_HEADER: str(ctx.deadline_ms)}
        if settings.api_key is not None:
            headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
        url = f"{settings.base_url.rstrip('/')}/chat/completions"
        # A little past the deadline: the worker's own timeout decides first (it records
        # the call as timed out, and an effect-free call is sent again at once).
        timeout = httpx.Timeout(ctx.remaining() + 1.0)
        try:
            async with httpx.AsyncClient(timeout=timeout) as http:
                if body.get("stream"):
                    reply = await _streamed(http, url, body, headers, ctx)
                else:
                    resp = await http.post(url, json=body, headers=headers)
                    _check(resp)
                    try:
                        reply = resp.json()
                    except ValueError as exc:
                        raise ModelError(f"reply is not JSON: {resp.text[:300]}") from exc
        except httpx.TransportError as exc:  # not sent, or the reply lost: ask again
            raise ModelUnavailable(f"{type(exc).__name__}: {exc}") from exc
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


def chat(ctx: RunContext, messages: Sequence[Mapping[str, Any]],
         tools: Sequence[Mapping[str, Any]] | None = None, **options: Any) -> ChatReply:
    """Take a ``chat`` step (``options``: temperature, max_tokens, stream...)."""
    return ChatReply.from_result(ctx.call(TOOL_NAME, chat_args(messages, tools, **options)))


async def achat(ctx: AsyncRunContext, messages: Sequence[Mapping[str, Any]],
                tools: Sequence[Mapping[str, Any]] | None = None,
                **options: Any) -> ChatReply:
    """``chat`` for an ``async def`` agent."""
    result = await ctx.call(TOOL_NAME, chat_args(messages, tools, **options))
    return ChatReply.from_result(result)


def tool_message(call: ToolCall, result: Any) -> dict[str, Any]:
    """The message that gives the model a tool call's result (canonical JSON: the same
    result gives the same message, so the conversation is rebuilt identically)."""
    return {"role": "tool", "tool_call_id": call.id,
            "content": json.dumps(result, sort_keys=True, separators=(",", ":"))}
