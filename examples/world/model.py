"""The world's model: scripted, OpenAI-compatible chat completions (no randomness).

``POST /v1/chat/completions`` answers from the conversation alone, so the same request
always gets the same reply, and a test knows in advance what the model will ask for. The
script reads the number of tool results so far (``role: "tool"`` messages) and the first
user message (the task; its first e-mail address is the recipient):

0. no tool result yet: ask to call ``notify`` with ``{"recipient", "message"}``;
1. one: ask to call ``write`` with ``{"source": "assistant", "summary": {...}}`` (the
   notification's id in it);
2. two or more: answer in text, citing the notification and the report.

A step whose tool is not among the request's ``tools`` is skipped (no tools: a text answer
at once). Usage is counted in words: ``prompt_tokens`` are the request's, and
``completion_tokens`` the reply's. With ``"stream": true`` the reply is sent as server-sent
events (``chat.completion.chunk`` objects, ``data: [DONE]`` last), with a usage chunk when
``stream_options.include_usage`` is set.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

#: The model names ``GET /v1/models`` lists (any name is accepted and echoed back).
MODELS = ("scripted",)

#: Who the script notifies when the task names no e-mail address.
DEFAULT_RECIPIENT = "ops@example.com"

_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _tool_result(message: dict[str, Any]) -> dict[str, Any]:
    try:
        value = json.loads(_text(message))
    except ValueError:
        return {"text": _text(message)}
    return value if isinstance(value, dict) else {"value": value}


def _words(text: str) -> int:
    return len(text.split())


def script(messages: list[dict[str, Any]], tool_names: set[str]) -> tuple[str | None,
                                                                           list[dict[str, Any]]]:
    """The scripted reply: ``(content, tool calls)``; each call ``{"name", "arguments"}``."""
    task = next((_text(m) for m in messages if m.get("role") == "user"), "")
    found = _EMAIL.search(task)
    recipient = found.group(0) if found else DEFAULT_RECIPIENT
    results = [_tool_result(m) for m in messages if m.get("role") == "tool"]
    if not results and "notify" in tool_names:
        return None, [{"name": "notify", "arguments": {
            "recipient": recipient, "message": task[:200] or "(no task given)"}}]
    if len(results) == 1 and "write" in tool_names:
        note = results[0]
        return None, [{"name": "write", "arguments": {"source": "assistant", "summary": {
            "count": 1, "total": 0.0, "recipient": recipient,
            "notification_id": note.get("notification_id"), "task": task[:200]}}}]
    if not results:
        return f"You asked: {task[:200]}. I have no tools to act on it.", []
    done = []
    for r in results:
        if "error" in r:
            done.append(f"a tool failed ({str(r['error'])[:100]})")
        elif "notification_id" in r:
            done.append(f"notified {r.get('recipient', recipient)} "
                        f"(notification #{r['notification_id']})")
        elif "report_id" in r:
            done.append(f"recorded report #{r['report_id']}")
        else:
            done.append("ran a tool")
    return "Done: " + ", then ".join(done) + ".", []


def completion(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion for a request body (the same body, the same reply)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) for m in messages):
        raise ValueError("'messages' must be a non-empty list of objects")
    tools = body.get("tools") or []
    names = {str((t.get("function") or {}).get("name")) for t in tools if isinstance(t, dict)}
    content, calls = script(messages, names)
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    n = sum(1 for m in messages if m.get("role") == "tool")
    tool_calls: list[dict[str, Any]] = [
        {"id": f"call_{n + 1}_{c['name']}", "type": "function", "function": {
            "name": c["name"], "arguments": json.dumps(c["arguments"], sort_keys=True)}}
        for c in calls]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    prompt = sum(_words(_text(m)) for m in messages) + 5 * len(tools)
    done = _words(content or "") + sum(_words(c["function"]["arguments"]) for c in tool_calls)
    return {
        "id": f"chatcmpl-{digest[:16]}", "object": "chat.completion", "created": 0,
        "model": str(body.get("model") or MODELS[0]),
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": done,
                  "total_tokens": prompt + done},
    }


def chunks(reply: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """The completion as ``chat.completion.chunk`` objects: a role delta, the content word
    by word, each tool call (its name, then its arguments in pieces), the finish reason,
    and the usage when asked for."""
    head = {"id": reply["id"], "object": "chat.completion.chunk", "created": 0,
            "model": reply["model"]}
    choice = reply["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": word}) for word in re.findall(r"\S+\s*", message["content"] or "")]
    for i, call in enumerate(message.get("tool_calls") or []):
        out.append(chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                          "function": {"name": call["function"]["name"],
                                                       "arguments": ""}}]}))
        args = call["function"]["arguments"]
        step = max(1, len(args) // 3)
        out += [chunk({"tool_calls": [{"index": i, "function": {"arguments": args[j:j + step]}}]})
                for j in range(0, len(args), step)]
    out.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        out.append({**head, "choices": [], "usage": reply["usage"]})
    return out
