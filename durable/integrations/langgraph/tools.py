"""LangChain tool calls inside a durable LangGraph run: the function's side (any LangChain
tool a node runs, a prebuilt ``ToolNode``'s included, whose call takes the step
``<name>.tool.<tool>``), the worker's side (the step tool that runs the tool itself and asks
its ``lookup`` after a crash), and the JSON a call's output is recorded as.

As for the chat models (``durable.integrations.langgraph.model``), the function's side is
the one place every tool's ``invoke`` and ``ainvoke`` go through, ``BaseTool.arun`` (and
``run``), replaced once per process (``install``) by a version that, inside a durable run
only, takes a step; the tool's callbacks fire in the step. A tool the ``DurableGraph`` was
not told of (neither a ``ToolNode``'s nor named in its ``tools=``) is refused inside a
durable run (``UsageError``: the run is quarantined, naming it, for its code to be fixed):
its effect would run again on every recovery.

A call is named by the LangGraph task that makes it (``binding.current_task``), the task's attempt
and how many equal calls the attempt made before it: a task that runs again (after an
interrupt's answer, after a crash) finds each call's recorded outcome. A tool's output that
JSON cannot carry (a ``Command``: ``Command(graph=Command.PARENT, update=...)`` from a
subgraph's tool, say) is recorded with LangGraph's serializer and given back as it was.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from durable.agents import Lookup, Tool, ToolContext
from durable.call_identity import args_digest
from durable.code import StepFailed
from durable.errors import UsageError
from durable.integrations.base import StepOptions, jsonable, recorded_lookup, run_in_step, stable
from durable.integrations.langgraph import records as rec
from durable.integrations.langgraph.binding import Binding, bound_run, current_task
from durable.integrations.langgraph.run import GraphOwner

__all__ = ["ToolCall", "ToolStep", "decode_output", "encode_output", "install"]

#: What the model is told of a call whose approval was rejected.
REJECTED = "Tool call was not approved"

#: LangGraph's own serializer, for a tool's output JSON cannot carry.
_SERDE = JsonPlusSerializer()


# The JSON of a tool step --------------------------------------------------------------------


def text_of(value: Any) -> Any:
    """A tool's return as LangChain tells it to the model: text (or content blocks) as it
    is, anything else as JSON text."""
    if isinstance(value, str) or (isinstance(value, list) and
                                  all(isinstance(v, str | dict) for v in value)):
        return value
    try:
        return json.dumps(jsonable(value), ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def encode_output(output: Any) -> dict[str, Any]:
    """A tool's output as recorded: the ``ToolMessage``'s content, status and artifact; the
    tool's return when it is JSON data (it was called without a call id); anything else (a
    ``Command``) with LangGraph's serializer (``typed``), shown beside it as JSON."""
    if isinstance(output, ToolMessage):
        return {"content": jsonable(output.content), "status": output.status,
                "artifact": jsonable(output.artifact)}
    shown = jsonable(output)
    if output is None or isinstance(output, str | int | float | bool) or (
            type(output) in (dict, list) and shown == output):
        return {"return": shown}
    return {"return": shown, "typed": rec.to_json(rec.dump(_SERDE, output))}


def decode_output(data: Any, call_id: str | None, name: str) -> Any:
    """The recorded output as the caller gets it: a ``ToolMessage`` for a tool call, the
    object itself for what was recorded with LangGraph's serializer."""
    if not isinstance(data, dict) or not ("content" in data or "return" in data):
        raise TypeError(f"a tool step recorded {str(data)[:200]!r}")
    if "typed" in data:
        return rec.load(_SERDE, rec.from_json(data["typed"]))
    if call_id is None:
        return data["return"] if "return" in data else data["content"]
    content = text_of(data["return"]) if "return" in data else data["content"]
    return ToolMessage(content=content, tool_call_id=call_id, name=name,
                       status=data.get("status") or "success", artifact=data.get("artifact"))


# The function's side ------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """The live call a tool step makes: handed from the function to the step tool."""

    tool: BaseTool
    input: str | dict[str, Any]
    call_id: str | None
    config: Any
    kwargs: dict[str, Any]


def _call_args(b: Binding, tool: BaseTool, tool_input: str | dict[str, Any],
               call_id: str | None) -> dict[str, Any]:
    """A call's identity: the task that makes it, its attempt, its call id and its input
    without injected arguments (the graph's state, a runtime: not the model's to choose,
    and not stable), and how many equal calls the attempt made before it."""
    shown: Any = tool_input
    if isinstance(tool_input, dict):
        filtered = getattr(tool, "_filter_injected_args", None)
        shown = filtered(tool_input) if callable(filtered) else tool_input
    named: dict[str, Any] = stable({"call_id": call_id, "input": shown})
    task = current_task()
    n = b.place(task.id, str(task.attempt), tool.name, args_digest(named))
    return {"task": task.id, "attempt": task.attempt, "n": n, **named}


def _step_of(b: Binding, tool: BaseTool) -> str:
    step = b.owner.tool_step(tool.name)
    if step is None:
        raise UsageError(f"DurableGraph({b.owner.name!r}): the tool {tool.name!r} is not one of "
                         "its steps; list it in tools= (or in a ToolNode of the graph)")
    return step


async def _take(b: Binding, tool: BaseTool, call: ToolCall) -> Any:
    step = _step_of(b, tool)
    try:
        out = await b.take(step, _call_args(b, tool, call.input, call.call_id), call)
    except StepFailed as exc:
        if exc.status != "rejected":
            raise
        out = {"content": f"{REJECTED}: {exc.error}", "status": "error"}
    return decode_output(out, call.call_id, tool.name)


_originals: dict[str, Callable[..., Any]] = {}


def install() -> None:
    """Make every LangChain tool's call a step inside a durable run (once per process)."""
    if _originals:
        return
    _originals["async"] = BaseTool.arun
    _originals["sync"] = BaseTool.run
    _originals["structured"] = StructuredTool.ainvoke

    async def ainvoke(self: StructuredTool, input: Any, config: Any = None,
                      **kwargs: Any) -> Any:
        if bound_run() is None:
            return await _originals["structured"](self, input, config, **kwargs)
        # A synchronous tool's call would take its step from a thread LangChain runs it
        # on, at a moment no replay can reproduce: it is taken here, and run on a thread
        # by the step.
        return await BaseTool.ainvoke(self, input, config, **kwargs)

    async def arun(self: BaseTool, tool_input: str | dict[str, Any], *args: Any,
                   config: Any = None, tool_call_id: str | None = None, **kwargs: Any) -> Any:
        b = bound_run()
        if b is None or args:
            return await _originals["async"](self, tool_input, *args, config=config,
                                             tool_call_id=tool_call_id, **kwargs)
        return await _take(b, self, ToolCall(self, tool_input, tool_call_id, config, kwargs))

    def run(self: BaseTool, tool_input: str | dict[str, Any], *args: Any,
            config: Any = None, tool_call_id: str | None = None, **kwargs: Any) -> Any:
        b = bound_run()
        if b is None or args:
            return _originals["sync"](self, tool_input, *args, config=config,
                                      tool_call_id=tool_call_id, **kwargs)
        call = ToolCall(self, tool_input, tool_call_id, config, kwargs)
        step = _step_of(b, self)
        try:
            out = b.take_blocking(step, _call_args(b, self, tool_input, tool_call_id), call)
        except StepFailed as exc:
            if exc.status != "rejected":
                raise
            out = {"content": f"{REJECTED}: {exc.error}", "status": "error"}
        return decode_output(out, tool_call_id, self.name)

    StructuredTool.ainvoke = ainvoke  # type: ignore[method-assign]
    BaseTool.arun = arun  # type: ignore[method-assign]
    BaseTool.run = run  # type: ignore[method-assign]


# The worker's side --------------------------------------------------------------------------


class ToolStep(Tool):
    """``<name>.tool.<tool>``: one call of a LangChain tool, by the tool itself (its own
    error handling included: an error it turns into a message for the model is recorded as
    that message)."""

    owner: ClassVar[GraphOwner]
    options: ClassVar[StepOptions]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        call = self.owner.handed(ctx, self.name, args, ToolCall)

        async def invoke() -> dict[str, Any]:
            out = await _originals["async"](call.tool, call.input, config=call.config,
                                            tool_call_id=call.call_id, **call.kwargs)
            return encode_output(out)

        return await run_in_step(invoke, ctx)

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup | Awaitable[Lookup]:
        given = args.get("input")
        return recorded_lookup(self.options.lookup, key,
                               given if isinstance(given, dict) else {"input": given},
                               lambda found: {"return": jsonable(found)})
