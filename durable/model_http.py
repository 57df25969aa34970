"""The HTTP of the model step (``durable.models``): what it reads of a reply (a completion,
a stream of server-sent events) and the errors a reply raises.

httpx is imported by the first request, not by this module: with rich and click installed
httpx imports its own command line too, a tenth of a second of every worker's start.
"""

from __future__ import annotations

import json
import math
import time
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from durable.agents import ToolContext
from durable.errors import DurableError, RateLimited
from durable.streams.partials import tool_call_delta

if TYPE_CHECKING:
    import httpx

__all__ = ["ModelError", "ModelUnavailable", "check", "retry_after", "streamed"]


class ModelUnavailable(DurableError):
    """The model did not answer (429, 5xx, 408 past the deadline, connection error, lost
    reply). A completion changes nothing: retryable. ``retry_after_s``: when the server
    said when to ask again (``Retry-After`` of a 429 or 503)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ModelError(DurableError):
    """The request was refused for good (400, 401, 404...) or the reply is not a chat
    completion. Not retried: the step fails."""


# The replies ------------------------------------------------------------------------------


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """A ``Retry-After`` header in seconds from now: delay-seconds or an HTTP date (RFC
    9110, 10.2.3); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when - (time.time() if now is None else now)
    return max(0.0, seconds) if math.isfinite(seconds) else None


def check(resp: httpx.Response) -> None:
    """Raise what a reply other than a 200 says: ``RateLimited`` (a 429 saying when, in
    seconds), ``ModelUnavailable`` (retryable) or ``ModelError``."""
    if resp.status_code == 200:
        return
    text = resp.text[:300]
    after = resp.headers.get("retry-after", "")
    if resp.status_code == 429 and after.replace(".", "", 1).isdigit():
        # The fleet waits as the provider asks, and its limits lower their rate.
        raise RateLimited(float(after), f"model answered 429: {text}")
    if resp.status_code in (408, 409, 429) or resp.status_code >= 500:
        after = retry_after(resp.headers.get("retry-after")) \
            if resp.status_code in (429, 503) else None
        raise ModelUnavailable(f"model answered {resp.status_code}: {text}", after)
    raise ModelError(f"model refused the request ({resp.status_code}): {text}")


async def streamed(http: httpx.AsyncClient, url: str, body: dict[str, Any],
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
            check(resp)
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
                    ctx.emit(tool_call_delta(int(tc.get("index", 0)), call_id=tc.get("id"),
                                             name=fn.get("name"),
                                             args=fn.get("arguments") or ""))
                finish = choice.get("finish_reason") or finish
    if not done:
        raise ModelUnavailable("the stream ended before [DONE]: the reply was lost")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(parts) if parts else None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {"id": meta.get("id"), "model": meta.get("model"), "usage": usage,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
