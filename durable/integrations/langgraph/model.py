"""A chat model request inside a durable LangGraph run: the function's side (any LangChain
chat model a node calls, whose generation takes the step ``<name>.model``), the worker's
side (the step tool that sends the request with the step's ``Idempotency-Key`` and
deadline, streaming its text and tool calls to the run's followers), and the JSON the step
records (the reply's messages and usage).

The function's side is the one place every chat model's ``invoke``, ``ainvoke``, ``batch``
and ``generate`` go through, below LangChain's callbacks and cache:
``BaseChatModel._agenerate_with_cache`` (and its synchronous twin), which ``install``
replaces once per process with a version that, inside a durable run only, takes a step;
outside one it is LangChain's own. A node's ``astream`` (``stream``) of a chat model is
that one step too, given back as one chunk: the step streams the tokens to the followers.
The callbacks a node's model call fires (tracing, LangGraph's own "messages" stream)
still fire, in the function, with the recorded reply.

A request's identity (``request_args``) is its digest, taken one new message at a time
(``durable.request_digest``), with the LangGraph task that sends it (``binding.current_task``):
the same request of the same task finds its recorded reply however often the task runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from langchain_core.exceptions import (
    ModelAPIError,
    ModelConnectionError,
    ModelRateLimitError,
    ModelTimeoutError,
)
from langchain_core.language_models.chat_models import BaseChatModel, generate_from_stream
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    message_to_dict,
    messages_from_dict,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from durable.agents import ToolContext
from durable.integrations.base import ModelStepBase, jsonable, stable
from durable.integrations.langgraph.binding import Binding, bound_run, current_task
from durable.integrations.langgraph.run import GraphOwner
from durable.request_digest import ListDigest, around, canonical
from durable.streams.partials import tool_call_delta

__all__ = ["MODEL_RETRYABLE", "ModelCall", "ModelStep", "decode_result", "encode_result",
           "install", "request_args"]

#: What a model step retries by default: LangChain's provider-neutral errors that say a
#: retry may succeed (a 429, a 5xx, no connection, a timeout), which every provider package
#: raises (beside its SDK's own type). Bounded by the step's attempts; never a bad request.
MODEL_RETRYABLE: tuple[type[BaseException], ...] = (
    ModelRateLimitError, ModelAPIError, ModelConnectionError, ModelTimeoutError)


# The JSON of a model step -------------------------------------------------------------------


def encode_result(result: ChatResult) -> dict[str, Any]:
    """A chat result as recorded: each generation's message and info, the model's output,
    and the usage (``usage.total_tokens`` is what the run's "tokens" budget counts)."""
    kinds: dict[str, int] = {}
    model = ""
    for gen in result.generations:
        usage = getattr(gen.message, "usage_metadata", None) or {}
        for kind, n in _priced(usage).items():
            kinds[kind] = kinds.get(kind, 0) + n
        meta = getattr(gen.message, "response_metadata", None) or {}
        model = model or str(meta.get("model_name") or meta.get("model") or "")
    if not model and isinstance(result.llm_output, dict):
        model = str(result.llm_output.get("model_name") or "")
    recorded = {"generations": [{"message": message_to_dict(g.message),
                                 "info": jsonable(g.generation_info)}
                                for g in result.generations],
                "llm_output": jsonable(result.llm_output),
                "usage": {"total_tokens": kinds.pop("total_tokens", 0), **kinds}}
    if model:  # the model priced (durable.costs)
        recorded["model"] = model
    return recorded


def _priced(usage: Any) -> dict[str, int]:
    """LangChain's ``usage_metadata`` by the token kinds a price is computed from."""
    details = usage.get("input_token_details") or {}
    found = {"total_tokens": usage.get("total_tokens"), "input_tokens": usage.get("input_tokens"),
             "output_tokens": usage.get("output_tokens"),
             "cache_read_tokens": details.get("cache_read"),
             "cache_write_tokens": details.get("cache_creation"),
             "input_audio_tokens": details.get("audio")}
    return {k: int(v) for k, v in found.items() if isinstance(v, int) and v > 0}


def decode_result(data: Any) -> ChatResult:
    if not isinstance(data, dict) or not isinstance(data.get("generations"), list):
        raise TypeError(f"a model step recorded {str(data)[:200]!r}, not a chat result")
    generations = []
    for gen in data["generations"]:
        (message,) = messages_from_dict([gen["message"]])
        generations.append(ChatGeneration(message=message, generation_info=gen.get("info")))
    return ChatResult(generations=generations, llm_output=data.get("llm_output"))


def _encoded(message: Any) -> bytes:
    """A message as a request's digest takes it: without its id (LangGraph draws one)."""
    if isinstance(message, BaseMessage):
        return canonical(stable(message.model_dump(mode="json", exclude={"id"})))
    return canonical(stable(message))


def request_args(b: Binding, model: BaseChatModel, messages: list[BaseMessage],
                 stop: list[str] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A request's identity: the digest of the model, the messages without their ids, the
    stop words and the call's options (its tools), with the task that sends it, its attempt
    and how many equal requests the attempt sent before; the task's id is told too."""
    task = current_task()
    name = getattr(model, "model_name", None) or getattr(model, "model", None) or ""
    fields = {"model": f"{model._llm_type}:{name}", "stop": stop, "options": stable(kwargs)}
    head, tail = around(fields, "messages")
    with b.lock:  # a synchronous node's request is named on its own thread
        digest = b.digests.setdefault(f"{task.node}|{fields['model']}", ListDigest(_encoded))
        request, size = digest.of(head, messages, tail)
    n = b.place(task.id, str(task.attempt), "model", request)
    named = hashlib.sha256(f"{request}|{task.id}|{task.attempt}|{n}".encode()).hexdigest()
    return {"_digest": named, "_bytes": size, "task": task.id}


# The function's side ------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelCall:
    """The live request a model step sends: handed from the function to the step tool."""

    model: BaseChatModel
    messages: list[BaseMessage]
    stop: list[str] | None
    kwargs: dict[str, Any]


_originals: dict[str, Callable[..., Any]] = {}


def install() -> None:
    """Make every chat model's generation a step inside a durable run (once per process)."""
    if _originals:
        return
    _originals["async"] = BaseChatModel._agenerate_with_cache
    _originals["sync"] = BaseChatModel._generate_with_cache

    async def agenerate(self: BaseChatModel, messages: list[BaseMessage],
                        stop: list[str] | None = None, run_manager: Any = None,
                        **kwargs: Any) -> ChatResult:
        b = bound_run()
        if b is None:
            return await _originals["async"](self, messages, stop, run_manager, **kwargs)  # type: ignore[no-any-return]
        got = await b.take(b.owner.model_step, request_args(b, self, messages, stop, kwargs),
                           ModelCall(self, messages, stop, kwargs))
        return decode_result(got)

    def generate(self: BaseChatModel, messages: list[BaseMessage],
                 stop: list[str] | None = None, run_manager: Any = None,
                 **kwargs: Any) -> ChatResult:
        b = bound_run()
        if b is None:
            return _originals["sync"](self, messages, stop, run_manager, **kwargs)  # type: ignore[no-any-return]
        got = b.take_blocking(b.owner.model_step, request_args(b, self, messages, stop, kwargs),
                              ModelCall(self, messages, stop, kwargs))
        return decode_result(got)

    BaseChatModel._agenerate_with_cache = agenerate  # type: ignore[method-assign]
    BaseChatModel._generate_with_cache = generate  # type: ignore[method-assign]
    _install_streams()


def _install_streams() -> None:
    """A node's ``astream``/``stream`` inside a durable run: one step (``ainvoke``), given
    back as one chunk; the step itself streams the tokens to the run's followers."""
    _originals["astream"] = BaseChatModel.astream
    _originals["stream"] = BaseChatModel.stream

    async def astream(self: BaseChatModel, input: Any, config: Any = None, *,
                      stop: list[str] | None = None,
                      **kwargs: Any) -> AsyncIterator[AIMessageChunk]:
        if bound_run() is None:
            async for chunk in _originals["astream"](self, input, config, stop=stop, **kwargs):
                yield chunk
            return
        yield as_chunk(await self.ainvoke(input, config, stop=stop, **kwargs))

    def stream(self: BaseChatModel, input: Any, config: Any = None, *,
               stop: list[str] | None = None, **kwargs: Any) -> Iterator[AIMessageChunk]:
        if bound_run() is None:
            yield from _originals["stream"](self, input, config, stop=stop, **kwargs)
            return
        yield as_chunk(self.invoke(input, config, stop=stop, **kwargs))

    BaseChatModel.astream = astream  # type: ignore[method-assign]
    BaseChatModel.stream = stream  # type: ignore[method-assign]


def as_chunk(message: BaseMessage) -> AIMessageChunk:
    """A reply as the one chunk of a stream: adding it up gives the reply back."""
    calls = getattr(message, "tool_calls", None) or []
    return AIMessageChunk(
        content=message.content, id=message.id, name=message.name,
        additional_kwargs=message.additional_kwargs,
        response_metadata=message.response_metadata,
        usage_metadata=getattr(message, "usage_metadata", None),
        tool_call_chunks=[{"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"],
                           "index": i, "type": "tool_call_chunk"} for i, c in enumerate(calls)],
        chunk_position="last")


# The worker's side --------------------------------------------------------------------------


class ModelStep(ModelStepBase):
    """``<name>.model``: one chat model request, by the real model, streamed to followers."""

    owner: ClassVar[GraphOwner]
    call_type = ModelCall

    async def request(self, call: ModelCall, ctx: ToolContext) -> dict[str, Any]:
        kwargs = _keyed(call, ctx)
        model = call.model
        if self.owner.stream and _streams(model):
            result = await _streamed(call, kwargs, ctx)
        else:
            result = await model._agenerate(call.messages, stop=call.stop, **kwargs)
        for idx, gen in enumerate(result.generations):
            if gen.message.id is None:  # LangChain would draw a random one
                gen.message.id = f"lc_run--{ctx.key}-{idx}"
        return encode_result(result)


def _streams(model: BaseChatModel) -> bool:
    return type(model)._astream is not BaseChatModel._astream and \
        not getattr(model, "disable_streaming", False)


def _keyed(call: ModelCall, ctx: ToolContext) -> dict[str, Any]:
    """The request's options with, for LangChain's OpenAI models, the step's idempotency key
    as an ``Idempotency-Key`` header and its deadline as the client's timeout."""
    kwargs = dict(call.kwargs)
    if type(call.model).__module__.startswith("langchain_openai"):
        kwargs["extra_headers"] = {**(kwargs.get("extra_headers") or {}),
                                   "Idempotency-Key": ctx.key}
        kwargs["timeout"] = max(0.1, ctx.remaining())
    return kwargs


async def _streamed(call: ModelCall, kwargs: dict[str, Any], ctx: ToolContext) -> ChatResult:
    """Stream the request: each text delta is partial output (``{"delta": text}``) for the
    run's followers, each tool call's name and argument deltas too
    (``durable.streams.partials.tool_call_delta``); the whole reply is the step's result.
    A model that can report the stream's usage is asked to (``stream_usage``), so the
    "tokens" budget holds."""
    if "stream_usage" in type(call.model).model_fields and "stream_usage" not in kwargs:
        kwargs["stream_usage"] = True
    chunks: list[ChatGenerationChunk] = []
    async for chunk in call.model._astream(call.messages, stop=call.stop, **kwargs):
        chunks.append(chunk)
        text = str(chunk.text)  # LangChain's text accessor, a ``str`` subclass
        if text:
            ctx.emit({"delta": text})
        for part in getattr(chunk.message, "tool_call_chunks", None) or ():
            ctx.emit(tool_call_delta(int(part.get("index") or 0), call_id=part.get("id"),
                                     name=part.get("name"), args=part.get("args") or ""))
    if not chunks:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=""))])
    return generate_from_stream(iter(chunks))
