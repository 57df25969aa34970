"""The HTTP of the model step (``durable.models``): the clients it sends requests with, what
it reads of a reply (a completion, a stream of server-sent events) and the errors a reply
raises.

One client per event loop and base URL, kept across calls (``client_for``): a request goes
out on a connection the last one left open, and the client's SSL context is built once.
Made for each call, a client cost 30-60 ms of CPU (its SSL context, for an ``http://`` URL
too) and a new connection: most of what a worker spent on a model call and its tool step.
A client belongs to the loop it was made on (its connections are that loop's): it is closed
when that loop shuts down (``durable.eventloop.at_loop_close``: the end of ``asyncio.run``;
the process's loop at a worker's shutdown). What the client reads from the environment
(proxies, ``SSL_CERT_FILE``) is read when it is made; each request gives its own timeout.

httpx is imported by the first request, not by this module: with rich and click installed
httpx imports its own command line too, a tenth of a second of every worker's start.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import time
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from durable.agents import ToolContext
from durable.errors import DurableError, RateLimited
from durable.eventloop import at_loop_close
from durable.streams.partials import tool_call_delta

if TYPE_CHECKING:
    import httpx

__all__ = ["KEEPALIVE", "ModelError", "ModelUnavailable", "check", "client_for", "retry_after",
           "streamed"]

#: Idle connections a client keeps open for the next requests. The connections in use are
#: not capped here: the fleet's ``model`` limit (``DURABLE_MODEL_IN_FLIGHT``) is the cap.
KEEPALIVE = 100


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


# The clients ------------------------------------------------------------------------------

#: The clients of each event loop, by base URL.
_CLIENTS: dict[asyncio.AbstractEventLoop, dict[str, httpx.AsyncClient]] = {}


async def client_for(base_url: str) -> httpx.AsyncClient:
    """The running loop's client for ``base_url``, made by the loop's first request there."""
    loop = asyncio.get_running_loop()
    clients = _CLIENTS.get(loop)
    if clients is None:
        for old in [old for old in list(_CLIENTS) if old.is_closed()]:
            _CLIENTS.pop(old, None)  # closed without shutting down: nothing left to close
        clients = _CLIENTS[loop] = {}
        await at_loop_close(functools.partial(_close, loop))
    http = clients.get(base_url)
    if http is None or http.is_closed:
        import httpx

        http = clients[base_url] = httpx.AsyncClient(limits=httpx.Limits(
            max_connections=None, max_keepalive_connections=KEEPALIVE))
    return http


async def _close(loop: asyncio.AbstractEventLoop) -> None:
    for http in _CLIENTS.pop(loop, {}).values():
        await http.aclose()


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
                   headers: dict[str, str], timeout: httpx.Timeout,
                   ctx: ToolContext) -> dict[str, Any]:
    """Read a streamed completion (SSE), emitting content deltas; returns it assembled in
    the shape of a non-streamed one."""
    parts: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish: str | None = None
    usage: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    async with http.stream("POST", url, json=body, headers=headers, timeout=timeout) as resp:
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
