"""A local HTTP "provider" for flow-control tests and benchmarks, and the agents that call it.

``Provider`` is a real HTTP server on a random port that counts every request, enforces its
own quotas (requests per window, requests in flight, tokens per window) and answers 429
with ``Retry-After`` past them, as a model provider does. ``POST /call`` with JSON
``{"key", "tokens"}`` -> ``{"ok": true, "usage": {...}}`` after ``latency_s``; ``GET
/stats`` -> what it saw; ``POST /quota`` changes its quotas.

Importing this module (``DURABLE_AGENTS=durable.testing.provider``) also registers the
``provider_call`` and ``provider_model`` tools and the ``calls_provider`` and ``asks_model``
agents. Their limits are read from the environment at import, so a test sets them before
it starts its workers:

- ``PROVIDER_URL``: the provider's address;
- ``LIMIT_IN_FLIGHT``, ``LIMIT_RATE``, ``LIMIT_PER_S``, ``LIMIT_MARGIN_S``: the ``provider``
  limit of ``provider_call`` (keyed by its ``provider`` argument);
- ``LIMIT_TOKENS``: the ``tpm`` limit of ``provider_model`` (a model step);
- ``RUN_LIMIT_IN_FLIGHT``: runs of the ``per_owner`` agent in flight per owner (1).
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import BaseModel

from durable.agents import Lookup, Tool, ToolContext, register
from durable.code import RunContext, agent
from durable.errors import RateLimited
from durable.flow.limits import Limit


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # a fleet's calls at once are not refused at the socket
    daemon_threads = True
    #: Replies whose caller had gone (a SIGKILLed worker): counted, not printed.
    lost_replies = 0

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.lost_replies += 1


class Provider:
    def __init__(self, *, rate: int = 0, per_s: float = 1.0, in_flight: int = 0,
                 tokens: int = 0, latency_s: float = 0.05, retry_after_s: float = 1.0) -> None:
        self.quota = {"rate": rate, "per_s": per_s, "in_flight": in_flight, "tokens": tokens,
                      "retry_after_s": retry_after_s}
        self.latency_s = latency_s
        self.lock = threading.Lock()
        self.arrivals: deque[float] = deque()
        self.token_log: deque[tuple[float, int]] = deque()
        self.now_in_flight = 0
        self.stats: dict[str, Any] = {"requests": 0, "accepted": 0, "rejected": 0,
                                      "max_in_flight": 0, "max_in_window": 0,
                                      "max_tokens_in_window": 0, "keys": {}}
        #: (arrival s, tokens) of every accepted call: the test computes its own windows.
        self.accepted: list[tuple[float, int]] = []
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _reply(self, code: int, body: dict[str, Any],
                       headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                with provider.lock:
                    self._reply(200, dict(provider.stats))

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                if self.path == "/quota":
                    with provider.lock:
                        provider.quota.update(body)
                    self._reply(200, provider.quota)
                    return
                code, reply, headers = provider.call(body)
                self._reply(code, reply, headers)

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> Provider:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def call(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        tokens = int(body.get("tokens", 0))
        with self.lock:
            now = time.monotonic()
            q = self.quota
            st = self.stats
            st["requests"] += 1
            while self.arrivals and self.arrivals[0] <= now - q["per_s"]:
                self.arrivals.popleft()
            while self.token_log and self.token_log[0][0] <= now - q["per_s"]:
                self.token_log.popleft()
            in_window = sum(n for _, n in self.token_log)
            over = (q["rate"] and len(self.arrivals) >= q["rate"]) or \
                (q["in_flight"] and self.now_in_flight >= q["in_flight"]) or \
                (q["tokens"] and in_window + tokens > q["tokens"])
            if over:
                st["rejected"] += 1
                return 429, {"error": "rate limited"}, {"Retry-After": str(q["retry_after_s"])}
            self.arrivals.append(now)
            self.token_log.append((now, tokens))
            self.accepted.append((now, tokens))
            self.now_in_flight += 1
            st["accepted"] += 1
            st["max_in_flight"] = max(st["max_in_flight"], self.now_in_flight)
            st["max_in_window"] = max(st["max_in_window"], len(self.arrivals))
            st["max_tokens_in_window"] = max(st["max_tokens_in_window"], in_window + tokens)
            key = str(body.get("key", ""))
            st["keys"][key] = st["keys"].get(key, 0) + 1
        try:
            time.sleep(self.latency_s)
        finally:
            with self.lock:
                self.now_in_flight -= 1
        return 200, {"ok": True, "usage": {"total_tokens": tokens}}, {}


def _env(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _post(body: dict[str, Any], timeout: float) -> Any:
    req = urllib.request.Request(os.environ["PROVIDER_URL"] + "/call",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 429:
            raise RateLimited(float(exc.headers.get("Retry-After", "1")), "provider") from None
        raise


_PER_S = _env("LIMIT_PER_S", 1.0)
_MARGIN_S = _env("LIMIT_MARGIN_S", 0.25)


@register
class ProviderCall(Tool):
    """One request to the provider; nothing changes there but its counts (a model call)."""

    name = "provider_call"
    timeout_s = 3.0
    effect_free = True
    limits = (Limit("provider", key="{args.provider}", in_flight=int(_env("LIMIT_IN_FLIGHT", 0)),
                    rate=int(_env("LIMIT_RATE", 0)), per_s=_PER_S, margin_s=_MARGIN_S),) \
        if _env("LIMIT_IN_FLIGHT", 0) or _env("LIMIT_RATE", 0) else ()

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return _post({"key": ctx.key}, self.timeout_s)

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


@register
class ProviderModel(Tool):
    """A model step: reserves its estimate against the token limit, settles its usage."""

    name = "provider_model"
    timeout_s = 3.0
    effect_free = True
    model = True
    limits = (Limit("tpm", key="{args.provider}", tokens=int(_env("LIMIT_TOKENS", 0)),
                    per_s=_PER_S, margin_s=_MARGIN_S),) if _env("LIMIT_TOKENS", 0) else ()

    def estimate_tokens(self, args: dict[str, Any]) -> int:
        return int(args.get("max_tokens", 0))

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return _post({"key": ctx.key, "tokens": int(args["tokens"])}, self.timeout_s)


class CallsInput(BaseModel):
    calls: int = 1


class ModelInput(BaseModel):
    tokens: int = 1000


@agent(input_model=CallsInput, tools=("provider_call",))
def calls_provider(ctx: RunContext, inp: CallsInput) -> dict[str, Any]:
    """``calls`` requests to the provider, one after the other."""
    for _ in range(inp.calls):
        ctx.call("provider_call", {"provider": "p1"})
    return {"calls": inp.calls}


@agent(input_model=ModelInput, tools=("provider_model",))
def asks_model(ctx: RunContext, inp: ModelInput) -> dict[str, Any]:
    """One model step of known usage."""
    reply = ctx.call("provider_model", {"provider": "p1", "tokens": inp.tokens,
                                        "max_tokens": inp.tokens})
    return {"usage": reply["usage"]}


class FanInput(BaseModel):
    calls: int = 3


@agent(input_model=FanInput, tools=("provider_call",))
def fans_provider(ctx: RunContext, inp: FanInput) -> dict[str, Any]:
    """``calls`` requests to the provider at once (a parallel group)."""
    ctx.parallel([("provider_call", {"provider": "p1", "n": n}) for n in range(inp.calls)])
    return {"calls": inp.calls}


@agent(input_model=CallsInput, tools=("provider_call",),
       run_limits=(Limit("per-owner", key="{owner}",
                         in_flight=int(_env("RUN_LIMIT_IN_FLIGHT", 1))),))
def per_owner(ctx: RunContext, inp: CallsInput) -> dict[str, Any]:
    """``calls`` requests one after the other; at most ``RUN_LIMIT_IN_FLIGHT`` runs of
    one owner in flight at once."""
    for _ in range(inp.calls):
        ctx.call("provider_call", {"provider": "p1"})
    return {"calls": inp.calls}
