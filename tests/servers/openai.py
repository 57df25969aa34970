"""A local OpenAI-compatible HTTP server (``POST /v1/chat/completions``, plain and streamed)
whose replies are scripted from the conversation, for the OpenAI Agents SDK tests.

It records every request it receives with its ``Idempotency-Key`` header: a model request
sent twice shows. Like OpenAI, vLLM, LiteLLM or Ollama, a streamed reply ends with its usage
only when the request asks for it (``stream_options.include_usage``); a plain reply always
carries it. The script picks the reply by the agent's instructions (the system
message) and by the tool results already in the conversation.
"""

from __future__ import annotations

import ast
import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from durable.log.events import ActionSucceeded


def _tool_results(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m.get("content")) for m in messages if m.get("role") == "tool"]


def _data(text: str) -> Any:
    """A tool's result as the SDK told it to the model: JSON, or a dict's ``str``."""
    try:
        return json.loads(text)
    except ValueError:
        return ast.literal_eval(text)


def _call(num: int, name: str, **args: Any) -> dict[str, Any]:
    return {"id": f"call_{num}_{name}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}


def script(body: dict[str, Any]) -> dict[str, Any]:
    """The assistant message answering ``body``: ``{"content"}`` or ``{"tool_calls"}``."""
    messages = body.get("messages") or []
    system = next((str(m.get("content")) for m in messages if m.get("role") == "system"), "")
    results = _tool_results(messages)
    if system.startswith("triage"):  # hands every request to the booker
        return {"tool_calls": [_call(0, "transfer_to_booker")]}
    if system.startswith("booker"):
        booked = [r for r in results if "slot" in r]
        if not booked:
            return {"tool_calls": [_call(1, "book", slot=1)]}
        if len(booked) == 1:
            return {"tool_calls": [_call(2, "book", slot=2), _call(3, "note", text="two")]}
        return {"content": "booked: " + ", ".join(_data(r)["done"] for r in booked)}
    if system.startswith("gate"):  # hands the traveler to boarding
        return {"tool_calls": [_call(0, "transfer_to_boarding")]}
    if system.startswith("boarding"):  # the first tool result is the handoff's
        if len(results) < 2:
            return {"tool_calls": [_call(1, "board")]}
        try:
            return {"content": "boarded: " + _data(results[1])["done"]}
        except (ValueError, SyntaxError, KeyError, TypeError):
            return {"content": "not boarded: " + results[1]}
    if system.startswith("lossy"):
        if not results:
            return {"tool_calls": [_call(1, "lossy_book", slot=1)]}
        return {"content": "booked: " + _data(results[0])["done"]}
    if system.startswith("small_refunder"):  # a small refund, then a large one
        if len(results) < 2:
            cents = 50 if not results else 500
            return {"tool_calls": [_call(len(results) + 1, "small_refund", order="A1",
                                         cents=cents)]}
        return {"content": "refunded: " + ", ".join(_data(r)["done"] for r in results)}
    if system.startswith("refunder"):
        if not results:
            return {"tool_calls": [_call(1, "refund", order="A1", cents=500)]}
        if "not approved" in results[0]:
            return {"content": "not refunded: " + results[0]}
        return {"content": "refunded: " + _data(results[0])["done"]}
    if system.startswith("counter"):  # one tool turn per count, then the total
        turns = int(system.split()[1])
        if len(results) < turns:
            return {"tool_calls": [_call(len(results) + 1, "tick", n=len(results) + 1)]}
        return {"content": f"counted {len(results)}"}
    if system.startswith("mcp_applier"):  # an MCP server's apply, one per turn, then peek
        turns = int(system.split()[1])
        if len(results) < turns:
            return {"tool_calls": [_call(len(results) + 1, "apply", n=len(results) + 1)]}
        if len(results) == turns:
            return {"tool_calls": [_call(turns + 1, "peek")]}
        return {"content": f"applied {turns}, peeked {results[-1]}"}
    if system.startswith("manager"):
        if not results:
            return {"tool_calls": [_call(1, "tell_story", input="a story")]}
        return {"content": "the story: " + results[0]}
    if system.startswith("reader"):  # one read_page call per user turn, then the count
        turns = sum(1 for m in messages if m.get("role") == "user")
        last = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        if not _tool_results(messages[last:]):
            return {"tool_calls": [_call(turns, "read_page", n=turns)]}
        seen = sum(len(str(m.get("content") or "")) for m in messages)
        return {"content": f"read {len(results)} pages in {turns} turns, {seen} chars seen"}
    if system.startswith("echo"):  # the last user message, said back
        said = [str(m.get("content")) for m in messages if m.get("role") == "user"]
        return {"content": f"echo {said[-1] if said else ''}"}
    if system.startswith("storyteller"):
        return {"content": " ".join(f"word{i}" for i in range(40))}
    return {"content": "hello"}


class OpenAIServer:
    """The server on a random local port, serving from a daemon thread."""

    def __init__(self, port: int = 0) -> None:
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        #: Seconds each streamed delta waits before it is sent (a slow model).
        self.delta_delay_s = 0.0
        #: HTTP statuses the next requests get instead of an answer (a faulty provider).
        self.faults: list[int] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append({"key": self.headers.get("Idempotency-Key"),
                                            "stream": bool(body.get("stream")), "body": body,
                                            "at": time.time()})
                with server.lock:
                    fault = server.faults.pop(0) if server.faults else None
                if fault is not None:
                    self._send(fault, {"error": {"message": f"injected {fault}",
                                                 "type": "server_error", "code": None}})
                    return
                reply = script(body)
                if body.get("stream"):
                    self._stream(reply, bool((body.get("stream_options") or {})
                                             .get("include_usage")))
                else:
                    self._send(200, completion(reply))

            def _send(self, status: int, data: dict[str, Any]) -> None:
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _stream(self, reply: dict[str, Any], include_usage: bool) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for chunk in chunks(reply, include_usage):
                    if server.delta_delay_s and chunk["choices"]:
                        time.sleep(server.delta_delay_s)
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self) -> OpenAIServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.faults.clear()
        self.delta_delay_s = 0.0

    def counts(self, prefix: str) -> dict[str, int]:
        """Requests received per idempotency key, for the keys of runs starting ``prefix``."""
        with self.lock:
            return dict(Counter(r["key"] for r in self.requests
                                if str(r["key"]).startswith(prefix)))


USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


def completion(reply: dict[str, Any]) -> dict[str, Any]:
    message = {"role": "assistant", "content": reply.get("content")}
    if "tool_calls" in reply:
        message["tool_calls"] = reply["tool_calls"]
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()),
            "model": "scripted", "usage": USAGE,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if "tool_calls" in reply else "stop"}]}


#: How many characters of a tool call's arguments one streamed chunk carries.
ARGS_PIECE = 8


def chunks(reply: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """The reply as stream chunks: its text word by word, each tool call as its id and name,
    then its arguments ``ARGS_PIECE`` characters at a time; then, when the request asked for
    it, a chunk with the usage."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "chatcmpl-1", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": "scripted",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    text = reply.get("content") or ""
    words = text.split(" ")
    for i, word in enumerate(words):
        out.append(chunk({"content": word if i == 0 else " " + word}))
    for i, call in enumerate(reply.get("tool_calls") or ()):
        args = call["function"]["arguments"]
        head = {**call, "function": {"name": call["function"]["name"], "arguments": ""}}
        out.append(chunk({"tool_calls": [{"index": i, **head}]}))
        for at in range(0, len(args), ARGS_PIECE):
            out.append(chunk({"tool_calls": [
                {"index": i, "function": {"arguments": args[at:at + ARGS_PIECE]}}]}))
    out.append(chunk({}, "tool_calls" if reply.get("tool_calls") else "stop"))
    if not include_usage:
        return out
    out.append({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": "scripted", "choices": [],
                "usage": USAGE})
    return out


def resent_after_recorded(client: Any, run: str, server: OpenAIServer) -> list[str]:
    """The model requests of ``run`` that arrived after their step's reply was recorded: a
    recorded request sent again. (A request in flight, not recorded, may be sent again after
    a crash: that is the contract of an effect-free step.)"""
    recorded = {e.event.step: e.event.ts / 1000 for e in client.events(run)
                if isinstance(e.event, ActionSucceeded)}
    resent = []
    for request in list(server.requests):
        run_id, _, step = str(request["key"]).rpartition(":")
        if run_id == run and int(step) in recorded and request["at"] > recorded[int(step)]:
            resent.append(request["key"])
    return resent



if __name__ == "__main__":  # a server of its own: ``python -m tests.servers.openai PORT``
    import sys

    OpenAIServer(int(sys.argv[1])).httpd.serve_forever()
