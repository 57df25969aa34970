"""Function tool calls inside a durable OpenAI Agents SDK run: the function's side (the
function tools of the clone, whose ``on_invoke_tool`` takes the step ``<name>.tool.<tool>``),
the worker's side (the step tool that calls the tool itself, and asks its ``lookup`` after a
crash), and the JSON a call's return is recorded as; and a ``DurableAgent`` as a tool of
another one, each call a child run (``child_tool``).

A child tool: the SDK's own ``agent.as_tool()`` runs the other agent inside the tool call,
one step of the caller's run. A child tool instead starts the other ``DurableAgent`` as a run
of its own (``durable.controls.children``; its id derived from the caller's run and step, so
a caller executed again starts it once), with its own log, steps, budgets and followers; the
caller waits for it holding no worker, and the child's final output is the tool's result. A
child that fails, is canceled or expires is told to the model as the tool's result.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from agents import Agent, Runner
from agents.tool import (
    DEFAULT_APPROVAL_REJECTION_MESSAGE,
    FunctionTool,
    maybe_invoke_function_tool_failure_error_function,
)
from agents.tool_context import ToolContext as SdkToolContext

from durable.agents import Lookup, OutcomeUnknown, Tool, ToolContext
from durable.code import StepFailed
from durable.code.steps import ChildFailed
from durable.integrations.base import (
    StepOptions,
    jsonable,
    make_step,
    recorded_lookup,
    run_in_step,
    stable,
)
from durable.integrations.openai_agents.run import AgentOwner, bound

# The JSON of a tool step --------------------------------------------------------------------


def encode_output(value: Any) -> dict[str, Any]:
    """A function tool's return as recorded: JSON data as it is, anything else as its ``str``
    (what the SDK tells the model of it)."""
    if isinstance(value, str | int | float | bool | type(None) | list | dict):
        return {"return": jsonable(value)}
    return {"text": str(value)}


def decode_output(data: Any) -> Any:
    if isinstance(data, dict) and "return" in data:
        return data["return"]
    if isinstance(data, dict) and "text" in data:
        return str(data["text"])
    raise TypeError(f"a tool step recorded {str(data)[:200]!r}")


# The function's side ------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """The live call a function tool step makes: handed from the function to the step tool."""

    tool: FunctionTool
    context: SdkToolContext[Any]
    arguments: str


def durable_function_tool(owner: AgentOwner, tool: FunctionTool, opts: StepOptions
                          ) -> tuple[list[Tool], FunctionTool]:
    """``tool`` inside ``owner``'s durable run: its step tools (``<name>.tool.<tool>``, and
    ``<name>.tool.<tool>.approval`` for the calls a callable ``needs_approval`` approves of)
    and the tool the clone lists, whose call takes the step."""
    needs = tool.needs_approval if opts.requires_approval is None else opts.requires_approval
    step = f"{owner.name}.tool.{tool.name}"
    approval = f"{step}.approval" if callable(needs) else None
    if not opts.step:
        raise ValueError(f"DurableAgent({owner.name!r}): StepOptions(step=False) for "
                         f"{tool.name!r}: every function tool of a DurableAgent is a step")
    base = opts.step_attrs(tool.timeout_seconds)
    made = [make_step(FunctionStep, step, owner=owner, **base, requires_approval=needs is True)]
    if approval is not None:
        made.append(make_step(FunctionStep, approval, owner=owner, **base,
                              requires_approval=True))

    async def invoke(tctx: SdkToolContext[Any], arguments: str) -> Any:
        b = bound(owner)
        if b is None:
            return await tool.on_invoke_tool(tctx, arguments)
        parsed = _parsed(arguments)
        name = step
        if approval is not None and callable(needs) and \
                await needs(tctx, parsed if isinstance(parsed, dict) else {},
                            tctx.tool_call_id):
            name = approval
        args = stable({"call_id": tctx.tool_call_id, "arguments": parsed})
        try:
            out = await b.step(name, args, ToolCall(tool, tctx, arguments))
        except StepFailed as exc:
            if exc.status == "rejected":
                return f"{DEFAULT_APPROVAL_REJECTION_MESSAGE} ({exc.error})"
            raise
        return decode_output(out)

    # This system asks for the approval: the SDK is told the call needs none.
    return made, dataclasses.replace(tool, on_invoke_tool=invoke, needs_approval=False,
                                     timeout_seconds=None)


def _parsed(arguments: str) -> Any:
    try:
        return json.loads(arguments) if arguments else {}
    except ValueError:
        return arguments  # the tool's own validation tells the model


# The worker's side --------------------------------------------------------------------------


class FunctionStep(Tool):
    """``<name>.tool.<tool>``: one call of a function tool, by the tool itself (its own error
    handling included: an exception it turns into a message for the model is recorded as
    that message, except ``OutcomeUnknown`` and the step's ``retryable``, see ``_invoke``)."""

    owner: ClassVar[AgentOwner]
    options: ClassVar[StepOptions]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        call = self.owner.handed(ctx, self.name, args, ToolCall)

        async def invoke() -> dict[str, Any]:
            return encode_output(await _invoke(call, self.retryable))

        return await run_in_step(invoke, ctx)

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup | Awaitable[Lookup]:
        arguments = args.get("arguments")
        return recorded_lookup(self.options.lookup, key,
                               arguments if isinstance(arguments, dict) else {}, encode_output)


async def _invoke(call: ToolCall, retryable: tuple[type[BaseException], ...]) -> Any:
    """The tool's own call, with the SDK's error handling (an exception told to the model as
    a message) except for what this system must see: ``OutcomeUnknown`` (the effect may have
    happened: resolved by ``lookup``, never told to the model as a failure it would retry
    under a new key) and the step's ``retryable`` exceptions (retried with the same key)."""
    invoker = call.tool.on_invoke_tool
    impl = getattr(invoker, "_invoke_tool_impl", None)
    if impl is None:  # not the SDK's failure-handling wrapper: the tool as it is
        return await invoker(call.context, call.arguments)
    passthrough: tuple[type[BaseException], ...] = (OutcomeUnknown, *retryable)
    try:
        return await impl(call.context, call.arguments)
    except passthrough:
        raise
    except Exception as exc:
        tool = getattr(invoker, "_function_tool", None) or call.tool
        message = await maybe_invoke_function_tool_failure_error_function(
            function_tool=tool, context=call.context, error=exc)
        if message is None:
            raise
        handled = getattr(invoker, "_on_handled_error", None)
        if callable(handled):
            handled(tool, exc, call.arguments, call.context)
        return message


# A DurableAgent as a tool, each call a child run --------------------------------------------


#: The attribute of a child tool naming the ``DurableAgent`` it runs.
CHILD_MARK = "_durable_child"

CHILD_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["input"],
    "properties": {"input": {"type": "string", "description": "What the agent is asked."}}}


class ChildAgent(Protocol):
    """What a child tool knows of the ``DurableAgent`` it runs (and of its caller)."""

    @property
    def name(self) -> str: ...

    @property
    def root(self) -> Agent[Any]: ...

    @property
    def max_turns(self) -> int: ...


def child_tool(agent: ChildAgent, name: str | None, description: str | None) -> FunctionTool:
    """The tool a caller's agent lists; outside a durable run it runs the agent directly."""

    async def direct(tctx: SdkToolContext[Any], arguments: str) -> Any:
        result = await Runner.run(agent.root, _child_input(arguments), max_turns=agent.max_turns)
        return jsonable(result.final_output)

    tool = FunctionTool(
        name=name or agent.name, params_json_schema=CHILD_SCHEMA, on_invoke_tool=direct,
        description=description or f"Ask the agent {agent.name!r} and get its final answer.")
    setattr(tool, CHILD_MARK, agent)
    return tool


def durable_child(caller: ChildAgent, tool: FunctionTool, child: ChildAgent) -> FunctionTool:
    """``tool`` inside ``caller``'s durable run: its call starts ``child`` as a child run."""

    async def invoke(tctx: SdkToolContext[Any], arguments: str) -> Any:
        b = bound(caller)
        if b is None:
            return await tool.on_invoke_tool(tctx, arguments)
        try:
            return await b.child(child.name, {"input": _child_input(arguments)})
        except ChildFailed as exc:
            return f"The agent {child.name!r} did not answer: run {exc.child} {exc.status}: " \
                   f"{exc.error}"

    return dataclasses.replace(tool, on_invoke_tool=invoke)


def _child_input(arguments: str) -> str:
    try:
        parsed = json.loads(arguments) if arguments else {}
    except ValueError:
        return arguments
    return str(parsed.get("input", "")) if isinstance(parsed, dict) else str(parsed)
