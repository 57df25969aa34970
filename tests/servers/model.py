"""A local OpenAI-compatible model server for the model-step tests: real HTTP on a loopback
port, in a thread of the test process, counting every request it receives per
``Idempotency-Key`` (the worker processes reach it through ``DURABLE_MODEL_BASE_URL``).

What it answers is scripted per test: ``plan`` is a list of replies taken one per request
(then ``ok``): ``("ok",)``, ``("slow", seconds)`` (answer after ``seconds``, past the
caller's timeout), ``("status", code, retry_after)``. A streamed request (``"stream":
true``) gets ``tokens`` content deltas; after ``hold_after`` of them it waits until
``release`` is set, so a test can join a follower mid-stream.

It speaks HTTP/1.1: a client may keep its connection open and send its next request on it
(a streamed reply, which has no length, closes it), and ``connections`` counts the TCP
connections accepted (``closed``: those the client closed since), so a test sees whether
the calls reuse one, and whether it was closed.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Seen:
    """One request received."""

    key: str
    at: float
    body: dict[str, Any]
    reply: str


@dataclass
class ModelServer:
    plan: list[tuple[Any, ...]] = field(default_factory=list)
    tokens: int = 200
    #: The model its replies say they came from.
    model: str = "local"
    hold_after: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    #: Set once the stream has sent ``hold_after`` tokens and holds.
    holding: threading.Event = field(default_factory=threading.Event)
    seen: list[Seen] = field(default_factory=list)
    url: str = ""
    #: TCP connections accepted, and those of them closed since.
    connections: int = 0
    closed: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _http: ThreadingHTTPServer | None = None

    def start(self) -> ModelServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # A reply's headers and body are two writes: with Nagle's algorithm the body
            # waits for the client's delayed ACK of the headers (40 ms) on a kept connection.
            disable_nagle_algorithm = True

            def setup(self) -> None:
                super().setup()
                with server._lock:
                    server.connections += 1

            def finish(self) -> None:
                super().finish()
                with server._lock:
                    server.closed += 1

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                server._handle(self)

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}/v1"
        threading.Thread(target=self._http.serve_forever, daemon=True,
                         name="model-server").start()
        return self

    def stop(self) -> None:
        self.release.set()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()

    def requests(self, key: str) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.key == key]

    def _next(self) -> tuple[Any, ...]:
        with self._lock:
            return self.plan.pop(0) if self.plan else ("ok",)

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        length = int(req.headers.get("Content-Length") or 0)
        body = json.loads(req.rfile.read(length) or b"{}")
        reply = self._next()
        with self._lock:
            self.seen.append(Seen(req.headers.get("Idempotency-Key") or "", time.time(),
                                  body, reply[0]))
        try:
            if reply[0] == "status":
                data = json.dumps({"error": {"message": f"scripted {reply[1]}"}}).encode()
                req.send_response(int(reply[1]))
                if reply[2] is not None:
                    req.send_header("Retry-After", str(reply[2]))
                req.send_header("Content-Type", "application/json")
                req.send_header("Content-Length", str(len(data)))
                req.end_headers()
                req.wfile.write(data)
                return
            if reply[0] == "slow":
                time.sleep(float(reply[1]))
            if body.get("stream"):
                self._stream(req)
                return
            data = json.dumps(_completion(_text(self.tokens), self.tokens, self.model)).encode()
            req.send_response(200)
            req.send_header("Content-Type", "application/json")
            req.send_header("Content-Length", str(len(data)))
            req.end_headers()
            req.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the caller gave up (its timeout): the request was still received

    def _stream(self, req: BaseHTTPRequestHandler) -> None:
        req.send_response(200)
        req.send_header("Content-Type", "text/event-stream")
        req.send_header("Connection", "close")  # the end of the reply is the end of the stream
        req.close_connection = True
        req.end_headers()

        def send(chunk: Any) -> None:
            payload = chunk if isinstance(chunk, str) else json.dumps(chunk)
            req.wfile.write(f"data: {payload}\n\n".encode())
            req.wfile.flush()

        for i in range(self.tokens):
            if self.hold_after and i == self.hold_after:
                self.holding.set()
                self.release.wait(30)
            send({"id": "c1", "model": self.model, "choices": [
                {"index": 0, "delta": {"content": _token(i)}, "finish_reason": None}]})
        send({"id": "c1", "model": self.model, "choices": [
            {"index": 0, "delta": {}, "finish_reason": "stop"}]})
        send({"id": "c1", "model": self.model, "choices": [], "usage": {
            "prompt_tokens": 5, "completion_tokens": self.tokens,
            "total_tokens": 5 + self.tokens}})
        send("[DONE]")


def _token(i: int) -> str:
    return f"t{i} "


def _text(n: int) -> str:
    return "".join(_token(i) for i in range(n))


def _completion(text: str, tokens: int, model: str = "local") -> dict[str, Any]:
    return {"id": "c1", "model": model, "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": tokens,
                      "total_tokens": 5 + tokens}}


def expected_text(n: int) -> str:
    """What the server's reply of ``n`` tokens says."""
    return _text(n)
